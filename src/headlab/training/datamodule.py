"""The Lightning data module of a task, and the exactly-once sampler for distributed evaluation."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pyarrow.compute as pc
from torch.utils.data import DataLoader, DistributedSampler

from headlab.core.models import load_tokenizer
from headlab.errors import UserError
from headlab.tasks.batches import PaddedRows, collated, column_values
from headlab.tasks.encoding import Collator, tokenize_split
from headlab.tasks.feature_cache import tokenizer_digest
from headlab.tasks.loading import load_task_data
from headlab.training.epoch_order import train_loader


class ExactlyOnceSampler(DistributedSampler):
    """Shards an evaluation set over processes so that every row is seen exactly once.

    ``DistributedSampler`` repeats rows to give every process the same count; ablation deltas
    are often under a point, so repeats would bias them. Here process ``rank`` gets a contiguous
    block of whole groups (``groups[i]``: the group of row i, equal groups adjacent; e.g. the
    features of one SQuAD question, which must be merged on one process). Processes may get
    different numbers of rows. Subclassing ``DistributedSampler`` keeps Lightning from
    replacing it.

    ``lengths`` (tokens per row): the process's groups longest first (each group's rows adjacent and in order, ties
    in row order), so that a batch pads its rows to about their own length: collated batches pad to their longest
    row, and rows in file order pad the median pair of a GLUE-style split to twice its length. Every consumer keys
    its outputs by ``example_index``, so the order changes no result.
    """

    def __init__(self, groups: Sequence[int], num_replicas: int, rank: int, lengths: Sequence[int] | None = None):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside 0..{num_replicas - 1}")
        self.num_replicas, self.rank = num_replicas, rank
        starts = [i for i in range(len(groups)) if i == 0 or groups[i] != groups[i - 1]]  # first row of each group
        bounds = [*starts, len(groups)]
        first, last = (len(starts) * r // num_replicas for r in (rank, rank + 1))
        blocks = [range(bounds[g], bounds[g + 1]) for g in range(first, last)]  # this process's groups' rows
        if lengths is not None:
            blocks.sort(key=lambda rows: -max(lengths[i] for i in rows))  # stable: ties keep the row order
        self.indices = [i for rows in blocks for i in rows]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)

    def set_epoch(self, epoch: int) -> None:  # the order never changes
        pass


class TaskDataModule(pl.LightningDataModule):
    """Tokenised train and eval splits of a task, with ``sentence_ids`` for ``unit`` in every batch.

    Loading, checking and tokenising happen once per process, on the first ``prepare_data`` or
    ``setup`` (call ``setup()`` yourself to fail on bad data before a model loads); tokenised
    splits are cached on disk, so later processes and runs read them. ``eval_examples[split]``
    keeps the raw eval rows (SQuAD contexts and answers).
    """

    def __init__(
        self,
        task: Any,
        model: Any,
        unit: str = "sentence",
        batch_size: int = 32,
        eval_batch_size: int = 64,
        num_workers: int = 0,
        cache_dir: str | Path = ".cache/headlab",
        max_train_examples: int | None = None,
        max_eval_examples: int | None = None,
        seed: int = 0,
        train: bool = True,
        by_length: bool = True,
    ):
        super().__init__()
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if not isinstance(value, int) or value < 1:
                raise UserError(f"data.{name} must be a positive integer, got {value!r}")
        self.task, self.model_cfg, self.unit = task, model, unit
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.cache_dir, self.seed = Path(cache_dir), seed
        self.limits = {"train": max_train_examples, "eval": max_eval_examples}
        self.eval_splits = list(task.eval_splits)
        self.with_train = train  # False: evaluation only (the training split is neither read nor tokenised)
        self.by_length = by_length  # evaluation batches of rows of similar lengths (ExactlyOnceSampler)

    def prepare_data(self) -> None:
        self.setup()

    def setup(self, stage: str | None = None) -> None:
        if not hasattr(self, "train_features"):
            self._build()

    def _build(self) -> None:
        tokenizer = load_tokenizer(self.model_cfg)
        raw = load_task_data(self.task, [self.task.train_split, *self.eval_splits] if self.with_train
                             else self.eval_splits)
        limit = lambda data, n: data if n is None else data.select(range(min(n, len(data))))  # noqa: E731
        self.eval_examples = {split: limit(raw[split], self.limits["eval"]) for split in self.eval_splits}
        self.num_examples = {s: len(d) for s, d in self.eval_examples.items()}
        for split, count in self.num_examples.items():
            if self.task.type == "regression" and count < 2:
                raise UserError(f"task {self.task.name}: split {split!r} has {count} example to score; Pearson and "
                                "Spearman correlations need at least 2")
        self.tokenizer_digest = tokenizer_digest(tokenizer)  # what the tokens depend on (the cache's key too)
        tokenize = lambda data, split, training: tokenize_split(  # noqa: E731
            data, self.task, tokenizer, self.unit, self.cache_dir, split, training, self.tokenizer_digest)
        self.train_features = None
        if self.with_train:
            train = limit(raw[self.task.train_split], self.limits["train"])
            self.num_examples = {self.task.train_split: len(train), **self.num_examples}
            self.train_features = tokenize(train, self.task.train_split, True)
        self.eval_features = {split: tokenize(data, split, False) for split, data in self.eval_examples.items()}
        self.collator = Collator(tokenizer.pad_token_id, regression=self.task.type == "regression")
        self._padded: dict[str, PaddedRows] = {}

    def padded_rows(self, split: str) -> PaddedRows:
        """An eval split's tokenised rows as padded batches (``PaddedRows``: the collator's batches, made in one
        gather per column), built once. Training batches keep the collator: ``PaddedRows`` holds its split in
        memory, where the collator reads the memory-mapped Arrow file, and a training split can be large."""
        if split not in self._padded:
            features = self.eval_features[split]
            self._padded[split] = PaddedRows(features, self.collator.pad_token_id, self.collator.regression)
        return self._padded[split]

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def _pinned(self) -> bool:
        """Batches in pinned memory when the trainer runs on a GPU: Lightning's copies then do not block."""
        trainer = self.trainer
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> DataLoader:
        """Shuffled per epoch from ``(seed, epoch)``, this process's share (``epoch_order``: resumable mid-epoch)."""
        return train_loader(self.train_features, self.batch_size, self._world(), self.seed, collate_fn=self.collator,
                            num_workers=self.num_workers, pin_memory=self._pinned())

    def eval_dataloader(self, split: str) -> DataLoader:
        features = self.eval_features[split]
        groups = column_values(features, "example_index") if "example_index" in features.column_names else \
            range(len(features))
        lengths = None
        if self.by_length:  # [rows]: tokens per row
            lengths = pc.list_value_length(features.with_format("arrow")["input_ids"]).to_numpy()
        sampler = ExactlyOnceSampler(list(groups), *self._world(), lengths=lengths)
        return DataLoader(self.padded_rows(split), batch_size=self.eval_batch_size, sampler=sampler,
                          collate_fn=collated, num_workers=self.num_workers, pin_memory=self._pinned())

    def val_dataloader(self) -> list[DataLoader]:
        return [self.eval_dataloader(split) for split in self.eval_splits]

    def test_dataloader(self) -> list[DataLoader]:
        return self.val_dataloader()
