"""tests/shared_state.py keeps the integration modules that share machine-wide state in
one xdist scope: a module that starts using the Slurm test cluster, libvirtd or the
huge page pools without being named there would run beside the others of its kind on
the other worker, and fail only now and then. The signs of each kind are read from the
modules' source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.shared_state import GROUP_OF, GROUP_ORDER, SHARED_STATE_GROUPS, in_group_order, scope_of

INTEGRATION = Path(__file__).resolve().parent.parent / "integration"
SIGNS = {
    # the cluster's fixture, or its user (whom the cluster makes and removes)
    "test-cluster": re.compile(r"\bslurm_cluster\b|cluster_support\.TEST_|import .*\bTEST_USER\b"),
    # libvirtd's fixture, the huge page pools, host tuning applied (tune --revert)
    "host-pools": re.compile(
        r"\blibvirtd\b|\bHugePages\b|reserve_hugepages|ensure_free|nr_hugepages|\"--revert\""
    ),
}
MODULES = sorted(INTEGRATION.glob("test_*.py"))


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_a_module_that_shares_machine_state_is_in_its_group(module: Path) -> None:
    text = module.read_text()
    kinds = [group for group, sign in SIGNS.items() if sign.search(text)]
    if kinds:
        assert GROUP_OF.get(module.stem) in kinds, (
            f"{module.stem} uses {kinds[0]}'s state: add it to that group in tests/shared_state.py"
        )


def test_every_module_named_in_a_group_exists() -> None:
    stems = {m.stem for m in MODULES}
    for group, modules in SHARED_STATE_GROUPS.items():
        assert modules <= stems, (group, sorted(modules - stems))


def test_the_scope_is_the_group_or_else_the_module() -> None:
    assert scope_of("tests/integration/test_cluster_job.py::test_x[a::b]") == "test-cluster"
    assert scope_of("tests/integration/test_verify.py::T::test_y") == "host-pools"
    assert scope_of("tests/integration/test_guest_boot.py::test_z") == (
        "tests/integration/test_guest_boot.py"
    )


def test_an_ordered_group_names_each_of_its_modules_once() -> None:
    """A module added to a group but not to its order would run first, unseen."""
    for group, order in GROUP_ORDER.items():
        assert sorted(order) == sorted(SHARED_STATE_GROUPS[group]), group


def _ids(*modules: str) -> list[str]:
    return [f"tests/integration/{m}.py::test_{k}" for m in modules for k in (1, 2)]


def test_the_group_runs_together_in_its_order_and_the_rest_keeps_its_own() -> None:
    collected = _ids("test_bench_compare", "test_cluster_bench", "test_guest_boot",
                     "test_cluster_migrate", "test_cluster_checkpoint", "test_verify")  # fmt: skip
    ran = [collected[i] for i in in_group_order(collected)]
    assert sorted(ran) == sorted(collected)
    assert ran == _ids("test_bench_compare", "test_cluster_checkpoint", "test_cluster_migrate",
                       "test_cluster_bench", "test_guest_boot", "test_verify")  # fmt: skip
