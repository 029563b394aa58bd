"""The studies' comparison figures: memory-bound overhead per page-size combination,
NetPIPE against message size per environment (native, container, virtio, e1000), one
overhead figure with every environment, and next to each what its environments differ
in.

Layout and selection tests: the environments and their observed facts (host page,
guest THP, NIC) are written here as the store would hold them, rows from the suites'
real metric definitions with seeded random values. The oracles are those written facts
(the legend must name each VM's combination as given) and the registry's own metric
definitions (which metrics are memory-bound), never the figure code's helpers.
"""

from __future__ import annotations

import random
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from hpcvm.bench.suites.hpcc.suite import METRICS as HPCC
from hpcvm.bench.suites.netpipe.suite import METRICS as NETPIPE
from hpcvm.report.figures import overview_figure, pages_figure, render_figures
from hpcvm.report.labels import env_colours, env_order, label
from hpcvm.report.model import NATIVE, EnvInfo, ReportData, Row, RunInfo
from hpcvm.report.variables import differing
from hpcvm.report.write import write_report

# name -> (kind, profile, observed versions, variant)
Facts = tuple[str, str | None, dict[str, str], dict[str, str | int]]
ENVS: dict[str, Facts] = {
    NATIVE: ("native", None, {}, {}),
    "container": ("container", None, {"container_runtime": "runc 1.1.5"}, {}),
    "vm:hpc": ("vm", "hpc", {"host_page": "2M", "guest_thp": "always"}, {}),
    "vm:hpc+page=4K": ("vm", "hpc", {"host_page": "4K", "guest_thp": "always"}, {"page": 4096}),
    "vm:hpc+thp=never": ("vm", "hpc", {"host_page": "2M", "guest_thp": "never"}, {"thp": "never"}),
}
NET_ENVS: dict[str, Facts] = {
    NATIVE: ENVS[NATIVE],
    "container": ENVS["container"],
    "vm:hpc": ("vm", "hpc", {"host_page": "2M", "guest_thp": "always", "nic": "bridge=br0"}, {}),
    "vm:hpc+e1000": (
        "vm",
        "hpc",
        {"host_page": "2M", "guest_thp": "always", "nic": "bridge=br0,model=e1000"},
        {"nic": "e1000"},
    ),
}
MEMORY = {m.name for m in HPCC if m.memory_bound}


def _info(name: str, facts: Facts) -> EnvInfo:
    kind, profile, versions, variant = facts
    return EnvInfo(
        name=name,
        kind=kind,
        profile=profile,
        accel="native" if kind != "vm" else "tcg",
        cpu_model="x",
        versions=versions,
        vcpus=1,
        memory_bytes=1 << 30,
        variant=variant,
    )


def _rows(envs: dict[str, Facts], suite: str, metrics: tuple[object, ...]) -> list[Row]:
    rng = random.Random(27)
    rows = []
    for m in metrics:
        for env in envs:
            mean = rng.uniform(1.0, 100.0)
            row: dict[str, object] = {
                "env": env,
                "suite": suite,
                "metric": m.name,  # type: ignore[attr-defined]
                "unit": m.unit,  # type: ignore[attr-defined]
                "higher_is_better": m.higher_is_better,  # type: ignore[attr-defined]
                "np": 1 if suite == "hpcc" else None,
                "n": 3,
                "mean": mean,
                "ci_low": mean * 0.9,
                "ci_high": mean * 1.1,
            }
            if env != NATIVE:
                pct = rng.uniform(0.0, 50.0)
                row |= {
                    "overhead_pct": pct,
                    "overhead_ci_low": pct - 3,
                    "overhead_ci_high": pct + 3,
                }
            rows.append(Row.model_validate(row))
    return rows


