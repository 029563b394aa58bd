"""The small pieces under discover(): hwloc's bitmap strings, its XML parser's refusals,
and isolation from the caller's HWLOC_* environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcvm.errors import TopologyError
from hpcvm.host import discover
from hpcvm.host.hwloc import parse, parse_bitmap
from tests.conftest import TOPOLOGIES, sysfs_root


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0x00000001", {0}),
        ("0x000000ff,0xffffffff", set(range(40))),
        ("0x00000003,,0x00000001", {0, 64, 65}),  # an empty word is zero
        ("0xf...f,0x00000005", {0, 2}),  # the infinite tail is dropped
        ("0x0", set()),
        ("", set()),
    ],
)
def test_parse_bitmap(text: str, expected: set[int]) -> None:
    assert parse_bitmap(text) == expected


def test_parse_refuses_xml_without_pus() -> None:
    text = (
        '<topology version="2.0"><object type="Machine" os_index="0" cpuset="0x0" '
        'complete_cpuset="0x0" nodeset="0x1" complete_nodeset="0x1">'
        '<object type="NUMANode" os_index="0" cpuset="0x0" nodeset="0x1" local_memory="1"/>'
        "</object></topology>"
    )
    with pytest.raises(TopologyError, match="no processing unit"):
        parse(text, what="test.xml")


@pytest.mark.parametrize("text", ["<topology", "<domain/>", '<topology version="2.0"/>'])
def test_parse_refuses_what_is_not_a_topology(text: str) -> None:
    with pytest.raises(TopologyError, match=r"test\.xml"):
        parse(text, what="test.xml")


def test_callers_hwloc_environment_does_not_leak(
    snapshots_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HWLOC_XMLFILE / HWLOC_SYNTHETIC in the user's environment would replace the source
    asked for; discover() must read the snapshot it was given."""
    root = sysfs_root(snapshots_dir, "2amd64-2n")
    expected = discover(sysfs_root=root)
    monkeypatch.setenv("HWLOC_XMLFILE", str(TOPOLOGIES / "xml" / "192em64t-24n8c2t.xml"))
    monkeypatch.setenv("HWLOC_SYNTHETIC", "pack:3 pu:3")
    assert discover(sysfs_root=root) == expected
