"""A process that stands in for a VM's QEMU where no guest is needed: its /proc ``comm``
says qemu (what runtime/machine/state.py asks of a live VM's pid) and it serves QMP on
a Unix socket as QEMU does (a greeting, ``qmp_capabilities``, ``query-status`` with an
event sent before the answer, ``quit``, after which it exits 0; any other command is
refused as QEMU refuses an unknown one). A SIGKILL instead of a ``quit`` reads as exit
code -9: the kernel tells how it ended."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from hpcvm.bootspec import BootSpec, Nic
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Machine
from tests.runtime_support import tiny_plan

STANDIN = r"""
import json, socket, sys
with open("/proc/self/comm", "w") as comm:
    comm.write("qemu-standin")
path, running = sys.argv[1], sys.argv[2] == "running"
VERSION = {"qemu": {"major": 8, "minor": 2, "micro": 0}, "package": ""}
GREETING = {"QMP": {"version": VERSION, "capabilities": []}}
decoder = json.JSONDecoder()


def requests(conn):
    # QMP is a stream of JSON objects, not lines: qemu.qmp ends none with a newline
    buffer = ""
    while chunk := conn.recv(65536):
        buffer += chunk.decode()
        while buffer.strip():
            try:
                request, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                break
            buffer = buffer.lstrip()[end:]
            yield request


def send(conn, message):
    conn.sendall(json.dumps(message).encode() + b"\r\n")


server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(1)
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    send(conn, GREETING)
    for request in requests(conn):
        command = request["execute"]
        tag = {"id": request["id"]} if "id" in request else {}  # qemu.qmp's client sends one
        if command == "quit":
            send(conn, {"return": {}, **tag})
            sys.exit(0)
        if command == "qmp_capabilities":
            out = {"return": {}}
        elif command == "query-status":
            send(conn, {"event": "RTC_CHANGE", "data": {"offset": 0}})
            out = {"return": {"status": "running" if running else "paused", "running": running}}
        else:
            out = {"error": {"class": "CommandNotFound", "desc": f"no command {command}"}}
        send(conn, {**out, **tag})
    conn.close()
"""


@contextlib.contextmanager
def standin_qemu(qmp_socket: Path, *, running: bool = True) -> Iterator[subprocess.Popen[str]]:
    """The stand-in, serving QMP at ``qmp_socket``; killed (and reaped) afterwards."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STANDIN, str(qmp_socket), "running" if running else "paused"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        comm = Path(f"/proc/{proc.pid}/comm")
        deadline = time.monotonic() + 10
        while comm.read_text().strip() != "qemu-standin" and time.monotonic() < deadline:
            time.sleep(0.01)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def standin_machine(
    run_dir: Path, pid: int | None, *, nics: tuple[Nic, ...] = (), disk_image: str | None = None
) -> Machine:
    """The record of a VM whose QEMU is the stand-in ``pid``, saved in ``run_dir`` as
    ``up`` saves it: its sockets in the run directory (no guest agent listens on its
    socket: down then goes straight to QMP quit)."""
    machine = Machine(
        name=run_dir.name, backend="qemu", run_dir=str(run_dir), pid=pid,
        started_at=time.time(), plan=tiny_plan(run_dir.name), image="test",
        boot=BootSpec(qmp_socket=str(run_dir / "qmp.sock"),
                      agent_socket=str(run_dir / "agent.sock"),
                      done_socket=str(run_dir / "done.sock"),
                      serial_log=str(run_dir / "console.log"), nics=nics,
                      disk_image=disk_image),
        hugetlbfs_dirs=(),
    )  # fmt: skip
    state.save_machine(machine)
    return machine
