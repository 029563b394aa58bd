"""When a started VM is ready, for ``up``: how long to wait, the wait for the guest
agent's first answer, and the check from inside that the guest configured its NICs.

Why a module of its own: what "up" means to its callers (an agent that answers, NICs
that work) and how a guest that never gets there is reported (QEMU's death, or the
console log a failed ``up`` keeps) is one decision, apart from starting QEMU
(runtime/vm/lifecycle.py). Why in vm/: only ``up`` waits here, and the NIC check talks
to the guest as ``exec`` does (runtime/vm/guest_exec.py).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from hpcvm import timeline
from hpcvm.errors import HpcvmError, RuntimeFailure, UsageError
from hpcvm.plan.model import VMPlan
from hpcvm.runtime.channels import guest_markers
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.machine.model import Backend, ExecResult, Machine
from hpcvm.runtime.machine.options import UpOptions
from hpcvm.runtime.machine.timeouts import ENV_READY_TIMEOUT, PROMPT_POLL, READY_TIMEOUT
from hpcvm.runtime.net import network
from hpcvm.runtime.vm.boot import BootMedia

if TYPE_CHECKING:
    from hpcvm.runtime.channels.agent import GuestAgent


def ready_timeout(options: UpOptions, plan: VMPlan, media: BootMedia) -> float:
    """Seconds from QEMU's start to the agent's answer: ``--ready-timeout``, else
    ``$HPCVM_READY_TIMEOUT``, else the boot media's own or the runtime's for the
    accelerator."""
    if options.ready_timeout is not None:
        return options.ready_timeout
    from_env = env_ready_timeout()
    if from_env is not None:
        return from_env
    return (media.ready_timeouts or READY_TIMEOUT)[plan.accel]


def env_ready_timeout() -> float | None:
    """``$HPCVM_READY_TIMEOUT`` in seconds, None when unset; a value that is not a
    finite number above zero is refused before anything starts (a deadline already past
    would start QEMU only to tear it down)."""
    env = os.environ.get(ENV_READY_TIMEOUT)
    if not env:
        return None
    try:
        seconds = float(env)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"{ENV_READY_TIMEOUT}={env!r} is not a positive number of seconds")
    return seconds


def wait_for_agent(machine: Machine, backend: Backend, deadline: float, budget: float) -> None:
    """Wait until the guest agent answers; QEMU dying meanwhile is reported as QEMU's
    death, an agent that never answers by ``deadline`` with the console log."""
    from hpcvm.runtime.channels.agent import GuestAgent

    assert machine.boot.agent_socket is not None
    agent = GuestAgent(
        machine.boot.agent_socket, timeout=budget, console_log=machine.boot.serial_log
    )
    try:
        agent.wait_ready(deadline, lambda: backend.alive(machine))
    except HpcvmError as exc:
        if not backend.alive(machine):
            raise RuntimeFailure(backend.death_message(machine), cause="qemu") from exc
        raise RuntimeFailure(
            f"the guest agent did not answer within {budget:.0f} s; see the console log "
            f"{kept_console(machine)}"
        ) from exc
    finally:
        agent.close()


def check_guest_nics(machine: Machine) -> None:
    """When the guest configured its NICs itself (``hpcvm.net=``), check from inside
    that it did: a VM that is up without its network would fail only later, in the
    middle of an MPI job on several hosts. One agent call, only for VMs with NICs."""
    from hpcvm.runtime.verify.nics import check_nics
    from hpcvm.runtime.vm.guest_exec import connected

    if not machine.boot.nics or not machine.boot.share_table:
        return
    with connected(machine, timeout=60.0) as agent:
        guest_markers.wait_network_done(agent)
        timeline.mark("up: guest network done")
        prompt = _Prompt(agent)
        failed = [c for c in check_nics(machine.boot.nics, prompt) if not c.ok]
        taken = guest_markers.addresses_in_use(agent) if failed else []
    if taken:
        raise RuntimeFailure(
            f"address {', '.join(taken)} is in use on the segment already (the guest's "
            "duplicate address detection got an answer): choose another --address",
            cause=network.ADDRESS_IN_USE,
        )
    if failed:
        what = "; ".join(f"{c.name}: expected {c.expected}, got {c.actual}" for c in failed)
        raise RuntimeFailure(
            f"the guest did not configure its network ({what}); see the console log "
            f"{kept_console(machine)}"
        )


class _Prompt:
    """The agent's exec, its end asked for every ``PROMPT_POLL`` s: ``up`` waits for it
    (an ``ip`` run of 0.3-0.5 s under TCG was found up to 0.1 s late at the default)."""

    def __init__(self, agent: GuestAgent) -> None:
        self.agent = agent

    def exec(self, argv: list[str], timeout: float | None = None) -> ExecResult:
        return self.agent.exec(argv, timeout, poll_max=PROMPT_POLL)


def kept_console(machine: Machine) -> Path:
    """The console log as a failed ``up`` keeps it: ``up`` tears the VM down before its
    error is printed, so the message names where the log will be (teardown's
    ``keep_logs``), not the run directory that is about to go."""
    return paths.kept_log(machine.name, paths.CONSOLE_LOG)
