"""README's exit-code table names every code an hpcvm command exits with: each error
class's ``exit_code`` (errors.py and the subclasses beside the code that raises them,
found by importing every module) and cli/main.py's 130 for an interruption."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import hpcvm
from hpcvm.errors import HpcvmError

README = Path(__file__).resolve().parents[2] / "README.md"
INTERRUPTED = 130  # cli/main.py: KeyboardInterrupt and click's Abort


def _all_error_classes() -> set[type[HpcvmError]]:
    for module in pkgutil.walk_packages(hpcvm.__path__, "hpcvm."):
        importlib.import_module(module.name)
    found: set[type[HpcvmError]] = set()
    todo = [HpcvmError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def _table() -> dict[int, str]:
    text = " ".join(README.read_text().split())
    paragraph = text.split("Exit codes: ", 1)[1].split("## ", 1)[0]
    parts = re.split(r"(?:^|, )(\d+) (?=[a-z`])", paragraph)
    return {int(code): words for code, words in zip(parts[1::2], parts[2::2], strict=True)}


def test_every_exit_code_is_in_the_readme() -> None:
    table = _table()
    codes = {cls.exit_code for cls in _all_error_classes()} | {INTERRUPTED}
    missing = sorted(codes - set(table))
    assert not missing, f"README's exit-code table lacks {missing}"


def test_the_table_names_no_code_nothing_exits_with() -> None:
    codes = {cls.exit_code for cls in _all_error_classes()} | {INTERRUPTED, 0}
    assert set(_table()) <= codes
