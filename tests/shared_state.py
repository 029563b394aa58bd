"""Which integration tests may run beside which: the scopes of scripts/test.sh's two
pytest-xdist workers for the integration tests (tests/conftest.py gives xdist the
scheduler that uses them).

While one worker's tests compute, the other's mostly wait on a guest (a 1-vCPU TCG
guest keeps one core of two busy), Slurm or the network. A module's tests stay in one
worker, so its module fixtures (often a booted guest) are made once. Modules that share
machine-wide state which a test beside them would disturb form one scope, run one after
the other in one worker, as the whole suite did before. (xdist's own ``loadgroup``,
driven by ``xdist_group`` marks, does not group under pytest 9: it renames items by
``_nodeid``, which pytest 9's ``nodeid`` no longer reads.)
"""

from __future__ import annotations

from pathlib import PurePosixPath

SHARED_STATE_GROUPS: dict[str, frozenset[str]] = {
    # The Slurm test cluster and its user hpcvm-test (made and removed by the cluster,
    # or by a module where it is absent; test_cluster_infra takes the cluster down and
    # up), and the cluster tests' checks that nothing of a job is left on any node.
    "test-cluster": frozenset(
        {
            "test_cluster_bench",
            "test_cluster_checkpoint",
            "test_cluster_infra",
            "test_cluster_job",
            "test_cluster_migrate",
            "test_hostile_paths",
            "test_netguard",
            "test_results_shared",
            "test_two_users",
            "test_bench_native_placement",
            # The container's /etc hides /etc/shadow by a mount on its path; the cluster's
            # useradd/userdel rename a new /etc/shadow in, which that mount no longer
            # covers (CI 2026-12-05: the container read it). A product race, in the note.
            "test_bench_container",
        }
    ),
    # The host's pools and daemons: libvirtd (a worker's session fixture would stop the
    # daemon it started under the other's feet), the huge page pools (raised by one test
    # and taken by another's guest between its check and its boot; test_host_live reads
    # them against sysfs), the hugetlbfs mounts hpcvm installs, and host tuning.
    "host-pools": frozenset(
        {
            "test_image_boot",
            "test_isolation",
            "test_libvirt_backend",
            "test_render_libvirt",
            "test_verify",
            "test_bench_compare",
            "test_render_qemu",
            "test_runtime_lifecycle",
            "test_unprivileged",
            "test_install_node",
            "test_host_live",
            "test_runtime_hugetlbfs_mount",
            "test_tune_host",
        }
    ),
}
GROUP_OF = {module: group for group, modules in SHARED_STATE_GROUPS.items() for module in modules}

# The order the test-cluster group's modules run in (the others keep pytest's). The
# group is the run's longest worker; the other two end minutes before it, and until
# then the two cores are busy. A module that mostly waits (the checkpoint story: link
# outages, checkpoint intervals, a ring paced at 300 ms) loses little to that
# contention, one whose TCG guests compute loses much (the bench job, two vm:hpc guests
# polling in MPI: 74 s alone, 232 s beside the others in the fresh clone of
# 2026-12-05 16:26). So the waiting ones run first and the computing ones last, when
# the group has the machine to itself. test_cluster_infra, which takes the cluster down
# and up, stays right after the checkpoint story, as before.
GROUP_ORDER: dict[str, tuple[str, ...]] = {
    "test-cluster": (
        "test_cluster_checkpoint",
        "test_cluster_infra",
        "test_netguard",
        "test_hostile_paths",
        "test_results_shared",
        "test_two_users",
        "test_bench_native_placement",
        "test_bench_container",
        "test_cluster_job",
        "test_cluster_migrate",
        "test_cluster_bench",
    ),
}


def in_group_order(nodeids: list[str]) -> list[int]:
    """The positions of ``nodeids`` rearranged so that each ordered group's tests come
    together where its first test was, in GROUP_ORDER's module order; every other test
    keeps its order, and a module's tests keep theirs (its fixtures are made once, also
    in a run without xdist; every xdist worker computes the same collection)."""
    first: dict[str, int] = {}
    for i, nodeid in enumerate(nodeids):
        first.setdefault(scope_of(nodeid), i)

    def key(i: int) -> tuple[int, int, int]:
        scope = scope_of(nodeids[i])
        order = GROUP_ORDER.get(scope)
        if order is None:
            return (i, 0, i)
        module = _module(nodeids[i])
        return (first[scope], order.index(module) if module in order else 0, i)

    return sorted(range(len(nodeids)), key=key)


def _module(nodeid: str) -> str:
    """A test id's module name (``test_cluster_job``)."""
    return PurePosixPath(nodeid.split("::", 1)[0]).stem


def scope_of(nodeid: str) -> str:
    """The scope of a test id: its module's shared-state group, or else its module."""
    return GROUP_OF.get(_module(nodeid), nodeid.split("::", 1)[0])
