"""Where ``bench``, ``results`` and ``report`` write, refused in one line before anything
starts when it cannot take their files, and the small things their output says.

Run as root here, so only what root is refused too is tested (an empty path, a file
where a directory must be, a directory where a file must be, a missing parent, a
zero or negative suite option); paths a user may not write are refused the same way
as that user in tests/integration/test_results_shared.py. Each refusal: exit 2, one
line ``hpcvm: error: ...`` naming the path and the fix, nothing made or changed. The
conditions table is rendered by a real rich Console 80 columns wide, from records
written to and read back from a real results database.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from hpcvm.bench.results.failures import cell_failures
from hpcvm.bench.results.results import summaries
from hpcvm.cli.bench_view import CONDITIONS, print_report
from hpcvm.cli.main import main
from hpcvm.store import NewEnvironment, Store
from tests.unit.test_store_readonly import make_results

NATIVE_NOISE = ["bench", "--env", "native", "--suite", "noise", "--reps", "2"]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("hpcvm: error: ") and "Traceback" not in err
    return err


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_bench_out_empty_is_refused_and_writes_nothing_into_the_working_directory(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*NATIVE_NOISE, "--out", ""]) == 2
    assert "--out is empty: give a path" in one_line_error(capsys)
    assert tree(cwd) == []


def test_bench_out_that_is_a_file_is_refused_untouched(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cwd / "passwd").write_text("root:x:0:0\n")
    assert main([*NATIVE_NOISE, "--out", "passwd"]) == 2
    assert "--out passwd exists and is not a directory" in one_line_error(capsys)
    assert tree(cwd) == ["passwd"] and (cwd / "passwd").read_text() == "root:x:0:0\n"


def test_bench_out_under_a_file_is_refused_naming_the_file(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cwd / "f").write_text("")
    assert main([*NATIVE_NOISE, "--out", "f/a/b"]) == 2
    assert f"{cwd / 'f'} is not a directory" in one_line_error(capsys)
    assert tree(cwd) == ["f"]


@pytest.mark.parametrize(
    ("option", "value"),
    [("--noise-quanta", "0"), ("--noise-quanta", "-5"), ("--noise-quantum-us", "0")],
)
def test_zero_or_negative_noise_options_are_refused_before_any_directory(
    cwd: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    assert main([*NATIVE_NOISE, option, value, "--out", "a/b"]) == 2
    err = one_line_error(capsys)
    assert f"{option} must be a positive number, not {value}" in err
    assert tree(cwd) == []  # neither a nor a/b, nor a lock


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_results(tmp_path_factory.mktemp("results"))


@pytest.mark.parametrize(
    ("csv", "message"),
    [
        ("", "--csv is empty"),
        (".", "--csv . is a directory: give a file name"),
        ("missing/x.csv", "the directory {cwd}/missing does not exist"),
    ],
)
def test_results_csv_that_cannot_be_a_file_is_refused(
    results: Path, cwd: Path, capsys: pytest.CaptureFixture[str], csv: str, message: str
) -> None:
    assert main(["results", str(results), "--csv", csv]) == 2
    assert message.format(cwd=cwd) in one_line_error(capsys)
    assert tree(cwd) == []


def test_results_csv_is_written_where_asked(
    results: Path, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", str(results), "--csv", "s.csv"]) == 0
    assert (cwd / "s.csv").read_text().startswith("run_id,env,")
    assert tree(cwd) == ["s.csv"]


def test_report_out_empty_is_refused(
    results: Path, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(results), "--out", ""]) == 2
    assert "--out is empty" in one_line_error(capsys)
    assert tree(cwd) == []


def test_report_counts_one_figure_and_one_file_in_the_singular(
    results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two identical runs of one cmd metric: their figures are drawn in one PNG."""
    out = tmp_path / "rep"
    assert main(["report", str(results), "--compare", str(results), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    pngs = list((out / "figures").glob("*.png"))
    assert len(pngs) == 1
    assert "compared 2 figures: 0 changed significantly" in printed
    assert f"figures: 1 PNG file in {out.absolute() / 'figures'}\n" in printed


def _vm_results(directory: Path) -> Path:
    """Conditions as a VM variant records them (bench/envs/vm.py writes these versions)."""
    with Store.open(directory, create=True) as store:
        run_id = store.create_run(
            args={"native": {"cpus": [0, 1], "mems": [0]}}, seed=1, confidence=0.97
        )
        store.add_environment(
            run_id,
            NewEnvironment(
                name="native",
                kind="native",
                accel="native",
                cpu_model="Intel(R) Xeon(R) Platinum 8480+",
                vcpus=2,
                memory_bytes=1 << 30,
            ),
        )
        store.add_environment(
            run_id,
            NewEnvironment(
                name="vm:hpc+page=4K+thp=always",
                kind="vm",
                profile="hpc",
                accel="tcg",
                cpu_model="Intel(R) Xeon(R) Platinum 8480+",
                versions={
                    "qemu": "7.2.11",
                    "host_page": "4K",
                    "guest_ram_on_host_thp": "100M",
                    "guest_thp": "always",
                },
                vcpus=2,
                memory_bytes=1 << 30,
                variant={"page": 4096, "thp": "always"},
            ),
        )
    return directory


@pytest.mark.parametrize("width", [80, 200])
def test_no_condition_is_cut_at_80_columns(tmp_path: Path, width: int) -> None:
    with Store.open(_vm_results(tmp_path)) as store:
        run = store.run()
        envs = store.environments(run.id)
        rows = summaries(store, run.id)
        failures = cell_failures(store.samples(run.id))
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=True, color_system=None)
    print_report(console, run, envs, rows, failures)
    text = buffer.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    for value in (
        "4K (100M on THP) / THP always",
        "vm:hpc+page=4K+thp=always",
        "0-1 (nodes 0)",
        "QEMU 7.2.11",
        "host page size 4K,",
        *CONDITIONS,
    ):
        assert value in text, value
    for word in ("Intel(R)", "Xeon(R)", "Platinum", "8480+"):
        assert word in text
