"""Live migration of one VM to another host, re-planned there, while it runs.

The two hosts' hpcvm processes meet on one authenticated connection
(migration/channel.py). The source offers the VM: its plan, how it was booted, its
guest ABI, the QEMU that runs it, the disk image under its overlay, and its NoCloud seed
(read-only, so not in QEMU's stream). The target checks all of that as a restore does
(runtime/checkpoint/save_restore.py: the same QEMU version and machine type, the same base image, a
plan for this host whose guest ABI is the offered one), starts QEMU waiting for the
state (``-incoming defer``) with a fresh overlay over the same base image, hands it
the connection, and answers. Only on that answer does the source hand its end to its
QEMU, which sends RAM and device state while the guest runs, stops the guest for the
last pass (QEMU's ``downtime``) and ends paused with its disks flushed. Then the disk
overlay follows, over a second authenticated connection, into the target's overlay
(whose QEMU opens it only at ``cont``, checkpoint/qemu_state.py), checked by its SHA-256; the
guest stands still for that copy too, and it is reported beside QEMU's figure.

Who runs the VM is decided in one place. The source resumes its copy when anything
fails before it tells the target "go", or when the target answers that it could not
run it (it has torn its copy down by then). The target runs its copy only after "go",
and answers once its agent answers. Without that answer the source keeps its copy
paused, neither resumed nor removed (MoveUnknown): the VM never runs in two places,
and is never silently lost.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hpcvm.bootspec import BootSpec
from hpcvm.errors import HpcvmError, InfeasiblePlanError, RuntimeFailure, UsageError
from hpcvm.host.model import HostTopology
from hpcvm.model import Frozen
from hpcvm.plan.model import VMPlan
from hpcvm.runtime.checkpoint import save_restore as checkpoint
from hpcvm.runtime.checkpoint.model import (
    SEED_FILE,
    BaseImage,
    Emulator,
    GuestAbi,
    abi_differences,
    guest_abi,
)
from hpcvm.runtime.machine import planning
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.machine.options import UpOptions, VmOptions
from hpcvm.runtime.migration.channel import (
    ChannelError,
    recv_file,
    recv_message,
    send_file,
    send_message,
)
from hpcvm.runtime.vm import lifecycle
from hpcvm.runtime.vm.boot import BootMedia

Warn = Callable[[str], None]
# Where a send stands, as ``send`` reports it (its docstring); the cluster's source step
# writes it in the VM's ``moving`` marker (cluster/tasks/moved.py).
Phase = Literal["sending", "paused", "go", "told"]
SETUP_TIMEOUT = 600.0  # seconds for the target to plan and start its QEMU (huge pages)
RECEIVE_TIMEOUT = 3600.0  # seconds for a whole incoming migration (a dirtying guest)
UNKNOWN_PREFIX = "move unknown:"
RUN_TIMEOUT = 1200.0  # seconds for the target to run the VM until its agent answers


class Offer(Frozen):
    """What the source tells the target about the VM it sends."""

    vm: str
    plan: VMPlan
    options: VmOptions
    boot: BootSpec  # as it runs at the source (its paths are the source's run dir's)
    abi: GuestAbi
    emulator: Emulator
    base_image: BaseImage | None


@dataclass(frozen=True)
class Sent:
    """A VM migrated away, as its source counted it."""

    downtime_ms: float  # QEMU's: the guest stood still for the last pass of RAM
    disk_ms: float  # then, still paused, while its disk overlay was copied
    total_ms: float  # from the start of the migration until the target had the disk
    ram_bytes: int
    disk_bytes: int


Connect = Callable[[], socket.socket]


def offer(machine: Machine) -> tuple[Offer, bytes]:
    """The offer for ``machine`` and its seed image's bytes; refused (as a checkpoint
    is) when QEMU cannot migrate it."""
    checkpoint.check(machine)
    assert machine.options is not None  # check() refuses a VM without
    saver = checkpoint.saver_for(machine.backend)
    seed = Path(machine.boot.seed_image).read_bytes() if machine.boot.seed_image else b""
    made = Offer(
        vm=machine.name,
        plan=machine.plan,
        options=machine.options,
        boot=machine.boot,
        abi=guest_abi(machine.plan, machine.boot),
        emulator=saver.emulator(machine),
        base_image=checkpoint.base_image(machine),
    )
    return made, seed


class MoveUnknown(RuntimeFailure):
    """The target was told to run the VM and its answer never came: the source keeps
    its copy paused (never resumed, never removed), since the target may run it."""


def send(
    machine: Machine,
    conn: socket.socket,
    connect: Connect,
    phase: Callable[[Phase], None] = lambda _: None,
) -> Sent:
    """Offer ``machine`` over ``conn`` (authenticated), migrate it once the target
    accepts, then send its disk overlay over a second connection (``connect()``), tell
    the target to run it, and return once the target says it runs. The VM is resumed
    here when anything fails before the target is told to run it, or when the target
    says it could not: it never runs in two places. Without the target's answer, it
    stays paused here (MoveUnknown).

    ``phase("sending")`` once the target accepted the offer (its QEMU waits for the
    state), ``phase("paused")`` once QEMU finished (the VM stands still here),
    ``phase("go")`` just before the target is told to run it and ``phase("told")`` just
    after: where the caller records how far it got, for whoever survives it
    (cluster/tasks/moved.py)."""
    made, seed = offer(machine)
    send_message(conn, {"offer": made.model_dump(mode="json")}, seed)
    conn.settimeout(SETUP_TIMEOUT)
    reply, _ = recv_message(conn)
    if not reply.get("ok"):
        raise UsageError(f"the target refused VM {machine.name}: {reply.get('message')}")
    phase("sending")
    began = time.monotonic()
    told = False
    try:
        status = checkpoint.saver_for(machine.backend).send(machine, conn.fileno())
        paused = time.monotonic()
        phase("paused")
        with connect() as disk:
            disk_bytes = _send_disk(machine, disk)
            disk_done = time.monotonic()
            phase("go")
            told = True
            send_message(disk, {"go": True})
            phase("told")
            word = _target_word(disk)
    except BaseException as exc:
        if told:
            raise MoveUnknown(
                f"{UNKNOWN_PREFIX} VM {machine.name} was handed to the target, whose answer "
                f"never came ({exc}): it stays paused here, and may run there"
            ) from exc
        with contextlib.suppress(HpcvmError):
            checkpoint.resume(machine)  # the target never ran it
        raise
    if not word.get("running"):
        with contextlib.suppress(HpcvmError):
            checkpoint.resume(machine)  # the target tore its copy down
        raise RuntimeFailure(f"the target could not run VM {machine.name}: {word.get('message')}")
    return Sent(
        downtime_ms=float(status.get("downtime", 0.0)),
        disk_ms=(disk_done - paused) * 1000,
        total_ms=(disk_done - began) * 1000,
        ram_bytes=int(status.get("ram", {}).get("transferred", 0)),
        disk_bytes=disk_bytes,
    )


def _send_disk(machine: Machine, disk: socket.socket) -> int:
    """The flushed overlay to the target, which answers once it is written."""
    assert machine.boot.disk_image is not None  # offer() refused a VM without
    size = send_file(disk, machine.boot.disk_image)
    disk.settimeout(SETUP_TIMEOUT)
    reply, _ = recv_message(disk)
    if not reply.get("ok"):
        raise RuntimeFailure(f"the target could not take the disk: {reply.get('message')}")
    return size


def _target_word(disk: socket.socket) -> dict[str, Any]:
    """The target's word once it runs the VM and its agent answered (or it failed)."""
    disk.settimeout(RUN_TIMEOUT)
    word, _ = recv_message(disk)
    return word


