"""VM variants as environments (bench/envs/variants.py): one rule parses every name, each
variant has one canonical spelling, a malformed or impossible one is refused in one
line naming the fix, and a variant is planned and placed exactly like its profile.

Oracles: the canonical names are written out here by hand from the syntax; the plans
of a variant and of its profile are made by the real planner on real machines'
topologies (../shared/topologies) and compared field by field as JSON, so any field
the variant changes beyond its own shows up; the hosts' page sizes come from the
snapshots' pools and CPU flags (what the host offers), not from hpcvm's code.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpcvm.bench.envs.kinds import canonical_env_names, parse_env
from hpcvm.bench.envs.variant_plans import check_placed_alike
from hpcvm.bench.envs.variants import VmVariant
from hpcvm.bench.envs.vm import plan_vm
from hpcvm.bench.run.config import BenchConfig
from hpcvm.errors import InfeasiblePlanError, UsageError
from hpcvm.host import HostTopology
from hpcvm.plan.model import VMPlan
from hpcvm.runtime.net.network import parse_network, with_nic_model
from hpcvm.units import GIB, KIB, MIB
from tests.conftest import TOPOLOGIES, sysfs_root
from tests.plan_checks import host_from, roomy, with_pools

SNAPS = ("40intel64-2g2n4c+pci", "16em64t-4s2c2t-offlines")


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        ("native", "native"),
        ("container", "container"),
        ("vm:hpc", "vm:hpc"),
        ("vm:hpc+e1000", "vm:hpc+e1000"),
        ("vm:hpc+nic=e1000", "vm:hpc+e1000"),
        ("vm:hpc+page=1g", "vm:hpc+page=1G"),
        ("vm:hpc+page=2048K", "vm:hpc+page=2M"),
        ("vm:hpc+thp=never+page=4K", "vm:hpc+page=4K+thp=never"),
        ("vm:naive+thp=always+virtio", "vm:naive+virtio+thp=always"),
    ],
)
def test_one_rule_one_spelling(typed: str, canonical: str) -> None:
    choice = parse_env(typed)
    assert choice.name == canonical
    assert parse_env(canonical) == choice


def test_the_variant_is_typed_data() -> None:
    choice = parse_env("vm:hpc+e1000+page=1G+thp=never")
    assert (choice.kind, choice.profile, choice.base) == ("vm", "hpc", "vm:hpc")
    assert choice.variant == VmVariant(nic="e1000", page=GIB, thp="never")
    assert choice.variant.record() == {"nic": "e1000", "page": GIB, "thp": "never"}
    assert choice.variant.differs_in() == [
        "NIC model e1000",
        "host page size 1G",
        "guest THP never",
    ]
    assert parse_env("vm:hpc").variant.is_base and parse_env("container").profile is None


@pytest.mark.parametrize(
    ("typed", "said", "fix"),
    [
        ("vm:fast", "unknown environment 'vm:fast'", "vm:hpc"),
        ("vm:hpc+", "empty variant part", "drop the extra '+'"),
        ("vm:hpc+huge=1G", "unknown variant key 'huge'", "page=4K|2M|1G"),
        ("vm:hpc+page=3M", "page='3M' is not a host page size", "page=4K or 2M or 1G"),
        ("vm:hpc+thp=sometimes", "is not a guest THP", "thp=always or madvise or never"),
        ("vm:hpc+rtl8139", "'rtl8139' is no variant", "KEY=VALUE"),
        ("vm:hpc+page=2M+page=4K", "gives page twice", "give it once"),
        ("vm:hpc+e1000+nic=virtio", "gives nic twice", "give it once"),
        ("container+page=4K", "unknown environment", "vm:hpc"),
    ],
)
def test_a_malformed_name_is_one_line_with_the_fix(typed: str, said: str, fix: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_env(typed)
    assert said in info.value.message and fix in info.value.message
    assert "\n" not in info.value.message and info.value.exit_code == 2


def test_two_spellings_of_one_variant_are_one_environment() -> None:
    with pytest.raises(UsageError, match="'vm:hpc\\+nic=e1000' and 'vm:hpc\\+e1000' are one"):
        canonical_env_names(("vm:hpc+nic=e1000", "vm:hpc+e1000"))
    assert canonical_env_names(("vm:hpc+thp=never+page=4K", "native")) == (
        "vm:hpc+page=4K+thp=never",
        "native",
    )


def test_a_nic_variant_needs_nodes() -> None:
    """A one-node VM has no NIC: a NIC model variant there would measure nothing."""
    config = BenchConfig(envs=("native", "vm:hpc+e1000"), suites=("netpipe",))
    with pytest.raises(UsageError, match="--nodes N"):
        config.check()
    config.model_copy(update={"nodes": 2}).check()
    with pytest.raises(UsageError, match="is written 'vm:hpc\\+page=4K\\+thp=never'"):
        BenchConfig(envs=("vm:hpc+thp=never+page=4K",), suites=("hpcc",)).check()


def test_a_nic_variant_sets_the_model_of_the_network_and_nothing_else() -> None:
    base = "bridge=br1,mtu=9000"
    varied = parse_network(with_nic_model(base, "e1000"))
    assert varied == replace(parse_network(base), model="e1000")
    assert with_nic_model(base, None) == base
    with pytest.raises(UsageError, match="has no NIC model"):
        with_nic_model("vf=auto", "e1000")


# -- planned alike ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=SNAPS)
def host(request: pytest.FixtureRequest, snapshots_dir: Path) -> HostTopology:
    return roomy(host_from("sysfs", str(sysfs_root(snapshots_dir, request.param))))


def _diff(a: Any, b: Any, path: str = "") -> set[str]:
    """The dotted paths where two JSON values differ (list items by index)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {p for k in a.keys() | b.keys() for p in _diff(a.get(k), b.get(k), f"{path}.{k}")}
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return {p for i, (x, y) in enumerate(zip(a, b, strict=True)) for p in _diff(x, y, path)}
    return set() if a == b else {path}


