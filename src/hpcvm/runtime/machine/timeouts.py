"""How long hpcvm waits for a VM, as plain numbers: the CLI shows them in ``--help``
without importing the runtime that uses them (runtime/vm/lifecycle.py)."""

from __future__ import annotations

ENV_READY_TIMEOUT = "HPCVM_READY_TIMEOUT"
READY_TIMEOUT = {"tcg": 90.0, "kvm": 30.0}  # seconds from QEMU start to the agent
DOWN_TIMEOUT = 30.0
EXEC_TIMEOUT_EXIT = 124  # like timeout(1)
# How often the end of a guest command someone is waiting for (up's NIC check, a
# cluster node's sshd start) is asked for at most; the agent's default backs off to
# 0.25 s, which is kinder to a long benchmark's guest (runtime/channels/agent.py)
PROMPT_POLL = 0.03