def receive(
    conn: socket.socket,
    name: str,
    accept: Connect,
    *,
    host: HostTopology | None = None,
    warn: Warn | None = None,
) -> tuple[Machine, Offer]:
    """Take the VM offered over ``conn`` as ``name`` on this host, re-planned here,
    its disk over the next connection (``accept()``); run it once the source says go,
    and say so to the source once its agent answers. A refusal or a failure is answered
    to the source and raised; nothing is left here when anything fails."""
    header, seed = recv_message(conn)
    answered = False
    disks: list[socket.socket] = []

    def answer(ok: bool, message: str = "") -> None:
        nonlocal answered
        if not answered:
            answered = True
            send_message(conn, {"ok": ok, "message": message})

    try:
        try:
            made = Offer.model_validate(header.get("offer"))
        except ValueError as exc:
            raise ChannelError(f"the source sent an offer this hpcvm cannot read: {exc}") from None
        plan, options, media = _prepare(made, seed, name, host, warn)
        saver = checkpoint.saver_for(made.options.backend)

        def take_state(machine: Machine) -> None:
            differences = abi_differences(made.abi, guest_abi(machine.plan, machine.boot))
            if differences:  # what up() built must be what was planned
                raise InfeasiblePlanError(f"the VM built here differs: {'; '.join(differences)}")
            saver.receive(machine, conn.fileno(), RECEIVE_TIMEOUT, lambda: answer(True))
            disks.append(accept())
            _receive_disk(machine, disks[0])

        machine = lifecycle.up(
            plan, options, host=host, warn=warn, media=media, load_state=take_state
        )
    except BaseException as exc:  # up() tore down what it made: the source may resume
        why = str(exc) or "interrupted"
        with contextlib.suppress(HpcvmError, OSError):
            answer(False, why)
        _last_word(disks, {"running": False, "message": why})
        raise
    _last_word(disks, {"running": True})
    return machine, made


