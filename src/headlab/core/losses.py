"""Per-example losses of the task heads, the terms of the models' mean losses, used wherever headlab needs one
(fine-tuning, evaluation records, gradient importance).

Extractive QA: a feature's loss is (cross-entropy of its start position + of its end position) / 2 over *its own*
positions only. Hugging Face's QA heads take the softmax over every position of the padded batch, so the logits
of padding entered it and a question's loss depended on which questions shared its batch; here the padding
positions (``attention_mask == 0``) are out of both softmaxes, so the loss equals that of the feature run alone.
"""

from __future__ import annotations

import torch


def example_losses(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    """``[batch]`` loss of each example, the terms of the model's mean loss (MSE or cross-entropy), in float32+."""
    if regression:
        return (logits[:, 0].double() - labels.double()) ** 2
    return torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")


def span_losses(start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor,
                end_positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[features]`` span loss of each feature (module docstring), in float32 or the logits' wider type; logits
    and ``attention_mask`` ``[features, seq]``, positions ``[features]``."""
    padding = attention_mask == 0  # [features, seq]

    def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)).masked_fill(padding, float("-inf"))
        return torch.nn.functional.cross_entropy(logits, target, reduction="none")

    return (cross_entropy(start_logits, start_positions) + cross_entropy(end_logits, end_positions)) / 2
