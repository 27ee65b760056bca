"""DeBERTa-v2 and v3 (``model_type`` "deberta-v2"): BERT's layer layout with its own disentangled self-attention
(``attention.self``): scores ``q k^T / sqrt(d s)`` plus content-to-position and position-to-content terms, masked and
softmaxed by hand, no AttentionInterface. headlab gives the module a forward that computes the same scores and hands
them to its attention function as an additive bias (``headlab.core.patch.disentangled``), so every policy acts on
the probabilities after DeBERTa's softmax. Pruning slices the position projections too (``share_att_key=false``).
v3 has no absolute positions (``position_biased_input=false``): relative ones only, bucketed."""

from __future__ import annotations

from typing import Any

from headlab.core.families.base import Family


class DebertaFamily(Family):
    def positions(self, config: dict[str, Any]) -> int | None:
        """Absolute positions only where the embeddings add them (v2's default); v3's are relative only."""
        return config.get("max_position_embeddings", 512) if config.get("position_biased_input", True) else None


FAMILY = DebertaFamily(name="deberta", model_types=("deberta-v2",), shape_defaults={"deberta-v2": (24, 24)},
                       projections=("query_proj", "key_proj", "value_proj"), own_attention=True,
                       extra_projections=("pos_key_proj", "pos_query_proj"), first_layer_only=("conv",))
