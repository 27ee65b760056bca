"""What headlab needs to know of an encoder family, and how it finds a model's parts from it.

A family is data (module paths, config keys) plus the few functions a family overrides; nothing here imports torch
or transformers, so the checks that run before they load (a config.json's shape, an unknown model type) read it.
Paths are dotted attribute names: ``layers`` from the base model (``model.base_model``) to its list of layers,
``attention`` and ``output`` from a layer to the module that calls the attention function and to the linear map
that mixes the heads' context vectors (its input is ``[batch, seq, heads * head_dim]``, head h in columns
``h * head_dim .. (h + 1) * head_dim``; its output is the attention block's, before the residual connection), ``mlp``
from a layer to the feed-forward block's last linear map (its output is the MLP's, before the residual connection).
A layer's own output is the residual stream after it (activation patching's sites: ``core/activation_sites.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any

from headlab.errors import UserError


def module_at(root: Any, path: str) -> Any:
    """``root.a.b.0.c`` for ``path="a.b.0.c"`` (indices of module lists included)."""
    return reduce(lambda node, name: node[int(name)] if name.isdigit() else getattr(node, name), path.split("."), root)


@dataclass(frozen=True)
class Family:
    """One family of encoders (``model_types``: the ``model_type`` values of its Hugging Face configs)."""

    name: str
    model_types: tuple[str, ...]
    shape_defaults: dict[str, tuple[int, int]]  # per model type: (layers, heads) its config class fills in
    shape_keys: tuple[str, str] = ("num_hidden_layers", "num_attention_heads")  # their names in config.json
    width_key: str = "hidden_size"  # the attention's width in config.json (heads * head_dim)
    layers_path: str = "encoder.layer"
    attention_path: str = "attention.self"
    output_path: str = "attention.output.dense"
    mlp_path: str = "output.dense"  # from a layer: the feed-forward block's last linear map
    projections: tuple[str, ...] = ("query", "key", "value")  # per-head output rows, in the attention module
    fused: bool = False  # one projection holds query, key and value blocks (ModernBERT's Wqkv)
    head_count: tuple[str, ...] = ("num_attention_heads",)  # the attention module's head count attributes
    head_width: str = "attention_head_size"  # the attention module's head_dim attribute
    head_total: tuple[str, ...] = ("all_head_size",)  # its attributes of heads * head_dim
    shared: bool = False  # one attention module serves every depth (a depth is the call's position)
    own_attention: bool = False  # the module computes attention itself (no AttentionInterface): headlab routes it
    extra_projections: tuple[str, ...] = ()  # more per-head projections, sliced with the others where present
    first_layer_only: tuple[str, ...] = ()  # encoder modules applied after its first layer only (start_at_layer)
    segment_ids: bool = True  # its tokenizers give a pair's segments as token_type_ids 0 / 1 (RoBERTa's: all 0)
    positions_from_padding: bool = False  # position ids count from config.json's pad_token_id (RoBERTa's): a
    # tokenizer padding with another id shifts every position; the other families read that id nowhere in a forward

    def shape(self, config: dict[str, Any], where: str) -> tuple[int, int]:
        """``(layers, heads)`` of a config.json's dict (defaults as its config class fills them in)."""
        defaults = self.shape_defaults[config["model_type"]]
        shape = tuple(config.get(key, default) for key, default in zip(self.shape_keys, defaults))
        for key, value in zip(self.shape_keys, shape):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{where}: {key}={value!r} is not a positive integer")
        width = config.get(self.width_key)
        if isinstance(width, int) and width % shape[1]:
            raise UserError(f"{where}: {self.shape_keys[1]}={shape[1]} does not divide {self.width_key}={width} "
                            "(each head takes an equal share)")
        self.check_config(config, where)
        return shape

    def positions(self, config: dict[str, Any]) -> int | None:
        """The longest sequence the model's position embeddings take (None: no absolute positions, or unknown)."""
        return config.get("max_position_embeddings")

    def check_config(self, config: dict[str, Any], where: str) -> None:
        """A ``UserError`` for a configuration of the family headlab cannot patch (none by default)."""

    def encoder(self, model: Any) -> tuple[Any, str]:
        """The module holding the list of layers, and the list's attribute name (``start_at_layer`` swaps it)."""
        parent, _, name = self.layers_path.rpartition(".")
        return (module_at(model.base_model, parent) if parent else model.base_model), name

    def layers(self, model: Any) -> list[Any]:
        """The model's layers, one per depth, in order (a module may repeat: ``shared``)."""
        return list(module_at(model.base_model, self.layers_path))

    def attention_modules(self, model: Any) -> list[Any]:
        """Per depth, the module that calls the attention function."""
        return [module_at(layer, self.attention_path) for layer in self.layers(model)]
