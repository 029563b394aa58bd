"""The settings registry: unknown names are one-line errors, every entry says what it
does in one line, boot settings never write, and a check reads what independent tools
(sysctl(8), the files themselves) read on this machine."""

from __future__ import annotations

import subprocess

import pytest

from hpcvm.errors import UsageError
from hpcvm.tune import snapshot_state
from hpcvm.tune.model import TuneTarget
from hpcvm.tune.registry import REGISTRY, get_setting
from hpcvm.tune.settings.boot import boot_advice, split_isolcpus
from hpcvm.tune.settings.kernel import STAT_INTERVAL
from hpcvm.tune.target import online_pus


def _target() -> TuneTarget:
    online = sorted(online_pus())
    assert len(online) >= 2, "the tune tests need a host with two PUs"
    return TuneTarget(vcpu_pus=(online[-1],), housekeeping_pus=(online[0],), source="test")


def test_unknown_setting_is_a_one_line_error_naming_the_known_ones() -> None:
    with pytest.raises(UsageError) as info:
        get_setting("nmi_watchdogg")
    message = str(info.value)
    assert "\n" not in message
    assert "'nmi_watchdogg'" in message
    assert all(name in message for name in REGISTRY)


def test_entries_are_named_and_explained_in_one_line() -> None:
    for name, setting in REGISTRY.items():
        assert setting.name == name
        assert get_setting(name) is setting
        assert setting.what and "\n" not in setting.what and len(setting.what) <= 110
        assert setting.when in ("runtime", "boot")


def test_boot_settings_never_write_and_runtime_rows_match_their_changes() -> None:
    target = _target()
    for setting in REGISTRY.values():
        row = setting.check(target)
        changes = setting.changes(target)
        if setting.when == "boot" or row.ok is not False:  # boot, ok or absent
            assert changes == [], setting.name
        else:
            assert changes, f"{setting.name} is not ok but apply would change nothing"


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("timer_migration", "kernel.timer_migration"),
        ("stat_interval", "vm.stat_interval"),
        ("numa_balancing", "kernel.numa_balancing"),
        ("watchdog_cpumask", "kernel.watchdog_cpumask"),
    ],
)
def test_check_reads_what_sysctl_reads(name: str, key: str) -> None:
    value = subprocess.run(
        ["sysctl", "-n", key], capture_output=True, text=True, check=True
    ).stdout.strip()
    row = get_setting(name).check(_target())
    assert row.has == value
    assert snapshot_state()[name] == value
    if name == "stat_interval":
        assert row.ok == (int(value) >= STAT_INTERVAL)


def test_snapshot_has_every_setting_and_the_applied_flag() -> None:
    snap = snapshot_state()
    assert list(snap) == [*REGISTRY, "hpcvm_tune"]
    assert all(isinstance(v, str) and v for v in snap.values())


def test_isolcpus_flags_and_cpus_are_told_apart() -> None:
    assert split_isolcpus("managed_irq,domain,2-3,7") == (
        "managed_irq,domain",
        frozenset({2, 3, 7}),
    )
    assert split_isolcpus("1,3") == ("", frozenset({1, 3}))


def test_boot_advice_names_the_exact_parameters_and_debian_steps() -> None:
    target = TuneTarget(vcpu_pus=(2, 3), housekeeping_pus=(0, 1), source="t")
    rows = [get_setting(n).check(target) for n in ("isolcpus", "rcu_nocbs", "irqaffinity")]
    tokens = {
        "isolcpus": "isolcpus=managed_irq,domain,2-3",
        "rcu_nocbs": "rcu_nocbs=2-3",
        "irqaffinity": "irqaffinity=0-1",
    }
    advice = boot_advice(
        [r.model_copy(update={"ok": False, "has": "not set"}) for r in rows], tokens
    )
    assert advice[0].endswith("isolcpus=managed_irq,domain,2-3 rcu_nocbs=2-3 irqaffinity=0-1")
    assert "GRUB_CMDLINE_LINUX" in advice[-1] and "update-grub" in advice[-1]
