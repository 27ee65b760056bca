"""RoBERTa, XLM-R and CamemBERT: BERT's modules; pairs are ``<s> A </s></s> B </s>`` without segment ids, so a
token's sentence comes from the tokenizer's sequence ids (as for every family: ``headlab.core.units``)."""

from __future__ import annotations

from typing import Any

from headlab.core.families.base import Family


class RobertaFamily(Family):
    def positions(self, config: dict[str, Any]) -> int | None:
        """Positions start after the padding index: roberta-base's 514 embeddings take 512 tokens."""
        total = config.get("max_position_embeddings")
        return None if total is None else total - config.get("pad_token_id", 1) - 1


FAMILY = RobertaFamily(name="roberta", model_types=("roberta", "xlm-roberta", "camembert"),
                       shape_defaults={"roberta": (12, 12), "xlm-roberta": (12, 12), "camembert": (12, 12)},
                       segment_ids=False, positions_from_padding=True)
