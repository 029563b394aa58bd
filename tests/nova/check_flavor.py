"""Nova's own view of flavors on a compute host: run with .venv-nova's python.

Reads batches on stdin, one JSON line each, ``{"cases": [{"flavor": {...}, "host":
{...}}, ...]}``, and answers each with one JSON line on stdout: a list with one answer
per case, same order (one process serves many batches: importing Nova takes seconds).
Nothing here re-implements a Nova rule: every answer comes from Nova 34's code, so
hpcvm's tests can use it as their oracle.

- ``flavor``: ``name``, ``vcpus``, ``ram`` (MiB), ``extra_specs``.
- ``host``: the compute host as its libvirt driver would report it, built by the test
  from hwloc's view of a machine: ``cells`` (``id``, ``cpus``, ``siblings``,
  ``memory_mib``, ``pages``: ``[[size_kb, total], ...]``), ``dedicated`` and
  ``shared`` (``[compute] cpu_dedicated_set`` / ``cpu_shared_set``), ``smt`` (whether
  the host CPU has SMT: the HW_CPU_HYPERTHREADING trait).

Each answer: ``errors`` (Nova's extra spec validators), ``constraints``
(``numa_get_constraints``: cells with cpus, memory, pagesize, cpu and thread policy;
``emulator_threads_policy``), ``resources``/``required``/``forbidden``
(``ResourceRequest.from_request_spec``), ``topology`` (``get_best_cpu_topology``),
``fit`` (``numa_fit_instance_to_host`` on the host, all its cells free: host cell and
pinning per guest cell, or null), ``error`` (an exception Nova raised, as text).
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from typing import Any

warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

from nova.api.validation.extra_specs import validators  # noqa: E402
from nova.scheduler import utils as scheduler_utils  # noqa: E402
from nova.virt import hardware  # noqa: E402

from nova import exception, objects  # noqa: E402

objects.register_all()


def host_topology(host: dict[str, Any]) -> objects.NUMATopology:
    """The host NUMATopology as nova's libvirt driver builds it (_get_host_numa_topology):
    each cell's cpus split by cpu_shared_set / cpu_dedicated_set, siblings cut to the PUs
    in either set, the small-page pool and huge page pools."""
    shared, dedicated = set(host["shared"]), set(host["dedicated"])
    cells = []
    for cell in host["cells"]:
        cpus = set(cell["cpus"])
        siblings = [set(s) & (shared | dedicated) for s in cell["siblings"]]
        cells.append(
            objects.NUMACell(
                id=cell["id"],
                socket=None,
                cpuset=cpus & shared,
                pcpuset=cpus & dedicated,
                memory=cell["memory_mib"],
                cpu_usage=0,
                memory_usage=0,
                pinned_cpus=set(),
                siblings=[s for s in siblings if s],
                mempages=[
                    objects.NUMAPagesTopology(size_kb=size, total=total, used=0, reserved=0)
                    for size, total in cell["pages"]
                ],
                network_metadata=objects.NetworkMetadata(physnets=set(), tunneled=False),
            )
        )
    return objects.NUMATopology(cells=cells)


def flavor_object(flavor: dict[str, Any]) -> objects.Flavor:
    return objects.Flavor(
        name=flavor["name"],
        flavorid=flavor["name"],
        vcpus=flavor["vcpus"],
        memory_mb=flavor["ram"],
        root_gb=0,
        ephemeral_gb=0,
        swap=0,
        extra_specs=dict(flavor["extra_specs"]),
    )


def validation_errors(specs: dict[str, str]) -> list[str]:
    errors = []
    for name, value in specs.items():
        try:
            validators.validate(name, value)
        except exception.ValidationError as err:
            errors.append(str(err))
    return errors


def constraints_view(numa: Any) -> dict[str, Any] | None:
    if numa is None:
        return None
    cells = [
        {
            "id": cell.id,
            "cpus": sorted(cell.cpuset | cell.pcpuset),
            "memory": cell.memory,
            "pagesize": cell.pagesize,
            "cpu_policy": cell.cpu_policy,
            "cpu_thread_policy": cell.cpu_thread_policy,
        }
        for cell in numa.cells
    ]
    policy = numa.emulator_threads_policy if "emulator_threads_policy" in numa else None
    return {"cells": cells, "emulator_threads_policy": policy}


def fit_view(host: objects.NUMATopology, numa: Any) -> dict[str, Any] | None:
    fitted = hardware.numa_fit_instance_to_host(host, numa, provider_mapping=None)
    if fitted is None:
        return None
    cells = []
    for cell in fitted.cells:
        pinning = cell.cpu_pinning_raw if "cpu_pinning_raw" in cell else None
        pinning = pinning or {}
        reserved = cell.cpuset_reserved if "cpuset_reserved" in cell else None
        cells.append(
            {
                "host_cell": cell.id,
                "cpus": sorted(cell.cpuset | cell.pcpuset),
                "pinning": {str(v): p for v, p in sorted(pinning.items())},
                "pagesize": cell.pagesize,
                "memory": cell.memory,
                "reserved": sorted(reserved) if reserved else [],
            }
        )
    return {"cells": cells}


def resource_view(flavor: objects.Flavor, image: Any, numa: Any) -> dict[str, Any]:
    """Placement's side: the resources and traits the scheduler asks placement for
    (with PCPU tracking, hw:cpu_thread_policy becomes HW_CPU_HYPERTHREADING)."""
    spec = objects.RequestSpec(
        flavor=flavor, image=image, numa_topology=numa, is_bfv=False, requested_resources=[]
    )
    request = scheduler_utils.ResourceRequest.from_request_spec(spec)
    request.strip_zeros()
    unnumbered = request.get_request_group(None)
    return {
        "resources": dict(request.merged_resources()),
        "required": sorted(request.all_required_traits),
        "forbidden": sorted(unnumbered.forbidden_traits),
    }


def check(case: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = {"errors": validation_errors(case["flavor"]["extra_specs"])}
    try:
        flavor = flavor_object(case["flavor"])
        image = objects.ImageMeta.from_dict({"properties": {}})
        numa = hardware.numa_get_constraints(flavor, image)
        answer["constraints"] = constraints_view(numa)
        answer.update(resource_view(flavor, image, numa))
        best = hardware.get_best_cpu_topology(flavor, image)
        answer["topology"] = [best.sockets, best.cores, best.threads]
        answer["fit"] = fit_view(host_topology(case["host"]), numa) if numa else None
    except Exception as err:
        answer["error"] = f"{type(err).__name__}: {err}"
    return answer


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            cases = json.loads(line)["cases"]
            sys.stdout.write(json.dumps([check(case) for case in cases]) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
