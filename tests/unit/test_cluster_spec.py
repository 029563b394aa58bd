"""The cluster job's data: deterministic guest addresses, the nodes' event lines, the
holder step's srun line and the MPI launch line across nodes.

Oracles: Python's ipaddress module for address arithmetic, Slurm's own ``srun
--help`` and Open MPI's ``ompi_info`` for the options hpcvm passes (an option they
do not know would make the real run fail), shlex for the scripts run in guests.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcvm.bench.core.launch import Spread, across, mpirun_argv, mpirun_program, with_cpu_set
from hpcvm.bench.envs.placement import NativePlacement
from hpcvm.cluster.batch.base import Allocation
from hpcvm.cluster.batch.slurm import Slurm
from hpcvm.cluster.benchnodes import native_places
from hpcvm.cluster.job import guest_mpi
from hpcvm.cluster.job.spec import (
    EVENT_PREFIX,
    NodeEvent,
    check_addresses,
    latest_per_node,
    node_address,
    parse_events,
)
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.guest import hosttools
from hpcvm.runtime.net.network import parse_address


@pytest.mark.parametrize(
    ("first", "index", "expected"),
    [
        ("10.77.0.101/24", 0, "10.77.0.101/24"),
        ("10.77.0.101/24", 3, "10.77.0.104/24"),
        ("10.0.0.255/16", 1, "10.0.1.0/16"),
    ],
)
def test_the_kth_node_gets_the_kth_next_address(first: str, index: int, expected: str) -> None:
    got = node_address(first, index)
    assert got == ipaddress.IPv4Interface(expected)
    assert got.network == ipaddress.IPv4Interface(first).network


def test_addresses_that_leave_the_network_are_refused_before_anything_starts() -> None:
    check_addresses("10.77.0.250/24", 4)  # .250-.253 fit
    with pytest.raises(UsageError, match="broadcast"):
        check_addresses("10.77.0.250/24", 6)  # .255 is the broadcast address


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("10.77.0.101", "prefix length"),
        ("10.77.0.0/24", "network's or broadcast"),
        ("fe80::1/64", "IPv4"),
        ("node1", "prefix length"),
    ],
)
def test_bad_addresses_get_one_line_errors(text: str, why: str) -> None:
    with pytest.raises(UsageError, match=why) as info:
        parse_address(text)
    assert "\n" not in str(info.value)


def _event(kind: str, index: int, **extra: object) -> NodeEvent:
    return NodeEvent.model_validate(
        {"event": kind, "node": f"node{index + 1}", "index": index, "vm": "c-x", **extra}
    )


def test_event_lines_round_trip_through_srun_labels_and_noise() -> None:
    ready = _event("ready", 0, address="10.0.0.1/24", vcpu_pus=(1, None))
    lines = [
        "some output of the task",
        ready.line(),
        "0: " + _event("failed", 1, message="no bridge br0").line(),  # srun --label
        EVENT_PREFIX + "{garbled",
    ]
    events = parse_events(lines)
    assert events[0] == ready
    assert [e.event for e in events] == ["ready", "failed"]
    latest = latest_per_node([*events, _event("down", 0)])
    assert {i: e.event for i, e in latest.items()} == {0: "down", 1: "failed"}


@pytest.mark.skipif(shutil.which("srun") is None, reason="Slurm's client is not installed")
def test_the_holder_step_uses_only_options_srun_knows(tmp_path: Path) -> None:
    allocation = Allocation(batch="slurm", job_id="7", nodes=("n1", "n2"))
    argv = Slurm().step_argv(allocation, "c", ["hpcvm", "cluster", "node"])
    # srun reads a slurm.conf before it prints its help; a minimal one does.
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1\n")
    env = {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["srun", "--help"], capture_output=True, text=True, env=env)
    help_text = done.stdout + done.stderr
    assert "--ntasks" in help_text, help_text
    # srun lists --cpu-bind only when a task affinity plugin is configured; the
    # integration tests run the real line on the test cluster.
    for option in argv[1:-3]:
        if not option.startswith("--cpu-bind"):
            assert option.split("=")[0] in help_text, option
    assert "--nodes=2" in argv and "--ntasks-per-node=1" in argv and "--overlap" in argv


def test_outside_an_allocation_cluster_commands_say_how_to_get_one() -> None:
    with pytest.raises(UsageError, match="sbatch -N"):
        Slurm().allocation(None, {})


def _ompi_knows(param: str) -> bool:
    done = subprocess.run(
        ["ompi_info", "--param", "all", "all", "--level", "9", "--parsable"],
        capture_output=True,
        text=True,
    )
    return f":{param}:" in done.stdout


@pytest.mark.skipif(shutil.which("ompi_info") is None, reason="Open MPI is not installed")
def test_across_nodes_mpirun_uses_tcp_on_the_given_network_and_deals_ranks_by_node() -> None:
    with across(Spread(nodes=2, network="10.77.0.0/24")):
        argv = mpirun_argv(2, ["prog"])
    assert "isolated" not in argv
    pairs = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv[:-2]) if a == "--mca"}
    assert pairs["btl_tcp_if_include"] == pairs["oob_tcp_if_include"] == "10.77.0.0/24"
    assert "tcp" in pairs["btl"].split(",")
    for param in pairs:
        assert _ompi_knows(param), param
    assert argv[argv.index("--map-by") + 1] == "node"
    assert mpirun_argv(2, ["prog"])[argv.index("--allow-run-as-root")] == "--allow-run-as-root"
    assert "isolated" in mpirun_argv(2, ["prog"])  # outside the block: one node again


@pytest.mark.skipif(shutil.which("ompi_info") is None, reason="Open MPI is not installed")
def test_the_guest_mpi_environment_names_parameters_open_mpi_has() -> None:
    env = dict(
        v.split("=", 1) for v in guest_mpi.mpi_environment(ipaddress.IPv4Network("10.1.0.0/16"))
    )
    for key in env:
        if key.startswith("OMPI_MCA_"):
            assert _ompi_knows(key.removeprefix("OMPI_MCA_")), key
    assert env["OMPI_MCA_btl_tcp_if_include"] == "10.1.0.0/16"
    agent = shlex.split(env["OMPI_MCA_plm_rsh_agent"])
    assert agent[:3] == ["ssh", "-i", guest_mpi.PRIVATE_KEY]


def test_native_runs_keep_slurm_variables() -> None:
    env = {"SLURM_JOB_ID": "3", "HOME": "/x", "SLURM_NODELIST": "n[1-2]"}
    assert Slurm().native_mpi_env(env) == [
        "SLURM_JOB_ID=3",
        "SLURM_NODELIST=n[1-2]",
    ]


def _node(cpus: tuple[int, ...] | None, allowed: tuple[int, ...]) -> native_places.NodeNative:
    placement = NativePlacement(cpus=cpus, mems=(0,), source="test")
    return native_places.NodeNative(placement=placement, allowed=allowed)


def test_alike_nodes_bind_native_ranks_to_their_common_pus() -> None:
    places = {"node1": _node((1, 2), (0, 1, 2, 3)), "node2": _node((1, 2), (0, 1, 2, 3))}
    assert native_places.common_cpus(places) == (1, 2)
    assert native_places.describe(places) == "node1: PUs 1-2, mems 0; node2: PUs 1-2, mems 0"
    assert native_places.differences(places) == []
    program = mpirun_program()
    argv = ["/usr/bin/env", "-C", "/w", program, "-np", "2", "--map-by", "node", "prog"]
    bound = with_cpu_set(argv, program, (1, 2, 3))
    assert bound == [*argv[:4], "--cpu-list", "1-3", "-np", "2", "prog"]
    assert with_cpu_set(argv, program, None) == argv


def test_unlike_nodes_run_native_where_each_node_allows_and_say_where_that_differs() -> None:
    confined = {"node1": _node((0,), (0,)), "node2": _node((1,), (1,))}
    assert native_places.common_cpus(confined) is None
    assert native_places.describe(confined) == "node1: PUs 0, mems 0; node2: PUs 1, mems 0"
    assert native_places.differences(confined) == []
    loose = {"node1": _node((0,), (0,)), "node2": _node((1,), (0, 1))}
    (said,) = native_places.differences(loose)
    assert said.startswith("native on node2 may use PUs 0-1, its VM's vCPUs PUs 1")


def test_each_nodes_placement_must_come_back() -> None:
    item = {"node": "node2", **_node((1,), (1,)).model_dump(mode="json")}
    assert native_places.parse(json.dumps(item) + "\n", ["node2"])["node2"].allowed == (1,)
    with pytest.raises(RuntimeFailure, match="node1"):
        native_places.parse(json.dumps(item), ["node1", "node2"])


def test_the_guest_scripts_are_valid_shell() -> None:
    for script in (
        guest_mpi.sshd_script("c-node1", ipaddress.IPv4Interface("10.0.0.5/24")),
        guest_mpi.first_vm_script([("10.0.0.5", 2), ("10.0.0.6", 2)]),
    ):
        # dash for a disk image's /bin/sh; busybox's sh, which the built-in guest runs
        # them with (guest_mpi.script_shell), is the host's busybox shared into it
        for shell in (["sh"], [hosttools.busybox().path.as_posix(), "sh"]):
            done = subprocess.run([*shell, "-n", "-c", script], capture_output=True, text=True)
            assert done.returncode == 0, (shell, done.stderr)
    assert "ListenAddress 10.0.0.5\n" in guest_mpi.sshd_script(
        "x", ipaddress.IPv4Interface("10.0.0.5/24")
    )
    assert "10.0.0.6 slots=2" in guest_mpi.first_vm_script([("10.0.0.6", 2)])


def test_each_guest_gets_a_valid_host_key_of_its_own(tmp_path: Path) -> None:
    """Made on the host (guest_mpi.py): ssh-keygen itself derives its public half, and
    two guests never share one."""
    first, second = guest_mpi.host_key("c-node1"), guest_mpi.host_key("c-node2")
    assert first != second
    path = tmp_path / "key"
    path.write_text(first)
    path.chmod(0o600)
    done = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("ssh-ed25519 "), done.stderr
    keys = guest_mpi.sshd_stdin("ssh-ed25519 AAAA job\n", first)
    assert keys.splitlines()[0] == "ssh-ed25519 AAAA job" and keys.endswith(first)
