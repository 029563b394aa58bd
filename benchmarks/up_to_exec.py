"""Time from `hpcvm up` to the first answered `hpcvm exec`, with the built-in guest.

Runs the real CLI as a user would (`up`, then `exec -- true` as soon as `up` returns,
then `down`), several times, and prints each run, the median and its ratio to the
issue's 8 s target (under TCG on a 2-core machine, a boot alone takes about 5 s).
The guest is built before the first timed run, so build time is not counted.
This is a benchmark script, not a test: it asserts nothing about time.

``--compare-whole-root`` alternates, run by run, today's guest (a share list, QEMU as
``hpcvm-qemu`` under its sandbox) with the behaviour it replaced: the host's whole root
in one read-only share, QEMU as root without sandbox, started directly (no staged
export). That old behaviour exists only
here (``_whole_root_cli`` patches the runtime in the `up` process it starts), never in
hpcvm itself. It prints both medians, their ratio, and the paired differences (share
list minus whole root, run by run): their median, how many pairs were slower, and the
two-sided Wilcoxon signed-rank p-value (scipy), so "beyond noise" is a test, not a look.

    .venv/bin/python benchmarks/up_to_exec.py [--runs 5] [--profile naive] [--vcpus 1]
        [--memory 512M] [--compare-whole-root]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

TARGET_SECONDS = 8.0
HPCVM = [str(Path(sys.executable).with_name("hpcvm"))]


WHOLE_ROOT_FLAG = "--as-whole-root-cli"


def _run(args: list[str], *, whole_root: bool = False) -> subprocess.CompletedProcess[str]:
    cli = [sys.executable, __file__, WHOLE_ROOT_FLAG] if whole_root else HPCVM
    return subprocess.run([*cli, *args], capture_output=True, text=True, check=False)


def _whole_root_cli(args: list[str]) -> int:
    """The hpcvm CLI with the pre-share-list guest: ``/`` as the only (read-only)
    share and QEMU left as root without its sandbox."""
    from hpcvm.bootspec import Share
    from hpcvm.cli.main import main as hpcvm_main
    from hpcvm.runtime.hostside import staging
    from hpcvm.runtime.vm import boot, lifecycle

    def whole_root(media: boot.BootMedia, *_args: object, **_kw: object) -> boot.BootMedia:
        share = Share(host_path="/", guest_path="/", tag="hpcvm0")
        return replace(media, boot=media.boot.model_copy(update={"shares": (share,)}))

    lifecycle.with_shares = whole_root  # type: ignore[assignment]
    lifecycle.confined = lambda spec, *_a: spec  # type: ignore[assignment]
    staging.stage = lambda *_a: None  # QEMU started directly, as it was
    return hpcvm_main(args)


def one_run(name: str, shape: list[str], *, whole_root: bool = False) -> float:
    """Seconds from starting `hpcvm up` to `hpcvm exec -- true` returning 0."""
    begin = time.monotonic()
    up = _run(["up", "--name", name, *shape], whole_root=whole_root)
    try:
        if up.returncode != 0:
            raise SystemExit(f"up failed ({up.returncode}): {up.stderr.strip()}")
        ran = _run(["exec", name, "--", "true"])
        seconds = time.monotonic() - begin
        if ran.returncode != 0:
            raise SystemExit(f"exec failed ({ran.returncode}): {ran.stderr.strip()}")
        return seconds
    finally:
        _run(["down", name])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", default="naive")
    parser.add_argument("--vcpus", default="1")
    parser.add_argument("--memory", default="512M")
    parser.add_argument("--compare-whole-root", action="store_true")
    opts = parser.parse_args()
    shape = ["--profile", opts.profile, "--vcpus", opts.vcpus, "--memory", opts.memory]

    built = subprocess.run([*HPCVM, "guest", "build"], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        print(f"note: `hpcvm guest build` exited {built.returncode}; up builds on demand")
    if opts.compare_whole_root:
        return compare(opts.runs, shape)
    times = []
    for i in range(opts.runs):
        seconds = one_run(f"bench-up-{os.getpid()}-{i}", shape)
        times.append(seconds)
        print(f"run {i + 1}: {seconds:.2f} s from `hpcvm up` to the first answered exec")
    median = statistics.median(times)
    print(
        f"median of {len(times)}: {median:.2f} s = {median / TARGET_SECONDS:.2f} x the "
        f"{TARGET_SECONDS:.0f} s target ({' '.join(shape)})"
    )
    return 0


def compare(runs: int, shape: list[str]) -> int:
    """Share list vs whole root, alternating (which goes first alternates too)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(runs):
        for whole_root in (i % 2 == 1, i % 2 == 0):
            name = f"bench-up-{os.getpid()}-{i}-{'root' if whole_root else 'list'}"
            seconds = one_run(name, shape, whole_root=whole_root)
            times[whole_root].append(seconds)
            what = "whole root, QEMU as root" if whole_root else "share list, hpcvm-qemu"
            print(f"run {i + 1}: {seconds:.2f} s ({what})")
    new, old = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"median of {runs}: share list {new:.2f} s, whole root {old:.2f} s, ratio "
        f"{new / old:.3f} (range share list {min(times[False]):.2f}-{max(times[False]):.2f}, "
        f"whole root {min(times[True]):.2f}-{max(times[True]):.2f}; {' '.join(shape)})"
    )
    print(paired(times[False], times[True]))
    return 0


def paired(new: list[float], old: list[float]) -> str:
    """The run-by-run differences: median, sign count, Wilcoxon signed-rank p."""
    from scipy.stats import wilcoxon

    diffs = [a - b for a, b in zip(new, old, strict=True)]
    slower = sum(d > 0 for d in diffs)
    p = wilcoxon(diffs).pvalue if len(diffs) >= 2 and any(diffs) else float("nan")
    return (
        f"pairs: share list slower in {slower} of {len(diffs)}, median difference "
        f"{statistics.median(diffs):+.2f} s, Wilcoxon signed-rank p = {p:.2f}"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == [WHOLE_ROOT_FLAG]:
        sys.exit(_whole_root_cli(sys.argv[2:]))
    sys.exit(main())
