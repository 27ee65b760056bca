"""The training order, and resuming it in the middle of an epoch.

``EpochSampler`` draws each epoch's order from ``(seed, epoch)`` (``DistributedSampler``'s permutation, this
process's share of it; one process takes all of it), so a resumed run can draw the interrupted epoch's order again.
``ResumeMidEpoch`` then makes the sampler skip the batches the checkpoint had already trained on. Without it
Lightning (2.6) restarts a plain loader from the epoch's first batch and stops after the remaining count: a run
resumed from a validation's ``last.ckpt`` trained twice on the epoch's first batches and never on its last ones.

Lightning's own stateful-loader route (``state_dict``/``load_state_dict`` on the loader) is not taken: its states are
not restored when ``configure_optimizers`` reads ``trainer.estimated_stepping_batches``, as the schedule here does
(Lightning issue 20550). The loops' restored progress says the same: the batches done in the current epoch.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch.utils.data import DataLoader, DistributedSampler


class EpochSampler(DistributedSampler):
    """A permutation per epoch from ``(seed, epoch)``, this process's share. ``resume(epoch, skip)``: the next
    iteration is that epoch's order without its first ``skip`` samples. Its length stays the whole share."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int, seed: int):
        super().__init__(dataset, num_replicas, rank, shuffle=True, seed=seed)
        self.resumed: tuple[int, int] | None = None
        self.iterations = 0  # iterations begun: a loader with worker processes begins one when it is created

    def resume(self, epoch: int, skip: int) -> None:
        self.resumed = (epoch, skip)

    def __iter__(self) -> Iterator[int]:
        skip = 0
        if self.resumed is not None:  # over Lightning's set_epoch, which comes before the iteration begins
            (self.epoch, skip), self.resumed = self.resumed, None
        indices = list(super().__iter__())  # [num_samples] of this process, for self.epoch
        self.iterations += 1
        return iter(indices[skip:])


class ResumeMidEpoch(pl.Callback):
    """On a run resumed from a checkpoint written during an epoch, the train loader's ``EpochSampler`` goes on
    from the first batch the checkpoint had not trained on, in the same order."""

    def __init__(self):
        # Lightning's warning on resuming a loader without state_dict: this callback does what it asks for.
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch",
                                category=PossibleUserWarning)

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        loop = trainer.fit_loop.epoch_loop
        # restored: the batches of this epoch done; a checkpoint written at a batch's end (``every_n_train_steps``)
        # counts that batch as processed, not yet completed (Lightning completes it when the loop resets, later)
        done = loop.batch_progress.current.completed + bool(getattr(loop, "restarted_on_train_batch_end", False))
        if not isinstance(sampler, EpochSampler) or not 0 < done < trainer.num_training_batches:
            return
        # A fit stopped by max_steps closes its epoch (started == completed), and Lightning runs the rest of that
        # epoch's batches as the next epoch: they are still the closed epoch's.
        epochs = trainer.fit_loop.epoch_progress.current
        epoch = trainer.current_epoch - (epochs.started == epochs.completed)
        sampler.resume(max(epoch, 0), done * trainer.train_dataloader.batch_size)
        if sampler.iterations:  # the iteration began before the restore (worker processes): begin it again
            iter(trainer.fit_loop._data_fetcher)


def train_loader(dataset: Any, batch_size: int, world: tuple[int, int], seed: int, **loader_args: Any) -> DataLoader:
    """The training loader: ``EpochSampler`` over this process's share (``world``: processes, rank) of ``dataset``.

    Each epoch's iterator draws its worker seed from the loader's own generator, not from torch's global one: a
    checkpoint written at an epoch's end saved the global state before the next epoch's iterator began, so a run
    resumed from it (states restored at its first batch) drew other dropout masks than the uninterrupted run, whose
    iterator had drawn once more. Nothing random runs in the workers (tokenised rows, a padding collator).
    """
    sampler = EpochSampler(dataset, *world, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, generator=torch.Generator().manual_seed(seed),
                      **loader_args)
