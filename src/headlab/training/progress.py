"""Progress lines in the job's log during long passes.

Lightning's rich progress bar writes nothing to a log file (``nohup``, SLURM, Hydra's ``<job>.log``) until its
stage ends, and ``enable_progress_bar=false`` shows nothing at all; a pass that runs for minutes then looks hung.
Every fine-tuning run, evaluation, gradient scoring and features pass logs one line per ``interval`` seconds
instead, for example ``evaluation: 120/313 batches (38%), 1:02 elapsed, about 1:40 left``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar

log = logging.getLogger(__name__)

INTERVAL_S = 60.0


def clock_time(seconds: float) -> str:
    """``75`` -> ``1:15``, ``3725`` -> ``1:02:05``."""
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class ProgressLines:
    """``label: done/total unit (percent), elapsed, about left``, logged at most once per ``interval`` seconds.

    ``total`` may be unknown (None or infinite): the line then says how many and how long only. ``done_before``: how
    many were done before this process started (a resumed run); the time left extrapolates from the rest."""

    def __init__(self, label: str, total: float | None, unit: str, interval: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, done_before: int = 0):
        self.label, self.unit, self.interval, self.clock, self.done_before = label, unit, interval, clock, done_before
        self.total = None if total is None or math.isinf(total) else int(total)
        self.start = self.last = clock()

    def update(self, done: int) -> None:
        """Log the line if ``interval`` seconds have passed since the last one (or the start)."""
        now = self.clock()
        if now - self.last >= self.interval:
            self.last = now
            log.info(self.line(done, now - self.start))

    def line(self, done: int, elapsed: float) -> str:
        if not self.total:
            return f"{self.label}: {done} {self.unit}, {clock_time(elapsed)} elapsed"
        rate = (done - self.done_before) / elapsed if elapsed > 0 else 0.0
        left = f", about {clock_time((self.total - done) / rate)} left" if rate > 0 and done < self.total else ""
        return (f"{self.label}: {done}/{self.total} {self.unit} ({100 * done / self.total:.0f}%), "
                f"{clock_time(elapsed)} elapsed{left}")


def counted_batches(batches: Iterable[dict[str, Any]], progress: ProgressLines) -> Iterator[dict[str, Any]]:
    """``batches`` unchanged; after each one is consumed, ``progress`` hears how many sequences are done."""
    done = 0
    for batch in batches:
        yield batch
        done += len(batch["input_ids"])  # input_ids: [batch, seq]
        progress.update(done)


class ProgressLog(pl.Callback):
    """Progress lines for Lightning's passes: training (optimizer steps of the whole run) and each validation
    (batches of all its data loaders, this rank's share), named by the module's ``pass_name`` if it has one. The
    sanity check is left out; rank zero logs."""

    def __init__(self, interval: float = INTERVAL_S):
        self.interval = interval
        self.training: ProgressLines | None = None
        self.validation: ProgressLines | None = None
        self.validated = 0

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.training = ProgressLines("training", trainer.estimated_stepping_batches, "steps", self.interval,
                                      done_before=trainer.global_step)  # > 0 when resumed from a checkpoint

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *args: Any) -> None:
        if self.training is not None and trainer.is_global_zero:
            self.training.update(trainer.global_step)

    def on_validation_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.validation = None if trainer.sanity_checking else ProgressLines(
            getattr(module, "pass_name", "validation"), sum(trainer.num_val_batches), "batches", self.interval)
        self.validated = 0

    def on_validation_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *args: Any) -> None:
        self.validated += 1
        if self.validation is not None and trainer.is_global_zero:
            self.validation.update(self.validated)


class NamedPassBar(RichProgressBar):
    """Lightning's rich progress bar, its validation bar named by the module's ``pass_name`` ("Gradient scoring",
    "Evaluation") instead of "Validation": the gradient pass of ``mode=importance`` is no validation."""

    @property
    def validation_description(self) -> str:
        module = self._trainer.lightning_module if self._trainer is not None else None
        name = getattr(module, "pass_name", None)
        return name[:1].upper() + name[1:] if name else super().validation_description

