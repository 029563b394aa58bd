#!/usr/bin/env bash
# The test suite: lint, types, unit and integration tests (integration tests boot real
# guests under QEMU and start a real libvirtd, so they run as root).
#
# The unit tests marked `alone` (their verdict rests on timing real work, which another
# test beside them disturbs) run first, in one process, on a quiet machine. Then the other
# unit tests and the integration tests (these boot real guests) run in one pytest-xdist
# run on three workers (HPCVM_TEST_INTEGRATION_WORKERS=N), --dist loadscope with
# tests/conftest.py's scheduler: a module's tests in one worker (its module fixtures,
# often a booted guest, are made once), and the modules that share machine-wide state
# (the Slurm test cluster and its user; libvirtd, huge page pools and host tuning) one
# after the other in one worker (tests/shared_state.py names them and says why).
# While one worker computes, the others' tests mostly wait on a 1-vCPU guest, Slurm or
# the network: the test-cluster group alone takes longer than all the rest, unit tests
# included, on the two other workers, even on 2 cores (docs/testing.md); the unit tests
# come last in the queue, so they fill the workers that the other groups free. With
# HPCVM_TEST_INTEGRATION_WORKERS=1 the unit tests run first on HPCVM_TEST_WORKERS
# workers (default: every CPU, at least two), then the integration tests in one process.
# Each run prints its slowest tests and its total (--durations in pyproject.toml); the
# script fails when any run fails, after all ran. With arguments (`-m "not
# integration"`, a path), one plain pytest run takes them.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/mypy
if [ "$#" -gt 0 ]; then
  exec .venv/bin/pytest -q "$@"
fi
status=0
echo "test: unit tests that time real work (marked alone), in one process"
.venv/bin/pytest -q -m alone tests/unit || status=$?
integration=${HPCVM_TEST_INTEGRATION_WORKERS:-3}
if [ "$integration" -gt 1 ]; then
  echo "test: the other unit tests and the integration tests, on $integration workers by shared-state group"
  # A short base for the tests' directories: xdist adds popen-gwN/ to each, and a VM's
  # socket path in a test's runtime directory must stay within a Unix socket's 107 bytes.
  base=$(mktemp -d /tmp/it.XXXXXX)
  rest=0
  .venv/bin/pytest -q -n "$integration" --dist loadscope --basetemp "$base" -m "not alone" \
    tests || rest=$?
  if [ "$rest" -eq 0 ]; then rm -rf "$base"; else status=$rest; echo "test: files in $base"; fi
else
  workers=${HPCVM_TEST_WORKERS:-$(nproc)}
  if [ "$workers" -lt 2 ]; then workers=2; fi
  echo "test: the other unit tests on $workers workers"
  .venv/bin/pytest -q -n "$workers" --dist loadfile -m "not alone" tests/unit || status=$?
  echo "test: the integration tests, in one process"
  .venv/bin/pytest -q tests --ignore=tests/unit || status=$?
fi
exit "$status"
