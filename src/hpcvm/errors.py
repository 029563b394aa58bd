"""One error root for everything a user can cause or meet.

Each message is a single line that says what is wrong and what to do about it; the CLI
prints it without a traceback and exits with the class's exit code, so scripts can tell
a typo (usage) from a request the host cannot satisfy (infeasible) from a broken host.
"""

from __future__ import annotations


class HpcvmError(Exception):
    """Root of all hpcvm errors. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(
        self, message: str, *, cause: str | None = None, option: str | None = None
    ) -> None:
        """Two facts as data, for a caller that acts on them without reading the text:
        ``cause``, what went wrong (e.g. "housekeeping": the PUs are taken by
        housekeeping cores); ``option``, which field of the request the refusal is about
        (a ``PlanRequest`` field such as "vcpus" or "memory_bytes"), so that a command
        building that request from options of its own (``hpcvm bench``) can name its
        own option instead of the one the message names."""
        super().__init__(message)
        self.message = message
        self.cause = cause
        self.option = option

    def __str__(self) -> str:
        return self.message


class UsageError(HpcvmError):
    """The request itself is malformed: bad size, unknown profile, unknown device."""

    exit_code = 2


class InfeasiblePlanError(HpcvmError):
    """The request is well formed but this host cannot satisfy it (too many vCPUs,
    too little memory, not enough free huge pages, a device that cannot be passed)."""

    exit_code = 3


class TopologyError(HpcvmError):
    """The host description could not be read: missing or malformed sysfs root or XML,
    hwloc missing or failing."""

    exit_code = 4


class RuntimeFailure(HpcvmError):
    """Starting, talking to or stopping a VM failed (QEMU died, the agent timed out,
    libvirt refused)."""

    exit_code = 5


class VerificationFailed(HpcvmError):
    """A running VM does not match its plan."""

    exit_code = 6


class BenchmarkError(HpcvmError):
    """A benchmark run could not be set up or its results could not be stored."""

    exit_code = 7


class BusyError(HpcvmError):
    """Another live process writes the same thing now (a results directory, the host's
    tuning, a cluster job); hpcvm.lock says which process."""

    exit_code = 8


class SamplesFailed(HpcvmError):
    """A bench run ended, but some environment x suite has no valid sample: it did not
    measure what it was asked to (the table and the logs say why)."""

    exit_code = 9


class TuneError(HpcvmError):
    """Writing or restoring a host setting failed (hpcvm tune); the message says which
    file, what the kernel answered and what state the host was left in."""

    exit_code = 10


class NodeLost(HpcvmError):
    """A cluster job lost a node's VM while it ran (the VM died, its node's task
    failed): its MPI program cannot go on; the message names the node and the job's
    last complete checkpoint, from which a requeued job restores (cluster/commands/keeper.py)."""

    exit_code = 11
