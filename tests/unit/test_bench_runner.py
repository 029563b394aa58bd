"""The measurement loop with the real native environment and the real cmd suite: real
commands (``/bin/sh`` scripts) print the figures, so every value the tests check was
produced by a process the runner started, not by the code under test.

Two native environments under different names stand in for "several environments"
where the order, pausing and interleaving matter (no VM is needed to test the loop);
``Recording`` adds a log of activate/deactivate/run calls to the real native
environment and can raise Ctrl-C (KeyboardInterrupt) at a chosen run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from hpcvm.bench.envs.environments import RunOutput
from hpcvm.bench.envs.native import NativeEnvironment
from hpcvm.bench.results.results import summaries
from hpcvm.bench.run.config import BenchConfig
from hpcvm.bench.run.runner import Runner
from hpcvm.bench.suites.registry import SuiteOptions, build_suites
from hpcvm.stats import interleaved_order
from hpcvm.store import Store

COUNTER = "/bin/sh -c 'n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; {body}'"


class Recording(NativeEnvironment):
    """The native environment under another name, logging what the runner asks of it."""

    def __init__(self, name: str, log: list[str], interrupt_at: int | None = None) -> None:
        super().__init__()
        self.name = name
        self.log = log
        self.active = False
        self.runs = 0
        self.interrupt_at = interrupt_at

    def activate(self) -> None:
        self.log.append(f"resume {self.name}")
        self.active = True

    def deactivate(self) -> None:
        self.log.append(f"pause {self.name}")
        self.active = False

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput:
        self.runs += 1
        if self.interrupt_at is not None and self.runs == self.interrupt_at:
            raise KeyboardInterrupt
        self.log.append(f"run {self.name} active={self.active}")
        return super().run(argv, workdir, timeout, outputs=outputs)


def _config(tmp_path: Path, body: str, **update: object) -> BenchConfig:
    options = SuiteOptions(
        cmd=COUNTER.format(body=body),
        metric=r"Time: ([0-9.eE+-]+) s",
        higher_is_better=False,
        unit="s",
        metric_name="Time",
        cmd_cwd=tmp_path,
    )
    values: dict[str, object] = {
        "envs": ("native",),
        "suites": ("cmd",),
        "reps": 3,
        "seed": 11,
        "timeout": 60.0,
        "suite_options": options,
    }
    values.update(update)
    return BenchConfig.model_validate(values)


def _runner(tmp_path: Path, config: BenchConfig, envs: dict[str, NativeEnvironment]) -> Runner:
    store = Store.open(tmp_path / "out", create=True)
    runs = store.runs()
    run_id = runs[-1].id if runs else store.create_run(args={}, seed=11, confidence=0.97)
    for env in envs.values():
        store.add_environment(run_id, env.describe())
    suites = build_suites(config.suites, config.suite_options)
    return Runner(
        store=store,
        run_id=run_id,
        seed=config.seed or 0,
        config=config,
        envs=envs,
        suites=suites,
        out_dir=tmp_path / "out",
        sizing_memory=1 << 30,
    )


def test_blocks_follow_the_seeded_interleaved_order_and_only_one_env_runs(
    tmp_path: Path,
) -> None:
    log: list[str] = []
    names = ["native", "native-b", "native-c"]
    envs: dict[str, NativeEnvironment] = {n: Recording(n, log) for n in names}
    config = _config(tmp_path, 'echo "Time: 1.$n s"', envs=tuple(names), reps=4)
    runner = _runner(tmp_path, config, envs)
    outcome = runner.run()
    assert (outcome.stop_reason, outcome.blocks) == ("fixed", 4)

    measured = runner.store.samples(runner.run_id, include_warmup=False)
    for block in range(4):
        in_block = [s for s in measured if s.repetition == block]
        expected = interleaved_order(names, block, 11)
        assert [s.env for s in in_block] == expected
        assert [s.position for s in in_block] == list(range(len(names)))
    # Never two at once: every run happened in the one resumed environment.
    runs = [line for line in log if line.startswith("run")]
    assert runs and all(line.endswith("active=True") for line in runs)
    # Before each switch every other environment was paused.
    for i, line in enumerate(log):
        if line.startswith("resume"):
            target = line.split()[1]
            paused = {ln.split()[1] for ln in log[max(0, i - 2) : i] if ln.startswith("pause")}
            assert paused == set(names) - {target}
    runner.store.close()


def test_warmup_is_recorded_and_left_out_of_the_summary(tmp_path: Path) -> None:
    # The command prints its call count: the warm-up prints 1, the reps 2, 3, 4.
    config = _config(tmp_path, 'echo "Time: $n s"', reps=3)
    runner = _runner(tmp_path, config, {"native": NativeEnvironment()})
    runner.run()
    samples = runner.store.samples(runner.run_id)
    assert [(s.warmup, s.metrics[0].value) for s in samples] == [
        (True, 1.0),
        (False, 2.0),
        (False, 3.0),
        (False, 4.0),
    ]
    (row,) = summaries(runner.store, runner.run_id)
    assert (row.n, row.mean) == (3, 3.0)
    runner.store.close()


def test_failed_and_unparsable_runs_are_kept_with_logs_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    body = (
        "if [ $n -eq 3 ]; then echo boom >&2; exit 3; fi; "
        'if [ $n -eq 4 ]; then echo no figure here; exit 0; fi; echo "Time: $n s"'
    )
    config = _config(tmp_path, body, reps=5)
    runner = _runner(tmp_path, config, {"native": NativeEnvironment()})
    runner.run()
    samples = runner.store.samples(runner.run_id, include_warmup=False)
    assert [s.ok for s in samples] == [True, False, False, True, True]
    crashed, garbled = samples[1], samples[2]
    assert crashed.error is not None and "code 3" in crashed.error and "boom" in crashed.error
    assert garbled.error is not None and "matched nothing" in garbled.error
    for failed in (crashed, garbled):
        assert failed.log_path is not None
        text = Path(failed.log_path).read_text()
        assert "FAILED" in text
    assert "boom" in Path(str(crashed.log_path)).read_text()
    (row,) = summaries(runner.store, runner.run_id)
    assert (row.n, row.failed) == (3, 2)
    assert row.mean == pytest.approx((2 + 5 + 6) / 3)
    runner.store.close()


@pytest.mark.parametrize(
    ("body", "update", "reason", "blocks"),
    [
        ('echo "Time: 7 s"', {"reps": None}, "target", 3),
        ('echo "Time: $((n * n * 37 % 101)) s"', {"reps": None, "max_reps": 5}, "max-reps", 5),
        (
            'echo "Time: $((n * n * 37 % 101)) s"',
            {"reps": None, "max_reps": 40, "max_time": 1e-6},
            "max-time",
            3,
        ),
    ],
)
def test_auto_records_the_rule_that_stopped_it(
    tmp_path: Path, body: str, update: dict[str, object], reason: str, blocks: int
) -> None:
    config = _config(tmp_path, body, **update)
    runner = _runner(tmp_path, config, {"native": NativeEnvironment()})
    outcome = runner.run()
    assert (outcome.stop_reason, outcome.blocks) == (reason, blocks)
    measured = runner.store.samples(runner.run_id, include_warmup=False)
    assert len(measured) == blocks
    runner.store.close()


def test_an_interrupted_loop_resumes_where_it_stopped(tmp_path: Path) -> None:
    log: list[str] = []
    names = ["native", "native-b"]
    config = _config(tmp_path, 'echo "Time: 1.$n s"', envs=tuple(names), reps=3)
    # The 4th run asked of native-b raises Ctrl-C: a few samples are done by then.
    first = {"native": Recording("native", log), "native-b": Recording("native-b", log, 4)}
    runner = _runner(tmp_path, config, dict(first))
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    done = runner.store.completed(runner.run_id)
    runner.store.close()
    assert 0 < len(done) < 8

    second = {"native": Recording("native", log), "native-b": Recording("native-b", log)}
    resumed = _runner(tmp_path, config, dict(second))
    resumed.run()
    samples = resumed.store.samples(resumed.run_id)
    keys = [s.key for s in samples]
    assert len(keys) == len(set(keys))  # nothing run twice
    assert {s.key for s in samples} >= done
    measured = [s for s in samples if not s.warmup]
    assert sorted((s.env, s.repetition) for s in measured) == sorted(
        (n, b) for n in names for b in range(3)
    )
    # The resumed process warmed up again (fresh environments) before measuring.
    warmups = [s for s in samples if s.warmup]
    assert len(warmups) > len(names)
    resumed.store.close()
