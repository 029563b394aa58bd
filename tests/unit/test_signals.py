"""An interrupt whose KeyboardInterrupt Python swallows (raised inside a ``__del__``,
an at-fork hook of a Popen with ``preexec_fn``: "Exception ignored in ...") must still
stop the work. CI saw one bench finish and exit 0 after its Ctrl-C was lost that way."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import pytest

from hpcvm.signals import interrupting, raise_if_interrupted


class _InterruptsWhileDropped:
    """Sends this process SIGINT from its ``__del__``; the handler's exception is raised
    inside ``__del__`` (the loop's backward jump runs pending handlers) and swallowed."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass


@pytest.fixture
def swallowed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


def test_a_swallowed_interrupt_is_raised_when_the_block_ends(swallowed: list[Any]) -> None:
    reached = False
    with pytest.raises(KeyboardInterrupt), interrupting(signal.SIGINT):
        _InterruptsWhileDropped()
        reached = True
    assert reached, "the interrupt was not swallowed: this test no longer tests anything"
    assert [type(u.exc_value) for u in swallowed] == [KeyboardInterrupt]


def test_a_swallowed_interrupt_is_raised_at_the_next_check(swallowed: list[Any]) -> None:
    steps = 0
    with pytest.raises(KeyboardInterrupt), interrupting(signal.SIGINT):
        for _ in range(3):
            raise_if_interrupted()
            steps += 1
            _InterruptsWhileDropped()
    assert steps == 1
    assert len(swallowed) == 1


def test_an_interrupt_that_left_its_block_is_not_raised_again() -> None:
    with pytest.raises(KeyboardInterrupt), interrupting(signal.SIGINT):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
    raise_if_interrupted()  # nothing pending: returns
    with interrupting(signal.SIGINT):
        pass


def test_an_interrupt_turned_into_another_error_is_not_raised_later() -> None:
    with pytest.raises(RuntimeError), interrupting(signal.SIGINT):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        except KeyboardInterrupt as exc:
            raise RuntimeError("the move's outcome is unknown") from exc
    raise_if_interrupted()


def test_ctrl_c_swallowed_inside_the_default_block_is_raised(swallowed: list[Any]) -> None:
    """The bench's block names no signal (SIGTERM by default); Ctrl-C, left to Python's
    own handler, would be lost there: the block takes it over while that handler has it."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    reached = False
    with pytest.raises(KeyboardInterrupt), interrupting():
        _InterruptsWhileDropped()
        reached = True
    assert reached and len(swallowed) == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_ctrl_c_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupting():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
