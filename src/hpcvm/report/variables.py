"""What the environments of a figure differ in: the variables the studies varied.

A figure compares environments; its reader needs to know which one thing (or things)
set them apart: the kind of virtualization (native, container, VM), the VM profile, the
host page size under guest RAM, the guest's transparent huge pages, the NIC model. All
of it is read from what the store recorded of each environment, as observed where it
was observable (a VM's page size and THP mode after boot, bench/envs/vm.py; its NIC from
the network it was given), never from its name. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hpcvm.report.model import EnvInfo

NIC_DEFAULT = "virtio"  # runtime/net/network.py: a NIC without model= is virtio


def kind_of(e: EnvInfo) -> str:
    return e.kind


def profile_of(e: EnvInfo) -> str | None:
    return e.profile if e.kind == "vm" else None


def host_page_of(e: EnvInfo) -> str | None:
    """The host page size under a VM's RAM as observed after boot, else as planned."""
    if e.kind != "vm":
        return None
    seen = e.versions.get("host_page")
    if seen:
        return seen
    page = e.variant.get("page")
    return _size(page) if isinstance(page, int) else None


def guest_thp_of(e: EnvInfo) -> str | None:
    if e.kind != "vm":
        return None
    thp = e.versions.get("guest_thp") or e.variant.get("thp")
    return str(thp) if thp else None


def nic_of(e: EnvInfo) -> str | None:
    """A VM's NIC model where it had a NIC (``bench --nodes``): the variant's, else the
    network's ``model=``, else virtio."""
    if e.kind != "vm" or ("nic" not in e.versions and "nic" not in e.variant):
        return None
    if isinstance(e.variant.get("nic"), str):
        return str(e.variant["nic"])
    for part in e.versions.get("nic", "").split(","):
        key, _, value = part.partition("=")
        if key == "model":
            return value
    return NIC_DEFAULT


def _size(nbytes: int) -> str:
    from hpcvm.units import format_size

    return format_size(nbytes)


# (what it is called, how to read it of an environment); in the order a reader asks.
VARIABLES: tuple[tuple[str, Callable[[EnvInfo], str | None]], ...] = (
    ("kind of environment", kind_of),
    ("VM profile", profile_of),
    ("host page size", host_page_of),
    ("guest THP", guest_thp_of),
    ("NIC model", nic_of),
)


def differing(envs: Sequence[EnvInfo]) -> list[str]:
    """The variables whose values differ among ``envs`` (VMs only for VM variables),
    each with its values: ``["host page size (4K, 2M)", "guest THP (always, never)"]``."""
    out = []
    for name, read in VARIABLES:
        values = [v for v in (read(e) for e in envs) if v is not None]
        distinct = list(dict.fromkeys(values))
        if len(distinct) > 1:
            out.append(f"{name} ({', '.join(distinct)})")
    return out


def differs_line(envs: Sequence[EnvInfo]) -> str:
    """One sentence for a figure's caption."""
    found = differing(envs)
    if not found:
        return "The environments drawn differ in nothing hpcvm recorded beyond their names."
    return "The environments drawn differ in: " + "; ".join(found) + "."


def page_combination(e: EnvInfo) -> str:
    """``host 2M / guest THP always``: a VM's page-size combination."""
    return f"host {host_page_of(e) or '?'} / guest THP {guest_thp_of(e) or '?'}"
