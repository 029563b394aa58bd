"""Checkpoint and restore one VM: its RAM, device state and disk, into a directory and
back, on this host or another of the same architecture and QEMU version.

The API is in steps, because a job's checkpoint (several VMs that talk to each other)
must pause every VM before it saves any, so that no message between guests is half
sent; ``checkpoint`` and ``restore`` compose the steps for one VM:

- ``check(machine)``: refuse now, with the reason and the way out, what cannot be
  saved (a backend without a state saver, QEMU's own blockers such as the built-in
  guest's 9p root, a guest not booted from a disk image). Changes nothing.
- ``pause(machine) -> bool``: stop its vCPUs; whether they were running.
- ``save(machine, directory) -> Saved``: write a paused VM's checkpoint: its plan, its
  state (QEMU's migration stream, runtime/checkpoint/qemu_state.py), its disk overlay and
  seed, and a manifest with the guest ABI, the QEMU version and every file's SHA-256,
  all at once or not at all (runtime/checkpoint/directory.py). The VM stays paused.
- ``resume(machine)``: run it again (and give it its disks back, which a save took).
- ``discard(machine)``: end a saved VM: QEMU quits and its run directory goes. No
  guest shutdown: the guest is frozen, and it lives on in the checkpoint.
- ``checkpoint(name, directory, resume=...)``: all of the above for one VM; on failure
  the VM is left as it was (running again if it ran) and no directory is made.
- ``load(directory) -> Checkpoint``: read a checkpoint and check every file.
- ``plan_restore(checkpoint, name) -> VMPlan``: plan the same request for this host
  (pins, memory binding and huge pages follow this host's topology and this process's
  CPU affinity) and refuse, with the differences, a plan whose guest ABI is not the
  saved one, or a QEMU that is not the one that saved it.
- ``restore(directory, name=...) -> Restored``: load, plan, then start QEMU waiting
  for the state (``-incoming``), pin it, load the state, resume, and step the guest's
  clock to the host's through the agent (the guest's clock stood still while it was
  saved, see docs/checkpoint.md). Everything is refused before anything starts; a
  failure after QEMU started leaves nothing (runtime/vm/lifecycle.py ``up``).

Which backend can save a VM's state is a registry (``STATE_SAVERS``, by backend name).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hpcvm.bootspec import BootSpec
from hpcvm.errors import HpcvmError, InfeasiblePlanError, RuntimeFailure, UsageError
from hpcvm.host.model import HostTopology
from hpcvm.plan.model import VMPlan
from hpcvm.registry import Registry
from hpcvm.runtime.backends.registry import get_backend
from hpcvm.runtime.checkpoint import directory as checkpoint_dir
from hpcvm.runtime.checkpoint.directory import Checkpoint
from hpcvm.runtime.checkpoint.model import (
    DISK_FILE,
    PLAN_FILE,
    SEED_FILE,
    STATE_FILE,
    BaseImage,
    Emulator,
    Manifest,
    abi_differences,
    guest_abi,
)
from hpcvm.runtime.checkpoint.qemu_state import QemuStateSaver
from hpcvm.runtime.machine import planning, state
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.machine.options import UpOptions
from hpcvm.runtime.vm import lifecycle, stopping
from hpcvm.runtime.vm.boot import BootMedia
from hpcvm.signals import signals_deferred

if TYPE_CHECKING:
    from hpcvm.runtime.channels.agent import GuestAgent

Warn = Callable[[str], None]
CLOCK_TOLERANCE = 1.0  # seconds: a guest clock this close to the host's is right
DOCS = "docs/checkpoint.md"


class StateSaver(Protocol):
    """Saves and loads the state of VMs of one backend."""

    def blockers(self, machine: Machine) -> list[str]:
        """The emulator's reasons why ``machine`` cannot be saved now; empty if it can."""
        ...

    def emulator(self, machine: Machine) -> Emulator:
        """The emulator running ``machine``."""
        ...

    def save(self, machine: Machine, path: Path) -> int:
        """Write the paused VM's state to a new file ``path``; its size."""
        ...

    def load(self, machine: Machine, path: Path) -> None:
        """Load a saved state into a VM started to receive one (``BootSpec.incoming``)."""
        ...

    def send(self, machine: Machine, conn_fd: int) -> dict[str, Any]:
        """Live-migrate the VM over a connected socket (runtime/migration/move.py); the
        emulator's last word on it (``downtime`` in ms)."""
        ...

    def receive(
        self, machine: Machine, conn_fd: int, budget: float, listening: Callable[[], None]
    ) -> None:
        """Take a live migration from a connected socket into a VM started to receive;
        ``listening()`` once the emulator reads it."""
        ...


