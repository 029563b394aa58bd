"""VMPlan: every placement decision for one VM, and the request that produced it.

A plan is the single source the renderers (QEMU argv, libvirt XML, cloud formats), the
runtime (pinning, hugetlbfs) and ``verify`` (what the guest must see) all read. It is
versioned JSON (``PLAN_SCHEMA_VERSION``); ``hpcvm plan --format json`` prints it and
``docs/plan-schema.json`` holds its JSON Schema.

Conventions: host CPUs and nodes are OS indexes; guest vCPUs are QEMU cpu-index order
(socket-major, then core, then thread); sizes are bytes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpcvm.model import Frozen
from hpcvm.plan.names import PROFILE_NAMES as PROFILE_NAMES  # re-exported: older importers
from hpcvm.plan.names import SMT_POLICIES as SMT_POLICIES
from hpcvm.plan.names import AccelChoice as AccelChoice
from hpcvm.plan.names import ProfileName as ProfileName
from hpcvm.plan.names import SmtPolicy as SmtPolicy
from hpcvm.plan.names import ThpMode as ThpMode

PLAN_SCHEMA_VERSION = 1

# The OpenStack thread policy each SMT policy means in intent. The flavor hpcvm renders
# (render/openstack.py) picks what Nova can schedule on the planned host instead: on an
# SMT host a cores-first plan is `prefer` with one thread per core in cpu_dedicated_set,
# since `isolate` forbids every SMT host (docs/openstack.md).
NOVA_THREAD_POLICY: dict[SmtPolicy, str] = {
    "cores": "isolate",
    "pack": "prefer",
    "require": "require",
}
Accel = Literal["kvm", "tcg"]


WarningKind = Literal["plan", "tcg"]  # tcg: the VM runs under software emulation


class PlanRequest(Frozen):
    """What the user asked for, validated for form (not yet for feasibility)."""

    name: str = "hpcvm"
    profile: ProfileName
    vcpus: int
    memory_bytes: int
    page_size_bytes: int | None = None  # None: the profile's default
    housekeeping: int | None = None  # cores per used NUMA node; None: profile default
    guest_nodes: int | None = None  # numa/hpc: guest nodes; None: one per used host node
    passthrough: tuple[str, ...] = ()  # PCI addresses as typed (normalised by plan)
    accel: AccelChoice = "auto"
    smt: SmtPolicy | None = None  # pinned profiles; None: "cores"
    # the guest kernel's transparent huge page mode; None: the guest kernel's default
    guest_thp: ThpMode | None = None


class TakenPus(Frozen):
    """The PUs one of the user's running VMs holds, as ``up`` reads them from its
    record: its vCPUs' PUs and those its QEMU threads (emulator, I/O) are pinned to. The
    planner keeps a new VM's vCPUs off them while other PUs are free (plan/taken.py)."""

    vm: str
    vcpu_pus: tuple[int, ...] = ()
    qemu_pus: tuple[int, ...] = ()


class Profile(Frozen):
    """What a profile turns on; the five profiles are the reference study's steps."""

    name: ProfileName
    description: str
    pin: bool  # 1:1 vCPU -> PU pinning
    hugepages: bool  # guest RAM on hugetlbfs by default
    vnuma: bool  # guest NUMA nodes mirror host nodes, memory bound per node
    housekeeping: bool  # QEMU's own threads on reserved housekeeping cores
    host_cpu: bool  # host CPU model, invariant TSC, kvm-clock
    passthrough: bool  # --passthrough allowed


class CpuTopology(Frozen):
    """QEMU's -smp topology; sockets * dies * cores * threads == vcpus."""

    sockets: int
    dies: int = 1
    cores: int
    threads: int


class VcpuPlacement(Frozen):
    """One vCPU: where it sits in the guest topology and which host PU runs it."""

    vcpu: int
    socket: int
    die: int = 0
    core: int
    thread: int
    guest_node: int | None  # None for a flat (non-NUMA) guest
    host_pu: int | None  # None when not pinned (naive)


