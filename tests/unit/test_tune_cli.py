"""`hpcvm tune` flags: each misuse is a one-line error with its exit code and leaves
nothing behind; --check reads the live host and writes nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcvm.tune.registry import REGISTRY
from hpcvm.tune.settings.boot import NOTHING_TO_ISOLATE
from hpcvm.tune.target import online_pus
from hpcvm.units import format_cpu_list


def tune(*args: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "tune", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _last() -> str:
    return str(max(online_pus()))


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--vcpu-pus", "1", "--plan", "p.json"], 2, "give one of"),
        (["--housekeeping-pus", "0"], 2, "goes with --vcpu-pus"),
        (["--check", "--dry-run", "--vcpu-pus", "1"], 2, "--dry-run goes with --apply"),
        (["--revert", "--vcpu-pus", "1"], 2, "takes no target"),
        (["--check"], 2, "say what to tune for"),
        (["--apply"], 2, "say what to tune for"),
        (["--vcpu-pus", "x-y"], 2, "--vcpu-pus 'x-y' is not a CPU list"),
        (["--vcpu-pus", "3-1"], 2, "--vcpu-pus '3-1' is not a CPU list"),
        (["--vcpu-pus", "1", "--housekeeping-pus", "0-x"], 2, "--housekeeping-pus '0-x'"),
        (["--vcpu-pus", "4096"], 2, "not online"),
        (["--plan", "/nonexistent/plan.json"], 2, "cannot read plan"),
        (["--for", "no-such-vm"], 2, "no VM named"),
        (["--apply", "--revert"], 2, "--apply and --revert exclude each other"),
        (["--revert", "--apply", "--vcpu-pus", "1"], 2, "exclude each other"),
        (["--check", "--apply", "--vcpu-pus", "1"], 2, "exclude each other"),
        (["--apply", "--json", "--vcpu-pus", "1"], 2, "--json goes with --check"),
        (["--apply", "--tuned-profile", "prof", "--vcpu-pus", "1"], 2, "drop --apply"),
    ],
)
def test_misuse_is_a_one_line_error(tmp_path: Path, args: list[str], code: int, words: str) -> None:
    done = tune(*args, state_dir=tmp_path / "state")
    assert done.returncode == code, done.stderr
    assert words in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "state").exists()


def test_all_pus_as_vcpus_leaves_no_housekeeping(tmp_path: Path) -> None:
    everything = format_cpu_list(sorted(online_pus()))
    done = tune("--apply", "--vcpu-pus", everything, state_dir=tmp_path / "s")
    assert done.returncode == 3
    assert "no housekeeping PU is left" in done.stderr
    assert not (tmp_path / "s").exists()


def test_a_file_that_is_not_a_plan_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"name": "x"}')
    done = tune("--check", "--plan", str(bad), state_dir=tmp_path / "s")
    assert done.returncode == 2
    assert "is not a plan" in done.stderr and "--format json" in done.stderr


def test_check_json_has_every_setting_and_writes_nothing(tmp_path: Path) -> None:
    done = tune("--check", "--json", "--vcpu-pus", _last(), state_dir=tmp_path / "s")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["name"] for r in rows] == list(REGISTRY)
    assert not (tmp_path / "s").exists()


def test_revert_with_nothing_saved_says_so(tmp_path: Path) -> None:
    done = tune("--revert", state_dir=tmp_path / "s")
    assert done.returncode == 0, done.stderr
    assert "nothing to revert" in done.stdout


def test_dry_run_lists_writes_and_saves_nothing(tmp_path: Path) -> None:
    done = tune("--apply", "--dry-run", "--vcpu-pus", _last(), state_dir=tmp_path / "s")
    assert done.returncode == 0, done.stderr
    assert "would write" in done.stdout or "nothing to change" in done.stdout
    assert not (tmp_path / "s").exists()


def test_tuned_profile_is_written_for_the_target(tmp_path: Path) -> None:
    out = tmp_path / "hpcvm-quiet"
    done = tune("--tuned-profile", str(out), "--vcpu-pus", _last(), state_dir=tmp_path / "s")
    assert done.returncode == 0, done.stderr
    assert f"isolated_cores={_last()}" in (out / "tuned.conf").read_text()


def test_check_reads_a_plan_that_hpcvm_plan_wrote(tmp_path: Path) -> None:
    plan = subprocess.run(
        [sys.executable, "-m", "hpcvm.cli.main", "plan", "--profile", "pinned", "--vcpus", "1",
         "--memory", "256M", "--format", "json"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    path = tmp_path / "plan.json"
    path.write_text(plan)
    pinned_pu = json.loads(plan)["placements"][0]["host_pu"]
    done = tune("--check", "--plan", str(path), state_dir=tmp_path / "s")
    assert done.returncode == 0, done.stderr
    assert f"vCPU PUs {pinned_pu}," in done.stdout
    tokens = json.loads(tune("--check", "--json", "--plan", str(path), state_dir=tmp_path).stdout)
    wanted = {r["name"]: r["wanted"] for r in tokens}["nohz_full"]
    # CPU 0, the kernel's boot CPU, is never isolated at boot (issue 36)
    assert wanted == (f"nohz_full={pinned_pu}" if pinned_pu else NOTHING_TO_ISOLATE)


def test_an_unwritable_state_dir_is_a_one_line_error() -> None:
    done = tune("--revert", state_dir=Path("/proc/hpcvm-no-such-dir/tune"))
    assert done.returncode == 10, done.stderr
    assert "cannot lock" in done.stderr and "--state-dir" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_bad_cpu_list_names_its_option_and_nothing_else(tmp_path: Path) -> None:
    done = tune("--vcpu-pus", "x-y", state_dir=tmp_path / "s")
    assert done.returncode == 2
    assert "None" not in done.stderr and "--housekeeping-pus" not in done.stderr


def test_masks_are_shown_decoded_in_both_columns(tmp_path: Path) -> None:
    """The kernel's hex masks (default_smp_affinity, the workqueue cpumask): what is
    wanted reads like what the host has, the mask and its PU list, and that list is the
    housekeeping PUs (every online PU but the vCPU's, from /sys)."""
    vcpu = _last()
    house = format_cpu_list(sorted(online_pus() - {int(vcpu)}))
    done = tune("--check", "--json", "--vcpu-pus", vcpu, state_dir=tmp_path / "s")
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    shape = re.compile(r"^[0-9a-f,]+ \((.+)\)$")
    for name in ("irq_default_affinity", "workqueue_cpumask"):
        row = rows[name]
        if row["ok"] is None:
            continue  # the host lacks it
        wanted, has = shape.match(row["wanted"]), shape.match(row["has"])
        assert wanted and has, row
        assert wanted.group(1) == house
