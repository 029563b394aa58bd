"""The errors of talking to a guest agent and of the commands run through it, apart
from the client (runtime/channels/agent.py) so that runtime/channels/guest_process.py,
which the client calls, can raise them too: a refusal, a program the guest lacks or cannot execute
(127, 126: as a shell), stdin larger than one agent message, a command interrupted or
timed out (and ended in the guest)."""

from __future__ import annotations

from hpcvm.errors import RuntimeFailure, UsageError


class AgentCommandError(RuntimeFailure):
    """The agent answered a command with an error; ``desc`` is its description."""

    def __init__(self, message: str, desc: str) -> None:
        super().__init__(message)
        self.desc = desc


NOT_FOUND_EXIT = 127  # as a shell: no such program
NOT_EXECUTABLE_EXIT = 126  # as a shell: found, but it cannot be executed
# The most stdin one guest-exec carries: qemu-ga's JSON parser refuses a message whose
# tokens exceed 64 MiB (MAX_TOKEN_SIZE, qobject/json-streamer.c), and ``input-data`` is
# base64 (4 bytes per 3); 64 KiB are left for the rest of the message.
MAX_INPUT = (64 * 1024 * 1024 - 64 * 1024) // 4 * 3


class ProgramNotFound(AgentCommandError):
    """The program to run does not exist in the guest (exit 127: a shell's "command
    not found")."""

    exit_code = NOT_FOUND_EXIT


class ProgramNotExecutable(AgentCommandError):
    """The program exists in the guest but cannot be executed (exit 126, as a shell)."""

    exit_code = NOT_EXECUTABLE_EXIT


class InputTooLarge(UsageError):
    """stdin for a guest command is more than one agent message carries (exit 2)."""


def check_input(program: str, data: bytes | None) -> None:
    """InputTooLarge when ``data`` is more than one guest-exec carries (MAX_INPUT)."""
    if data is not None and len(data) > MAX_INPUT:
        raise InputTooLarge(
            f"stdin for {program!r} is over {MAX_INPUT / (1 << 20):.1f} MiB, the most one guest "
            "agent message carries; put the data in a shared directory (--share) and give "
            "the command its path"
        )


class ExecInterrupted(KeyboardInterrupt):
    """A guest command was interrupted (Ctrl-C, SIGTERM) and ended in the guest first;
    ``what`` says what became of it. A KeyboardInterrupt, so every caller's cleanup
    runs as for Ctrl-C, and the CLI exits 130."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class CommandTimedOut(RuntimeFailure):
    """A guest command outlived its timeout and was ended; ``ended`` says how."""

    def __init__(self, message: str, ended: str) -> None:
        super().__init__(message, cause="timeout")
        self.ended = ended