class GuestNode(Frozen):
    """A guest NUMA node mirroring one host node.

    ``host_node`` holds the node's memory. ``cpu_node`` is the node of the PUs running
    its vCPUs: the same unless that node is outside cpuset.mems (memory then goes to
    the nearest allowed node) or the PUs have no node at all (None); ``local`` says
    whether the guest's claim "these vCPUs are local to this memory" is true.
    """

    index: int
    host_node: int
    vcpus: tuple[int, ...]
    memory_bytes: int
    cpu_node: int | None = None  # None with local=True: same as host_node (old plans)
    local: bool = True


class MemoryRegion(Frozen):
    """One QEMU memory backend (one per guest node, or one for a flat guest).

    backend "ram" is anonymous memory (``memory-backend-ram``), "file" is hugetlbfs
    (``memory-backend-file`` at ``mem_path``). ``host_nodes``/``policy`` bind it.
    """

    id: str
    size_bytes: int
    guest_node: int | None
    backend: Literal["ram", "file"]
    page_size_bytes: int  # 4096 for ordinary pages
    mem_path: str | None = None  # hugetlbfs mount point for backend "file"
    host_nodes: tuple[int, ...] = ()
    policy: Literal["bind", "default"] = "default"
    prealloc: bool = False


class CpuModel(Frozen):
    """Guest CPU model. ``model`` None means QEMU's default (qemu64)."""

    model: str | None
    features: tuple[str, ...] = ()  # e.g. ("invtsc",); rendered as +invtsc


class PassthroughDevice(Frozen):
    bdf: str
    kind: str
    host_node: int | None
    iommu_group: int | None
    guest_node: int | None
    group_members: tuple[str, ...] = ()  # other functions passed with it


class Decision(Frozen):
    """One decision in words a person can check against the host."""

    topic: str  # "vcpus", "memory", "numa", "housekeeping", "cpu", "clock", ...
    text: str


class VMPlan(Frozen):
    """The tuned VM for one host, request and profile. Pure data; see module doc."""

    schema_version: int = PLAN_SCHEMA_VERSION
    name: str
    profile: ProfileName
    request: PlanRequest
    host_source: str
    host_cpu_model: str = ""
    accel: Accel
    accel_reason: str
    vcpus: int
    memory_bytes: int
    topology: CpuTopology
    placements: tuple[VcpuPlacement, ...]
    guest_nodes: tuple[GuestNode, ...]  # empty for a flat guest
    guest_distances: tuple[tuple[int, ...], ...]  # by guest node index; empty if flat
    memory: tuple[MemoryRegion, ...]
    page_size_bytes: int
    # whether the host may back anonymous guest RAM with its transparent huge pages
    # (QEMU asks for them); False when 4K pages were asked for explicitly: QEMU then
    # starts with THP disabled for it (prctl PR_SET_THP_DISABLE), so 4K means 4K
    host_thp: bool = True
    # host node -> number of huge pages of page_size_bytes the plan takes there
    hugepages_needed: dict[int, int] = Field(default_factory=dict)
    emulator_pus: tuple[int, ...] = ()  # empty: not restricted
    iothreads: int = 0
    iothread_pus: tuple[int, ...] = ()
    housekeeping_pus: tuple[int, ...] = ()
    cpu: CpuModel
    clock: str  # "kvm-clock", or what the guest will use instead and why in decisions
    passthrough: tuple[PassthroughDevice, ...] = ()
    guest_kernel_args: tuple[str, ...] = ()  # recommended guest kernel command line
    host_tuning: tuple[str, ...] = ()  # recommended host settings, as commands/lines
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[str, ...] = ()
    # what each warning is about ("tcg": the VM is emulated), one per warning, so a
    # caller acts on a kind without reading the text
    warning_kinds: tuple[WarningKind, ...] = ()

    @property
    def pinned(self) -> bool:
        return any(p.host_pu is not None for p in self.placements)

    def vcpu_pus(self) -> tuple[int, ...]:
        """Host PUs of the vCPUs in vCPU order (empty when unpinned)."""
        return tuple(p.host_pu for p in self.placements if p.host_pu is not None)
