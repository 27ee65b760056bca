"""Honest speed comparisons of models on the same batches: alternating rounds, medians (``BENCHMARKS.md`` style)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from headlab.analysis.jobs.plan_evaluator import MODEL_INPUTS


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def forward_seconds(models: Mapping[str, torch.nn.Module], batches: Sequence[Mapping[str, torch.Tensor]],
                    rounds: int, device: torch.device | str = "cpu") -> dict[str, list[float]]:
    """Seconds of one forward pass over ``batches`` per model and round.

    Each model runs once untimed (warm-up), then the models take turns, round after round, so drift in the
    machine's speed hits all of them alike. Models are moved to ``device`` and put in eval mode.
    """
    device = torch.device(device)
    inputs = [{k: batch[k].to(device) for k in MODEL_INPUTS if k in batch} for batch in batches]
    for model in models.values():
        model.to(device).eval()
        for batch in inputs:
            model(**batch)
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            _synchronize(device)
            start = time.perf_counter()
            for batch in inputs:
                model(**batch)
            _synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return seconds