def _last_word(disks: list[socket.socket], word: dict[str, Any]) -> None:
    """Tell the source whether the VM runs here, if it got as far as the disk."""
    for disk in disks:
        with contextlib.suppress(HpcvmError, OSError):
            send_message(disk, word)
        disk.close()


def _receive_disk(machine: Machine, disk: socket.socket) -> None:
    """The source's flushed overlay over this VM's (not opened by QEMU yet); returns
    once the source says go (from then on it will not run its copy)."""
    assert machine.boot.disk_image is not None
    try:
        recv_file(disk, machine.boot.disk_image)
    except (HpcvmError, OSError, KeyError, ValueError) as exc:
        with contextlib.suppress(OSError):
            send_message(disk, {"ok": False, "message": str(exc)})
        raise RuntimeFailure(f"receiving the disk of VM {machine.name}: {exc}") from exc
    send_message(disk, {"ok": True})
    try:
        word, _ = recv_message(disk)
    except (HpcvmError, OSError) as exc:
        raise RuntimeFailure(f"the source of VM {machine.name} did not say go: {exc}") from exc
    if not word.get("go"):
        raise RuntimeFailure(f"the source of VM {machine.name} did not say go")


def _prepare(
    made: Offer, seed: bytes, name: str, host: HostTopology | None, warn: Warn | None
) -> tuple[VMPlan, UpOptions, BootMedia]:
    """Check the offer against this host as a restore checks a checkpoint, and plan it."""
    from hpcvm.runtime.checkpoint.qemu_state import emulator_here

    what = f"VM {made.vm}"
    checkpoint.same_emulator(made.emulator, emulator_here(), what, warn)
    if made.base_image is None or made.boot.disk_image is None:
        raise UsageError(f"{what} is not a disk-image guest: only those migrate")
    checkpoint.same_base_image(made.base_image, f"{what}'s disk overlay", f"{what} started")
    mac = made.boot.nics[0].mac if made.boot.nics else None
    options = UpOptions(**made.options.model_dump(), name=name, mac=mac)
    request = made.plan.request.model_copy(update={"name": name, "accel": made.plan.accel})
    nics = lifecycle.nics_for(options, name)
    boot = made.boot.model_copy(update={"nics": nics})

    def differ(plan: VMPlan) -> list[str]:
        return abi_differences(made.abi, guest_abi(plan, boot))

    # beside this host's running VMs where that keeps the guest, else its own layout
    plan, differences = planning.plan_same_guest(request, differ, host=host, warn=warn)
    if differences:
        raise InfeasiblePlanError(
            f"this host cannot take {what} with the guest it runs: {'; '.join(differences)}"
        )
    return plan, options, _media(made, seed)


def _media(made: Offer, seed: bytes) -> BootMedia:
    """Boot media waiting for the state: a fresh overlay over the same base image (the
    overlay's clusters come in QEMU's stream) and the source's seed, in the run dir."""
    from hpcvm.guest.disk import check_image, make_overlay

    assert made.base_image is not None
    base = made.base_image.path

    def into_run_dir(run_dir: Path, boot: BootSpec) -> BootSpec:
        overlay = make_overlay(check_image(base), run_dir)
        made_files: dict[str, Any] = {"disk_image": str(overlay)}
        if made.boot.seed_image is not None:
            path = run_dir / SEED_FILE
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(seed)
            made_files["seed_image"] = str(path)
        return boot.model_copy(update=made_files)

    boot = checkpoint.incoming_boot(made.boot)
    return BootMedia(boot=boot, label=base, kernel=None, into_run_dir=into_run_dir)