def _plan(host: HostTopology, variant: VmVariant, profile: str = "hpc") -> VMPlan:
    return plan_vm(profile, vcpus=4, memory_bytes=4 * GIB, host=host, variant=variant)[0]  # type: ignore[arg-type]


# What each variant may change of its profile's plan, and nothing else.
ALLOWED = {
    "page": {
        ".request.page_size_bytes",
        ".page_size_bytes",
        ".host_thp",
        ".memory.backend",
        ".memory.page_size_bytes",
        ".memory.mem_path",
        ".hugepages_needed",
        ".host_tuning",
        ".decisions",
    },
    "thp": {".request.guest_thp", ".guest_kernel_args", ".decisions"},
}


@pytest.mark.parametrize(
    ("key", "variant"),
    [
        ("page", VmVariant(page=4 * KIB)),
        ("page", VmVariant(page=GIB)),
        ("thp", VmVariant(thp="never")),
        ("thp", VmVariant(thp="always")),
    ],
)
def test_a_variant_changes_its_own_fields_only(
    host: HostTopology, key: str, variant: VmVariant
) -> None:
    base = _plan(host, VmVariant())
    varied = _plan(host, variant)
    changed = _diff(base.model_dump(mode="json"), varied.model_dump(mode="json"))
    assert changed, "the variant changed nothing"
    beyond = {p for p in changed if not any(p.startswith(a) for a in ALLOWED[key])}
    assert not beyond, beyond
    check_placed_alike({"vm:hpc": base, "vm:hpc+x": varied})
    if variant.thp is not None:
        assert varied.guest_kernel_args == (
            *base.guest_kernel_args,
            f"transparent_hugepage={variant.thp}",
        )
    if variant.page is not None:
        assert {m.page_size_bytes for m in varied.memory} == {variant.page}
        assert {m.backend for m in varied.memory} == {"ram" if variant.page == 4 * KIB else "file"}
        # 4K by name is 4K pages: the host's transparent huge pages kept off QEMU
        assert varied.host_thp == (variant.page != 4 * KIB) and base.host_thp


def test_a_variant_placed_elsewhere_is_refused(host: HostTopology) -> None:
    """Free 1G pages only on the node the 2M plan does not use would move the VM: the
    run refuses it rather than compare two placements."""
    base = _plan(host, VmVariant())
    used = {n for m in base.memory for n in m.host_nodes}
    others = [n.os_index for n in host.nodes if n.kind == "normal" and n.os_index not in used]
    if not others:
        pytest.skip("a one-node host cannot place the VM elsewhere")
    nodes = []
    for node in host.nodes:
        pools = tuple(
            p.model_copy(update={"free": 0 if node.os_index in used else p.free})
            if p.size_bytes == GIB
            else p
            for p in node.hugepages
        )
        nodes.append(node.model_copy(update={"hugepages": pools}))
    moved = _plan(host.model_copy(update={"nodes": tuple(nodes)}), VmVariant(page=GIB))
    assert {n for m in moved.memory for n in m.host_nodes}.isdisjoint(used)
    with pytest.raises(InfeasiblePlanError) as info:
        check_placed_alike({"vm:hpc": base, "vm:hpc+page=1G": moved})
    assert "vm:hpc+page=1G would be placed unlike vm:hpc" in info.value.message


def test_1g_pages_on_a_host_without_them_are_refused_with_the_fix(snapshots_dir: Path) -> None:
    """A host whose CPU lacks pdpe1gb and which has no 1G pool offers no 1G pages."""
    found = host_from("xml", str(TOPOLOGIES / "xml" / "24em64t-2n6c2t-pci.xml"))
    no_1g = with_pools(roomy(found), 2 * MIB, total=4096, free=4096)
    nodes = tuple(
        n.model_copy(update={"hugepages": tuple(p for p in n.hugepages if p.size_bytes != GIB)})
        for n in no_1g.nodes
    )
    flags = frozenset(f for f in found.cpu_flags if f != "pdpe1gb")
    host = no_1g.model_copy(update={"nodes": nodes, "cpu_flags": flags})
    with pytest.raises(InfeasiblePlanError) as info:
        _plan(host, VmVariant(page=GIB))
    said = info.value.message
    assert said.startswith("vm:hpc+page=1G: the host offers no 1G huge pages")
    assert "+page=4K|2M|1G" in said and "\n" not in said
    _plan(host, VmVariant(page=2 * MIB))  # what the message offers plans


def test_a_page_size_the_profile_does_not_use_is_refused(host: HostTopology) -> None:
    with pytest.raises(UsageError) as info:
        _plan(host, VmVariant(page=2 * MIB), profile="pinned")
    assert info.value.message.startswith("vm:pinned+page=2M: ")
    assert "+page=4K|2M|1G" in info.value.message


def test_a_guest_thp_mode_needs_the_memory_linux_keeps_thp_on_in(host: HostTopology) -> None:
    """Below 512 MiB of usable RAM a Linux guest turns THP off whatever its command line
    says (measured: a 512M guest shows never when asked for always): refused, naming
    bench's own option."""
    with pytest.raises(UsageError) as info:
        plan_vm("hpc", vcpus=1, memory_bytes=512 * MIB, host=host, variant=VmVariant(thp="always"))
    assert "--vm-memory" in info.value.message and "640M" in info.value.message
    plan_vm("hpc", vcpus=1, memory_bytes=640 * MIB, host=host, variant=VmVariant(thp="always"))
