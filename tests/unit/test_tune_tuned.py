"""The generated tuned profile: an INI file tuned's loader can read (configparser reads
the same syntax), including cpu-partitioning with the plan's vCPU PUs as isolated_cores,
and never naming a housekeeping PU as isolated."""

from __future__ import annotations

import configparser

from hypothesis import given
from hypothesis import strategies as st

from hpcvm.tune.cpumask import parse_list, parse_mask
from hpcvm.tune.model import TuneTarget
from hpcvm.tune.tuned import tuned_profile


@given(
    st.sets(st.integers(0, 255), min_size=2).flatmap(
        lambda pus: st.tuples(st.just(sorted(pus)), st.integers(1, len(pus) - 1))
    )
)
def test_profile_isolates_exactly_the_vcpu_pus(case: tuple[list[int], int]) -> None:
    pus, split = case
    target = TuneTarget(
        vcpu_pus=tuple(pus[split:]), housekeeping_pus=tuple(pus[:split]), source="VM x"
    )
    ini = configparser.ConfigParser(interpolation=None)
    ini.optionxform = str  # type: ignore[assignment,method-assign]
    ini.read_string(tuned_profile(target))
    assert ini["main"]["include"] == "cpu-partitioning"
    assert parse_list(ini["variables"]["isolated_cores"]) == set(target.vcpu_pus)
    assert parse_list(ini["sysctl"]["kernel.watchdog_cpumask"]) == set(target.housekeeping_pus)
    mask = ini["sysfs"]["/sys/devices/virtual/workqueue/cpumask"]
    assert parse_mask(mask) == set(target.housekeeping_pus)
    assert ini["cpu"]["devices"] == ",".join(f"cpu{c}" for c in target.vcpu_pus)
