"""The main job's bench, before and after: native half-widths and wall time.

Runs the bench part of the README's first command twice, sequentially on the same
machine: once with the code of a "before" git ref (exported into a temporary
directory with ``git archive`` and run with its own ``src`` first on PYTHONPATH) and
its command line, once with the working tree and the new command line. Then prints,
for every native metric, the relative 97% half-width (half-width / |mean|) and n
before and after, and the wall time of each run with their ratio. Extreme statistics
(the noise suite's max detour and p99.9, which ``--reps auto`` does not judge) are
marked.

Each side's results are read by that side's own ``hpcvm results --json``, so a change
of the database between the two refs does not matter. The noise benchmark binary is a
build output (``make all``), absent from an exported tree: both sides use the working
tree's (``HPCVM_NOISE_BIN``, copied into the other tree so that its guests, which see
the bench's working directory, find it), so its C code is the working tree's on both sides.

A benchmark, not a test: it asserts nothing. Run it on a quiet machine: other jobs on
the cores widen every interval and lengthen every run, and the comparison then says
more about them than about the change.

    .venv/bin/python benchmarks/main_job.py --before 79f1aed
    .venv/bin/python benchmarks/main_job.py --before REF --keep /tmp/mainjob \\
        --before-args "--size quick --reps 3" --after-args "--size quick --target 10% --max-time 4m"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The README's first command, bench part: before (issue 9) and now.
BEFORE_ARGS = "--size quick --reps 3"
AFTER_ARGS = "--size quick --target 10% --max-time 4m --max-reps 200"
EXTREME = "(extreme: not judged)"


@dataclass(frozen=True)
class Side:
    """One measured run of the main job's bench."""

    label: str
    args: str
    wall_s: float
    rows: list[dict[str, Any]]
    exit_code: int


def _env(src: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src)
    env["HPCVM_NOISE_BIN"] = str(_noise_bin(src))
    return env


def _noise_bin(src: Path) -> Path:
    """The working tree's noise binary, copied into ``src``'s tree when that is another
    (a guest sees the bench's working directory, not this checkout)."""
    built = ROOT / "src" / "hpcvm" / "data" / "hpcvm-noise"
    target = src / "hpcvm" / "data" / "hpcvm-noise"
    if target != built and not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)
    return target


def _hpcvm(src: Path, args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    code = "import sys; from hpcvm.cli.main import entry; sys.exit(entry())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=_env(src),
        cwd=src.parent,
        text=True,
        check=False,
        **kw,
    )


def run_side(label: str, src: Path, args: str, out: Path) -> Side:
    """The bench with ``args`` from the code in ``src``, into ``out``; its rows."""
    log = out.with_suffix(".log")
    print(f"== {label}: hpcvm bench {args} --out {out}  (code: {src}; log: {log})", flush=True)
    started = time.monotonic()
    with log.open("w") as sink:
        bench = _hpcvm(src, ["bench", *shlex.split(args), "--out", str(out)], stdout=sink)
    wall = time.monotonic() - started
    listed = _hpcvm(src, ["results", str(out), "--json"], capture_output=True)
    if listed.returncode != 0:
        raise SystemExit(f"{label}: hpcvm results failed: {listed.stderr.strip()}")
    return Side(label, args, wall, json.loads(listed.stdout), bench.returncode)


def relative(row: dict[str, Any]) -> float | None:
    mean, half = row.get("mean"), row.get("half_width")
    if mean is None or half is None or mean == 0:
        return None
    return float(half) / abs(float(mean))


def _extreme(suite: str, metric: str) -> bool:
    from hpcvm.bench.suites.registry import kind_of  # the working tree's definitions

    kind = kind_of(suite)
    return kind is not None and any(m.name == metric and m.extreme for m in kind.metrics)


def native_rows(side: Side) -> dict[tuple[str, str, Any], dict[str, Any]]:
    return {
        (r["suite"], r["metric"], r.get("np")): r
        for r in side.rows
        if r["env"] == "native" and not r.get("detail")
    }


def _pct(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value * 100:.1f}%"


def table(before: Side, after: Side, target: float) -> str:
    """Per native metric: relative half-width and n, before and after."""
    old, new = native_rows(before), native_rows(after)
    lines = [
        f"{'suite':6} {'metric':28} {'np':>3} {'before':>9} {'n':>4} {'after':>9} {'n':>4}",
    ]
    over = 0
    for key in sorted({*old, *new}, key=lambda k: (k[0], k[1], str(k[2]))):
        suite, metric, np_ = key
        a, b = old.get(key, {}), new.get(key, {})
        rel_b = relative(b) if b else None
        mark = f" {EXTREME}" if _extreme(suite, metric) else ""
        if not mark and (rel_b is None or rel_b > target):
            over += 1
            mark = " > target"
        lines.append(
            f"{suite:6} {metric:28} {'-' if np_ is None else np_:>3} "
            f"{_pct(relative(a) if a else None):>9} {a.get('n', '-')!s:>4} "
            f"{_pct(rel_b):>9} {b.get('n', '-')!s:>4}{mark}"
        )
    ratio = after.wall_s / before.wall_s if before.wall_s else math.nan
    lines += [
        "",
        f"wall time: before {before.wall_s:.0f} s ({before.args}), "
        f"after {after.wall_s:.0f} s ({after.args}), ratio {ratio:.2f}",
        f"native metrics judged and over the {target * 100:g}% target after: {over}",
        f"exit codes: before {before.exit_code}, after {after.exit_code}",
    ]
    return "\n".join(lines)


def export(ref: str, tree: Path) -> None:
    """The files of ``ref`` in ``tree`` (``git archive``: nothing is written into the
    repository, unlike a worktree, whose record lives in its .git)."""
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="git ref of the 'before' code")
    parser.add_argument("--before-args", default=BEFORE_ARGS)
    parser.add_argument("--after-args", default=AFTER_ARGS)
    parser.add_argument("--target", type=float, default=0.10, help="for the > target marks")
    parser.add_argument("--keep", type=Path, default=None, help="keep results and logs in DIR")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpcvm-mainjob-") as tmp:
        base = args.keep.absolute() if args.keep else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        tree = Path(tmp) / "before-tree"
        export(args.before, tree)
        before = run_side("before", tree / "src", args.before_args, base / "before")
        after = run_side("after", ROOT / "src", args.after_args, base / "after")
    print()
    print(table(before, after, args.target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
