"""What ``mean`` and ``resample`` heads take in ``ablate.py``'s jobs (docs/plans.md).

The reference set is ``mask.reference`` (``train``: the task's training split; ``validation``: its first evaluation
split; or a data file in the task's format), its first ``mask.reference_examples`` examples, tokenised like the
evaluation data; it is loaded and checked before the weights. ``JobSubstitutes``:

* ``means(model)``: every head's mean context vector over the reference set (``mask.mean_over``), computed once per
  weights, reference set and setting, and cached as ``<baseline_dir>/means/<key>.npz`` (the key a hash of exactly
  those, the data files' sizes and times and the tokenizer's content included; another job of the sweep reads it);
* ``sources(model, batch, split)``: the ``head_sources`` of an evaluated batch for ``mask.resamples`` draws: draw k
  gives example e the reference example ``source(e, k)`` (seeded by ``seed``), and an evaluated feature (a SQuAD
  window) the source's feature of the same window number (modulo its windows). The rows of the K draws are stacked
  draw-major, so a forward of the batch repeated K times takes them whole.

An example is never its own source, and "own" is by content (its model inputs: token ids and segments), whatever the
reference is called: a split name, the split's data file, a copy, or ``train`` whose file is the evaluated one. Where
the reference set begins with the evaluated examples (the same inputs in the same order), each draw is a derangement
of them (uniform beyond); any other draw that lands on an example with the same inputs is drawn again among the
others.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from headlab.analysis.jobs.checks import REFERENCE_SPLITS
from headlab.core.plans import REFERENCED, HeadPlan
from headlab.core.substitutes.means import HeadMeans, head_means, load_means, save_means
from headlab.core.substitutes.sources import derangement, resample_sources
from headlab.errors import UserError
from headlab.files import config_hash, path_stamp
from headlab.tasks.batches import collated
from headlab.training.datamodule import TaskDataModule


def uses_substitutes(plans: list[HeadPlan], estimates: tuple[str, ...] = ()) -> set[str]:
    """Which of ``mean`` and ``resample`` the plans' heads or the estimates use."""
    used = {policy for plan in plans for policy in REFERENCED if plan.counts()[policy]}
    return used | (set(estimates) & set(REFERENCED))


def reference_task(task: Any, reference: str) -> tuple[Any, str]:
    """The task whose one evaluation split is the reference set, and that split's name."""
    plain = OmegaConf.to_container(task, resolve=True)
    if reference == "train":
        split = task.train_split
    elif reference == "validation":
        split = task.eval_splits[0]
    else:
        split = "reference"
        plain |= {"dataset": None, "subset": None, "data_files": {split: reference}}
    return OmegaConf.create(plain | {"eval_splits": [split]}), split


def example_contents(features: Any) -> np.ndarray:
    """``[examples]``: a digest of each example's model inputs (the token ids and segments of all its features, in
    order), by ``example_index``: equal digests, equal inputs."""
    columns = [name for name in ("input_ids", "token_type_ids") if name in features.column_names]
    values = {name: features[name] for name in columns}
    digests: dict[int, Any] = {}
    for row, owner in enumerate(features["example_index"]):
        digest = digests.setdefault(owner, hashlib.blake2b(digest_size=16))
        for name in columns:
            digest.update(np.asarray(values[name][row], dtype=np.int64).tobytes() + b"|")
        digest.update(b"/")
    return np.array([digests[owner].digest() for owner in sorted(digests)], dtype="S16")


