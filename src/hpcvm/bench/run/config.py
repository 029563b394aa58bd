"""What one ``hpcvm bench`` run was asked to do, as recorded in its database.

``identity()`` is the part that defines the measurement (environments, suites and their
settings, process counts, VM shape): a ``--resume`` must match it, or the resumed
samples would not belong with the recorded ones. The stopping settings (reps, target,
caps, timeout) may change on resume: asking an interrupted run for more repetitions is
a reasonable thing to do.
"""

from __future__ import annotations

from typing import Any, Literal

from hpcvm.bench.envs.kinds import canonical_env_names, parse_env
from hpcvm.bench.run.choices import DEFAULT_MAX_REPS as DEFAULT_MAX_REPS  # re-exported
from hpcvm.bench.run.choices import DEFAULT_MAX_TIME as DEFAULT_MAX_TIME
from hpcvm.bench.run.choices import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from hpcvm.bench.run.choices import DEFAULT_VM_MEMORY as DEFAULT_VM_MEMORY
from hpcvm.bench.suites.registry import SuiteOptions, derived_keys, suite_names
from hpcvm.errors import UsageError
from hpcvm.model import Frozen
from hpcvm.stats import DEFAULT_CONFIDENCE


class BenchConfig(Frozen):
    """Every setting of a bench run (see the CLI's help for each)."""

    envs: tuple[str, ...]
    suites: tuple[str, ...]
    np: tuple[int, ...] = (1,)
    reps: int | None = None  # None: auto
    min_reps: int = 3
    max_reps: int = DEFAULT_MAX_REPS
    max_time: float | None = DEFAULT_MAX_TIME  # seconds of measuring; None: no cap
    target: float = 0.01
    confidence: float = DEFAULT_CONFIDENCE
    seed: int | None = None  # None: drawn at random and recorded
    timeout: float = DEFAULT_TIMEOUT  # per sample
    vm_vcpus: int | None = None  # None: max(np)
    vm_memory: int = DEFAULT_VM_MEMORY
    vm_guest_nodes: int | None = None
    vm_backend: str = "qemu"  # a name in runtime/backends/registry.py BACKENDS
    native_cpus: tuple[int, ...] | Literal["all"] | None = None  # None: the VM's PUs
    nodes: int = 1  # --nodes: ranks spread over this many nodes of an allocation
    batch: str = "slurm"  # --batch: the batch system that gives those nodes (cluster/)
    container_runtime: str = "auto"  # --container-runtime: runtime/oci/runtime.py RUNTIMES or auto
    suite_options: SuiteOptions = SuiteOptions()

    def check(self) -> BenchConfig:
        """Refuse settings that cannot make a run (one-line UsageError)."""
        if not self.envs:
            raise UsageError("give at least one --env (native, container, vm:naive, vm:hpc, ...)")
        check_env_names(self.envs, self.nodes)
        if not self.suites:
            raise UsageError(f"give at least one --suite ({', '.join(suite_names())}) or --cmd")
        if not self.np or min(self.np) < 1:
            raise UsageError("--np takes positive process counts, e.g. --np 1,2")
        if self.reps is not None and self.reps < 1:
            raise UsageError(f"--reps must be auto or a positive number, not {self.reps}")
        if self.min_reps < 2:
            raise UsageError("at least 2 repetitions are needed for an interval")
        if self.max_reps < self.min_reps:
            raise UsageError(f"--max-reps {self.max_reps} is below the minimum {self.min_reps}")
        if not 0.0 < self.target < 1.0:
            raise UsageError(f"--target must be a fraction in (0, 1), e.g. 1%, not {self.target}")
        if not 0.0 < self.confidence < 1.0:
            raise UsageError(f"--confidence must be in (0, 1), e.g. 0.97, not {self.confidence}")
        if self.timeout <= 0 or (self.max_time is not None and self.max_time <= 0):
            raise UsageError("--timeout and --max-time must be positive durations")
        if self.nodes < 1:
            raise UsageError(f"--nodes must be 1 or more, not {self.nodes}")
        if self.vm_vcpus is not None and self.vm_vcpus < 1:
            raise UsageError(f"--vm-vcpus must be positive, not {self.vm_vcpus}")
        return self

    @property
    def vcpus(self) -> int:
        """vCPUs of every VM environment (of each node's VM with --nodes): --vm-vcpus,
        else the largest np (shared out over the nodes)."""
        if self.vm_vcpus is not None:
            return self.vm_vcpus
        return -(-max(self.np) // self.nodes)

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the recorded one."""
        # a kind's calibrated values (noise's quantum of work) are derived, not chosen:
        # a resumed run takes the recorded ones
        options = self.suite_options.model_dump(mode="json")
        derived = derived_keys()
        options["values"] = {k: v for k, v in options["values"].items() if k not in derived}
        return self.model_dump(
            mode="json",
            include={
                "envs",
                "suites",
                "np",
                "vm_vcpus",
                "vm_memory",
                "nodes",
                "vm_guest_nodes",
                "native_cpus",
                "container_runtime",
            },
        ) | {"suite_options": options}

    def record(self) -> dict[str, Any]:
        """Everything, for the database."""
        return self.model_dump(mode="json")


def check_env_names(envs: tuple[str, ...], nodes: int) -> None:
    """Every environment well formed, in its canonical spelling (the CLI writes it so,
    bench/envs/variants.py), once; a NIC variant only where VMs have a NIC (--nodes)."""
    canonical = canonical_env_names(envs)
    for typed, name in zip(envs, canonical, strict=True):
        if typed != name:
            raise UsageError(f"environment {typed!r} is written {name!r}: use that spelling")
        if nodes == 1 and parse_env(name).variant.nic is not None:
            raise UsageError(
                f"{name}: a NIC model matters across nodes only (a one-node VM has no NIC: "
                "its MPI ranks meet in shared memory); compare NIC models with --nodes N "
                "(e.g. --nodes 2 --batch local), or drop the NIC variant"
            )
