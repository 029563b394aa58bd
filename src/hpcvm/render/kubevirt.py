"""A VMPlan as a KubeVirt VirtualMachine manifest (``kubevirt.io/v1``). Pure: no I/O.

In KubeVirt the kubelet, not the plan, chooses the host: its CPU manager (static policy)
gives the virt-launcher pod whole CPUs, and KubeVirt pins the vCPUs to those. So the
manifest asks for the plan's kind of guest: dedicated CPUs (which need the pod's
Guaranteed QoS, requests == limits), the guest's sockets/cores/threads, huge pages by
size, a guest NUMA topology mirroring the pod's CPUs (``guestMappingPassthrough``), an
isolated emulator thread, the host CPU model and its features, the kvm-clock timer, host
devices. What it cannot say (host PU and node numbers, the guest node split and
distances, housekeeping PUs, I/O thread counts, host tuning) comes back as notes.
Field names follow KubeVirt's v1 API and the admission rules of its webhook.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from hpcvm.errors import UsageError
from hpcvm.plan.model import VMPlan
from hpcvm.render.checks import check_renderable
from hpcvm.render.cloud import (
    comment_lines,
    distances_text,
    group_note,
    host_side_notes,
    housekeeping_text,
    hugepages_text,
    is_huge,
    node_map_text,
    pins_text,
)
from hpcvm.units import GIB, KIB, MIB

API_VERSION = "kubevirt.io/v1"
#: KubeVirt's webhook refuses more than two threads per core with dedicated CPUs.
MAX_DEDICATED_THREADS = 2
#: A Kubernetes object name (RFC 1123 label, as KubeVirt requires for VM names).
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

Obj = dict[str, Any]


@dataclass(frozen=True)
class VMRender:
    """The manifest (a VirtualMachine object) and the notes on what it cannot say."""

    manifest: Obj
    notes: tuple[str, ...] = ()


@dataclass
class _Parts:
    notes: list[str] = field(default_factory=list)


def kubevirt_vm(plan: VMPlan, *, image: str | None = None) -> VMRender:
    """The VirtualMachine for ``plan``, created stopped (``runStrategy: Halted``). With
    ``image``, a containerDisk image booted as the root disk."""
    check_renderable(plan)
    _check_name(plan)
    parts = _Parts()
    domain: Obj = {
        "cpu": _cpu(plan, parts),
        "resources": _resources(plan, parts),
    }
    memory = _memory(plan, parts)
    if memory:
        domain["memory"] = memory
    iothreads = _iothreads(plan, parts)
    if iothreads:
        domain["ioThreadsPolicy"] = iothreads
    domain["machine"] = {"type": "q35"}
    domain["clock"] = _clock(plan, parts)
    domain["devices"] = _devices(plan, image, parts)
    spec: Obj = {"domain": domain}
    if image is not None:
        spec["volumes"] = [{"name": "rootdisk", "containerDisk": {"image": image}}]
    else:
        parts.notes.append("no boot disk: render with an image or add a volume")
    parts.notes += host_side_notes(plan, "each node")
    manifest: Obj = {
        "apiVersion": API_VERSION,
        "kind": "VirtualMachine",
        "metadata": {"name": plan.name, "annotations": {"hpcvm/profile": plan.profile}},
        "spec": {
            "runStrategy": "Halted",
            "template": {"metadata": {"labels": {"kubevirt.io/vm": plan.name}}, "spec": spec},
        },
    }
    return VMRender(manifest=manifest, notes=tuple(parts.notes))


def kubevirt_yaml(plan: VMPlan, *, image: str | None = None) -> str:
    """The manifest as YAML for ``kubectl apply -f``, after the notes as ``#`` comments
    (so a saved file carries its caveats)."""
    render = kubevirt_vm(plan, image=image)
    header = f"hpcvm: plan {plan.name!r} (profile {plan.profile}) as a KubeVirt VirtualMachine"
    head = comment_lines(header, render.notes)
    body = yaml.safe_dump(render.manifest, sort_keys=False, default_flow_style=False)
    return "\n".join(head) + "\n" + body


def quantity(nbytes: int) -> str:
    """Bytes as a Kubernetes quantity in binary units: ``2Gi``, ``1536Mi``, ``4Ki``."""
    for unit, factor in (("Gi", GIB), ("Mi", MIB), ("Ki", KIB)):
        if nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return str(nbytes)


def _check_name(plan: VMPlan) -> None:
    if not _NAME_RE.match(plan.name):
        raise UsageError(
            f"VM name {plan.name!r} is not a Kubernetes object name (lowercase letters, "
            "digits and '-', at most 63): choose another with --name"
        )


def _cpu(plan: VMPlan, parts: _Parts) -> Obj:
    """Topology, model and features; for a pinned plan dedicated CPUs, for hpc an
    isolated emulator thread, for a NUMA plan the pod's NUMA passed to the guest."""
    cpu = _topology(plan, parts)
    cpu.update(_model(plan, parts))
    if plan.pinned:
        cpu["dedicatedCpuPlacement"] = True
        parts.notes.append(
            "the kubelet's CPU manager (static policy) picks the dedicated host CPUs; the "
            f"plan's pins cannot be requested: {pins_text(plan)}"
        )
        if plan.emulator_pus:
            cpu["isolateEmulatorThread"] = True
            parts.notes.append(
                "isolateEmulatorThread gives QEMU's emulator thread one more dedicated CPU "
                f"the kubelet picks; the plan's housekeeping cannot be named "
                f"({housekeeping_text(plan)})"
            )
    numa = _numa(plan, parts)
    if numa:
        cpu["numa"] = numa
    return cpu


