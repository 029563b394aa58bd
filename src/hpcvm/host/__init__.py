"""host stage of the hpcvm pipeline (see DESIGN.md): read a machine into a HostTopology.

``discover()`` reads this host, a sysfs snapshot or an hwloc XML file; ``synthetic()``
builds one from an hwloc synthetic description. Both go through hwloc and one parser.
"""

from hpcvm.host.discover import discover, synthetic
from hpcvm.host.model import HostTopology

__all__ = ["HostTopology", "discover", "synthetic"]
