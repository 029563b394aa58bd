"""What ``hpcvm plan --format qemu`` leaves out of its command line, said in comments.

Without a BootSpec the line is the planned machine only: no boot media, no console and
no management socket (``-nodefaults``), and no pinning, which QEMU's command line cannot
express at all (the runtime pins threads by id after start). A user who pastes the line
would otherwise start a VM that boots nothing, unpinned, with an I/O thread nothing
uses; the comments name each gap and the option or step that fills it. Pure: no I/O.
"""

from __future__ import annotations

from hpcvm.plan.model import VMPlan
from hpcvm.units import format_cpu_list


def left_out(plan: VMPlan) -> list[str]:
    """Shell comment lines (``# ...``) to print before the plan's QEMU line."""
    io = ",iothread=iothread1" if plan.iothreads else ""
    lines = [
        "# The planned machine only; add what it leaves out before running it:",
        "#   boot media: -kernel FILE -initrd FILE -append 'ARGS', or a disk: -drive "
        f"file=DISK,if=none,id=disk0 -device virtio-blk-pci,drive=disk0{io}",
        "#   a console and a monitor (-nodefaults removed them): -serial stdio "
        "-qmp unix:qmp.sock,server=on,wait=off",
        *_pinning(plan),
    ]
    if plan.iothreads:
        lines.append(
            "#   iothread1 serves only a disk attached with iothread=iothread1 (above); "
            "without one it idles"
        )
    lines.append("# hpcvm up does all of this and boots the built-in guest.")
    return lines


def _pinning(plan: VMPlan) -> list[str]:
    pins = [(p.vcpu, p.host_pu) for p in plan.placements if p.host_pu is not None]
    if not pins:
        return [f"#   vCPUs: not pinned (profile {plan.profile}); nothing to add"]
    pairs = ", ".join(f"vCPU {vcpu} -> PU {pu}" for vcpu, pu in pins)
    lines = [
        "#   pinning, which QEMU has no option for: start with -S, read each vCPU's "
        "thread id (QMP query-cpus-fast), taskset -pc each, then QMP cont: " + pairs
    ]
    if plan.emulator_pus:
        lines.append(
            "#   QEMU's other threads (emulator, I/O) -> PUs "
            f"{format_cpu_list(list(plan.emulator_pus))}: taskset -apc that list QEMU's "
            "pid before pinning the vCPUs"
        )
    return lines