def _data(envs: dict[str, Facts], rows: list[Row]) -> ReportData:
    run = RunInfo(
        id=1,
        results_dir="/nonexistent",
        status="finished",
        stop_reason="fixed",
        confidence=0.97,
        started_at=0.0,
        finished_at=1.0,
        elapsed_s=1.0,
        seed=1,
        hpcvm_version="test",
    )
    infos = tuple(_info(n, facts) for n, facts in envs.items())
    return ReportData(run=run, host=None, envs=infos, rows=tuple(rows))


def _bar_envs(fig: Figure) -> set[str]:
    return {
        str(p.get_gid())
        for ax in fig.axes
        for p in ax.patches
        if isinstance(p, Rectangle) and p.get_gid()
    }


def test_the_page_figure_draws_memory_bound_metrics_one_series_per_combination() -> None:
    data = _data(ENVS, _rows(ENVS, "hpcc", HPCC))
    drawn = pages_figure(data, env_colours(data.env_names), 0.97)
    assert drawn is not None
    fig, names = drawn
    vms = [n for n, facts in ENVS.items() if facts[0] == "vm"]
    assert sorted(names) == sorted(vms) and _bar_envs(fig) == set(vms)
    ticks = {t.get_text() for ax in fig.axes for t in ax.get_xticklabels() if t.get_text()}
    assert ticks == {label("hpcc", m, 1) for m in MEMORY}
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    for name in vms:
        versions = ENVS[name][2]
        assert f"{name}: host {versions['host_page']} / guest THP {versions['guest_thp']}" in legend


def test_no_page_figure_when_every_vm_has_the_same_pages() -> None:
    same = {n: ENVS[n] for n in (NATIVE, "container", "vm:hpc")}
    data = _data(same, _rows(same, "hpcc", HPCC))
    assert pages_figure(data, env_colours(data.env_names), 0.97) is None


def test_one_overview_has_every_environment_but_the_baseline() -> None:
    rows = _rows(ENVS, "hpcc", HPCC[:3]) + _rows(ENVS, "netpipe", NETPIPE)
    fig = overview_figure(rows, env_colours(ENVS), 0.97)
    assert fig is not None
    assert _bar_envs(fig) == set(ENVS) - {NATIVE}
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() if t.get_text()]
    sized = {m.name for m in NETPIPE if m.message_bytes is not None}
    assert not any(label("netpipe", m, None) in t for t in ticks for m in sized)


def test_what_the_environments_differ_in_is_read_from_their_records() -> None:
    data = _data(ENVS, [])
    assert differing(data.envs) == [
        "kind of environment (native, container, vm)",
        "host page size (2M, 4K)",
        "guest THP (always, never)",
    ]
    vms = [e for e in data.envs if e.name in ("vm:hpc", "vm:hpc+thp=never")]
    assert differing(vms) == ["guest THP (always, never)"]
    net = _data(NET_ENVS, []).envs
    assert differing([e for e in net if e.kind == "vm"]) == ["NIC model (virtio, e1000)"]


def test_every_figure_says_what_its_environments_differ_in(tmp_path: Path) -> None:
    rows = _rows(NET_ENVS, "netpipe", NETPIPE) + _rows(NET_ENVS, "hpcc", HPCC[:2])
    data = _data(NET_ENVS, rows)
    figures = {f.kind: f for f in render_figures(data, tmp_path)}
    assert {"sizes", "overview", "overhead", "absolute"} <= set(figures)
    assert "NIC model (virtio, e1000)" in figures["sizes"].differs
    assert "kind of environment (native, container, vm)" in figures["overview"].differs
    write_report(data, tmp_path, ("md", "html"))
    assert figures["sizes"].differs in (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    assert "NIC model (virtio, e1000)" in html


def test_environments_are_ordered_native_container_profile_then_its_variants() -> None:
    names = ["vm:hpc+page=4K", "vm:naive", "container", "vm:hpc", NATIVE, "vm:hpc+e1000"]
    assert env_order(names) == [
        NATIVE,
        "container",
        "vm:naive",
        "vm:hpc",
        "vm:hpc+e1000",
        "vm:hpc+page=4K",
    ]
