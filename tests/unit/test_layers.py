"""No import runs back up the pipeline (DESIGN.md): walk every module of the package
with ``ast`` (imports inside functions included) and fail when a stage imports a stage
that comes later than it. The layers are DESIGN.md's pipeline read as dependencies:

    foundation  errors, model, units, lock, signals, plugins, registry, bootspec, lazy,
                timeline, procs, nic_models
    1           host; stats and store (libraries of their own: no stage below them)
    2 plan  3 render  4 guest  5 runtime  6 tune  7 bench  8 cluster  9 report  10 cli

A stage may import its own modules, the foundation and any stage of a lower layer.

Inside a stage that has sub-packages, the same rule holds between them (``INNER``): a
sub-package may import its own modules and those of a lower sub-package of its stage,
never a later one. For runtime:

    0 hostside  1 machine, oci  2 channels, net  3 backends  4 verify  5 vm
    6 checkpoint  7 migration

For cluster:

    0 job, batch  1 tasks  2 commands  3 benchnodes

For bench:

    0 core  1 suites, results  2 envs  3 run

and above them ``cluster/internal.py`` (``TOP``), the one module outside its rooms: the
dispatcher ``python -m hpcvm.cluster.internal ROLE`` starts on a node, which may import
every room and which no room imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "hpcvm"
FOUNDATION = {
    "errors",
    "model",
    "units",
    "lock",
    "signals",
    "plugins",
    "registry",
    "bootspec",
    "lazy",
    "timeline",
    "procs",
    "nic_models",
    "__init__",
}
LAYER = {
    "host": 1,
    "stats": 1,
    "store": 1,
    "plan": 2,
    "render": 3,
    "guest": 4,
    "runtime": 5,
    "tune": 6,
    "bench": 7,
    "cluster": 8,
    "report": 9,
    "cli": 10,
}


def _stage(parts: tuple[str, ...]) -> str:
    return parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """Stages (or foundation modules) that ``path`` imports from hpcvm."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "hpcvm":
                found.add(parts[1] if len(parts) > 1 else "__init__")
    return found


def test_every_module_belongs_to_a_known_stage() -> None:
    stages = {_stage(p.relative_to(PACKAGE).parts) for p in PACKAGE.rglob("*.py")}
    unknown = stages - FOUNDATION - set(LAYER) - {"data"}
    assert not unknown, f"add these to the layers of this test and of DESIGN.md: {unknown}"


def test_no_stage_imports_a_later_one() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        stage = _stage(path.relative_to(PACKAGE).parts)
        if stage in FOUNDATION:
            later = set(LAYER)  # the foundation imports no stage at all
        else:
            later = {s for s, layer in LAYER.items() if layer >= LAYER[stage] and s != stage}
        for target in sorted(_imports(path) & later):
            wrong.append(f"{path.relative_to(PACKAGE)} imports hpcvm.{target}")
    assert not wrong, "imports running back up the pipeline:\n" + "\n".join(wrong)


# Sub-packages of a stage, by layer (module doc); a stage's modules outside them (its
# __init__) import none of them.
INNER: dict[str, dict[str, int]] = {
    "bench": {"core": 0, "suites": 1, "results": 1, "envs": 2, "run": 3},
    "runtime": {
        "hostside": 0,
        "machine": 1,
        "oci": 1,
        "channels": 2,
        "net": 2,
        "backends": 3,
        "verify": 4,
        "vm": 5,
        "checkpoint": 6,
        "migration": 7,
    },
    "cluster": {
        "job": 0,
        "batch": 0,
        "tasks": 1,
        "commands": 2,
        "benchnodes": 3,
    },
}
# Modules of a divided stage that stand above all its rooms (module doc).
TOP: dict[str, set[str]] = {"cluster": {"internal.py"}}


def _inner_imports(path: Path, stage: str) -> set[str]:
    """Sub-packages of ``stage`` that ``path`` imports (function-local imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["hpcvm", stage] and len(parts) > 2 and parts[2] in INNER[stage]:
                found.add(parts[2])
    return found


def test_every_module_of_a_divided_stage_lies_in_a_known_sub_package() -> None:
    for stage, subs in INNER.items():
        top = PACKAGE / stage
        allowed = {"__init__.py", *TOP.get(stage, set())}
        loose = sorted(p.name for p in top.glob("*.py") if p.name not in allowed)
        assert not loose, f"put these in a sub-package of {stage} (and in INNER): {loose}"
        found = {p.name for p in top.iterdir() if (p / "__init__.py").is_file()}
        assert found == set(subs), f"{stage}'s sub-packages and INNER differ"


def test_no_room_imports_the_dispatcher_above_them() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE)} imports hpcvm.{stage}.{top.removesuffix('.py')}"
        for stage, tops in TOP.items()
        for path in sorted((PACKAGE / stage).rglob("*.py"))
        for top in tops
        if path.name != top and f"hpcvm.{stage}.{top.removesuffix('.py')}" in _imported(path)
    ]
    assert not wrong, "\n".join(wrong)


def _imported(path: Path) -> set[str]:
    """Every hpcvm module name ``path`` imports (function-local imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_sub_package_imports_a_later_one() -> None:
    wrong = []
    for stage, subs in INNER.items():
        for path in sorted((PACKAGE / stage).rglob("*.py")):
            parts = path.relative_to(PACKAGE / stage).parts
            if parts[0] in TOP.get(stage, set()):
                continue  # the dispatcher above every room
            own = parts[0] if len(parts) > 1 else None
            for target in sorted(_inner_imports(path, stage)):
                if own is None or (target != own and subs[target] >= subs[own]):
                    wrong.append(f"{path.relative_to(PACKAGE)} imports hpcvm.{stage}.{target}")
    assert not wrong, "imports running back up inside a stage:\n" + "\n".join(wrong)


def test_the_walk_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from hpcvm.report.load import load_report\n")
    assert _imports(module) == {"report"}


def _module_graph() -> dict[str, set[str]]:
    """hpcvm module -> the hpcvm modules it imports (function-local imports too; a name
    imported from a package counts as its submodule when there is one)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    graph[name].add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names)
    return {m: {t for t in targets if t in modules and t != m} for m, targets in graph.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a path that returns to its start), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        stack = [(start, [start])]
        seen = {start}
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    return [*path, start]
                if nxt not in seen and nxt not in done:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        done.add(start)
    return None


def test_no_module_imports_itself_through_others() -> None:
    """No import circle, not even one hidden in a function: each is a sign that two
    modules own one thing (the figures/sizes and verify/verify_shares circles were)."""
    cycle = _cycle(_module_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
