"""The options that shape and boot a VM, shared by ``up``, ``run`` and ``cluster up``,
and the one place they become a typed request (runtime/machine/options.py ``VmRequest``).

``vm_options`` adds the options to a command; the command hands what click parsed to
``vm_request`` (or ``VmOptionValues.parse``, cli/vm_values.py), which knows every
option by name and refuses any other, so an option that no request field takes cannot
be accepted and dropped. The models load only when a command runs, not for --help.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click

from hpcvm.cli.common import seconds
from hpcvm.nic_models import NIC_MODELS
from hpcvm.plan.names import PROFILE_NAMES
from hpcvm.runtime.backends.registry import BACKENDS

if TYPE_CHECKING:
    from hpcvm.runtime.machine.options import VmRequest

F = TypeVar("F", bound=Callable[..., Any])


SHAPE_OPTIONS = ("profile", "vcpus", "memory")  # required unless a command says otherwise


def vm_options(func: F) -> F:
    """The VM's shape and how to boot it."""
    return _vm_options(func, shape_required=True)


def vm_options_shape_optional(func: F) -> F:
    """``vm_options`` where the shape may be left out (``cluster up --restore``: the
    saved VMs have theirs); the command checks it with ``require_shape``."""
    return _vm_options(func, shape_required=False)


def require_shape(kw: Mapping[str, Any]) -> None:
    """click's own refusal of a missing required option, for a shape left optional."""
    for name in SHAPE_OPTIONS:
        if kw.get(name) is None:
            raise click.MissingParameter(param_type="option", param_hint=f"'--{name}'")


def _vm_options(func: F, *, shape_required: bool) -> F:
    req = shape_required
    unless = "" if req else " Required unless --restore."
    options = [
        click.option(
            "--profile",
            required=req,
            type=click.Choice(PROFILE_NAMES),
            help=f"Tuning profile.{unless}",
        ),
        click.option("--vcpus", required=req, type=int, help=f"Number of vCPUs.{unless}"),
        click.option("--memory", required=req, help=f"Guest memory, e.g. 2G or 512M.{unless}"),
        click.option("--page-size", default=None, help="4K, 2M or 1G (profile default)."),
        click.option(
            "--housekeeping", type=int, default=None, help="hpc: cores per node for QEMU."
        ),
        click.option(
            "--guest-nodes", type=int, default=None, help="numa/hpc: number of guest nodes."
        ),
        click.option("--passthrough", multiple=True, help="hpc: PCI device to pass (repeatable)."),
        click.option(
            "--accel",
            type=click.Choice(["auto", "kvm", "tcg"]),
            default="auto",
            show_default=True,
            help="KVM, TCG, or KVM when a probe guest boots on it.",
        ),
        click.option(
            "--backend",
            type=click.Choice(list(BACKENDS)),
            default="qemu",
            show_default=True,
            help="Run QEMU directly (QMP) or through libvirt.",
        ),
        click.option("--connect", "connect_uri", default=None, help="libvirt URI."),
        click.option("--kernel", default=None, help="Boot this kernel (with --initrd)."),
        click.option("--initrd", default=None, help="Initramfs for --kernel."),
        click.option("--image", default=None, help="Boot a disk image instead of a kernel."),
        click.option(
            "--share",
            "shares",
            multiple=True,
            metavar="HOST_DIR[:GUEST_DIR][:rw]",
            help="Share a host directory with the guest, read-only unless :rw "
            "(repeatable). The built-in guest also sees /usr, /bin, /sbin, /lib*, /opt, "
            "/etc without secrets and, read-only, the working directory unless it is /, "
            "a home, a top-level or a world-writable directory such as /tmp.",
        ),
        click.option(
            "--network",
            default=None,
            metavar=f"KIND=SOURCE[,model={'|'.join(NIC_MODELS)}][,mtu=N]",
            help="Give the VM a NIC on the host network: bridge=BR (a tap in bridge BR; "
            "model=e1000 alone means bridge=br0), macvtap=NIC (a macvtap in bridge mode on "
            "the host's Ethernet NIC) or vf=auto|PCI_ADDRESS (an SR-IOV VF passed through, "
            "hpc profile). See docs/networking.md.",
        ),
        click.option(
            "--address",
            default=None,
            metavar="IPV4/PREFIX",
            help="The guest's address on --network (e.g. 10.77.0.101/24), set by the "
            "guest itself at boot.",
        ),
        click.option(
            "--ready-timeout",
            callback=seconds,
            metavar="SECONDS",
            default=None,
            help="Seconds to wait for the guest agent (default 90 under TCG, 30 under KVM; "
            "or $HPCVM_READY_TIMEOUT).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def no_stdin_option(func: F) -> F:
    """``exec``'s and ``run``'s ``--no-stdin``, as ssh's ``-n``: a non-terminal stdin
    is otherwise read to its end for the guest command, which a script whose stdin
    stays open (a pipe nobody closes) would wait on forever."""
    return click.option(
        "--no-stdin",
        is_flag=True,
        help="Do not pass stdin to the command (it is passed unless a terminal).",
    )(func)


def vm_request(values: Mapping[str, Any]) -> VmRequest:
    """The typed request of the VM options among ``values`` (cli/vm_values.py)."""
    from hpcvm.cli.vm_values import VmOptionValues

    return VmOptionValues.parse(values).request()
