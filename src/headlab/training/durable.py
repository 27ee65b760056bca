"""What makes a fine-tuning run resumable exactly, and its checkpoints safe to resume from.

- ``AtomicCheckpointIO``: every checkpoint is written to a temporary file in its own folder and renamed into place.
  Lightning's ``_atomic_save`` writes through fsspec's transaction, whose temporary file lies in the system's
  temporary folder: committing it is a copy across filesystems, and a full disk left ``last.ckpt`` truncated (every
  rerun then crashed on it).
- ``RandomStates``: checkpoints carry the torch (and CUDA), numpy and Python random states; a resumed fit restores
  them right before its first training batch, where the uninterrupted run stood when it saved (after the validation
  that wrote the checkpoint). Dropout then draws the same masks: the resumed weights equal the uninterrupted run's.
- ``readable_checkpoint``: whether a checkpoint file is a whole ``torch.save`` archive (a truncated one is not).
- ``training_lock``: one ``train.py`` run per job directory at a time.
"""

from __future__ import annotations

import random
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from headlab.files import atomic_file, folder_lock

RANDOM_STATES = "headlab_random_states"  # the checkpoint's key
LOCK_FILE = ".train.lock"


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` to a temporary file beside the checkpoint, flushed to disk, then renamed over it."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        with atomic_file(path, "wb") as handle:
            torch.save(checkpoint, handle)


def random_states() -> dict[str, Any]:
    """The process's random states: torch's CPU generator, every CUDA device's, numpy's global and Python's, as
    tensors and plain numbers (what Lightning's ``weights_only`` loading accepts)."""
    name, keys, position, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    states = {"torch": torch.get_rng_state(),
              "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(gauss)],
              "python": [version, torch.tensor(internal, dtype=torch.int64), gauss_next]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_random_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal.tolist()), gauss_next))
    if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])


class RandomStates(pl.Callback):
    """Saves the random states in every checkpoint; restores them before the first batch of a resumed fit."""

    def __init__(self):
        self.pending: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer: pl.Trainer, module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[RANDOM_STATES] = random_states()

    def on_load_checkpoint(self, trainer: pl.Trainer, module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        self.pending = checkpoint.get(RANDOM_STATES)  # None: a checkpoint of an older headlab

    def on_train_batch_start(self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.pending is not None:
            set_random_states(self.pending)
            self.pending = None


def readable_checkpoint(path: Path) -> str | None:
    """None when ``path`` is a whole ``torch.save`` archive; else why not (a truncated file has no zip directory).
    Reads the archive's directory only, not the weights."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    if not any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
        return "no data.pkl in the archive"
    return None


@contextmanager
def training_lock(output_dir: Path) -> Iterator[None]:
    """Held by the run that trains in ``output_dir`` (rank zero; other ranks of a distributed run pass): a second
    ``train.py`` run of the same folder started meanwhile stops with an error instead of training beside it."""
    if rank_zero_only.rank != 0:
        yield
        return
    with folder_lock(output_dir, LOCK_FILE, f"another train.py run is training in {str(output_dir)!r} (it holds "
                     f"{LOCK_FILE}); wait for it to end (then rerun: a finished job says 'already done'), or give "
                     "this one another hydra.run.dir"):
        yield
