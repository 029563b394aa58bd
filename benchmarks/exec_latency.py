"""Wall time of `hpcvm exec NAME -- true` on a running VM, against `hpcvm --version` and
against the guest agent's own work, each in a fresh process, as a script calling exec in
a loop sees it (issue 37: exec within 0.1 s of --version).

Three sides, timed alternately, their order rotating every round, so that all see the
same machine load:
- ``version``: `hpcvm --version` (the interpreter, click and hpcvm's entry point);
- ``exec``: `hpcvm exec NAME -- true`;
- ``agent``: a fresh interpreter that imports only hpcvm's agent client and runs
  ``true`` through it (connect, guest-sync, guest-exec, status until it exits): what
  any client of the guest agent pays, the guest's own part included.
``exec - agent`` is what hpcvm's command adds to the agent's work (click, the record,
the checks); ``exec - version`` is the issue's measure, and includes the guest's part,
which under TCG is emulated and on a busy 2-core host alone can exceed 0.1 s.

Each timed run starts ``--gap`` seconds (default 0.15, not counted) after the one before:
without a client on QEMU's end the guest agent sleeps 100 ms between reads, so a new
client waited up to that long (a guest-sync took 2-5 ms after a 0.1 s pause, 50-100 ms
right after a close), which would otherwise be charged to whichever side came next.
The agent relay (runtime/channels/agent_relay.py) keeps a client on QEMU's end now;
with ``--vm NAME`` of a VM whose relay was killed the earlier case is measured. What a
script calling exec back to back sees is printed apart: ``--loop`` execs in a row,
their mean.

Prints each side's median, the two differences, the goal, and the conditions (the VM's
accelerator from its `up` line, the host CPU model, the rounds). Boots its own 1-vCPU
VM in a private runtime directory and takes it down (``--vm NAME`` uses a running one).
A benchmark script, not a test: it asserts nothing about time.

    .venv/bin/python benchmarks/exec_latency.py [--rounds 15] [--gap 0.15] [--loop 10]
        [--vm NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's benchmarks/
from benchmarks.bench_common import command_seconds, cpu_model

GOAL_SECONDS = 0.1
HPCVM = str(Path(sys.executable).with_name("hpcvm"))
SHAPE = ["--profile", "naive", "--vcpus", "1", "--memory", "256M"]
# The agent's work alone: hpcvm's client of qemu-guest-agent, nothing else of hpcvm.
AGENT_ONLY = """
import sys
from hpcvm.runtime.channels.agent import GuestAgent
with GuestAgent(sys.argv[1], timeout=30) as agent:
    sys.exit(agent.exec(["true"]).exit_code)
"""


@contextmanager
def running_vm(name: str | None) -> Iterator[tuple[str, dict[str, str], str]]:
    """A running VM: its name, the environment that finds it, and its `up` line."""
    if name is not None:
        yield name, dict(os.environ), "(a running VM given with --vm)"
        return
    with tempfile.TemporaryDirectory(prefix="hpcvm-exec-latency-") as tmp:
        env = dict(os.environ, HPCVM_RUNTIME_DIR=f"{tmp}/rt")
        name = f"execlat{os.getpid()}"
        up = subprocess.run(
            [HPCVM, "up", "--name", name, *SHAPE], capture_output=True, text=True, env=env
        )
        if up.returncode != 0:
            sys.exit(f"exec_latency: hpcvm up failed: {up.stderr.strip()}")
        try:
            line = next((ln for ln in up.stdout.splitlines() if ": up in " in ln), "")
            yield name, env, line
        finally:
            subprocess.run([HPCVM, "down", name], capture_output=True, env=env)


def agent_socket(name: str, env: dict[str, str]) -> str:
    """The VM's agent socket, from its record (read here, outside the timed part)."""
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys; from hpcvm.runtime.machine.handle import read_handle; "
         "print(read_handle(sys.argv[1]).agent_socket)", name],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    return out.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--gap", type=float, default=0.15, help="seconds between runs")
    parser.add_argument("--loop", type=int, default=10, help="execs back to back")
    parser.add_argument("--vm", default=None, help="a running VM (default: boot one)")
    opts = parser.parse_args()
    with running_vm(opts.vm) as (name, env, up_line):
        sides = {
            "version": [HPCVM, "--version"],
            "exec": [HPCVM, "exec", "--no-stdin", name, "--", "true"],
            "agent": [sys.executable, "-c", AGENT_ONLY, agent_socket(name, env)],
        }
        for argv in sides.values():
            command_seconds(argv, env)  # warm the page cache once
        times: dict[str, list[float]] = {side: [] for side in sides}
        order = list(sides)
        for i in range(opts.rounds):
            for side in order[i % 3 :] + order[: i % 3]:
                times[side].append(command_seconds(sides[side], env, opts.gap))
        med = {side: statistics.median(values) for side, values in times.items()}
        time.sleep(opts.gap)
        begin = time.perf_counter()
        for _ in range(opts.loop):
            command_seconds(sides["exec"], env)
        looped = (time.perf_counter() - begin) / opts.loop
    print(f"VM: {up_line.strip()}")
    print(f"host CPU: {cpu_model()}, {os.cpu_count()} CPUs; {opts.rounds} rounds, "
          f"{opts.gap:g} s between runs")  # fmt: skip
    for side, value in med.items():
        print(f"{side:<8} median {value:.3f} s  (min {min(times[side]):.3f}, "
              f"max {max(times[side]):.3f})")  # fmt: skip
    over = med["exec"] - med["version"]
    print(f"exec - version: {over:.3f} s (goal {GOAL_SECONDS} s: "
          f"{'met' if over <= GOAL_SECONDS else 'missed'})")  # fmt: skip
    print(f"exec - agent:   {med['exec'] - med['agent']:.3f} s (hpcvm's command over the "
          "agent's own work)")  # fmt: skip
    print(f"agent - version: {med['agent'] - med['version']:.3f} s (the guest's part and "
          "the agent client's)")  # fmt: skip
    print(f"exec back to back: {looped:.3f} s each ({opts.loop} in a row, the agent's "
          "pause after each client included)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
