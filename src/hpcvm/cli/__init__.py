"""Thin command line: parse, call the stages, print, map errors to exit codes."""
