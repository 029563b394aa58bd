"""``--reps auto`` in the measurement loop: each cell stops on its own, extreme
statistics are left out, the time cap holds, and cheap cells fill the blocks.

Real processes print every value (``/bin/sh -c 'echo ...'`` run by the real native
environment); what the test chooses is the stream of values each environment prints
and, through a fake clock the suite advances, what each sample costs: timing a real
run would make the test depend on the machine's load. Two native environments under
different names stand in for a cheap native cell and an expensive guest cell (a TCG
guest's sample costs some thirty times a native one); no VM is needed for the loop.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Sequence
from itertools import count
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from hpcvm.bench.core.metrics import Metric, MetricValue
from hpcvm.bench.envs.environments import RunOutput
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.run.runner import Runner
from hpcvm.store import SampleRecord, Store

TARGET = 0.1
CONF = 0.97
STEADY = Metric(name="t", unit="s", higher_is_better=False)
PEAK = Metric(name="peak", unit="s", higher_is_better=False, extreme=True)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Scripted:
    """A suite whose sample is a real process printing the next values chosen for its
    environment (found from the workdir, ``work/<env>/<sample>``); preparing a sample
    advances the fake clock by what the environment's sample costs."""

    name = "scripted"
    uses_np = False
    metrics = (STEADY, PEAK)
    output_files: tuple[str, ...] = ()

    def __init__(
        self, streams: dict[str, Iterator[float]], costs: dict[str, float], clock: FakeClock
    ) -> None:
        self.streams = streams
        self.costs = costs
        self.clock = clock
        self.peaks = np.random.default_rng(99)

    def validate(self, np_values: Sequence[int]) -> None:
        return None

    def prepare(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        env = workdir.parent.name
        self.clock.now += self.costs[env]
        # the peak is heavy-tailed: judging it would keep every cell to its caps
        peak = float(self.peaks.pareto(1.1) * 1000.0 + 1.0)
        return ["/bin/sh", "-c", f"echo t={next(self.streams[env])!r} peak={peak!r}"]

    def parse(self, workdir: Path, stdout: str, stderr: str, exit_code: int) -> list[MetricValue]:
        fields = dict(token.split("=") for token in stdout.split())
        return [m.value(float(fields[m.name])) for m in self.metrics]


def _native(name: str) -> NativeEnvironment:
    env = NativeEnvironment()
    env.name = name
    return env


def _run(
    tmp_path: Path,
    streams: dict[str, Iterator[float]],
    costs: dict[str, float],
    **update: object,
) -> tuple[Runner, list[SampleRecord]]:
    values: dict[str, object] = {
        "envs": tuple(streams),
        "suites": ("cmd",),  # stored only; the runner is handed the scripted suite
        "reps": None,
        "target": TARGET,
        "max_time": None,
        "seed": 5,
        "timeout": 60.0,
    }
    values.update(update)
    config = BenchConfig.model_validate(values)
    clock = FakeClock()
    store = Store.open(tmp_path / "out", create=True)
    run_id = store.create_run(args={}, seed=5, confidence=CONF)
    envs = {name: _native(name) for name in streams}
    for env in envs.values():
        store.add_environment(run_id, env.describe())
    runner = Runner(
        store=store,
        run_id=run_id,
        seed=5,
        config=config,
        envs=envs,
        suites=[Scripted(streams, costs, clock)],
        out_dir=tmp_path / "out",
        sizing_memory=1 << 30,
        clock=clock,
    )
    runner.outcome = runner.run()  # type: ignore[attr-defined]
    return runner, store.samples(run_id, include_warmup=False)


def _oracle_stop(values: list[float], n_min: int = 3) -> int:
    """First n >= n_min whose scipy t interval is within the target."""
    for n in range(n_min, len(values) + 1):
        head = values[:n]
        mean = statistics.fmean(head)
        low, high = sps.t.interval(CONF, n - 1, loc=mean, scale=sps.sem(head))
        if (high - low) / 2 <= TARGET * abs(mean):
            return n
    raise AssertionError("the stream never meets the target; make it longer")


def _noisy(seed: int, cv: float = 0.4) -> Iterator[float]:
    rng = np.random.default_rng(seed)
    return (abs(float(rng.normal(100.0, 100.0 * cv))) + 1.0 for _ in count())


def _n(samples: list[SampleRecord], env: str) -> int:
    return sum(1 for s in samples if s.env == env)


def test_a_cell_stops_at_the_n_scipy_says(tmp_path: Path) -> None:
    values = np.random.default_rng(3).normal(100.0, 25.0, size=300).tolist()
    expected = _oracle_stop(values[1:])  # the warm-up prints the first value
    assert expected > 10
    runner, samples = _run(tmp_path, {"native": iter(values)}, {"native": 1.0}, max_reps=300)
    assert _n(samples, "native") == expected
    assert runner.outcome.stop_reason == "target"  # type: ignore[attr-defined]


def test_each_cell_stops_on_its_own_and_extremes_are_left_out(tmp_path: Path) -> None:
    """native prints a steady figure (target at the minimum, whatever its heavy-tailed
    peak does); native-b a noisy one (it runs on to its repetition cap)."""
    streams = {"native": iter([7.0] * 100), "native-b": _noisy(1)}
    runner, samples = _run(tmp_path, streams, {"native": 1.0, "native-b": 1.0}, max_reps=8)
    assert (_n(samples, "native"), _n(samples, "native-b")) == (3, 8)
    outcome = runner.outcome  # type: ignore[attr-defined]
    assert outcome.stop_reason == "max-reps"
    assert "native scripted: target after 3" in outcome.detail
    assert "native-b scripted: max-reps after 8" in outcome.detail
    assert "not judged (extreme statistics): peak" in outcome.detail
    keys = [(s.env, s.repetition) for s in samples]
    assert sorted(keys) == sorted({*keys})  # repetitions numbered per cell, no clash


def test_time_cap_holds_and_cheap_cells_fill_the_blocks(tmp_path: Path) -> None:
    """A 1 s cell beside a 30 s one, both noisy (CV 40%: some 80 repetitions for the
    target), 300 s of time. The cheap cell takes many samples inside the blocks the dear
    one runs in; once the dear one has its minimum it gives way (80 x 30 s cannot fit)
    until the cheap one has met its target, then spends the time left, never starting a
    sample that would end past the cap: the measuring ends within one dear sample
    before it (it once ran on past it by up to a sample of every open cell)."""
    costs = {"native": 1.0, "native-b": 30.0}
    runner, samples = _run(
        tmp_path,
        {"native": _noisy(2), "native-b": _noisy(3)},
        costs,
        max_time=300.0,
        max_reps=200,
    )
    outcome = runner.outcome  # type: ignore[attr-defined]
    assert outcome.stop_reason == "max-time"
    assert "native scripted: target after" in outcome.detail
    assert "native-b scripted: max-time after" in outcome.detail
    cheap = [s.id for s in samples if s.env == "native"]
    dear = [s.id for s in samples if s.env == "native-b"]
    assert len(cheap) >= 10 * 3
    # at most its minimum while the cheap cell runs, nothing more until that one is done
    assert sum(1 for i in dear if i < cheap[-1]) <= 3
    assert len(dear) > 3  # then the time left is still used
    # the cheap cell's samples spread over the blocks the dear one runs in
    assert sum(1 for i in cheap if dear[0] < i < dear[1]) >= 10
    everything = runner.store.samples(runner.run_id)
    # every warm-up first, so the first block already knows what each cell costs
    assert max(s.id for s in everything if s.warmup) < min(s.id for s in samples)
    elapsed = runner.store.run(runner.run_id).elapsed_s
    assert elapsed == sum(costs[s.env] for s in everything)
    assert 300.0 - costs["native-b"] < elapsed <= 300.0
    assert "native-b scripted: max-time after" in outcome.detail


def test_the_minimum_is_taken_whatever_the_cap(tmp_path: Path) -> None:
    """A cap shorter than the warm-ups and minimums: every cell still gets its 3
    repetitions (every result needs an interval), and not one more."""
    costs = {"native": 1.0, "native-b": 30.0}
    runner, samples = _run(
        tmp_path, {"native": _noisy(6), "native-b": _noisy(7)}, costs, max_time=50.0
    )
    assert (_n(samples, "native"), _n(samples, "native-b")) == (3, 3)
    assert runner.outcome.stop_reason == "max-time"  # type: ignore[attr-defined]


def test_the_interval_of_a_stopped_cell_meets_the_target(tmp_path: Path) -> None:
    values = np.random.default_rng(8).normal(50.0, 10.0, size=300).tolist()
    _, samples = _run(tmp_path, {"native": iter(values)}, {"native": 1.0}, max_reps=300)
    taken = [v for s in samples for m in s.metrics if m.metric == "t" and (v := m.value)]
    half = sps.t.ppf(1 - (1 - CONF) / 2, len(taken) - 1) * statistics.stdev(taken)
    assert half / math.sqrt(len(taken)) <= TARGET * statistics.fmean(taken)


class Interrupting(NativeEnvironment):
    """The native environment under another name; Ctrl-C at its n-th run."""

    def __init__(self, name: str, interrupt_at: int | None) -> None:
        super().__init__()
        self.name = name
        self.runs = 0
        self.interrupt_at = interrupt_at

    def run(self, argv: Sequence[str], workdir: Path, timeout: float, **kw: object) -> RunOutput:
        self.runs += 1
        if self.runs == self.interrupt_at:
            raise KeyboardInterrupt
        return super().run(argv, workdir, timeout, **kw)  # type: ignore[arg-type]


def test_an_interrupted_auto_run_resumes_each_cell_where_it_stopped(tmp_path: Path) -> None:
    """Ctrl-C in the middle; the resumed process warms up again and goes on counting
    each cell's repetitions from the stored ones: no key twice, every cell to its cap."""
    config = BenchConfig.model_validate(
        {
            "envs": ("native", "native-b"),
            "suites": ("cmd",),
            "reps": None,
            "target": TARGET,
            "max_reps": 6,
            "max_time": None,
            "seed": 5,
        }
    )
    clock = FakeClock()
    streams = {"native": _noisy(4), "native-b": _noisy(5)}
    suite = Scripted(streams, {"native": 1.0, "native-b": 1.0}, clock)
    store = Store.open(tmp_path / "out", create=True)
    run_id = store.create_run(args={}, seed=5, confidence=CONF)

    def runner(interrupt_at: int | None) -> Runner:
        envs = {n: Interrupting(n, interrupt_at if n == "native-b" else None) for n in streams}
        if not store.environments(run_id):
            for env in envs.values():
                store.add_environment(run_id, env.describe())
        return Runner(
            store=store,
            run_id=run_id,
            seed=5,
            config=config,
            envs=envs,
            suites=[suite],
            out_dir=tmp_path / "out",
            sizing_memory=1 << 30,
            clock=clock,
        )

    with pytest.raises(KeyboardInterrupt):
        runner(4).run()
    before = store.samples(run_id)
    assert 0 < len(before) < 14
    runner(None).run()
    samples = store.samples(run_id)
    keys = [s.key for s in samples]
    assert len(keys) == len(set(keys))
    measured = [s for s in samples if not s.warmup]
    for env in streams:
        assert sorted(s.repetition for s in measured if s.env == env) == list(range(6))
    assert sum(1 for s in samples if s.warmup) == 4  # each process warmed both up


def test_under_a_time_cap_native_fills_first(tmp_path: Path) -> None:
    """Native noisier than the VM cell (its target needs some 80 samples, the VM's some
    20), both 1 s a sample, 60 s of time: cheapest-first alone would give the VM its
    target and native the rest. Native's interval is in every overhead, so the VM takes
    its minimum and waits while native is open; native gets the time up to the cap."""
    costs = {"native": 1.0, "vm-b": 1.0}
    runner, samples = _run(
        tmp_path,
        {"native": _noisy(11, cv=0.4), "vm-b": _noisy(12, cv=0.2)},
        costs,
        max_time=60.0,
        max_reps=200,
    )
    assert _n(samples, "vm-b") == 3
    assert _n(samples, "native") >= 60 - 2 - 3 - 1  # warm-ups, the VM's minimum, one spare
    assert "native scripted: max-time after" in runner.outcome.detail  # type: ignore[attr-defined]


def test_without_a_time_cap_no_cell_waits_for_native(tmp_path: Path) -> None:
    """With no cap there is nothing to share: both cells run to their own targets,
    interleaved (the VM cell's samples are not held back until native is done)."""
    streams = {"native": _noisy(11, cv=0.4), "vm-b": _noisy(12, cv=0.2)}
    _, samples = _run(tmp_path, streams, {"native": 1.0, "vm-b": 1.0}, max_reps=200)
    native = [s.id for s in samples if s.env == "native"]
    vm = [s.id for s in samples if s.env == "vm-b"]
    assert len(vm) > 3
    assert sum(1 for i in vm if i < native[-1]) > 3


class WarmsUpSmall(Scripted):
    """The scripted suite with a warm-up of its own that prints a value no sample does."""

    warmup_cost_share = 0.1

    def prepare_warmup(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        self.clock.now += 0.1
        return ["/bin/sh", "-c", "echo t=-7.0 peak=1.0"]


def test_a_suite_s_own_warm_up_runs_for_warm_ups_only(tmp_path: Path) -> None:
    clock = FakeClock()
    config = BenchConfig.model_validate(
        {"envs": ("native",), "suites": ("cmd",), "reps": 3, "seed": 5, "timeout": 60.0}
    )
    store = Store.open(tmp_path / "out", create=True)
    run_id = store.create_run(args={}, seed=5, confidence=CONF)
    env = _native("native")
    store.add_environment(run_id, env.describe())
    suite = WarmsUpSmall({"native": _noisy(1)}, {"native": 1.0}, clock)
    Runner(
        store=store,
        run_id=run_id,
        seed=5,
        config=config,
        envs={"native": env},
        suites=[suite],
        out_dir=tmp_path / "out",
        sizing_memory=1 << 30,
        clock=clock,
    ).run()
    got = {
        (s.warmup, m.value)
        for s in store.samples(run_id)
        for m in s.metrics
        if m.metric == "t" and (s.warmup or m.value == -7.0)
    }
    assert got == {(True, -7.0)}


class TenthWarmUp(Scripted):
    """A warm-up that costs a tenth of a sample, as the suite declares."""

    warmup_cost_share = 0.1

    def prepare_warmup(self, workdir: Path, np: int, memory_bytes: int) -> list[str]:
        self.clock.now += self.costs[workdir.parent.name] * self.warmup_cost_share
        return ["/bin/sh", "-c", "echo t=1.0 peak=1.0"]


def test_a_small_warm_up_still_gives_the_first_block_a_sample_s_pace(tmp_path: Path) -> None:
    """Cheap cells fill the first block for as long as the dearest cell's sample takes,
    which is known only from its warm-up there: a warm-up of a tenth of a sample (3 s
    for a 30 s cell) must be scaled by the suite's share, or the cheap cell would get
    3 samples where it should get some 30 (CV 40%: it needs about 80)."""
    clock = FakeClock()
    config = BenchConfig.model_validate(
        {"envs": ("native", "vm-b"), "suites": ("cmd",), "reps": None, "target": TARGET,
         "max_time": None, "max_reps": 200, "seed": 5, "timeout": 60.0}
    )  # fmt: skip
    store = Store.open(tmp_path / "out", create=True)
    run_id = store.create_run(args={}, seed=5, confidence=CONF)
    envs = {name: _native(name) for name in ("native", "vm-b")}
    for env in envs.values():
        store.add_environment(run_id, env.describe())
    streams = {"native": _noisy(21), "vm-b": _noisy(22, cv=0.02)}
    suite = TenthWarmUp(streams, {"native": 1.0, "vm-b": 30.0}, clock)
    Runner(
        store=store, run_id=run_id, seed=5, config=config, envs=envs, suites=[suite],
        out_dir=tmp_path / "out", sizing_memory=1 << 30, clock=clock,
    ).run()  # fmt: skip
    samples = store.samples(run_id, include_warmup=False)
    vm = [s.id for s in samples if s.env == "vm-b"]
    native = [s.id for s in samples if s.env == "native"]
    assert len(vm) >= 2
    assert sum(1 for i in native if i < vm[1]) >= 25
