"""Wall time of `hpcvm ps`, `hpcvm ps --json` and `hpcvm down NAME` against
`hpcvm --version`, each in a fresh process, before and after a change (issue 37:
commands import only what they use).

Every round boots VMs (not timed) in a private runtime directory with the working
tree's `hpcvm up`, one per side, and waits ``--settle`` seconds. Then, their order
rotating every round so that all see the same machine load, each side (the code of
``--before REF``, exported with ``git archive`` into a temporary directory, which
writes nothing into the repository; and the working tree's ``src``) times:

- ``version``: `hpcvm --version` (the interpreter, click and hpcvm's entry point);
- ``ps``: `hpcvm ps` with the round's VMs running (it asks each QEMU over QMP whether
  its vCPUs run);
- ``ps-json``: `hpcvm ps --json`;
- ``down``: `hpcvm down NAME` of one of the round's VMs (the guest asked to power off,
  QEMU waited for, its files removed): the guest's own shutdown is in it.

Each timed run starts ``--gap`` seconds after the one before (not counted), so that a
guest agent's pause after a client (benchmarks/exec_latency.py) is not charged to the
next run. Prints each side's medians and their difference to `--version` on the same
side. Without ``--before`` only the working tree is timed. A benchmark script, not a
test: it asserts nothing about time.

    .venv/bin/python benchmarks/command_latency.py [--before REF] [--rounds 9] [--gap 0.15]
        [--settle 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's benchmarks/
from benchmarks.bench_common import command_seconds, cpu_model

ROOT = Path(__file__).resolve().parents[1]
HPCVM = str(Path(sys.executable).with_name("hpcvm"))
SHAPE = ["--profile", "naive", "--vcpus", "1", "--memory", "256M", "--accel", "tcg"]
COMMANDS = ("version", "ps", "ps-json", "down")


def argv_of(command: str, vm: str) -> list[str]:
    return {
        "version": [HPCVM, "--version"],
        "ps": [HPCVM, "ps"],
        "ps-json": [HPCVM, "ps", "--json"],
        "down": [HPCVM, "down", vm],
    }[command]


def up(name: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [HPCVM, "up", "--name", name, *SHAPE], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        sys.exit(f"command_latency: hpcvm up failed: {done.stderr.strip()}")


def export(ref: str, into: Path) -> Path:
    """``ref``'s ``src`` in ``into`` (git archive: nothing written into the repository)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "src"],
        check=True,
        capture_output=True,
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="git ref of the 'before' code")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--gap", type=float, default=0.15, help="seconds between runs")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after the ups")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpcvm-command-latency-") as tmp:
        base = dict(os.environ, HPCVM_RUNTIME_DIR=f"{tmp}/rt")
        srcs = {"after": ROOT / "src"}
        if opts.before:
            srcs = {"before": export(opts.before, Path(tmp)), **srcs}
        envs = {side: dict(base, PYTHONPATH=str(src)) for side, src in srcs.items()}
        times = {(side, c): [] for side in envs for c in COMMANDS}  # type: ignore[var-annotated]
        try:
            for r in range(opts.rounds):
                vms = {side: f"cl{os.getpid()}r{r}{side[0]}" for side in envs}
                for vm in vms.values():
                    up(vm, base)
                time.sleep(opts.settle)  # the guests' boot work after `up` returned
                runs = [(side, c) for c in COMMANDS[:-1] for side in envs]
                runs = runs[r % len(runs) :] + runs[: r % len(runs)]
                downs = [(side, "down") for side in envs]
                for side, command in runs + (downs if r % 2 == 0 else downs[::-1]):
                    argv = argv_of(command, vms[side])
                    if r == 0 and command != "down":
                        command_seconds(argv, envs[side], 0.0)  # the first run compiles and caches
                    times[side, command].append(command_seconds(argv, envs[side], opts.gap))
                print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr, flush=True)
        finally:
            subprocess.run([HPCVM, "down", "--all"], capture_output=True, env=base)
    print(f"host CPU: {cpu_model()}, {os.cpu_count()} CPUs; TCG, 1 vCPU, 256 MiB; "
          f"{opts.rounds} rounds, {opts.gap:g} s between runs")  # fmt: skip
    for side in envs:
        version = statistics.median(times[side, "version"])
        for command in COMMANDS:
            values = times[side, command]
            med = statistics.median(values)
            over = "" if command == "version" else f"  ({med - version:+.3f} s over --version)"
            print(f"{side:<6} {command:<8} median {med:.3f} s (min {min(values):.3f}, "
                  f"max {max(values):.3f}){over}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