STATE_SAVERS: Registry[StateSaver] = Registry("state saver")
STATE_SAVERS.register("qemu", QemuStateSaver())


@dataclass(frozen=True)
class Saved:
    """A checkpoint written."""

    directory: Path
    state_bytes: int
    disk_bytes: int  # overlay and seed
    seconds: float  # from the start of the save to the committed directory
    state_seconds: float  # of which the emulator writing the state


@dataclass(frozen=True)
class ClockStep:
    """The guest's wall clock against the host's after a restore, in seconds (positive:
    the guest is behind), before and after hpcvm stepped it through the agent."""

    behind_before: float
    behind_after: float | None  # None when it could not be read back
    error: str = ""  # what the agent said if stepping failed

    @property
    def ok(self) -> bool:
        return self.behind_after is not None and abs(self.behind_after) <= CLOCK_TOLERANCE


@dataclass(frozen=True)
class Restored:
    machine: Machine
    checkpoint: Checkpoint
    seconds: float  # from the start of the restore until the agent answered
    clock: ClockStep | None


# -- checkpoint -------------------------------------------------------------------------


def saver_for(backend: str) -> StateSaver:
    if backend not in STATE_SAVERS:
        raise UsageError(
            f"hpcvm cannot checkpoint VMs of the {backend} backend: start the VM with "
            f"--backend {' or '.join(STATE_SAVERS)}"
        )
    return STATE_SAVERS[backend]


def check(machine: Machine) -> None:
    """Refuse, before anything changes, a VM that cannot be saved; say why and how."""
    saver = saver_for(machine.backend)
    backend = get_backend(machine.backend, machine.connect_uri)
    if not backend.alive(machine):
        raise RuntimeFailure(f"VM {machine.name} is not running (QEMU pid {machine.pid} gone)")
    blockers = saver.blockers(machine)
    if blockers:
        hint = (
            " (the built-in guest's root is the host's file system over 9p)"
            if machine.boot.share_table
            else ""
        )
        raise UsageError(
            f"VM {machine.name} cannot be checkpointed: QEMU says: {'; '.join(blockers)}"
            f"{hint}; to checkpoint a VM, boot a disk image (--image) without --share "
            f"mounted in the guest ({DOCS})"
        )
    if machine.boot.disk_image is None or machine.options is None:
        why = "a kernel boot" if machine.options is not None else "started by an older hpcvm"
        raise UsageError(
            f"VM {machine.name} cannot be checkpointed: hpcvm checkpoints disk-image guests "
            f"only, and it is {why}; start it with --image ({DOCS})"
        )


def pause(machine: Machine) -> bool:
    """Stop the VM's vCPUs; True when they were running."""
    backend = get_backend(machine.backend, machine.connect_uri)
    running = backend.status(machine) == "running"
    if running:
        backend.pause(machine)
    return running


def resume(machine: Machine) -> None:
    """Run the VM's vCPUs again (after a save, QEMU takes its disks back first)."""
    get_backend(machine.backend, machine.connect_uri).resume(machine)


def discard(machine: Machine) -> None:
    """End a VM whose state was saved: QEMU quits, its run directory goes."""
    stopping.teardown(machine)


