"""VM variants: an environment names a profile plus the one thing it changes.

The studies compared ways of virtualizing side by side: host page sizes against guest
page sizes (memory virtualization), an emulated NIC against a paravirtual one. In hpcvm
each such variant is an environment of its own, so that one interleaved run measures
them all. One rule parses every environment name::

    ENV   := native | container | vm:PROFILE ( +PART )*
    PART  := KEY=VALUE | MODEL            (a bare NIC model: +e1000 is +nic=e1000)

Keys (``KEYS``, one entry each):

- ``nic=virtio|e1000``: the VMs' NIC model. Only ``bench --nodes`` gives a VM a NIC
  (its ranks talk over it); a one-node VM has none, so a NIC variant is refused there.
- ``page=4K|2M|1G``: the host page size under guest RAM (``--page-size``): 4K is
  anonymous memory (which the host's transparent huge pages may still back, recorded
  with the run), 2M and 1G are hugetlbfs.
- ``thp=always|madvise|never``: the guest kernel's transparent huge page mode
  (``transparent_hugepage=`` on its command line).

Keys combine (``vm:hpc+page=2M+thp=always``). A name has one canonical spelling: parts
in the order of ``KEYS``, the NIC model bare, sizes as 4K/2M/1G, so two spellings of
one variant are one environment. Every malformed name is one line naming the fix. What
a variant may not do on this host (1G pages it lacks, a page size its profile does not
use) the planner refuses, before anything starts (bench/envs/vm.py).

The kinds of environment (native, container, vm and a plugin's) and the one parser of
every name are bench/envs/kinds.py's; this module reads the VM names. Light on purpose:
``hpcvm bench --help`` imports it (no pydantic).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, fields, replace
from typing import Any

from hpcvm.errors import UsageError
from hpcvm.nic_models import NIC_MODELS
from hpcvm.plan.names import PAGE_SIZE_CHOICES, PROFILE_NAMES, THP_MODES, ProfileName
from hpcvm.registry import Registry
from hpcvm.units import format_size, parse_size

NATIVE = "native"  # the names of the built-in kinds (bench/envs/kinds.py registers them)
CONTAINER = "container"
VM_PREFIX = "vm:"
SEP = "+"


@dataclass(frozen=True)
class VmVariant:
    """What a VM environment changes of its profile; None: the profile's own."""

    nic: str | None = None  # "virtio", "e1000"
    page: int | None = None  # bytes: 4096, 2 MiB, 1 GiB
    thp: str | None = None  # "always", "madvise", "never"

    def parts(self) -> list[str]:
        """The canonical ``+`` parts, in the order of ``KEYS``."""
        return [k.write(v) for k in KEYS.values() if (v := getattr(self, k.field)) is not None]

    def differs_in(self) -> list[str]:
        """What it changes, in words: ``["NIC model e1000", "guest THP never"]``."""
        return [
            f"{k.variable} {k.show(v)}"
            for k in KEYS.values()
            if (v := getattr(self, k.field)) is not None
        ]

    def record(self) -> dict[str, str | int]:
        """As the store keeps it: the keys it sets, by their names."""
        return {
            k.name: v for k in KEYS.values() if isinstance(v := getattr(self, k.field), str | int)
        }

    @property
    def is_base(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))


BASE = VmVariant()  # a profile as it is: the default of every variant argument


@dataclass(frozen=True)
class VariantKey:
    """One key of the variant syntax: how it is written, read and named."""

    name: str  # as typed before '='
    field: str  # the VmVariant field it sets
    variable: str  # what it varies, in words ("host page size")
    # canonical values, for messages and help; for NIC models the live registry
    # (nic_models.py), which a plugin adds to
    choices: Collection[str]
    read: Callable[[str], object | None]  # the typed value of a text, None if invalid
    show: Callable[[object], str]  # the canonical text of a value
    bare: bool = False  # its values may be written alone (+e1000)

    def write(self, value: object) -> str:
        text = self.show(value)
        return text if self.bare else f"{self.name}={text}"


def _read_choice(choices: Collection[str]) -> Callable[[str], object | None]:
    return lambda text: text if text in choices else None


