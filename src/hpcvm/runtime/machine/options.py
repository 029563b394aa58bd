"""What a user asks for when a VM is started, as typed requests.

``VmRequest`` is the whole of ``hpcvm up`` and ``run`` beside the VM's name: the plan
request and :class:`VmOptions`, how to boot what is planned. The CLI builds it from its
options in one place (cli/vm_options.py), every cluster node gets it inside its
``ClusterSpec`` (cluster/job/spec.py extends it), and ``lifecycle.up`` takes its options as
:class:`UpOptions`. Unknown fields are refused (``Frozen``), so an option that nothing
reads cannot be accepted and dropped.
"""

from __future__ import annotations

from pydantic import PositiveFloat

from hpcvm.model import Frozen
from hpcvm.plan.model import PlanRequest

DEFAULT_BACKEND = "qemu"


class VmOptions(Frozen):
    """How to boot a planned VM (each field is the ``up`` option of the same name)."""

    backend: str = DEFAULT_BACKEND  # a name in runtime/backends/registry.py BACKENDS
    connect_uri: str | None = None  # libvirt URI (--connect)
    kernel: str | None = None  # with initrd: boot these instead of the built-in guest
    initrd: str | None = None
    image: str | None = None  # a disk image booted instead of a kernel
    ready_timeout: PositiveFloat | None = None  # None: $HPCVM_READY_TIMEOUT or the default
    shares: tuple[str, ...] = ()  # --share HOST_DIR[:GUEST_DIR][:rw] (runtime/hostside/shares.py)
    network: str | None = None  # --network KIND=SOURCE[,model=...][,mtu=N] (net/network.py)
    address: str | None = None  # --address 10.77.0.101/24: the guest's, set by itself


class VmRequest(Frozen):
    """A VM to start: what to plan and how to boot it."""

    plan: PlanRequest
    vm: VmOptions = VmOptions()


class UpOptions(VmOptions):
    """``lifecycle.up``'s options: the VM's name, and the directory the built-in guest
    sees as the working directory (None: this process's)."""

    name: str
    workdir: str | None = None
    # The guest's MAC when it is not the one its name gives: a VM that migrated in keeps
    # the MAC it had (its devices are part of the state, cluster/commands/migrate.py)
    mac: str | None = None
