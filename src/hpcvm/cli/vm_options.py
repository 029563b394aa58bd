"""The options that shape and boot a VM, shared by ``up``, ``run`` and ``cluster up``,
and the one place they become a typed request (runtime/options.py ``VmRequest``).

``vm_options`` adds the options to a command; the command hands what click parsed to
``VmOptionValues.parse``, which knows every option by name and refuses any other, so an
option that no request field takes cannot be accepted and dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from hpcvm.cli.common import seconds
from hpcvm.errors import UsageError
from hpcvm.model import Frozen
from hpcvm.plan.model import PROFILE_NAMES, AccelChoice, PlanRequest
from hpcvm.runtime.backends import BACKENDS
from hpcvm.runtime.options import VmOptions, VmRequest
from hpcvm.units import parse_size

F = TypeVar("F", bound=Callable[..., Any])


def vm_options(func: F) -> F:
    """The VM's shape and how to boot it."""
    options = [
        click.option(
            "--profile", required=True, type=click.Choice(PROFILE_NAMES), help="Tuning profile."
        ),
        click.option("--vcpus", required=True, type=int, help="Number of vCPUs."),
        click.option("--memory", required=True, help="Guest memory, e.g. 2G or 512M."),
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
            metavar="KIND=SOURCE[,model=virtio|e1000][,mtu=N]",
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


class VmOptionValues(Frozen):
    """What click parsed for ``vm_options``, one field per option (its Python name)."""

    profile: str
    vcpus: int
    memory: str
    page_size: str | None
    housekeeping: int | None
    guest_nodes: int | None
    passthrough: tuple[str, ...]
    accel: AccelChoice
    backend: str
    connect_uri: str | None
    kernel: str | None
    initrd: str | None
    image: str | None
    shares: tuple[str, ...]
    network: str | None
    address: str | None
    ready_timeout: float | None

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> VmOptionValues:
        """The VM options among ``values`` (a command's other options are its own)."""
        return cls.model_validate({k: values[k] for k in cls.model_fields})

    def plan_request(self) -> PlanRequest:
        return PlanRequest.model_validate(
            {
                "profile": self.profile,
                "vcpus": self.vcpus,
                "memory_bytes": parse_size(self.memory, what="--memory"),
                "page_size_bytes": (
                    parse_size(self.page_size, what="--page-size") if self.page_size else None
                ),
                "housekeeping": self.housekeeping,
                "guest_nodes": self.guest_nodes,
                "passthrough": self.passthrough,
                "accel": self.accel,
            }
        )

    def vm(self) -> VmOptions:
        fields = self.model_dump(include=set(VmOptions.model_fields))
        try:
            return VmOptions.model_validate(fields)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = "--" + str(first["loc"][0]).replace("_", "-")
            raise UsageError(f"{where}: {first['msg']}") from None

    def request(self) -> VmRequest:
        return VmRequest(plan=self.plan_request(), vm=self.vm())