def _topology(plan: VMPlan, parts: _Parts) -> Obj:
    """sockets x cores x threads == vCPUs. No dies in KubeVirt (folded into sockets);
    with dedicated CPUs at most two threads per core (threads folded into cores)."""
    t = plan.topology
    sockets, cores, threads = t.sockets * t.dies, t.cores, t.threads
    if t.dies > 1:
        parts.notes.append(
            f"KubeVirt has no dies: the plan's {t.sockets} socket(s) x {t.dies} dies are "
            f"{sockets} sockets"
        )
    if plan.pinned and threads > MAX_DEDICATED_THREADS:
        parts.notes.append(
            f"KubeVirt allows at most {MAX_DEDICATED_THREADS} threads per core with "
            f"dedicated CPUs: the plan's {threads} threads per core are shown as cores"
        )
        cores, threads = cores * threads, 1
    return {"sockets": sockets, "cores": cores, "threads": threads}


def _model(plan: VMPlan, parts: _Parts) -> Obj:
    """``host-passthrough`` for the plan's host CPU; QEMU's default (qemu64) and TCG's
    ``max`` have no KubeVirt equivalent (KubeVirt marks qemu64 obsolete and runs KVM), so
    the model is left to KubeVirt's default (host-model). Features are required."""
    out: Obj = {}
    model = plan.cpu.model
    if model == "host":
        out["model"] = "host-passthrough"
    elif model is None:
        parts.notes.append(
            "the plan keeps QEMU's default CPU model (qemu64), which KubeVirt treats as "
            "obsolete: the model is left to KubeVirt's default (host-model)"
        )
    else:
        parts.notes.append(
            f"the plan's CPU model {model!r} has no KubeVirt equivalent: the model is left "
            "to KubeVirt's default (host-model)"
        )
    if plan.cpu.features:
        out["features"] = [{"name": f, "policy": "require"} for f in plan.cpu.features]
    return out


def _numa(plan: VMPlan, parts: _Parts) -> Obj:
    """``guestMappingPassthrough``: the guest gets the NUMA nodes of the CPUs the pod
    was given. KubeVirt requires dedicated CPUs and huge pages for it."""
    if not plan.guest_nodes:
        return {}
    if not (plan.pinned and is_huge(plan)):
        parts.notes.append(
            "KubeVirt builds a guest NUMA topology only with dedicated CPUs and huge pages; "
            f"this plan has {'4K pages' if plan.pinned else 'no pinning'}, so the guest is "
            f"flat instead of {len(plan.guest_nodes)} node(s) ({node_map_text(plan)})"
        )
        return {}
    parts.notes.append(
        "guestMappingPassthrough mirrors the NUMA nodes of the CPUs the kubelet gives the "
        "pod: it cannot pick host nodes, and the guest gets as many nodes as those CPUs "
        f"span, with KubeVirt's vCPU/memory split, not the plan's ({node_map_text(plan)}); "
        "it needs the NUMA feature gate in the KubeVirt CR"
    )
    if len(plan.guest_nodes) > 1:
        parts.notes.append(f"guest NUMA distances are not expressed: {distances_text(plan)}")
    return {"guestMappingPassthrough": {}}


