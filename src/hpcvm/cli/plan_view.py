"""Rich tables of a VMPlan, in the order a person checks a plan against the host: what
VM, which PU runs each vCPU, which host node holds each guest node, how memory is
backed, where QEMU's own threads run, what to tune, and every decision with its reason.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from hpcvm.host.model import HostTopology
from hpcvm.plan.model import NOVA_THREAD_POLICY, VMPlan
from hpcvm.units import format_cpu_list, format_size


def render(plan: VMPlan, host: HostTopology | None = None) -> Group:
    """All sections, in reading order; empty sections are left out. The recommendations
    are lines of text, not a table: they are commands to copy (module doc)."""
    parts: list[Table | Text] = [summary(plan), vcpus(plan, host)]
    if plan.guest_nodes:
        parts.append(guest_nodes(plan))
    parts.append(memory(plan))
    if plan.housekeeping_pus:
        parts.append(housekeeping(plan))
    if plan.passthrough:
        parts.append(passthrough(plan))
    if plan.host_tuning or plan.guest_kernel_args:
        parts.append(recommendations(plan))
    if plan.warnings:
        parts.append(_lines("Warnings", plan.warnings, style="yellow"))
    parts.append(decisions(plan))
    return Group(*parts)


def print_plan(plan: VMPlan, console: Console, host: HostTopology | None = None) -> None:
    """Every section; lines longer than the console (a recommended ``echo`` into a
    sysfs path) run on instead of being cut or folded, so they can be copied whole."""
    console.print(render(plan, host), soft_wrap=True)


def summary(plan: VMPlan) -> Table:
    t = plan.topology
    table = Table(title=f"Plan {plan.name!r}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    rows = [
        ("profile", plan.profile),
        ("host", f"{plan.host_source}  {plan.host_cpu_model}".strip()),
        ("accelerator", f"{plan.accel.upper()}: {plan.accel_reason}"),
        ("vCPUs", str(plan.vcpus) + ("" if plan.pinned else " (not pinned)")),
        (
            "topology",
            f"{t.sockets} sockets x {t.dies} dies x {t.cores} cores x {t.threads} threads",
        ),
        (
            "memory",
            f"{format_size(plan.memory_bytes)} on {format_size(plan.page_size_bytes)} pages",
        ),
        ("guest NUMA nodes", str(len(plan.guest_nodes)) if plan.guest_nodes else "none (flat)"),
        ("SMT policy", _smt_text(plan)),
        ("CPU model", _cpu_text(plan)),
        ("clock", plan.clock),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table


def _smt_text(plan: VMPlan) -> str:
    if not plan.pinned:
        return "none (vCPUs not pinned)"
    smt = plan.request.smt or "cores"
    return (
        f"{smt} (in intent OpenStack's hw:cpu_thread_policy={NOVA_THREAD_POLICY[smt]}; "
        "--format openstack picks what Nova can schedule here); see decisions"
    )


def _cpu_text(plan: VMPlan) -> str:
    if plan.cpu.model is None:
        return "QEMU default (qemu64)"
    return ",".join([plan.cpu.model, *(f"+{f}" for f in plan.cpu.features)])


def vcpus(plan: VMPlan, host: HostTopology | None) -> Table:
    node_of_pu = {p.os_index: p.node for p in host.pus} if host else {}
    guest_host = {g.index: g.host_node for g in plan.guest_nodes}
    table = Table(title="vCPUs", title_justify="left")
    for col in ("vCPU", "socket", "core", "thread", "guest node", "host PU", "host node"):
        table.add_column(col, justify="right")
    for p in plan.placements:
        node = node_of_pu.get(p.host_pu) if p.host_pu is not None else None
        if node is None and p.guest_node is not None:
            node = guest_host.get(p.guest_node)
        table.add_row(
            str(p.vcpu),
            str(p.socket),
            str(p.core),
            str(p.thread),
            _opt(p.guest_node),
            _opt(p.host_pu, "any"),
            _opt(node),
        )
    return table


def guest_nodes(plan: VMPlan) -> Table:
    table = Table(title="Guest NUMA nodes", title_justify="left")
    table.add_column("guest node", justify="right")
    table.add_column("memory on host node", justify="right")
    table.add_column("vCPUs on")
    table.add_column("vCPUs")
    table.add_column("memory", justify="right")
    table.add_column("distances (to guest nodes 0..n-1)")
    for node, row in zip(plan.guest_nodes, plan.guest_distances, strict=True):
        table.add_row(
            str(node.index),
            str(node.host_node),
            _cpu_home(node.host_node, node.cpu_node, node.local),
            format_cpu_list(list(node.vcpus)),
            format_size(node.memory_bytes),
            " ".join(map(str, row)),
        )
    return table


def _cpu_home(host_node: int, cpu_node: int | None, local: bool) -> str:
    if local:
        return f"host node {host_node} (local)"
    if cpu_node is None:
        return "PUs without a node (not local)"
    return f"host node {cpu_node} (not local: outside cpuset.mems or without memory)"


def memory(plan: VMPlan) -> Table:
    table = Table(title="Memory backing", title_justify="left")
    for col in ("region", "size", "backing", "guest node", "bound to", "prealloc"):
        table.add_column(col)
    for r in plan.memory:
        page = format_size(r.page_size_bytes)
        backing = (
            f"hugetlbfs {page} at {r.mem_path}" if r.backend == "file" else f"anonymous {page}"
        )
        bound = (
            f"host node {','.join(map(str, r.host_nodes))} ({r.policy})" if r.host_nodes else "any"
        )
        table.add_row(
            r.id,
            format_size(r.size_bytes),
            backing,
            _opt(r.guest_node),
            bound,
            "yes" if r.prealloc else "no",
        )
    if plan.hugepages_needed:
        needed = ", ".join(f"node {h}: {n}" for h, n in sorted(plan.hugepages_needed.items()))
        table.caption = (
            f"{format_size(plan.page_size_bytes)} huge pages taken per host node: {needed}"
        )
    return table


def housekeeping(plan: VMPlan) -> Table:
    table = Table(title="QEMU's own threads", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("host PUs")
    table.add_row("housekeeping", format_cpu_list(list(plan.housekeeping_pus)))
    table.add_row("emulator thread", format_cpu_list(list(plan.emulator_pus)))
    table.add_row(f"I/O threads ({plan.iothreads})", format_cpu_list(list(plan.iothread_pus)))
    return table


def passthrough(plan: VMPlan) -> Table:
    table = Table(title="Passthrough (VFIO)", title_justify="left")
    for col in ("device", "kind", "host node", "IOMMU group", "guest node", "passed with it"):
        table.add_column(col)
    for d in plan.passthrough:
        table.add_row(
            d.bdf,
            d.kind,
            _opt(d.host_node),
            _opt(d.iommu_group),
            _opt(d.guest_node),
            ", ".join(d.group_members) or "-",
        )
    return table


def recommendations(plan: VMPlan) -> Text:
    """Commands and kernel arguments to apply, one per line (``host:`` or ``guest
    kernel:`` first). A table would cut or fold a long path at the terminal's width
    (80 columns when piped), breaking the very command a user pastes; printed with
    ``soft_wrap``, each line stays whole and the terminal wraps it for the eye."""
    text = Text("Recommendations (not applied)", style="italic")
    for line in plan.host_tuning:
        text.append("\n")
        text.append("  host: ", style="bold")
        text.append(line)
    if plan.guest_kernel_args:
        text.append("\n")
        text.append("  guest kernel: ", style="bold")
        text.append(" ".join(plan.guest_kernel_args))
    return text


def decisions(plan: VMPlan) -> Table:
    table = Table(title="Decisions", title_justify="left")
    table.add_column("topic", style="bold")
    table.add_column("decision")
    for d in plan.decisions:
        table.add_row(d.topic, d.text)
    return table


def _lines(title: str, lines: tuple[str, ...], *, style: str) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("line", style=style)
    for line in lines:
        table.add_row(line)
    return table


def _opt(value: int | None, none: str = "-") -> str:
    return none if value is None else str(value)
