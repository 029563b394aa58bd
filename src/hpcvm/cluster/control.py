"""``cluster up``, ``ps``, ``exec`` and ``down``: run on the job's batch node.

``up`` starts the holder step (slurm.py) in its own session, so that it outlives the
``hpcvm`` process that started it and ends only with the step, and sends its output to a
log in the cluster's state directory (``<runtime dir>/.clusters/NAME``, next to the VMs'
own directories). The other commands read the nodes' events from that log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from hpcvm.cluster import launcher, slurm
from hpcvm.cluster.holder import TAKING_DOWN
from hpcvm.cluster.spec import (
    SPEC_ENV,
    ClusterSpec,
    NodeEvent,
    check_addresses,
    latest_per_node,
    parse_events,
)
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.lock import exclusive
from hpcvm.model import Frozen
from hpcvm.runtime import paths, state
from hpcvm.runtime.model import ExecResult
from hpcvm.signals import signals_deferred

CLUSTERS_DIR = ".clusters"  # under the runtime root; dot: `hpcvm ps` skips it
LOG_FILE = "holder.log"
RECORD_FILE = "cluster.json"
KEY_FILE = "id_job"
DOWN_WAIT = 60.0  # seconds for every node to report its VM down
LOG_TAIL = 20


class ClusterRecord(Frozen):
    """What ``cluster up`` leaves on the batch node for the other commands."""

    name: str
    job_id: str
    nodes: tuple[str, ...]
    holder_pid: int
    network: str  # the VMs' network, e.g. 10.0.0.0/24
    vcpus: int


def cluster_dir(name: str) -> Path:
    return paths.runtime_root() / CLUSTERS_DIR / paths.check_name(name)


@contextlib.contextmanager
def _one_writer(name: str) -> Iterator[None]:
    """One ``cluster up`` or ``down`` of a name at a time (hpcvm.lock: dies with its
    holder). The lock file sits beside the state directory, which up and the holder
    remove and remake, so that both processes lock the same file; it goes when released
    (``remove``), and the clusters' directory with it once that is empty."""
    directory = cluster_dir(name)
    paths.ensure_root()
    directory.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        with exclusive(
            directory.parent / f"{directory.name}.lock",
            f"cluster {name!r}",
            f"wait for it to finish, or stop it and run hpcvm cluster down {name}",
            remove=True,
        ):
            yield
    finally:
        with contextlib.suppress(OSError):
            directory.parent.rmdir()


def read_record(name: str) -> ClusterRecord:
    path = cluster_dir(name) / RECORD_FILE
    if not path.is_file():
        raise UsageError(
            f"no cluster named {name!r} on this node: start it with hpcvm cluster up --name "
            f"{name} (ps, exec and down run where up ran, the job's batch node)"
        )
    return ClusterRecord.model_validate_json(path.read_text())


def events(name: str) -> list[NodeEvent]:
    log = cluster_dir(name) / LOG_FILE
    if not log.is_file():
        return []
    return parse_events(log.read_text(errors="replace").splitlines())


