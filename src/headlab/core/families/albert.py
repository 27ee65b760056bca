"""ALBERT: one attention module per layer group (one group in every released model), called once per depth, so a
plan addresses depths L0..L{n-1} as for BERT and a depth is the call's position in the forward. The module calls
the attention function and applies ``dense`` itself. Physically removing a head of one depth would remove it from
every depth sharing the weights, so only a prune of the same heads at every depth of a group is physical."""

from __future__ import annotations

from typing import Any

from headlab.core.families.base import Family, module_at
from headlab.errors import UserError


class AlbertFamily(Family):
    def check_config(self, config: dict[str, Any], where: str) -> None:
        inner = config.get("inner_group_num", 1)
        if inner != 1:
            raise UserError(f"{where}: inner_group_num={inner!r}: headlab patches ALBERTs with one layer per group "
                            "(inner_group_num=1, as every released ALBERT)")

    def layers(self, model: Any) -> list[Any]:
        config = model.config
        groups = module_at(model.base_model, "encoder.albert_layer_groups")
        per_group = config.num_hidden_layers / config.num_hidden_groups  # AlbertTransformer's own arithmetic
        return [groups[int(depth / per_group)].albert_layers[0] for depth in range(config.num_hidden_layers)]

    def encoder(self, model: Any) -> tuple[Any, str]:
        raise NotImplementedError("ALBERT's layers share modules: a forward cannot start at a depth")


FAMILY = AlbertFamily(name="albert", model_types=("albert",), shape_defaults={"albert": (12, 64)},
                      layers_path="encoder.albert_layer_groups", attention_path="attention",
                      output_path="attention.dense", mlp_path="ffn_output", shared=True)
