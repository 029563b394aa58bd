"""One VM sample: the script that recreates the work directory, times the benchmark and
writes the evidence, and ``GuestSampler.run`` driving it through the guest agent.

The script runs here under the real busybox sh, bash and dash (a guest picks them in
that order), on the real /proc/interrupts; the files it recreates are compared with the
bytes they came from. ``run`` talks to a real qemu-guest-agent run on the host
(``-m unix-listen``): that agent stands in for the guest's, and its process for QEMU's
in the liveness check, and a FIFO forwarded to a unix socket stands in for QEMU's
completion port (no VM is booted in a unit test; the integration tests run the same
code in TCG guests). What is checked there is what the sample asks of the agent: one
connection for the VM and one guest process tree per sample, where there were four
execs and some fifteen processes (1.2 s per sample under TCG), and with the completion
port, no status polling while the benchmark runs.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpcvm.bench.envs import guest_sampler as vm
from hpcvm.bench.envs.environments import CLEAN_ENV
from hpcvm.bench.envs.guest_sampler import (
    MAX_ARG,
    TEXT_CHUNK,
    GuestSampler,
    file_arguments,
    guest_evidence,
)
from hpcvm.bench.envs.vm import plan_vm
from hpcvm.bootspec import BootSpec
from hpcvm.errors import RuntimeFailure
from hpcvm.runtime.channels.agent import GuestAgent
from hpcvm.runtime.machine.model import ExecResult, Machine
from hpcvm.units import MIB

QEMU_GA = "/usr/sbin/qemu-ga"
BUSYBOX = shutil.which("busybox") or "/bin/busybox"  # busybox-static: scripts/setup.sh
SHELLS = (BUSYBOX, "/bin/bash", "/bin/dash")
FILE_COMMANDS = "guest-file-open,guest-file-read,guest-file-close"


def _files() -> dict[str, bytes]:
    """What suites write, and what no argument can carry as it is."""
    return {
        "hpccinf.txt": b"HPLinpack benchmark input file\n% \\n $HOME `x` 'q' \"d\"\n",
        "unicode.txt": ("\u00e9\u4e2d" * (TEXT_CHUNK // 2 + 7)).encode(),  # > 1 chunk
        "nul.bin": b"a\x00b" * 10,
        "latin1.txt": "caf\u00e9 \u00b5s\n".encode("latin-1"),  # not UTF-8
        "big.bin": random.Random(9).randbytes(MAX_ARG),  # base64 over one argument
        "empty": b"",
        "no-newline": b"last line",
    }


def _shell(shell: str) -> list[str]:
    return [shell, "sh"] if shell == BUSYBOX else [shell]


def _script(
    shell: str, workdir: Path, args: list[str], argv: list[str], port: str = ""
) -> list[str]:
    return [*_shell(shell), "-c", vm._SAMPLE, "sh", str(workdir), "30", port, "t0k3n",
            str(len(args) // 3), *args, *CLEAN_ENV, *argv]  # fmt: skip


@pytest.mark.parametrize("shell", SHELLS)
def test_the_script_recreates_the_files_runs_the_argv_and_writes_the_evidence(
    tmp_path: Path, shell: str
) -> None:
    source, target = tmp_path / "host", tmp_path / "guest" / "work"
    source.mkdir()
    for name, data in _files().items():
        (source / name).write_bytes(data)
    target.mkdir(parents=True)
    (target / "stale").write_text("from an interrupted earlier attempt")
    argv = ["/bin/sh", "-c", "echo out; echo err >&2; cat hpccinf.txt > seen; exit 7"]
    argv = ["/usr/bin/env", "-C", str(target), *argv]
    args = file_arguments(source)
    done = subprocess.run(_script(shell, target, args, argv), capture_output=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (7, b"out\n", b"err\n")
    made = {p.name: p.read_bytes() for p in target.iterdir() if not p.name.startswith(".")}
    assert made == {**_files(), "seen": _files()["hpccinf.txt"]}
    seconds, rates, problem = guest_evidence((target / vm._EVIDENCE_FILE).read_bytes())
    assert problem == "" and seconds is not None and 0 < seconds < 30
    assert rates is not None and all(r > 0 for r in rates.values())
    # text goes as it is (no process in the guest), other bytes in base64
    kinds = {args[i]: args[i + 1] for i in range(0, len(args), 3)}
    assert kinds == {
        "hpccinf.txt": "t",
        "unicode.txt": "t",
        "nul.bin": "b",
        "latin1.txt": "b",
        "big.bin": "b",
        "empty": "t",
        "no-newline": "t",
    }
    assert max(len(a.encode()) for a in args) <= 128 * 1024  # Linux's MAX_ARG_STRLEN


@pytest.mark.parametrize("shell", SHELLS)
def test_a_work_directory_that_cannot_be_made_fails_before_the_benchmark(
    tmp_path: Path, shell: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ran = tmp_path / "ran"
    argv = ["/usr/bin/touch", str(ran)]
    done = subprocess.run(
        _script(shell, blocker / "work", [], argv), capture_output=True, text=True, check=False
    )
    assert not ran.exists()
    result = ExecResult(exit_code=done.returncode, stdout=done.stdout, stderr=done.stderr)
    with pytest.raises(RuntimeFailure) as info:
        vm._check_setup("vm:naive", blocker / "work", result)
    message = str(info.value)
    assert f"could not create {blocker / 'work'} in the guest" in message
    assert "Not a directory" in message and vm._SETUP_FAILED not in message
    assert "\n" not in message


# -- run() through a real qemu-guest-agent ------------------------------------------------


def _start_agent(tmp: Path, blocked: str = "") -> subprocess.Popen[bytes]:
    sock = tmp / "qga.sock"
    argv = [QEMU_GA, "-m", "unix-listen", "-p", str(sock), "-f", str(tmp / "qga.pid")]
    argv += ["-t", str(tmp), "-b", ",".join(filter(None, ["guest-shutdown", blocked]))]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"qemu-ga did not create {sock} (exit {proc.poll()})")
        time.sleep(0.02)
    return proc


def host_agent_vm(
    tmp: Path, proc: subprocess.Popen[bytes], shell: str, port: str = ""
) -> GuestSampler:
    """A sampler whose guest is this host's qemu-ga (see the module doc): the VM's
    liveness is that process's, its facts what a guest with ``shell`` would report."""
    plan, _ = plan_vm("naive", vcpus=1, memory_bytes=512 * MIB)
    machine = Machine(
        name="h9-sample",
        backend="qemu",
        run_dir=str(tmp),
        pid=proc.pid,
        started_at=time.time(),
        plan=plan,
        boot=BootSpec(agent_socket=str(tmp / "qga.sock"), done_socket=str(tmp / "done.sock")),
        image="host qemu-ga",
    )
    bash = shell if shell == "/bin/bash" else ""
    facts = ["kernel", "cpu", "tsc", "1", bash, shell if shell == BUSYBOX else "", port]
    return GuestSampler(
        machine, "vm:naive", alive=lambda _machine: proc.poll() is None, facts=facts
    )


