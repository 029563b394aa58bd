"""host stage of the hpcvm pipeline (see DESIGN.md): read a machine into a HostTopology.

``discover()`` reads this host, a sysfs snapshot or an hwloc XML file; ``synthetic()``
builds one from an hwloc synthetic description. Both go through hwloc and one parser.
"""

from typing import TYPE_CHECKING

from hpcvm.lazy import lazy_exports

if TYPE_CHECKING:
    from hpcvm.host.discover import discover, synthetic
    from hpcvm.host.model import HostTopology

__all__ = [
    "HostTopology",
    "discover",
    "synthetic",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "hpcvm.host.discover": ("discover", "synthetic"),
        "hpcvm.host.model": ("HostTopology",),
    },
)
