"""SIGTERM in a run of several processes (DDP), without a collective inside the signal handler.

Lightning registers its own SIGTERM handler right before its loops run, in front of ours
(``headlab.study.interrupts``): it passes the signal on to the processes rank 0 started, then broadcasts a tensor from
inside the handler. A signal comes between any two instructions, so that broadcast meets the other ranks in the middle
of another collective (a gradient all-reduce): under NCCL the ranks wait on each other for ever, under gloo rank 1 dies
with a traceback ("Connection closed by peer"). Every rank gets the signal anyway (the launcher passes it on, and a
scheduler sends it to each), so ``PlainSigterm`` puts back a handler without the broadcast once Lightning's is in: pass
the signal on, then the handlers that were there before Lightning's (ours: ``Terminated``, exit status 143).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from lightning.pytorch.callbacks import Callback


class PlainSigterm(Callback):
    """Lightning's SIGTERM handler without its broadcast, in runs of several processes (module docstring)."""

    def restore(self, trainer: Any) -> None:
        if trainer.world_size <= 1 or threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        connector = trainer._signal_connector
        handlers = getattr(current, "signal_handlers", None)  # Lightning's _HandlersCompose
        if handlers is None:
            return
        before = [h for h in handlers if callable(h) and getattr(h, "__self__", None) is not connector]
        launcher = trainer.strategy.launcher

        def handle(signum: int, frame: Any) -> None:
            if launcher is not None and getattr(launcher, "procs", None):  # rank 0: the processes it started
                launcher.kill(signum)
            for handler in before:
                handler(signum, frame)

        signal.signal(signal.SIGTERM, handle)

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self.restore(trainer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.restore(trainer)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.restore(trainer)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self.restore(trainer)

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self.restore(trainer)