@pytest.fixture
def agent_spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[Any]]]:
    """Every agent command and connection the sample makes (the real ones still run)."""
    seen: dict[str, list[Any]] = {"calls": [], "opens": []}
    call, open_ = GuestAgent.call, GuestAgent._open

    def spy_call(self: GuestAgent, command: str, arguments: Any = None) -> Any:
        seen["calls"].append((command, arguments))
        return call(self, command, arguments)

    def spy_open(self: GuestAgent) -> Any:
        seen["opens"].append(self.path)
        return open_(self)

    monkeypatch.setattr(GuestAgent, "call", spy_call)
    monkeypatch.setattr(GuestAgent, "_open", spy_open)
    yield seen


def _sample(env: GuestSampler, workdir: Path) -> Any:
    workdir.mkdir(parents=True)
    (workdir / "hpccinf.txt").write_bytes(_files()["hpccinf.txt"])
    (workdir / "nul.bin").write_bytes(_files()["nul.bin"])
    # the sleep spans some timer ticks: a bare copy takes ~1 ms, in which no interrupt
    # may fire at all (CI once saw an empty guest rate table)
    copy = "cat hpccinf.txt nul.bin > hpccoutf.txt; sleep 0.2; echo done; echo warn >&2; exit 3"
    argv = ["/usr/bin/env", "-C", str(workdir), "/bin/sh", "-c", copy]
    return env.run(argv, workdir, 30.0, outputs=("hpccoutf.txt", "not-made.txt"))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_sample_is_one_agent_connection_and_one_guest_exec(
    tmp_path: Path, shell: str, agent_spy: dict[str, list[Any]]
) -> None:
    proc = _start_agent(tmp_path)
    try:
        env = host_agent_vm(tmp_path, proc, shell)
        workdir = tmp_path / "results" / "work" / "vm-naive" / "hpcc-r0"
        out = _sample(env, workdir)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert (out.exit_code, out.stdout, out.stderr, out.timed_out) == (3, "done\n", "warn\n", False)
    expected = _files()["hpccinf.txt"] + _files()["nul.bin"]
    assert (workdir / "hpccoutf.txt").read_bytes() == expected
    assert not (workdir / "not-made.txt").exists()
    assert out.guest_seconds is not None and 0 < out.guest_seconds <= out.host_seconds
    assert out.evidence["interrupts"]["guest"] and out.evidence["interrupts"]["host"]
    assert "guest_evidence_error" not in out.evidence
    assert out.evidence["clock"]["host_seconds"] > 0
    execs = [args for command, args in agent_spy["calls"] if command == "guest-exec"]
    programs = [args["path"] for args in execs]
    # the sample script, and base64 only for the output that was never made
    assert programs == [shell if shell != "/bin/dash" else "/bin/sh", "/usr/bin/base64"]
    assert execs[0]["arg"][0] == ("sh" if shell == BUSYBOX else "-c")
    assert len(agent_spy["opens"]) == 1


