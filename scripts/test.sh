#!/usr/bin/env bash
# The test suite: lint, types, unit and integration tests (integration tests boot real
# guests under QEMU and start a real libvirtd, so they run as root).
#
# The unit tests (pure Python, CPU-bound) run on every CPU with pytest-xdist, at least two
# workers (HPCVM_TEST_WORKERS=N sets another number), a test file's tests in one worker
# (--dist loadfile: its module fixtures are made once), but those marked `alone` (their
# verdict rests on timing real work, which another worker beside them disturbs) run
# after them in one process. Everything else runs as before, in
# one process: the integration tests share the Slurm test cluster, huge pages, host
# tuning and timing-sensitive guests. Each part prints its slowest tests and its total
# (--durations in pyproject.toml); the script fails when either part fails, after both
# ran. With arguments (`-m "not integration"`, a path), one plain pytest run takes them.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/mypy
if [ "$#" -gt 0 ]; then
  exec .venv/bin/pytest -q "$@"
fi
workers=${HPCVM_TEST_WORKERS:-$(nproc)}
if [ "$workers" -lt 2 ]; then workers=2; fi
status=0
echo "test: unit tests on $workers workers"
.venv/bin/pytest -q -n "$workers" --dist loadfile -m "not alone" tests/unit || status=$?
echo "test: unit tests that time real work (marked alone), in one process"
.venv/bin/pytest -q -m alone tests/unit || status=$?
echo "test: the rest (integration tests), in one process"
.venv/bin/pytest -q tests --ignore=tests/unit || status=$?
exit "$status"
