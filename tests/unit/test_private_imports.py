"""No module reaches into another package's private names (issue 24): neither
``from hpcvm.other.module import _name`` nor ``module._name`` on a module imported from
another package (function-local imports included). A stage offers what others need
under a public name; the walk is ``ast``'s, over every module of the package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "hpcvm"


def _package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def reaches(path: Path, own: str) -> list[str]:
    """Private names of other packages that the module at ``path`` (in package ``own``)
    uses."""
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}  # local name -> the hpcvm package it is a module of
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("hpcvm"):
                continue
            package = _package_of(node.module)
            for alias in node.names:
                if package != own and _private(alias.name):
                    found.append(f"{node.module}.{alias.name}")
                aliases[alias.asname or alias.name] = package
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("hpcvm.") and alias.asname:
                    aliases[alias.asname] = _package_of(alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and aliases.get(node.value.id, own) != own
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_module_uses_another_packages_private_names() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        wrong += [f"{path.relative_to(PACKAGE)}: {name}" for name in reaches(path, own)]
    assert not wrong, "private names used across packages:\n" + "\n".join(wrong)


def test_the_walk_finds_both_kinds(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from hpcvm.bench.envs.vm import _FACTS\n"
        "def f():\n    from hpcvm.bench import vm\n    return vm._SAMPLE, vm.plan_vm\n"
    )
    assert reaches(module, "cluster") == ["hpcvm.bench.envs.vm._FACTS", "vm._SAMPLE"]
    assert reaches(module, "bench") == []
