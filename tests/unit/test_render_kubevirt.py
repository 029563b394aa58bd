"""KubeVirt VirtualMachine manifests of the planner's plans on every real snapshot.

Each manifest is checked against the plan itself and against the admission rules of
KubeVirt's webhook for dedicated CPUs (Guaranteed QoS: requests == limits, whole CPUs;
at most two threads per core; an isolated emulator thread and guest NUMA only with
dedicated CPUs, guest NUMA only with huge pages; memory a multiple of the page size).
The YAML text is read back with PyYAML. There is no Kubernetes cluster here, so the
manifests are not applied.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpcvm.errors import UsageError
from hpcvm.plan.model import PROFILE_NAMES, PassthroughDevice, ProfileName, VMPlan
from hpcvm.render.kubevirt import VMRender, kubevirt_vm, kubevirt_yaml
from hpcvm.units import GIB, KIB, MIB
from tests import render_plans as hand
from tests.conftest import Snapshot
from tests.unit.test_render_openstack import cloud_plans, pooled_xml, run_plan

IMAGE = "quay.io/containerdisks/fedora:40"
_UNITS = {"": 1, "Ki": KIB, "Mi": MIB, "Gi": GIB}


def parse_quantity(text: str) -> int:
    """A Kubernetes binary quantity (``512Mi``, ``2Gi``, ``4096``) in bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", text)
    assert match, f"{text!r} is not a binary quantity"
    return int(match[1]) * _UNITS[match[2] or ""]


def domain_of(manifest: dict[str, Any]) -> dict[str, Any]:
    domain: dict[str, Any] = manifest["spec"]["template"]["spec"]["domain"]
    return domain


def check_vm(plan: VMPlan, render: VMRender) -> None:
    """The manifest asks KubeVirt for the plan's guest, in a form its webhook admits."""
    manifest = render.manifest
    assert manifest["apiVersion"] == "kubevirt.io/v1" and manifest["kind"] == "VirtualMachine"
    assert manifest["metadata"]["name"] == plan.name
    assert manifest["spec"]["runStrategy"] == "Halted"
    domain = domain_of(manifest)
    pinned = any(p.host_pu is not None for p in plan.placements)
    assert pinned == (plan.profile != "naive")
    _check_cpu(plan, domain["cpu"], pinned)
    _check_resources(plan, domain, pinned)
    _check_numa(plan, domain["cpu"], pinned)
    assert domain["cpu"].get("isolateEmulatorThread", False) == (plan.profile == "hpc")
    assert ("model" in domain["cpu"]) == (plan.cpu.model == "host")
    if plan.cpu.model == "host":
        assert domain["cpu"]["model"] == "host-passthrough"
    features = [f["name"] for f in domain["cpu"].get("features", [])]
    assert features == list(plan.cpu.features)
    assert ("timer" in domain["clock"]) == (plan.accel == "kvm")
    if pinned:
        pus = ",".join(str(p.host_pu) for p in plan.placements)
        assert any(pus in n for n in render.notes), "the pins KubeVirt cannot take are said"


def _check_cpu(plan: VMPlan, cpu: dict[str, Any], pinned: bool) -> None:
    t = plan.topology
    shape = (cpu["sockets"], cpu["cores"], cpu["threads"])
    assert shape[0] * shape[1] * shape[2] == plan.vcpus
    if pinned and t.threads > 2:
        assert shape == (t.sockets * t.dies, t.cores * t.threads, 1)
    else:
        assert shape == (t.sockets * t.dies, t.cores, t.threads)
    assert cpu.get("dedicatedCpuPlacement", False) == pinned
    if pinned:
        assert cpu["threads"] <= 2, "KubeVirt: at most two threads with dedicated CPUs"


def _check_resources(plan: VMPlan, domain: dict[str, Any], pinned: bool) -> None:
    resources = domain["resources"]
    requests = resources["requests"]
    assert parse_quantity(requests["memory"]) == plan.memory_bytes
    if pinned:
        assert resources["limits"] == requests, "Guaranteed QoS: requests == limits"
        assert requests["cpu"] == str(plan.vcpus)
    else:
        assert "limits" not in resources and "cpu" not in requests
    huge = {r.page_size_bytes for r in plan.memory if r.backend == "file"}
    page = domain.get("memory", {}).get("hugepages", {}).get("pageSize")
    if huge:
        assert page is not None and {parse_quantity(page)} == huge
        assert plan.memory_bytes % parse_quantity(page) == 0
    else:
        assert page is None


def _check_numa(plan: VMPlan, cpu: dict[str, Any], pinned: bool) -> None:
    huge = any(r.backend == "file" for r in plan.memory)
    expected = bool(plan.guest_nodes) and huge and pinned
    assert ("numa" in cpu) == expected
    if expected:
        assert cpu["numa"] == {"guestMappingPassthrough": {}}


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_snapshot_plans_make_the_planned_vm(snapshot: Snapshot, profile: ProfileName) -> None:
    plans = [p for p in cloud_plans(snapshot) if p.profile == profile]
    if not plans:
        pytest.skip(f"the planner accepts no {profile} request on {snapshot.name}")
    for plan in plans:
        check_vm(plan, kubevirt_vm(plan))


