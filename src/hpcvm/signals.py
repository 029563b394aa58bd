"""Signal handling shared by everything that must tear VMs down on the way out."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Let cleanup finish: a Ctrl-C or SIGTERM that arrives inside waits until the block
    is done, then is raised as KeyboardInterrupt, so a VM is never left half torn down.
    Outside the main thread (where handlers cannot be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def _remember(signum: int, _frame: object) -> None:
        pending.append(signum)

    for s in handlers:
        signal.signal(s, _remember)
    try:
        yield
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    if pending:
        raise KeyboardInterrupt


# Set by ``interrupting``'s handler, cleared once an exception has left its block.
# A handler's exception is swallowed where Python cannot raise (an at-fork hook of a
# Popen with preexec_fn, a __del__, a weakref callback: "Exception ignored in ..."); the
# flag keeps such an interrupt from being lost, so the work still stops at the next
# ``raise_if_interrupted`` or at the block's end.
_pending: list[int] = []


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt when an interrupt came inside ``interrupting`` and its
    exception was swallowed where it was raised. Long loops call it between steps."""
    if _pending:
        _pending.clear()
        raise KeyboardInterrupt


@contextlib.contextmanager
def interrupting(*signums: int) -> Iterator[None]:
    """Inside the block, ``signums`` (default SIGTERM: a batch system ending the job)
    raise KeyboardInterrupt like Ctrl-C, so the same cleanup runs; so does Ctrl-C
    (SIGINT) while Python's own handler has it, since that handler cannot remember an
    interrupt whose exception was swallowed. Such an interrupt is raised when the block
    ends. Outside the main thread (where handlers cannot be set) it does nothing."""
    wanted = set(signums or (signal.SIGTERM,))
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        wanted.add(signal.SIGINT)

    def _raise(signum: int, _frame: object) -> None:
        _pending.append(signum)
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    try:
        try:
            for s in sorted(wanted):
                previous[s] = signal.signal(s, _raise)
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    except BaseException:
        _pending.clear()  # the block is ending on its way out already
        raise
    raise_if_interrupted()
