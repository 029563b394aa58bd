"""The host's NUMA distances as a lookup built once (node os_index pair -> distance)."""

from __future__ import annotations

from hpcvm.host.model import HostTopology
from hpcvm.plan.notes import Notes

LOCAL = 10
REMOTE = 20


def distance_map(host: HostTopology, notes: Notes) -> dict[tuple[int, int], int]:
    """Distances by (node, node). A host description without a full matrix gets the
    ACPI defaults (10 local, 20 remote) and a warning, so planning still works."""
    order = [n.os_index for n in host.nodes]
    rows = host.distances
    if len(rows) == len(order) and all(len(r) == len(order) for r in rows):
        out = {(a, b): rows[i][j] for i, a in enumerate(order) for j, b in enumerate(order)}
        bad = sorted({out[a, a] for a in order} - {LOCAL})
        if bad:
            notes.warn(
                f"the host's local NUMA distance is {bad[0]}, not {LOCAL}: QEMU and Linux "
                "expect 10, the guest may reject the distance table"
            )
        return out
    if len(order) > 1:
        notes.warn("the host description has no NUMA distance matrix: assuming 10 local, 20 remote")
    return {(a, b): LOCAL if a == b else REMOTE for a in order for b in order}