def _show_size(value: object) -> str:
    return format_size(value) if isinstance(value, int) else str(value)


def _read_page(text: str) -> object | None:
    try:
        size = parse_size(text, what="page size")
    except UsageError:
        return None
    return size if size in PAGE_SIZE_CHOICES else None


KEYS: Registry[VariantKey] = Registry("variant key")
KEYS.register(
    "nic",
    VariantKey(
        name="nic",
        field="nic",
        variable="NIC model",
        choices=NIC_MODELS,
        read=_read_choice(NIC_MODELS),
        show=str,
        bare=True,
    ),
)
KEYS.register(
    "page",
    VariantKey(
        name="page",
        field="page",
        variable="host page size",
        choices=tuple(format_size(s) for s in PAGE_SIZE_CHOICES),
        read=_read_page,
        show=_show_size,
    ),
)
KEYS.register(
    "thp",
    VariantKey(
        name="thp",
        field="thp",
        variable="guest THP",
        choices=THP_MODES,
        read=_read_choice(THP_MODES),
        show=str,
    ),
)


@dataclass(frozen=True)
class EnvChoice:
    """One parsed environment name: its kind, and for a VM its profile and variant."""

    kind: str
    profile: ProfileName | None = None  # for a VM
    variant: VmVariant = BASE

    @property
    def name(self) -> str:
        """The canonical name: what tables, the database and ``--compare`` use."""
        if self.profile is None:
            return self.kind
        return SEP.join([f"{VM_PREFIX}{self.profile}", *self.variant.parts()])

    @property
    def base(self) -> str:
        """The environment this one varies (``vm:hpc`` for ``vm:hpc+e1000``)."""
        return self.kind if self.profile is None else f"{VM_PREFIX}{self.profile}"


def syntax() -> str:
    """The variant syntax in one phrase, for help and messages."""
    keys = []
    for key in KEYS.values():
        keys.append(f"{key.name}={'|'.join(key.choices)}")
        if key.bare:
            keys[-1] += f" (or +{'|+'.join(key.choices)})"
    return "a VM profile may add +KEY=VALUE variants: " + ", ".join(keys)


def parse_vm(name: str) -> tuple[ProfileName, VmVariant] | None:
    """The profile and variant of a VM environment name (``vm:hpc+e1000``); None for a
    name that is not ``vm:PROFILE...``; UsageError for a malformed variant part."""
    head, *parts = name.split(SEP)
    profile = head.removeprefix(VM_PREFIX)
    if not head.startswith(VM_PREFIX) or profile not in PROFILE_NAMES:
        return None
    variant = VmVariant()
    for part in parts:
        variant = _with_part(name, variant, part)
    return next(p for p in PROFILE_NAMES if p == profile), variant


def vm_names() -> tuple[str, ...]:
    """The VM environments of the profiles, as help lists them."""
    return tuple(f"{VM_PREFIX}{p}" for p in PROFILE_NAMES)


def _with_part(name: str, variant: VmVariant, part: str) -> VmVariant:
    key_name, sep, text = part.partition("=")
    if not part:
        raise UsageError(f"environment {name!r} has an empty variant part: drop the extra '+'")
    if not sep:
        bare = [k for k in KEYS.values() if k.bare and k.read(part) is not None]
        if not bare:
            raise UsageError(
                f"environment {name!r}: {part!r} is no variant: write KEY=VALUE ({syntax()})"
            )
        key, text = bare[0], part
    else:
        if key_name not in KEYS:
            raise UsageError(f"environment {name!r}: unknown variant key {key_name!r}: {syntax()}")
        key = KEYS[key_name]
    value = key.read(text)
    if value is None:
        raise UsageError(
            f"environment {name!r}: {key.name}={text!r} is not a {key.variable}: use "
            f"{key.name}={' or '.join(key.choices)}"
        )
    if getattr(variant, key.field) is not None:
        raise UsageError(f"environment {name!r} gives {key.name} twice: give it once")
    update: dict[str, Any] = {key.field: value}
    return replace(variant, **update)
