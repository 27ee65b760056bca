"""Ctrl-C stops the study, whatever runs when it comes.

A SIGINT raised ``KeyboardInterrupt`` wherever the study stood: inside a weakref or garbage-collection callback
Python prints and drops it, and Lightning turns it into ``exit(1)`` and ignores SIGINT from then on. So the handler
also records that it came; the study checks the record after each job and stage, puts its own handler back before
each job, and ends with exit status 130 (128 + SIGINT, as a shell reports it) and a note of where it stopped.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

EXIT_INTERRUPTED = 130


class Interrupted(SystemExit):
    """The study stopped at the user's Ctrl-C (exit status 130)."""

    def __init__(self) -> None:
        super().__init__(EXIT_INTERRUPTED)


class Interrupts:
    """Records a SIGINT (and raises ``KeyboardInterrupt`` as Python's own handler does)."""

    def __init__(self) -> None:
        self.received = False

    def handle(self, signum: int, frame: Any) -> None:
        self.received = True
        raise KeyboardInterrupt

    def listen(self) -> None:
        """(Again) this handler for SIGINT: a library may have replaced it (Lightning ignores SIGINT after one)."""
        signal.signal(signal.SIGINT, self.handle)

    def check(self) -> None:
        """``KeyboardInterrupt`` if a SIGINT came, even one that a callback swallowed."""
        if self.received:
            raise KeyboardInterrupt


@contextmanager
def stopping_on_ctrl_c(say: Any, where: Any) -> Iterator[Interrupts]:
    """The block runs with ``Interrupts`` listening; a Ctrl-C (or the ``exit(1)`` Lightning makes of it) ends it
    with ``say("note: ...")`` naming ``where()`` and ``Interrupted``."""
    interrupts, previous = Interrupts(), signal.getsignal(signal.SIGINT)
    interrupts.listen()
    try:
        yield interrupts
        interrupts.check()
    except (KeyboardInterrupt, SystemExit) as stop:
        if not interrupts.received and not isinstance(stop, KeyboardInterrupt):
            raise
        say(f"note: interrupted (Ctrl-C) during {where()}; run the same command to go on from there (the finished "
            "jobs and stages are skipped)")
        raise Interrupted from None
    finally:
        signal.signal(signal.SIGINT, previous)
