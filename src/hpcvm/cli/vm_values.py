"""What click parsed for the VM options (cli/vm_options.py), typed: one field per
option, each read once, into runtime/machine/options.py's ``VmRequest``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from hpcvm.errors import UsageError
from hpcvm.model import Frozen, first_complaint
from hpcvm.plan.model import AccelChoice, PlanRequest
from hpcvm.runtime.machine.options import VmOptions, VmRequest
from hpcvm.units import parse_size


class VmOptionValues(Frozen):
    """What click parsed for ``vm_options``, one field per option (its Python name)."""

    profile: str
    vcpus: int
    memory: str
    page_size: str | None
    housekeeping: int | None
    guest_nodes: int | None
    passthrough: tuple[str, ...]
    accel: AccelChoice
    backend: str
    connect_uri: str | None
    kernel: str | None
    initrd: str | None
    image: str | None
    shares: tuple[str, ...]
    network: str | None
    address: str | None
    ready_timeout: float | None

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> VmOptionValues:
        """The VM options among ``values`` (a command's other options are its own)."""
        return cls.model_validate({k: values[k] for k in cls.model_fields})

    def plan_request(self) -> PlanRequest:
        return PlanRequest.model_validate(
            {
                "profile": self.profile,
                "vcpus": self.vcpus,
                "memory_bytes": parse_size(self.memory, what="--memory"),
                "page_size_bytes": (
                    parse_size(self.page_size, what="--page-size") if self.page_size else None
                ),
                "housekeeping": self.housekeeping,
                "guest_nodes": self.guest_nodes,
                "passthrough": self.passthrough,
                "accel": self.accel,
            }
        )

    def vm(self) -> VmOptions:
        fields = self.model_dump(include=set(VmOptions.model_fields))
        try:
            return VmOptions.model_validate(fields)
        except ValidationError as exc:
            first = first_complaint(exc)
            option = "--" + str(first.loc[0]).replace("_", "-")
            raise UsageError(f"{option}: {first.msg}") from None

    def request(self) -> VmRequest:
        return VmRequest(plan=self.plan_request(), vm=self.vm())
