"""Where a sample runs: natively or in a VM, behind one small interface.

``Environment.run(argv, workdir, timeout, outputs=...) -> RunOutput`` runs one suite
argv and returns its output, the host-side wall time and the evidence gathered around
it. The same argv runs both ways (the guest sees the host's root), and in both ways it
runs with the same clean environment (``env -i PATH=...``): qemu-guest-agent hands its
commands a bare environment, so the native run gets the same, or the two would not run
the same program.

Natively the argv is a child process in its own session (a Ctrl-C in the terminal
reaches hpcvm, which kills the whole benchmark process group itself). In a VM the files
``prepare`` wrote into the host work directory are recreated at the same path in the
guest (its root is the host's, read-only, under a writable tmpfs overlay), the argv runs
under a small shell wrapper that reads /proc/interrupts and the guest clock right around
it and enforces the timeout inside the guest (coreutils ``timeout``, which kills the
benchmark's whole process group), and the files the suite names are copied back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field

from hpcvm.bench.core.launch import CLEAN_ENV as CLEAN_ENV  # re-exported: runs are launched there
from hpcvm.bench.core.launch import STD_PATH as STD_PATH
from hpcvm.bench.core.launch import decode_output as decode_output
from hpcvm.bench.envs.variants import CONTAINER as CONTAINER  # re-exported: the names live there
from hpcvm.bench.envs.variants import NATIVE as NATIVE
from hpcvm.bench.envs.variants import VM_PREFIX as VM_PREFIX
from hpcvm.model import Frozen
from hpcvm.store.records import EnvKind, NewEnvironment


class RunOutput(Frozen):
    """What one run returned, as the runner records it."""

    exit_code: int
    stdout: str
    stderr: str
    host_seconds: float  # host wall time around the run (VM: around the agent call)
    guest_seconds: float | None = None  # the guest's own measure of the same run
    timed_out: bool = False
    evidence: dict[str, Any] = Field(default_factory=dict)


class Environment(Protocol):
    """A place to run samples; see the module docstring."""

    name: str
    kind: EnvKind
    vcpus: int  # CPUs a benchmark may use (np above this is refused)
    memory_bytes: int

    def start(self) -> None:
        """Make it ready (boot a VM and pause it); nothing natively."""
        ...

    def describe(self) -> NewEnvironment:
        """Plan, accelerator, CPU model and versions, for the store (after start)."""
        ...

    def activate(self) -> None:
        """About to measure here: resume a paused VM."""
        ...

    def deactivate(self) -> None:
        """Another environment is measured now: pause, so this one takes no CPU."""
        ...

    def run(
        self, argv: Sequence[str], workdir: Path, timeout: float, *, outputs: Sequence[str] = ()
    ) -> RunOutput: ...

    def close(self) -> None:
        """Release everything (a VM goes down); safe to call twice or before start."""
        ...
