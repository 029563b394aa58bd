"""Where the saved tuning state lives by default (state.py explains why), as plain
values: ``hpcvm tune --help`` shows them without importing the tuning code."""

from __future__ import annotations

from pathlib import Path

ENV_DIR = "HPCVM_TUNE_DIR"
DEFAULT_DIR = Path("/var/lib/hpcvm/tune")
