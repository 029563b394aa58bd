"""Lazily exported package names (hpcvm/lazy.py), checked in fresh interpreters: a name
reads as the object its module defines whether or not a submodule of the same name was
imported first, nothing is imported before a name is read, and a typo is an error."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("package", "name"),
    [("hpcvm.host", "discover"), ("hpcvm.report", "compare"), ("hpcvm.stats", "overhead")],
)
def test_a_name_shared_with_a_submodule_is_the_exported_object(package: str, name: str) -> None:
    code = (
        f"import {package}.{name}, types\n"
        f"from {package} import {name}\n"
        f"from {package}.{name} import {name} as direct\n"
        f"print(isinstance({name}, types.ModuleType), {name} is direct)"
    )
    assert _python(code) == "False True"


def test_nothing_is_imported_before_a_name_is_read() -> None:
    code = (
        "import sys, hpcvm.stats, hpcvm.report\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scipy', 'matplotlib')))\n"
        "from hpcvm.stats import summarize\n"
        "print('scipy' in sys.modules)"
    )
    assert _python(code).splitlines() == ["[]", "True"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    code = (
        "import hpcvm.stats\n"
        "try:\n    hpcvm.stats.sumarize\nexcept AttributeError as e:\n    print(e)"
    )
    assert _python(code) == "module 'hpcvm.stats' has no attribute 'sumarize'"
