"""How ``cluster up`` gives each VM's tap its netguard peers (job isolation, docs/site.md
"What separates users"): the job's addresses each node knows before its VM runs
(cluster/tasks/node.py ``job_addresses``), the helper's arguments they become
(runtime/net/netguard.py), and the refusal of ``--address auto`` where the site isolates
jobs (cluster/commands/control.py ``check_isolation``). The helper itself, with those
arguments, runs for real in tests/integration/test_netguard_isolation.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm.bootspec import Nic
from hpcvm.cluster.commands import control
from hpcvm.cluster.job.spec import ClusterRequest
from hpcvm.cluster.tasks import node
from hpcvm.errors import UsageError
from hpcvm.runtime.net import netguard
from tests.unit.test_cluster_checkpoint import _spec, write_checkpoint

NIC = Nic(kind="bridge", source="br0", mac="52:54:00:00:00:01", ifname="hv0",
          address="10.77.0.201/24", mtu=1500)  # fmt: skip


def test_a_static_jobs_vms_are_its_first_address_and_the_next_ones() -> None:
    spec = _spec().model_copy(update={"nodes": 4, "spare": 1})  # 3 VMs, 1 spare
    assert node.job_addresses(spec) == ["10.77.0.200", "10.77.0.201", "10.77.0.202"]


def test_an_auto_job_knows_no_peers_before_its_vms_run() -> None:
    assert node.job_addresses(_spec().model_copy(update={"first_address": "auto"})) == []


def test_a_restored_job_has_its_checkpoints_addresses(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", vms=3)
    spec = _spec().model_copy(update={"restore": str(tmp_path / "ckpt"), "first_address": "auto"})
    assert node.job_addresses(spec) == ["10.77.0.200/24", "10.77.0.201/24", "10.77.0.202/24"]


def test_the_peers_reach_the_helper_only_while_the_job_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netguard, "CONFIG", _config(tmp_path, "job-isolation on\n"))
    assert netguard.guard_argv(NIC, fd=7) == [
        "guard", "--mac", NIC.mac, "--ip", "10.77.0.201", "--fd", "7",
    ]  # fmt: skip
    with netguard.job_peers(["10.77.0.200/24", "10.77.0.201/24", "10.77.0.200"]):
        assert netguard.guard_argv(NIC) == [
            "guard", "--mac", NIC.mac, "--ip", "10.77.0.201",
            "--peer", "10.77.0.200", "--peer", "10.77.0.201", "--ifname", "hv0",
        ]  # fmt: skip
    assert "--peer" not in netguard.guard_argv(NIC)


def test_no_peers_reach_a_helper_where_the_site_has_no_isolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose helper predates isolation (it refuses --peer) still guards the taps
    of a site that does not isolate jobs."""
    monkeypatch.setattr(netguard, "CONFIG", _config(tmp_path, "bridge br0\n"))
    with netguard.job_peers(["10.77.0.200/24", "10.77.0.201/24"]):
        assert "--peer" not in netguard.guard_argv(NIC)


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "netguard.conf"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "on"),
    [
        ("bridge br0\n", False),
        ("job-isolation on\n", True),
        ("job-isolation on  # the site's choice\n", True),
        ("job-isolation on\njob-isolation off\n", False),  # the last line counts
        ("# job-isolation on\n", False),
    ],
)
def test_isolation_on_reads_the_admins_config_as_the_helper_does(
    tmp_path: Path, text: str, on: bool
) -> None:
    assert netguard.isolation_on(_config(tmp_path, text)) is on


def test_isolation_off_without_a_config(tmp_path: Path) -> None:
    assert netguard.isolation_on(tmp_path / "none.conf") is False


def _request(first_address: str, network: str | None = "bridge=br0") -> ClusterRequest:
    spec = _spec()
    vm = spec.vm.model_copy(update={"network": network})
    return ClusterRequest.model_validate(
        {**spec.model_dump(include=set(ClusterRequest.model_fields)), "vm": vm,
         "first_address": first_address}
    )  # fmt: skip


def test_cluster_up_auto_is_refused_in_one_line_where_jobs_are_isolated(tmp_path: Path) -> None:
    config = _config(tmp_path, "bridge br0\njob-isolation on\n")
    with pytest.raises(UsageError) as refused:
        control.check_isolation(_request("auto"), config)
    said = str(refused.value)
    assert "\n" not in said and "give --address IP/PREFIX" in said and str(config) in said
    control.check_isolation(_request("10.77.0.200/24"), config)  # static: its peers known
    control.check_isolation(_request("auto", network=None), config)  # no bridge: no guard
    control.check_isolation(_request("auto"), _config(tmp_path, "bridge br0\n"))  # off
