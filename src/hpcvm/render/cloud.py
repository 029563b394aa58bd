"""What the cloud targets (OpenStack flavors, KubeVirt manifests) share. Pure: no I/O.

A cloud scheduler, not the plan, chooses the host: which PUs run the vCPUs, which host
node backs each guest node, where QEMU's own threads go. A cloud render can only ask for
the plan's kind of guest. These helpers word the plan's host-specific decisions the
same way in both targets' notes, so that nothing the plan decided is dropped unsaid.
"""

from __future__ import annotations

from hpcvm.plan.model import PassthroughDevice, VMPlan
from hpcvm.units import KIB, format_cpu_list, format_size

SMALL_PAGE = 4 * KIB


def pins_text(plan: VMPlan) -> str:
    """``vCPUs 0-3 -> host PUs 2,34,3,35``: host PUs in vCPU order, not sorted."""
    pus = ",".join(map(str, plan.vcpu_pus()))
    if plan.vcpus == 1:
        return f"vCPU 0 -> host PU {pus}"
    return f"vCPUs 0-{plan.vcpus - 1} -> host PUs {pus}"


def node_map_text(plan: VMPlan) -> str:
    """``guest node 0 -> host node 1, guest node 1 -> host node 0``."""
    return ", ".join(f"guest node {n.index} -> host node {n.host_node}" for n in plan.guest_nodes)


def distances_text(plan: VMPlan) -> str:
    return "; ".join(" ".join(map(str, row)) for row in plan.guest_distances)


def hugepages_text(plan: VMPlan) -> str:
    """``256 x 2M on host node 0, 256 x 2M on host node 1``."""
    page = format_size(plan.page_size_bytes)
    return ", ".join(
        f"{count} x {page} on host node {node}"
        for node, count in sorted(plan.hugepages_needed.items())
    )


def housekeeping_text(plan: VMPlan) -> str:
    text = f"emulator threads on host PUs {format_cpu_list(plan.emulator_pus)}"
    if plan.iothreads:
        pus = format_cpu_list(plan.iothread_pus) if plan.iothread_pus else "any PU"
        text += f", {plan.iothreads} I/O thread(s) on {pus}"
    return text


def device_label(dev: PassthroughDevice) -> str:
    """A stable name for a passed device's kind (``hpcvm-infiniband``): the plan knows
    the device's address and kind, not its vendor:product, so the cloud side (a Nova
    PCI alias, a KubeVirt resource name) is named by kind and mapped by the operator."""
    return f"hpcvm-{dev.kind}"


def is_huge(plan: VMPlan) -> bool:
    return plan.page_size_bytes != SMALL_PAGE


def host_side_notes(plan: VMPlan, where: str) -> list[str]:
    """The plan's host tuning and guest kernel line: recommendations for the hosts and
    the image, which neither a flavor nor a manifest can carry. ``where`` names the
    hosts (``each compute host``, ``each node``)."""
    notes = []
    if plan.host_tuning:
        notes.append(
            f"host tuning the plan recommends, to apply on {where} (not expressible here): "
            + "; ".join(plan.host_tuning)
        )
    if plan.guest_kernel_args:
        notes.append(
            "guest kernel command line the plan recommends (set it in the guest image): "
            + " ".join(plan.guest_kernel_args)
        )
    return notes


def group_note(plan: VMPlan, bdf: str, members: tuple[str, ...], scheduler: str, unit: str) -> str:
    """VFIO hands a whole IOMMU group to one guest; a cloud scheduler allocates each
    device on its own and does not keep a group together. Members the plan does not
    pass (a hand-edited plan) are named: they get no ``unit`` (alias, resource)."""
    passed = {d.bdf for d in plan.passthrough}
    missing = [m for m in members if m not in passed]
    text = (
        f"VFIO passes {bdf} only together with its IOMMU group ({', '.join(members)}); "
        f"{scheduler} picks each {unit}'s device on its own and does not keep a group "
        f"together, so offer only such whole groups to it"
    )
    if missing:
        text += f"; {', '.join(missing)} get no {unit} here: add them"
    return text


def comment_lines(header: str, notes: tuple[str, ...]) -> list[str]:
    """The header and notes as ``#`` lines for a shell script or YAML file. A note is
    kept on one line whatever a hand-edited plan put in it: a newline would end the
    comment and make the rest a command (or YAML)."""
    return [f"# {' '.join(text.splitlines())}" for text in (header, *(f"note: {n}" for n in notes))]