def save(machine: Machine, directory: Path) -> Saved:
    """Write the checkpoint of a paused VM into ``directory`` (which must not exist),
    all at once or not at all; the VM stays paused."""
    check(machine)
    saver = saver_for(machine.backend)
    if get_backend(machine.backend, machine.connect_uri).status(machine) == "running":
        raise UsageError(f"VM {machine.name} is running: pause it before saving it")
    assert machine.options is not None  # check() refused a VM without
    begin = time.monotonic()
    saved_at = time.time()
    with checkpoint_dir.writing(directory) as writer:
        emulator = saver.emulator(machine)
        writer.write_text(PLAN_FILE, machine.plan.model_dump_json(indent=2))
        state_begin = time.monotonic()
        state_bytes = saver.save(machine, writer.path(STATE_FILE))
        state_seconds = time.monotonic() - state_begin
        writer.written(STATE_FILE)
        disk_bytes = 0
        for name, source in _disk_files(machine.boot).items():
            disk_bytes += writer.copy_in(name, source).size
        manifest = Manifest(
            name=machine.name,
            saved_at=saved_at,
            hostname=socket.gethostname(),
            backend=machine.backend,
            emulator=emulator,
            abi=guest_abi(machine.plan, machine.boot),
            options=machine.options,
            boot=machine.boot,
            base_image=base_image(machine),
            files={},
        )
        target = checkpoint_dir.commit(writer, manifest, directory)
    return Saved(target, state_bytes, disk_bytes, time.monotonic() - begin, state_seconds)


def _disk_files(boot: BootSpec) -> dict[str, Path]:
    files = {DISK_FILE: boot.disk_image, SEED_FILE: boot.seed_image}
    return {name: Path(path) for name, path in files.items() if path is not None}


def base_image(machine: Machine) -> BaseImage | None:
    """The user's image under the overlay (``Machine.image`` of a disk-image guest)."""
    if machine.boot.disk_image is None:
        return None
    info = Path(machine.image).stat()
    return BaseImage(path=machine.image, size=info.st_size, mtime_ns=info.st_mtime_ns)


def checkpoint(name: str, directory: Path, *, resume_after: bool = False) -> Saved:
    """Check, pause, save, then stop the VM (or with ``resume_after`` run it again).
    On failure the VM runs again if it ran, and no directory is left."""
    machine = state.load_machine(name)
    check(machine)
    checkpoint_dir.check_target(directory)
    was_running = pause(machine)
    try:
        saved = save(machine, directory)
    except BaseException:
        if was_running:
            with contextlib.suppress(HpcvmError):
                resume(machine)
        raise
    if resume_after:
        resume(machine)
    else:
        discard(machine)
    return saved


# -- restore ----------------------------------------------------------------------------


def load(directory: Path) -> Checkpoint:
    """The checkpoint at ``directory``, every file checked (checkpoint_dir.load)."""
    return checkpoint_dir.load(directory)


def check_emulator(checkpoint: Checkpoint, here: Emulator, warn: Warn | None = None) -> None:
    """The QEMU here must be the version that saved the state, with the same machine
    type; a different distribution build of that version only earns a warning."""
    same_emulator(checkpoint.manifest.emulator, here, f"checkpoint {checkpoint.directory}", warn)


def same_emulator(saved: Emulator, here: Emulator, what: str, warn: Warn | None) -> None:
    """Refuse a QEMU other than the one that runs (or saved) ``what``: a state only
    loads into the same version and machine type."""
    if (saved.version, saved.machine_type) != (here.version, here.machine_type):
        raise InfeasiblePlanError(
            f"{what} was saved by QEMU {saved.version} (machine "
            f"{saved.machine_type}); here QEMU is {here.version} (machine "
            f"{here.machine_type}): restore it on a host with QEMU {saved.version}"
        )
    if saved.package != here.package and warn is not None:
        warn(f"{what} was saved by QEMU {saved.package}; this host runs {here.package}")


