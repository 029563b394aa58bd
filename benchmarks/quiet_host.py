"""What the host tuning buys: the noise suite on the vCPU PUs, natively and in vm:hpc,
with and without `hpcvm tune --apply`, interleaved.

One vm:hpc VM is started (`hpcvm up`), and its plan gives the PUs: its vCPU PUs are
measured natively (the noise benchmark's workers pinned there) and inside it (on every
vCPU). Each repetition block runs the two host states, untuned and tuned, in a fresh
random order (hpcvm.stats.interleaved_order); tuned means `hpcvm.tune` applied for the
VM's plan, reverted right after the block's measurements of that state, so the host is
untuned between blocks and at the end whatever happens. The first block is a warm-up
and is discarded. The work per quantum is calibrated once per environment (first run)
and then fixed with -i, so untuned and tuned do the same work.

Printed per environment and metric (time lost to detours, %; worst per-CPU 99.9th
percentile detour, us): the mean and its Student-t interval for each state, and the
change tuned/untuned - 1 with its Fieller interval (hpcvm.stats.overhead; negative =
the tuning helped). Needs root (it writes the host's tuning) and a built guest.

    .venv/bin/python benchmarks/quiet_host.py [--reps 8] [--quanta 20000] [--quantum-us 50]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from hpcvm.bench.suites.noise.suite import (
    P999_DETOUR,
    TIME_LOST,
    noise_binary,
    parse_report,
    report_metrics,
)
from hpcvm.runtime.machine.state import load_machine
from hpcvm.stats import interleaved_order, overhead, summarize
from hpcvm.tune import engine, snapshot_state, state
from hpcvm.tune.model import TuneTarget
from hpcvm.tune.target import from_plan, online_pus
from hpcvm.units import format_cpu_list

HPCVM = str(Path(sys.executable).with_name("hpcvm"))
VM = "quiet-host"
STATES = ("untuned", "tuned")
METRICS = (TIME_LOST, P999_DETOUR)
CONFIDENCE = 0.97


def sh(*argv: str, timeout: float = 600) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@contextlib.contextmanager
def vm_hpc(memory: str) -> Iterator[TuneTarget]:
    """A running vm:hpc with one vCPU per usable PU but one; its tuning target."""
    vcpus = max(1, len(online_pus()) - 1)
    share = ["--share", sys.base_prefix] if not sys.base_prefix.startswith("/usr") else []
    sh(HPCVM, "up", "--name", VM, "--profile", "hpc", "--vcpus", str(vcpus),
       "--memory", memory, *share)  # fmt: skip
    try:
        yield from_plan(load_machine(VM).plan, online_pus(), f"VM {VM}")
    finally:
        subprocess.run([HPCVM, "down", VM], capture_output=True, timeout=300)


@contextlib.contextmanager
def tuned(target: TuneTarget, directory: Path, on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    engine.apply(target, directory)
    try:
        yield
    finally:
        engine.revert(directory)


class Runner:
    """Runs the noise benchmark natively or in the VM; fixes -i after the first run."""

    def __init__(self, quanta: int, quantum_us: int, target: TuneTarget, vcpus: int) -> None:
        self.base = ["-n", str(quanta), "-q", str(quantum_us)]
        self.cpus = {"native": format_cpu_list(list(target.vcpu_pus)),
                     "vm:hpc": format_cpu_list(list(range(vcpus)))}  # fmt: skip
        self.iterations: dict[str, int] = {}

    def run(self, env: str) -> dict[str, float]:
        argv = [str(noise_binary()), *self.base, "-c", self.cpus[env]]
        if env in self.iterations:
            argv += ["-i", str(self.iterations[env])]
        if env == "vm:hpc":
            argv = [HPCVM, "exec", VM, *argv]
        report = parse_report(sh(*argv))
        self.iterations.setdefault(env, report.iterations)
        values = {v.metric.name: v.value for v in report_metrics(report)}
        out: dict[str, float] = {}
        for m in METRICS:
            value = values[m.name]
            if value is None:
                raise SystemExit(f"noise on {env} reported no {m.name}")
            out[m.name] = value
        return out


def measure(
    args: argparse.Namespace, target: TuneTarget, vcpus: int
) -> dict[tuple[str, str, str], list[float]]:
    """(env, state, metric) -> one value per kept block."""
    runner = Runner(args.quanta, args.quantum_us, target, vcpus)
    samples: dict[tuple[str, str, str], list[float]] = {}
    for block in range(args.reps + 1):
        for host_state in interleaved_order(list(STATES), block, args.seed):
            with tuned(target, args.state_dir, host_state == "tuned"):
                for env in interleaved_order(["native", "vm:hpc"], block, args.seed + 1):
                    values = runner.run(env)
                    if block == 0:
                        continue  # warm-up
                    for name, value in values.items():
                        samples.setdefault((env, host_state, name), []).append(value)
        print(f"block {block}/{args.reps} done", file=sys.stderr)
    return samples


def report(samples: dict[tuple[str, str, str], list[float]]) -> None:
    print(f"{'env':8} {'metric':22} {'untuned mean [97% CI]':28} {'tuned mean [97% CI]':28} "
          "change tuned/untuned [97% CI]")  # fmt: skip
    for env in ("native", "vm:hpc"):
        for metric in METRICS:
            cells = []
            for host_state in STATES:
                s = summarize(samples[(env, host_state, metric.name)], CONFIDENCE)
                cells.append(f"{s.mean:8.3f} [{s.ci_low:.3f}, {s.ci_high:.3f}]")
            ratio = overhead(samples[(env, "untuned", metric.name)],
                             samples[(env, "tuned", metric.name)],
                             higher_is_better=False, confidence=CONFIDENCE)  # fmt: skip
            change = f"{ratio.overhead_pct:+.1f}%"
            if ratio.bounded:
                change += f" [{ratio.overhead_ci_low:+.1f}%, {ratio.overhead_ci_high:+.1f}%]"
            else:
                change += f" (no interval: {ratio.note.replace('native', 'untuned')})"
            print(f"{env:8} {metric.name:22} {cells[0]:28} {cells[1]:28} {change}")


def figure(samples: dict[tuple[str, str, str], list[float]], path: Path, title: str) -> None:
    """Bars of each state's mean with its 97% interval as whiskers, per environment and
    metric (the README's before/after figure), drawn from this run's own samples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpcvm.report.figures import whisker

    fig, axes = plt.subplots(1, len(METRICS), figsize=(9, 3.6))
    for ax, metric in zip(axes, METRICS, strict=True):
        for i, env in enumerate(("native", "vm:hpc")):
            for j, host_state in enumerate(STATES):
                s = summarize(samples[(env, host_state, metric.name)], CONFIDENCE)
                x = i + 0.38 * (j - 0.5)
                ax.bar(
                    x,
                    s.mean,
                    0.36,
                    color=("#d62728", "#1f77b4")[j],
                    label=host_state if i == 0 else None,
                )
                if s.ci_low is not None and s.ci_high is not None:
                    whisker(ax, x, s.ci_low, s.ci_high)
        ax.set_xticks([0, 1], ["native", "vm:hpc"])
        ax.set_title(f"{metric.short or metric.name} ({metric.unit})", fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=8, help="blocks kept (plus one warm-up)")
    parser.add_argument("--quanta", type=int, default=20000)
    parser.add_argument("--quantum-us", type=int, default=50)
    parser.add_argument("--memory", default="512M")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--state-dir", type=Path, default=state.state_dir())
    parser.add_argument("--figure", type=Path, default=None, help="write the figure (PNG)")
    args = parser.parse_args()
    if state.load(args.state_dir) is not None:
        raise SystemExit("hpcvm tuning is already applied: `hpcvm tune --revert` first")
    started = time.time()
    print(f"load average at the start {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with vm_hpc(args.memory) as target:
        vcpus = len(target.vcpu_pus)
        print(f"host {platform.node()} ({len(online_pus())} PUs, kernel {platform.release()}); "
              f"vm:hpc {vcpus} vCPU on PUs {format_cpu_list(list(target.vcpu_pus))}, "
              f"housekeeping PUs {format_cpu_list(list(target.housekeeping_pus))}; "
              f"noise {args.quanta} quanta of {args.quantum_us} us; {args.reps} blocks "
              f"(+1 warm-up), seed {args.seed}")  # fmt: skip
        print("untuned host:", snapshot_state(args.state_dir))
        engine_rows = engine.check(target)
        print("tuning applies:", ", ".join(r.name for r in engine_rows
                                           if r.when == "runtime" and r.ok is False))  # fmt: skip
        samples = measure(args, target, vcpus)
    report(samples)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"took {time.time() - started:.0f} s; load average at the end {load}")
    if args.figure is not None:
        title = (f"noise on the vCPU PUs, untuned vs hpcvm tune --apply; {args.reps} blocks, "
                 f"TCG guest, {platform.node()}, whiskers: 97% intervals")  # fmt: skip
        figure(samples, args.figure, title)


if __name__ == "__main__":
    main()