def _resources(plan: VMPlan, parts: _Parts) -> Obj:
    """Pinned: Guaranteed QoS (requests == limits, whole CPUs), which dedicated CPUs
    require. Unpinned: memory requested only (Burstable), so the vCPUs float over the
    node's shared CPUs as QEMU's default threads do."""
    memory = quantity(plan.memory_bytes)
    if plan.pinned:
        amounts = {"cpu": str(plan.vcpus), "memory": memory}
        return {"requests": dict(amounts), "limits": dict(amounts)}
    parts.notes.append(
        "unpinned: Burstable QoS (memory requested, no limits): the vCPUs share the "
        "node's CPUs, and KubeVirt requests 1/cpuAllocationRatio CPU per vCPU"
    )
    return {"requests": {"memory": memory}}


def _memory(plan: VMPlan, parts: _Parts) -> Obj:
    """Huge pages by size: the pod then requests ``hugepages-<size>`` for guest RAM.
    Locking and preallocation have no field: notes."""
    if plan.profile == "hpc" and plan.accel == "kvm":
        parts.notes.append("the plan locks QEMU's memory (mem-lock); a manifest cannot ask")
    if any(r.prealloc for r in plan.memory):
        parts.notes.append(
            "the plan preallocates guest memory at start; a manifest cannot ask for it"
        )
    if not is_huge(plan):
        return {}
    parts.notes.append(
        f"each node needs free {quantity(plan.page_size_bytes)} huge pages for the pod; "
        f"the plan takes {hugepages_text(plan)}"
    )
    return {"hugepages": {"pageSize": quantity(plan.page_size_bytes)}}


def _iothreads(plan: VMPlan, parts: _Parts) -> str | None:
    """``auto`` with an isolated emulator thread, which KubeVirt then also runs the I/O
    threads on (the plan's housekeeping PUs in spirit); ``shared`` (one I/O thread for
    all disks) otherwise. KubeVirt sizes the pool itself."""
    if not plan.iothreads:
        return None
    isolated = plan.pinned and bool(plan.emulator_pus)
    parts.notes.append(
        f"KubeVirt sizes its I/O threads itself: the plan's {plan.iothreads} I/O thread(s) "
        f"are ioThreadsPolicy {'auto' if isolated else 'shared'}"
    )
    return "auto" if isolated else "shared"


def _clock(plan: VMPlan, parts: _Parts) -> Obj:
    """UTC like ``-rtc base=utc``; under KVM the kvm-clock timer present, as in the
    libvirt domain. A TCG plan gets a note: KubeVirt runs KVM unless its CR says
    ``useEmulation``."""
    clock: Obj = {"utc": {}}
    if plan.accel == "kvm":
        clock["timer"] = {"kvm": {"present": True}}
    else:
        parts.notes.append(
            "the plan is for TCG (software emulation); KubeVirt runs guests under KVM "
            "unless useEmulation is set in the KubeVirt CR"
        )
    return clock


def _devices(plan: VMPlan, image: str | None, parts: _Parts) -> Obj:
    """No balloon and no graphics, like the QEMU line's ``-nodefaults`` (KubeVirt's pod
    network interface stays: a cloud guest is reached through it); the root disk;
    passed devices as ``gpus`` (GPUs) or ``hostDevices`` by a resource name the KubeVirt
    CR must permit, named by kind as the plan does not know vendor:product."""
    devices: Obj = {"autoattachMemBalloon": False, "autoattachGraphicsDevice": False}
    if image is not None:
        devices["disks"] = [{"name": "rootdisk", "bootOrder": 1, "disk": {"bus": "virtio"}}]
    gpus: list[Obj] = []
    hostdevs: list[Obj] = []
    for dev in plan.passthrough:
        resource = f"hpcvm/{dev.kind}"
        if dev.kind == "gpu":
            gpus.append({"name": f"gpu{len(gpus)}", "deviceName": resource})
        else:
            hostdevs.append({"name": f"hostdev{len(hostdevs)}", "deviceName": resource})
        parts.notes.append(
            f"PCI device {dev.bdf} ({dev.kind}) is resource {resource!r}: permit it in the "
            "KubeVirt CR (permittedHostDevices.pciHostDevices with pciVendorSelector from "
            f"`lspci -nn -s {dev.bdf}` and resourceName {resource}); KubeVirt passes any "
            f"such device, not {dev.bdf} itself"
        )
        if dev.group_members:
            parts.notes.append(group_note(plan, dev.bdf, dev.group_members, "KubeVirt", "resource"))
    if gpus:
        devices["gpus"] = gpus
    if hostdevs:
        devices["hostDevices"] = hostdevs
    return devices
