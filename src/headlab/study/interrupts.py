"""Ctrl-C (SIGINT) and SIGTERM stop any job, the study included, whatever runs when they come.

A SIGINT raises ``KeyboardInterrupt`` and a SIGTERM ``Terminated`` wherever the process stood: inside a weakref or
garbage-collection callback Python prints and drops it, Lightning turns a ``KeyboardInterrupt`` into ``exit(1)``
(and ignores SIGINT from then on), and without a handler of ours Lightning's own SIGTERM handler only sets a flag
that an evaluation checks between batches. So the handler also records which signal came; the study checks the
record after each job and stage and puts its own handler back before each job. Either signal ends the command with
exit status 128 + the signal's number (130 for SIGINT, 143 for SIGTERM, as a shell reports them) and one
``note:`` line of where it stopped; files are written atomically, so what finished stays valid for a rerun.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}  # what stops a job, as the note names it
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143


class Terminated(BaseException):
    """Raised by the SIGTERM handler: a ``BaseException``, as ``KeyboardInterrupt`` (no ``except Exception`` takes
    it)."""


class Interrupted(SystemExit):
    """The command stopped at a signal: exit status 128 + its number."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(128 + signum)
        self.signum = signum


class Interrupts:
    """Records a SIGINT or SIGTERM, and raises ``KeyboardInterrupt`` (as Python's own handler does) or
    ``Terminated``."""

    def __init__(self) -> None:
        self.received: int | None = None  # the signal's number, once one came

    def handle(self, signum: int, frame: Any) -> None:
        self.received = signum
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated

    def listen(self) -> None:
        """(Again) this handler for both signals: a library may have replaced it (Lightning ignores SIGINT after
        one)."""
        for signum in SIGNALS:
            signal.signal(signum, self.handle)

    def check(self) -> None:
        """``KeyboardInterrupt`` if a signal came, even one that a callback swallowed."""
        if self.received is not None:
            raise KeyboardInterrupt


@contextmanager
def stopping_on_signals(say: Any, where: Any, rerun: str = "run the same command to go on from there (the finished "
                        "jobs and stages are skipped)") -> Iterator[Interrupts]:
    """The block runs with ``Interrupts`` listening; a Ctrl-C or SIGTERM (or the ``exit(1)`` Lightning makes of a
    Ctrl-C) ends it with ``say("note: ...")`` naming the signal, ``where()`` and ``rerun``, and ``Interrupted``. An
    ``Interrupted`` from a block inside (which said where) passes through. Off the main thread (where Python takes no
    handlers) the block runs as it is."""
    interrupts, previous = Interrupts(), {signum: signal.getsignal(signum) for signum in SIGNALS}
    if threading.current_thread() is not threading.main_thread():
        yield interrupts
        return
    interrupts.listen()
    try:
        yield interrupts
        interrupts.check()
    except (KeyboardInterrupt, Terminated, SystemExit) as stop:
        if isinstance(stop, Interrupted) or (interrupts.received is None and isinstance(stop, SystemExit)):
            raise
        signum = interrupts.received or (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
        say(f"note: interrupted ({SIGNALS[signum]}) during {where()}; {rerun}")
        raise Interrupted(signum) from None
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(signum, handler)
