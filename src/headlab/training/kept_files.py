"""What a finished fine-tuning keeps: its weights once.

While a run trains, ``checkpoints/`` holds ``last.ckpt`` and ``best.ckpt``, each with the optimizer's, the loops' and
the random states (about three times the weights): what a killed run resumes from. Once it has finished, ``model/``
holds the final weights (``save_pretrained``, what ``ablate.py ckpt_path=JOB`` loads), so unless
``keep_training_state=true``:

- ``last.ckpt`` goes (the same weights as ``model/``);
- ``best.ckpt`` goes when it was written at the final step (the same weights again), else it keeps its weights and
  hyper-parameters only (``ablate.py ckpt_path=JOB/checkpoints/best.ckpt`` evaluates it);
- ``checkpoints/`` and ``checkpoints.json`` go when nothing is left in it.

``keep_training_state=true`` keeps both checkpoints whole, to continue training later with ``ckpt_path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from headlab.files import atomic_file

# What a weights-only checkpoint keeps: enough for ablate.py (weights, model and task) and to say where it stood.
WEIGHT_KEYS = ("state_dict", "hyper_parameters", "hparams_name", "epoch", "global_step", "pytorch-lightning_version")
TRAINING_STATE_KEY = "optimizer_states"  # present in a checkpoint that training can continue from


def checkpoint_step(path: Path) -> int:
    """The global step a checkpoint was written at (memory-mapped: the tensors are not read)."""
    return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)["global_step"])


def kept_checkpoints(checkpoint_dir: Path, best: str | None, final_step: int, final_weights: Path,
                     keep_training_state: bool) -> tuple[str | None, str | None]:
    """``(best_checkpoint, last_checkpoint)`` a finished run records: the best weights' file (``final_weights`` when
    the best checkpoint holds the final weights) and the resumable last checkpoint (None unless kept)."""
    if keep_training_state:
        return best, str(checkpoint_dir / "last.ckpt")
    if best is not None and checkpoint_step(Path(best)) == final_step:
        best = str(final_weights)
    return best, None


def keep_only(checkpoint_dir: Path, record: dict[str, Any]) -> None:
    """Remove the checkpoints ``record`` (a finished run's results) does not name, and the training state of those
    it names unless it kept that state. Idempotent: a run killed halfway through it finishes on its rerun."""
    # by name: the record's paths are absolute, and a job folder moved since would otherwise lose every checkpoint
    named = {Path(path).name for path in (record.get("best_checkpoint"), record.get("last_checkpoint"))
             if isinstance(path, str) and Path(path).parent.name == checkpoint_dir.name}
    keep_state = record.get("last_checkpoint") is not None
    for path in sorted(checkpoint_dir.glob("*.ckpt")):
        if path.name not in named:
            path.unlink()
        elif not keep_state:
            weights_only(path)
    if checkpoint_dir.is_dir() and not any(checkpoint_dir.iterdir()):
        checkpoint_dir.rmdir()
        (checkpoint_dir.parent / "checkpoints.json").unlink(missing_ok=True)


def weights_only(path: Path) -> None:
    """Rewrite a Lightning checkpoint with its weights and hyper-parameters only (atomically); no-op if it is."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if TRAINING_STATE_KEY not in checkpoint:
        return
    with atomic_file(path, "wb") as handle:
        torch.save({key: checkpoint[key] for key in WEIGHT_KEYS if key in checkpoint}, handle)


def has_training_state(path: Path) -> bool:
    """Whether training can continue from the checkpoint at ``path`` (False for a weights-only one)."""
    return TRAINING_STATE_KEY in torch.load(path, map_location="cpu", weights_only=False, mmap=True)
