#!/usr/bin/env bash
# The test suite: lint, types, unit and integration tests (integration tests boot real
# guests under QEMU and start a real libvirtd, so they run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/mypy
.venv/bin/pytest -q "$@"