def test_outputs_come_back_when_the_agent_refuses_file_commands(
    tmp_path: Path, agent_spy: dict[str, list[Any]]
) -> None:
    """A guest whose qemu-ga disables guest-file-* (some distributions' default): the
    evidence and the outputs come back through base64 in the guest instead."""
    proc = _start_agent(tmp_path, blocked=FILE_COMMANDS)
    try:
        env = host_agent_vm(tmp_path, proc, "/bin/bash")
        workdir = tmp_path / "results" / "work" / "vm-naive" / "hpcc-r0"
        out = _sample(env, workdir)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    expected = _files()["hpccinf.txt"] + _files()["nul.bin"]
    assert (workdir / "hpccoutf.txt").read_bytes() == expected
    assert out.guest_seconds is not None and "guest_evidence_error" not in out.evidence
    assert len(agent_spy["opens"]) == 1


class _PortStandIn:
    """QEMU's side of the completion port: what the guest writes to its device (here a
    FIFO) comes out of a unix socket the host connects to."""

    def __init__(self, tmp: Path) -> None:
        self.device = tmp / "vport0p2"
        os.mkfifo(self.device)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(tmp / "done.sock"))
        self.server.listen(1)
        self.thread = threading.Thread(target=self._forward, daemon=True)
        self.thread.start()

    def _forward(self) -> None:
        client, _ = self.server.accept()
        with client:
            while True:
                with open(self.device, "rb") as fifo:  # one writer per sample
                    data = fifo.read()
                if not data:
                    continue
                try:
                    client.sendall(data)
                except OSError:
                    return


def test_with_the_completion_port_the_agent_is_not_polled_during_the_benchmark(
    tmp_path: Path, agent_spy: dict[str, list[Any]]
) -> None:
    """A benchmark of 1.5 s: the status is asked once before the wait, at most once a
    second during it and once or twice as it exits; backing-off polling asked 9 times."""
    proc = _start_agent(tmp_path)
    port = _PortStandIn(tmp_path)
    try:
        env = host_agent_vm(tmp_path, proc, BUSYBOX, port=str(port.device))
        outs = []
        for rep in range(2):
            workdir = tmp_path / "results" / "work" / "vm-naive" / f"sleep-r{rep}"
            workdir.mkdir(parents=True)
            argv = ["/bin/sh", "-c", "sleep 1.5; echo slept"]
            agent_spy["calls"].clear()
            outs.append(env.run(argv, workdir, 30.0))
            polls = [c for c, _ in agent_spy["calls"] if c == "guest-exec-status"]
            assert 1 <= len(polls) <= 5, polls
    finally:
        env.close()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert [(o.exit_code, o.stdout) for o in outs] == [(0, "slept\n")] * 2
    assert all(o.guest_seconds is not None and o.guest_seconds >= 1.5 for o in outs)
    assert len(agent_spy["opens"]) == 1  # one agent connection for both samples