class JobSubstitutes:
    """The reference set of a job and what mean and resample heads take from it (module docstring)."""

    def __init__(self, cfg: Any, tokenizer_cfg: Any, evaluated: TaskDataModule | None, resample: bool):
        mask = cfg.mask
        self.mean_over, self.draws, self.seed = mask.mean_over, mask.resamples if resample else 1, cfg.seed
        self.cache_dir, self.model_key = cfg.baseline_dir, None  # core.models.model_hash: set once the model loads
        self.reference, self.examples = mask.reference, mask.reference_examples
        if resample and self.examples < 2:
            raise UserError(f"mask.reference_examples={self.examples}: resample needs at least 2 reference examples "
                            "(each example takes another's heads)")
        task, self.split = reference_task(cfg.task, mask.reference)
        data_cfg = {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items()
                    if k in ("eval_batch_size", "cache_dir")}
        data = TaskDataModule(task, tokenizer_cfg, unit=mask.unit, seed=cfg.seed, train=False,
                              max_eval_examples=self.examples, **data_cfg)
        data.setup()
        found = data.num_examples[self.split]
        if found < self.examples:
            named = mask.reference in REFERENCE_SPLITS
            where = f"{mask.reference} (split {self.split})" if named else mask.reference
            raise UserError(f"mask.reference={where} has {found} examples; mask.reference_examples="
                            f"{self.examples} needs that many (lower it, or use a larger reference set)")
        self.features, self.rows, self.batch_size = data.eval_features[self.split], data.padded_rows(self.split), \
            data.eval_batch_size
        owners = np.asarray(self.features["example_index"])  # [features]: each feature's example
        self.first = np.searchsorted(owners, np.arange(self.examples))  # [examples]: its first feature
        self.windows = np.bincount(owners, minlength=self.examples)  # [examples]: its features
        self.contents = example_contents(self.features)  # [examples]: what "the same example" means
        plain = OmegaConf.to_container(task, resolve=True)  # its data files' stamps too: rewritten data is other data
        self.identity = {"task": plain, "data_stamps": path_stamp(plain.get("data_files")), "reference": mask.reference,
                         "stamp": path_stamp(mask.reference), "examples": self.examples, "mean_over": self.mean_over,
                         "tokenizer": data.tokenizer_digest}
        if evaluated is not None and self.mean_over == "positions":
            self._check_positions(evaluated)
        self._means: HeadMeans | None = None
        self._assignments: dict[tuple[str, int], np.ndarray] = {}
        self._windows: dict[str, tuple[int, int]] = {}  # per split: (last example seen, its windows so far)
        self.sizes: dict[str, int] = {}

    def _check_positions(self, evaluated: TaskDataModule) -> None:
        """``mean_over=positions`` has a mean for every position an evaluated input reaches."""
        reached = max(len(ids) for ids in self.features["input_ids"])
        for split, features in evaluated.eval_features.items():
            longest = max(len(ids) for ids in features["input_ids"])
            if longest > reached:
                raise UserError(f"mask.mean_over=positions: split {split} has inputs of {longest} tokens, longer than "
                                f"any reference example ({reached}); use mean_over=tokens or a reference set of "
                                "inputs as long")

    def means(self, model: torch.nn.Module) -> HeadMeans:
        """The means over the reference set (cached; computed on the model's device when missing); the model's
        ``model_key`` must be set."""
        if self._means is None:
            identity = {"model": self.model_key, **self.identity}
            path = Path(self.cache_dir) / "means" / f"{config_hash(identity)}.npz"
            means = load_means(path, identity)
            if means is None:
                means = head_means(model, self._batches(model), self.mean_over)
                save_means(means, path, identity)
            self._means = means
        return self._means

    def _batches(self, model: torch.nn.Module):
        device = next(model.parameters()).device
        loader = DataLoader(self.rows, batch_size=self.batch_size, collate_fn=collated)
        for batch in loader:
            yield {name: value.to(device) for name, value in batch.items()}

    def start_pass(self, features: dict[str, Any]) -> None:
        """Before a pass over the evaluated splits: their tokenised features (``sources`` draws for each example)."""
        self.evaluated = {split: example_contents(rows) for split, rows in features.items()}
        self.sizes, self._windows = {split: len(contents) for split, contents in self.evaluated.items()}, {}

    def sources(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: str) -> torch.Tensor:
        """``head_sources`` ``[layers, draws * batch, seq, heads, head_dim]`` of ``batch`` (module docstring); after
        ``means`` and ``start_pass``."""
        examples = batch["example_index"].tolist()
        windows = self._window_numbers(split, examples)
        rows = []
        for draw in range(self.draws):
            owners = self._assignment(split, draw)[examples]
            rows += [int(self.first[o] + w % self.windows[o]) for o, w in zip(owners, windows)]
        device = batch["input_ids"].device
        chosen = self.rows.__getitems__(rows)
        inputs = {name: chosen[name].to(device) for name in ("input_ids", "attention_mask", "token_type_ids")
                  if name in chosen}
        return resample_sources(model, inputs, batch["input_ids"].shape[1], self._means)

    def drawn(self, split: str) -> np.ndarray:
        """``[draws, examples of split]``: the reference example each evaluated example takes its heads from."""
        return np.stack([self._assignment(split, draw) for draw in range(self.draws)])

    def _window_numbers(self, split: str, examples: list[int]) -> list[int]:
        """Each row's window number within its example (the rows of an example are adjacent, in order)."""
        last, count = self._windows.get(split, (-1, 0))
        numbers = []
        for example in examples:
            count = count + 1 if example == last else 0
            last = example
            numbers.append(count)
        self._windows[split] = (last, count)
        return numbers

    def _assignment(self, split: str, draw: int) -> np.ndarray:
        """``[examples of split]``: each evaluated example's source in draw ``draw``: uniform over the reference set,
        seeded by (seed, draw, split); where the reference set begins with the split's examples, a derangement of
        those; never an example with the same inputs (module docstring)."""
        key = (split, draw)
        if key not in self._assignments:
            mine = self.evaluated[split]  # [examples of split]
            generator = np.random.default_rng([self.seed, draw, int(config_hash(split), 16) % 2**32])
            drawn = generator.integers(0, self.examples, len(mine))
            inside = min(len(mine), self.examples)
            if (mine[:inside] == self.contents[:inside]).all():  # the same examples in the same order
                drawn[:inside] = derangement(self.examples, generator)[:inside]
            for example in np.flatnonzero(mine == self.contents[drawn]):  # its own inputs: drawn again
                others = np.flatnonzero(self.contents != mine[example])
                if not len(others):
                    raise UserError(f"resample: every example of mask.reference={self.reference} has the inputs of "
                                    f"evaluated example {example} of {split}; it needs another to take heads from")
                drawn[example] = others[generator.integers(0, len(others))]
            self._assignments[key] = drawn
        return self._assignments[key]
