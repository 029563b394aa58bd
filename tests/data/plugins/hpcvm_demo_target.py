"""A throw-away render target registered from outside hpcvm (tests/unit/test_plugins.py):
one module, one registry call. It prints each vCPU and the host PU it is pinned to."""

from hpcvm.host.model import HostTopology
from hpcvm.plan.model import VMPlan
from hpcvm.render.targets import RenderTarget, register


def _pins(plan: VMPlan, host: HostTopology) -> str:
    return "\n".join(f"vcpu{p.vcpu} pu{p.host_pu}" for p in plan.placements)


register(RenderTarget("pins", _pins, "vCPU to host PU, one per line (a test plugin)"))