def check_base_image(checkpoint: Checkpoint) -> None:
    """The disk image under the saved overlay must be the one it was saved over."""
    base = checkpoint.manifest.base_image
    if base is not None:
        where = f"checkpoint {checkpoint.directory}"
        same_base_image(base, f"{where}'s disk overlay", f"{where} was saved")


def same_base_image(base: BaseImage, under: str, since: str) -> None:
    """The disk image under ``under`` (an overlay) must be here, unchanged ``since``."""
    path = Path(base.path)
    try:
        info = path.stat()
    except OSError as exc:
        raise UsageError(
            f"the disk image {path} under {under} is not there ({exc.strerror}): put the "
            "image at that path"
        ) from exc
    if (info.st_size, info.st_mtime_ns) != (base.size, base.mtime_ns):
        raise UsageError(
            f"the disk image {path} changed since {since} (size or modification time "
            f"differ): {under} is only valid over the very same image"
        )


def plan_restore(
    checkpoint: Checkpoint,
    name: str,
    *,
    host: HostTopology | None = None,
    warn: Warn | None = None,
) -> VMPlan:
    """The saved request planned again for this host, under the accelerator the state
    was saved with; refused with the differences when its guest ABI is not the saved
    one (InfeasiblePlanError, as ``plan`` refuses)."""
    saved = checkpoint.plan
    request = saved.request.model_copy(update={"name": name, "accel": saved.accel})
    nics = lifecycle.nics_for(checkpoint.manifest.options, name)
    boot = checkpoint.manifest.boot.model_copy(update={"nics": nics})

    def differ(plan: VMPlan) -> list[str]:
        return abi_differences(checkpoint.manifest.abi, guest_abi(plan, boot))

    plan, differences = planning.plan_same_guest(request, differ, host=host, warn=warn)
    if differences:
        raise InfeasiblePlanError(
            f"this host cannot restore checkpoint {checkpoint.directory} with the guest it "
            f"saved: {'; '.join(differences)}"
        )
    return plan


def restore(
    directory: Path,
    *,
    name: str | None = None,
    host: HostTopology | None = None,
    warn: Warn | None = None,
    step_clock: bool = True,
    before_resume: Callable[[Machine], None] | None = None,
) -> Restored:
    """Start the VM saved in ``directory`` on this host, re-planned here; return once
    its agent answers. Refused before anything starts when the checkpoint is damaged
    or incompatible with this host; nothing is left when a later step fails.
    ``before_resume(machine)`` runs once the state is loaded, the vCPUs still stopped:
    a job's restore waits there until every node has loaded its VM (cluster/tasks/node.py)."""
    from hpcvm.runtime.checkpoint.qemu_state import emulator_here

    begin = time.monotonic()
    checkpoint = load(directory)
    manifest = checkpoint.manifest
    saver = saver_for(manifest.backend)
    vm_name = name or manifest.name
    check_emulator(checkpoint, emulator_here(), warn)
    check_base_image(checkpoint)
    plan = plan_restore(checkpoint, vm_name, host=host, warn=warn)
    options = UpOptions(**manifest.options.model_dump(), name=vm_name)

    def load_state(machine: Machine) -> None:
        differences = abi_differences(manifest.abi, guest_abi(machine.plan, machine.boot))
        if differences:  # what up() built must be what was planned above
            raise InfeasiblePlanError(f"the restored VM differs: {'; '.join(differences)}")
        saver.load(machine, checkpoint.file(STATE_FILE))
        if before_resume is not None:
            before_resume(machine)

    machine = lifecycle.up(
        plan, options, host=host, warn=warn, media=_media(checkpoint), load_state=load_state
    )
    try:
        clock = _step_clock(machine, warn) if step_clock else None
    except BaseException:
        with signals_deferred():
            stopping.teardown(machine)
        raise
    return Restored(machine, checkpoint, time.monotonic() - begin, clock)