@pytest.mark.parametrize("name", sorted(hand.all_plans()))
def test_hand_built_plans_make_the_planned_vm(name: str) -> None:
    plan = hand.all_plans()[name]
    check_vm(plan, kubevirt_vm(plan))


@pytest.mark.parametrize("name", sorted(hand.all_plans()))
def test_yaml_round_trips_and_carries_the_notes(name: str) -> None:
    plan = hand.all_plans()[name]
    text = kubevirt_yaml(plan, image=IMAGE)
    render = kubevirt_vm(plan, image=IMAGE)
    assert yaml.safe_load(text) == render.manifest
    comments = [line.removeprefix("# note: ") for line in text.splitlines() if line[:1] == "#"]
    assert set(render.notes) <= set(comments) and render.notes


def test_vm_checks_can_fail() -> None:
    """A plan's manifest checked against a different plan fails."""
    numa, hpc = hand.numa(), hand.hpc_kvm()
    pairs = ((numa, hand.pinned()), (numa, hand.numa_4k()), (hand.pinned(), hand.naive()))
    for plan, other in (*pairs, (hpc, hpc.model_copy(update={"accel": "tcg"}))):
        with pytest.raises(AssertionError):
            check_vm(plan, kubevirt_vm(other.model_copy(update={"name": plan.name})))


def test_more_than_two_threads_become_cores() -> None:
    """KubeVirt refuses threads > 2 with dedicated CPUs (KNL-like 4-way SMT): the
    guest gets the same vCPUs as cores, and a note says so."""
    plan = hand.hpc_kvm()
    t = plan.topology.model_copy(update={"sockets": 1, "cores": 2, "threads": 4})
    plan = plan.model_copy(update={"topology": t})
    render = kubevirt_vm(plan)
    check_vm(plan, render)
    assert domain_of(render.manifest)["cpu"]["cores"] == 8
    assert any("4 threads per core" in n for n in render.notes)


def test_image_is_the_root_disk() -> None:
    spec = kubevirt_vm(hand.numa(), image=IMAGE).manifest["spec"]["template"]["spec"]
    assert spec["volumes"] == [{"name": "rootdisk", "containerDisk": {"image": IMAGE}}]
    assert [d["name"] for d in spec["domain"]["devices"]["disks"]] == ["rootdisk"]
    bare = kubevirt_vm(hand.numa())
    assert "volumes" not in bare.manifest["spec"]["template"]["spec"]
    assert any("no boot disk" in n for n in bare.notes)


def test_passed_devices_are_host_devices_and_gpus() -> None:
    """hpc_kvm's InfiniBand HCA, plus a GPU added by hand (no VFIO device here)."""
    plan = hand.hpc_kvm()
    gpu = PassthroughDevice(
        bdf="0000:af:00.0", kind="gpu", host_node=1, iommu_group=90, guest_node=1
    )
    plan = plan.model_copy(update={"passthrough": (*plan.passthrough, gpu)})
    render = kubevirt_vm(plan)
    devices = domain_of(render.manifest)["devices"]
    assert devices["hostDevices"] == [{"name": "hostdev0", "deviceName": "hpcvm/infiniband"}]
    assert devices["gpus"] == [{"name": "gpu0", "deviceName": "hpcvm/gpu"}]
    for dev in plan.passthrough:
        assert any(dev.bdf in n and "permittedHostDevices" in n for n in render.notes)


@pytest.mark.parametrize("name", ["Job_1", "-job", "a" * 64, "job.one"])
def test_a_name_kubernetes_refuses_is_a_one_line_usage_error(name: str) -> None:
    with pytest.raises(UsageError, match="not a Kubernetes object name") as info:
        kubevirt_vm(hand.naive(name=name))
    assert "\n" not in str(info.value)


# --- hpcvm plan --format kubevirt -------------------------------------------------------


def test_cli_prints_a_yaml_manifest(tmp_path: Path) -> None:
    xml = pooled_xml(tmp_path)
    result = run_plan(
        "--profile", "numa", "--vcpus", "8", "--memory", "8G", "--topology", xml,
        "--format", "kubevirt",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    manifest = yaml.safe_load(result.stdout)
    assert manifest["kind"] == "VirtualMachine" and manifest["metadata"]["name"] == "hpcvm"
    domain = domain_of(manifest)
    cpu = domain["cpu"]
    assert cpu["sockets"] * cpu["cores"] * cpu["threads"] == 8
    assert cpu["dedicatedCpuPlacement"] is True
    assert domain["resources"]["requests"] == domain["resources"]["limits"]
    assert parse_quantity(domain["resources"]["requests"]["memory"]) == 8 * GIB
    assert parse_quantity(domain["memory"]["hugepages"]["pageSize"]) == 2 * MIB


def test_cli_refuses_a_bad_name_in_one_line(tmp_path: Path) -> None:
    result = run_plan(
        "--profile", "numa", "--vcpus", "2", "--memory", "1G", "--name", "Job_1",
        "--topology", pooled_xml(tmp_path), "--format", "kubevirt",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("hpcvm: error:") and "Job_1" in line


def test_a_note_with_a_newline_stays_a_comment() -> None:
    """A hand-edited plan's host tuning line with a newline must not become YAML."""
    plan = hand.numa().model_copy(update={"host_tuning": ("sysctl -w x=1\ninjected: true",)})
    assert yaml.safe_load(kubevirt_yaml(plan)) == kubevirt_vm(plan).manifest
