"""Wall time of `hpcvm --help` and of every command's `--help`, against `hpcvm --version`.

Each help is timed alternately with `hpcvm --version` (the interpreter, click and
hpcvm's entry point, nothing else), the pair's order swapping every round, so both
sides see the same machine load. Prints, per help: the medians, their ratio, and
whether the median is within the 0.15 s goal (issue 29). Writes nothing anywhere.
This is a benchmark script, not a test: tests/unit/test_cli_help.py checks what
`--help` imports, which is what makes it fast.

    .venv/bin/python benchmarks/cli_help.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOAL_SECONDS = 0.15
HPCVM = str(Path(sys.executable).with_name("hpcvm"))
HELPS: list[tuple[str, ...]] = [
    (),
    ("host",),
    ("plan",),
    ("guest",),
    ("guest", "build"),
    ("up",),
    ("ps",),
    ("exec",),
    ("verify",),
    ("down",),
    ("run",),
    ("bench",),
    ("results",),
    ("report",),
    ("tune",),
    ("cluster",),
    ("cluster", "up"),
]


def seconds(argv: list[str]) -> float:
    begin = time.perf_counter()
    subprocess.run([HPCVM, *argv], capture_output=True, check=True)
    return time.perf_counter() - begin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    opts = parser.parse_args()
    seconds([*HELPS[-1], "--help"])  # warm the page cache once
    print(f"{'command':<22} {'help s':>7} {'--version s':>11} {'ratio':>6}  goal {GOAL_SECONDS} s")
    worst = 0.0
    for words in HELPS:
        argv = [*words, "--help"]
        sides: dict[str, list[float]] = {"help": [], "version": []}
        for i in range(opts.rounds):
            order = ("help", "version") if i % 2 == 0 else ("version", "help")
            for side in order:
                sides[side].append(seconds(argv if side == "help" else ["--version"]))
        help_s, version_s = (statistics.median(sides[s]) for s in ("help", "version"))
        worst = max(worst, help_s)
        label = " ".join(["hpcvm", *argv])
        met = "met" if help_s <= GOAL_SECONDS else "MISSED"
        print(f"{label:<22} {help_s:7.3f} {version_s:11.3f} {help_s / version_s:6.2f}  {met}")
    print(
        f"slowest help: median {worst:.3f} s over {opts.rounds} rounds "
        f"(goal {GOAL_SECONDS} s: {'met' if worst <= GOAL_SECONDS else 'missed'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