def _media(checkpoint: Checkpoint) -> BootMedia:
    """Boot what was saved: the saved boot spec without its old run dir's endpoints,
    waiting for the state, with the saved disk files copied into the new run dir."""
    boot = incoming_boot(checkpoint.manifest.boot)

    def into_run_dir(run_dir: Path, boot: BootSpec) -> BootSpec:
        made: dict[str, str] = {}
        for name, field in ((DISK_FILE, "disk_image"), (SEED_FILE, "seed_image")):
            entry = checkpoint.manifest.files.get(name)
            if entry is None:
                continue
            copied = checkpoint_dir.copy_hashed(checkpoint.file(name), run_dir / name)
            if copied != entry:
                raise UsageError(
                    f"checkpoint {checkpoint.directory} changed while it was restored: "
                    f"{name} no longer matches its checksum"
                )
            made[field] = str(run_dir / name)
        return boot.model_copy(update=made)

    label = checkpoint.manifest.base_image.path if checkpoint.manifest.base_image else "restored"
    return BootMedia(boot=boot, label=label, kernel=None, into_run_dir=into_run_dir)


def incoming_boot(saved: BootSpec) -> BootSpec:
    """The boot spec of a QEMU that waits for ``saved``'s state: its boot media without
    the old run dir's files and endpoints (the runtime adds this run dir's)."""
    return BootSpec(
        kernel=saved.kernel,
        initrd=saved.initrd,
        cmdline=saved.cmdline,
        share_table=saved.share_table,
        agent_port_name=saved.agent_port_name,
        incoming=True,
    )


def _step_clock(machine: Machine, warn: Warn | None) -> ClockStep:
    """Set the guest's wall clock to the host's through the agent and measure it
    before and after. ``guest-set-time`` first; qemu-ga 7.2 refuses it outright when
    the guest has no /sbin/hwclock (it would write the RTC too), so then ``date -s``
    in the guest. Only CLOCK_REALTIME moves: the guest's monotonic clock, which timing
    code uses, simply did not count the time the VM was saved."""
    from hpcvm.runtime.channels.agent import GuestAgent

    assert machine.boot.agent_socket is not None
    agent = GuestAgent(machine.boot.agent_socket, timeout=30.0)
    try:
        before = _behind(agent)
        errors: list[str] = []
        after: float | None = None
        for step in (_set_time, _date_s):
            try:
                step(agent)
                after = _behind(agent)
            except HpcvmError as exc:
                errors.append(str(exc))
                continue
            if abs(after) <= CLOCK_TOLERANCE:
                break
    finally:
        agent.close()
    result = ClockStep(before, after, "; ".join(errors))
    if not result.ok and warn is not None:
        warn(
            f"the guest clock of {machine.name} is {before:.1f} s behind the host's and "
            f"could not be stepped ({result.error or 'it did not move'}): set it in the guest"
        )
    return result


def _set_time(agent: GuestAgent) -> None:
    agent.call("guest-set-time", {"time": time.time_ns()})


def _date_s(agent: GuestAgent) -> None:
    """``date -s`` in the guest, twice when once is not close enough: the time is taken
    before the agent starts ``date``, so a loaded guest ends up behind by however long
    that takes (about 1 s seen under TCG with the host busy); the second step adds the
    lag the first left, measured."""
    _set_date(agent, 0.0)
    lag = _behind(agent)
    if abs(lag) > CLOCK_TOLERANCE / 2:
        _set_date(agent, lag)


def _set_date(agent: GuestAgent, ahead: float) -> None:
    done = agent.exec(["date", "-u", "-s", f"@{time.time() + ahead:.6f}"], timeout=30.0)
    if done.exit_code != 0:
        raise RuntimeFailure(f"date -s in the guest failed: {done.stderr.strip()}")


def _behind(agent: GuestAgent) -> float:
    guest_ns = int(agent.call("guest-get-time"))
    return (time.time_ns() - guest_ns) / 1e9
