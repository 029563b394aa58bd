"""Registry: render target name (as typed after ``hpcvm plan --format``) -> renderer.

A target turns one plan into one text for another system. Adding one is a module with
its renderer and one ``register`` call (in hpcvm below, or from a plugin: see
hpcvm/plugins.py); ``--format`` offers exactly the registered names plus ``table``, and
an unknown name is a one-line UsageError, never a fallback to some other target.
Renderers are imported when used, so ``hpcvm plan`` does not load YAML or XML code it
does not need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcvm.registry import Registry

if TYPE_CHECKING:
    from hpcvm.host.model import HostTopology
    from hpcvm.plan.model import VMPlan


@dataclass(frozen=True)
class RenderTarget:
    """One output of ``hpcvm plan``: ``render(plan, host)`` is the whole text printed;
    ``host`` is the machine the plan was made for (a cloud flavor checks that what it
    asks for is schedulable there, and prints the compute host's side)."""

    name: str
    render: Callable[[VMPlan, HostTopology], str]
    description: str
    warns: bool = True  # the plan's warnings go to stderr beside the output


TARGETS: Registry[RenderTarget] = Registry("render target")


def register(target: RenderTarget) -> None:
    """Add a target; a second target of the same name is a mistake, not an override."""
    TARGETS.register(target.name, target)


def get(name: str) -> RenderTarget:
    """The target called ``name``; UsageError naming the known ones otherwise."""
    return TARGETS.get_or_refuse(name)


def _json(plan: VMPlan, _host: HostTopology) -> str:
    return plan.model_dump_json(indent=2)


def _qemu(plan: VMPlan, _host: HostTopology) -> str:
    from hpcvm.render.qemu import qemu_command_line
    from hpcvm.render.qemu_notes import left_out

    return "\n".join([*left_out(plan), qemu_command_line(plan)])


def _libvirt(plan: VMPlan, _host: HostTopology) -> str:
    from hpcvm.render.libvirt import libvirt_xml

    return libvirt_xml(plan)


def _openstack(plan: VMPlan, host: HostTopology) -> str:
    from hpcvm.render.openstack import openstack_flavor_commands

    return openstack_flavor_commands(plan, host).rstrip("\n")


def _kubevirt(plan: VMPlan, _host: HostTopology) -> str:
    from hpcvm.render.kubevirt import kubevirt_yaml

    return kubevirt_yaml(plan).rstrip("\n")


for _target in (
    RenderTarget("json", _json, "the plan itself, versioned (docs/plan-schema.json)", False),
    RenderTarget(
        "qemu",
        _qemu,
        "the planned machine as one shell-quoted QEMU line, after # comments naming what "
        "to add (boot media, console, pinning)",
    ),
    RenderTarget("libvirt", _libvirt, "a libvirt domain for virsh define"),
    RenderTarget("openstack", _openstack, "OpenStack flavor commands, notes as comments"),
    RenderTarget("kubevirt", _kubevirt, "a KubeVirt VirtualMachine manifest"),
):
    register(_target)
