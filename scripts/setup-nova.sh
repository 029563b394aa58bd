#!/usr/bin/env bash
# The test-only oracle for `hpcvm plan --format openstack`: OpenStack Nova 34 (2025.2)
# from PyPI in its own virtualenv, .venv-nova, so that Nova's ~130 pinned dependencies
# never mix with hpcvm's .venv. tests/unit/test_render_openstack_nova.py runs
# tests/nova/check_flavor.py with this python and skips when it is missing.
# Nova's dependencies are pinned by tests/nova/constraints.txt (what nova 34.0.0
# resolved to on Python 3.11, Nov 2026), so the oracle does not drift between runs.
# About 2 minutes and 400 MB on first run; safe to run again (prints what it did).
set -euo pipefail
cd "$(dirname "$0")/.."

NOVA_VERSION=${HPCVM_NOVA_VERSION:-34.0.0}
PYTHON=${PYTHON:-python3}

if [ ! -x .venv-nova/bin/python ]; then
  "$PYTHON" -m venv .venv-nova
fi
have=$(.venv-nova/bin/python -c 'from importlib.metadata import version; print(version("nova"))' 2>/dev/null || true)
if [ "$have" != "$NOVA_VERSION" ]; then
  .venv-nova/bin/pip install -q --upgrade pip
  .venv-nova/bin/pip install -q -c tests/nova/constraints.txt "nova==$NOVA_VERSION"
fi
PYTHONWARNINGS=ignore .venv-nova/bin/python -c "import nova.virt.hardware, nova.scheduler.utils"
echo "setup: nova $NOVA_VERSION installed in .venv-nova (test oracle for --format openstack)"