def holder_alive(record: ClusterRecord) -> bool:
    try:
        os.kill(record.holder_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _is_not_zombie(record.holder_pid)


def _is_not_zombie(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z"


# -- up ---------------------------------------------------------------------------------


def make_keys(directory: Path, name: str) -> tuple[str, str]:
    """A key pair for this job only (ed25519, no passphrase): (public, private)."""
    key = directory / KEY_FILE
    done = subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            f"hpcvm-cluster-{name}",
            "-f",
            str(key),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeFailure(f"ssh-keygen failed: {done.stderr.strip()}")
    return key.with_suffix(".pub").read_text(), key.read_text()


@contextlib.contextmanager
def _claimed(name: str) -> Iterator[Path]:
    """The cluster's state directory, new; removed again if ``up`` fails."""
    directory = cluster_dir(name)
    if (directory / RECORD_FILE).is_file():
        record = read_record(name)
        if holder_alive(record):
            raise UsageError(
                f"cluster {name!r} is already up (job {record.job_id}): hpcvm cluster down "
                f"{name} first, or choose another --name"
            )
    shutil.rmtree(directory, ignore_errors=True)
    paths.ensure_root()
    directory.parent.mkdir(mode=0o700, exist_ok=True)
    directory.mkdir(mode=0o700)
    try:
        yield directory
    except BaseException:
        _remove_state(name)
        raise


def up(
    spec_fields: dict[str, object], name: str, timeout: float, say: Callable[[str], None]
) -> list[NodeEvent]:
    """Start the VMs of ``name`` on every node of this allocation; return their ready
    events, or raise after taking every VM down again."""
    allocation = slurm.current_allocation()
    launcher.require_sshd()
    check_workdir(str(spec_fields["workdir"]), str(spec_fields.get("backend", "qemu")))
    check_addresses(str(spec_fields["first_address"]), len(allocation.nodes))
    with _one_writer(name), _claimed(name) as directory:
        public, private = make_keys(directory, name)
        spec = ClusterSpec.model_validate(
            {
                **spec_fields,
                "name": name,
                "job_id": allocation.job_id,
                "nodes": len(allocation.nodes),
                "public_key": public,
                "private_key": private,
            }
        )
        holder = _start_holder(allocation, spec, directory)
        record = ClusterRecord(
            name=name,
            job_id=allocation.job_id,
            nodes=allocation.nodes,
            holder_pid=holder.pid,
            network=str(spec.network_of_vms),
            vcpus=spec.request.vcpus,
        )
        (directory / RECORD_FILE).write_text(record.model_dump_json())
        nodes = ", ".join(allocation.nodes)
        say(f"{name}: starting a VM on {len(allocation.nodes)} node(s): {nodes}")
        try:
            return _wait_ready(record, holder, timeout, say)
        except BaseException:
            with signals_deferred():
                _take_down(record, holder, say)
            raise


def check_workdir(workdir: str, backend_name: str) -> None:
    """The job's directory is where its programs and inputs are, shared with every guest
    at the same path: refuse before anything starts when QEMU's user cannot read it (a
    lone ``hpcvm up`` only warns and leaves it out)."""
    from hpcvm.runtime.backends import get_backend
    from hpcvm.runtime.confine import can_access

    backend = get_backend(backend_name)
    user = backend.qemu_user()
    by_root = bool(getattr(backend, "opens_shares_as_root", False)) and user.switch
    if not can_access(workdir, user, write=False, opened_by_root=by_root):
        raise UsageError(
            f"the job's directory {workdir} is not readable by {user.name}, the user QEMU "
            f"runs as, so the guests could not run programs from it: allow it (setfacl -m "
            f"u:{user.name}:rx {workdir}) or run the job from a directory it can read"
        )


def _start_holder(
    allocation: slurm.Allocation, spec: ClusterSpec, directory: Path
) -> subprocess.Popen[bytes]:
    srun = slurm.holder_argv(allocation, spec.name, [*hpcvm_argv(), "cluster", "node"])
    argv = [sys.executable, "-m", "hpcvm.cluster.holder", str(directory), *srun]
    env = {**os.environ, SPEC_ENV: spec.model_dump_json()}
    with (directory / LOG_FILE).open("ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=spec.workdir,
            start_new_session=True,
        )


def hpcvm_argv() -> list[str]:
    """How the nodes start this same hpcvm: the same interpreter and package (a
    cluster shares its software installation, as it shares hpcvm's venv here)."""
    return [sys.executable, "-m", "hpcvm.cli.main"]


def _wait_ready(
    record: ClusterRecord,
    holder: subprocess.Popen[bytes],
    timeout: float,
    say: Callable[[str], None],
) -> list[NodeEvent]:
    deadline = time.monotonic() + timeout
    announced: set[int] = set()
    while True:
        latest = latest_per_node(events(record.name))
        for index, event in latest.items():
            if event.event == "ready" and index not in announced:
                announced.add(index)
                say(f"{event.node}: {event.vm} ready at {event.address}")
        bad = [e for e in latest.values() if e.event in ("failed", "died")]
        if bad:
            e = bad[0]
            raise RuntimeFailure(
                f"node {e.node}: {e.message}; every VM of cluster {record.name} is taken down"
                f"{_log_hint(record.name)}"
            )
        ready = [e for e in latest.values() if e.event == "ready"]
        if len(ready) == len(record.nodes):
            return ready
        if holder.poll() is not None:
            raise RuntimeFailure(
                f"the holder step of cluster {record.name} ended (srun exit {holder.returncode}) "
                f"before every node was ready{_log_hint(record.name)}"
            )
        if time.monotonic() > deadline:
            missing = [n for i, n in enumerate(record.nodes) if i not in announced]
            raise RuntimeFailure(
                f"node(s) {', '.join(missing)} did not report their VM ready within {timeout:g} s"
                f"{_log_hint(record.name)}"
            )
        time.sleep(0.5)


def _log_hint(name: str) -> str:
    tail = (cluster_dir(name) / LOG_FILE).read_text(errors="replace").splitlines()[-LOG_TAIL:]
    lines = [line for line in tail if not line.startswith("hpcvm-cluster-event ")]
    if not lines:
        return ""
    sys.stderr.write("hpcvm: the nodes' output (srun):\n" + "\n".join(lines) + "\n")
    return " (the nodes' output is above)"


# -- down -------------------------------------------------------------------------------


def _step(name: str) -> str | None:
    return next((e.step for e in events(name) if e.step), None)


def _take_down(
    record: ClusterRecord, holder: subprocess.Popen[bytes] | None, say: Callable[[str], None]
) -> list[str]:
    """End the holder step and wait until every node reported its VM down; the nodes
    that did not, by name. The state directory goes in any case."""
    (cluster_dir(record.name) / TAKING_DOWN).touch()  # the holder leaves the log to us
    # SIGTERM to the step's tasks, which stop their VMs in order. Not to srun: a signal
    # makes srun abort the step, and its tasks are then SIGKILLed mid-boot (their
    # reapers clean up, but a VM being started is better stopped by its own task).
    step = _step(record.name) or slurm.find_step(record.job_id, slurm.step_name(record.name))
    if step is not None:
        slurm.signal_step(step, "TERM")
    else:  # no step yet (srun still waits for it): ending srun ends the request
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.holder_pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_WAIT
    while time.monotonic() < deadline and _holder_running(record, holder):
        time.sleep(0.3)
    if _holder_running(record, holder):
        if step is not None:
            slurm.signal_step(step, None)
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.holder_pid, signal.SIGKILL)
    latest = latest_per_node(events(record.name))
    started = {i for i, e in latest.items() if e.event != "failed"}
    unconfirmed = [
        record.nodes[i] for i in sorted(started) if latest[i].event not in ("down", "died")
    ]
    for i in sorted(started):
        if latest[i].event in ("down", "died"):
            say(f"{record.nodes[i]}: {latest[i].vm} {latest[i].event}")
    _remove_state(record.name)
    return unconfirmed


def _remove_state(name: str) -> None:
    """The cluster's state directory, and the clusters' directory once it is empty."""
    directory = cluster_dir(name)
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(OSError):
        directory.parent.rmdir()


def _holder_running(record: ClusterRecord, holder: subprocess.Popen[bytes] | None) -> bool:
    if holder is not None:
        return holder.poll() is None
    return holder_alive(record)


def down(name: str, say: Callable[[str], None]) -> None:
    """Take every VM of cluster ``name`` down, on every node."""
    with _one_writer(name):
        record = read_record(name)
        with signals_deferred():
            unconfirmed = _take_down(record, None, say)
    if unconfirmed:
        raise RuntimeFailure(
            f"node(s) {', '.join(unconfirmed)} did not confirm their VM down; Slurm ended "
            "the step, check those nodes with hpcvm ps"
        )


# -- ps and exec ------------------------------------------------------------------------


def status(name: str) -> tuple[ClusterRecord, list[NodeEvent], bool]:
    """The record, each node's last event, and whether the holder step still runs."""
    record = read_record(name)
    return record, list(latest_per_node(events(name)).values()), holder_alive(record)


def this_node() -> str:
    import socket

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def exec_first(name: str, argv: Sequence[str], workdir: str, timeout: float | None) -> ExecResult:
    """Run ``argv`` in the first node's VM, with the MPI environment that spreads its
    ranks over every VM of the job."""
    import ipaddress

    from hpcvm.runtime.agent import GuestAgent

    record, latest, alive = status(name)
    first = next((e for e in latest if e.index == 0), None)
    if not alive or first is None or first.event != "ready":
        raise RuntimeFailure(f"cluster {name} is not up (see hpcvm cluster ps {name})")
    if first.node != this_node():
        raise UsageError(
            f"run hpcvm cluster exec on {first.node}, the job's first node (its VM runs "
            "mpirun), as a batch script does"
        )
    entry = state.entry_for(paths.run_dir(first.vm))
    if entry is None or entry.machine is None:
        raise RuntimeFailure(f"VM {first.vm} of cluster {name} is gone from this node")
    machine = entry.machine
    assert machine.boot.agent_socket is not None
    env = launcher.mpi_environment(ipaddress.IPv4Network(record.network))
    agent = GuestAgent(machine.boot.agent_socket, timeout=30.0, console_log=machine.boot.serial_log)
    try:
        return agent.exec(["/usr/bin/env", "-C", workdir, *argv], timeout=timeout, env=env)
    finally:
        agent.close()
