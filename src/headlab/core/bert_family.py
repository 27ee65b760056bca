"""The parts of a BERT-family model headlab reaches into: self-attention modules, the encoder's layers.

``layer_inputs`` records the hidden states entering each layer during a forward; ``start_at_layer``
runs a forward from a given layer's input, skipping the layers below it (they would compute the
same thing again); ``self_attention_output`` records what a layer's self-attention returns and
``replay_self_attention`` makes it return a given tensor instead of computing it. Head sweeps combine
them: an ablation in layer l leaves layers 0..l-1 as they were, so its forward can start from layer l,
and it changes only some heads' columns of layer l's self-attention output.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from headlab.core.model_files import check_bert_family
from headlab.errors import UserError


def self_attention_modules(model: PreTrainedModel) -> list[torch.nn.Module]:
    """The model's self-attention modules, one per layer, in layer order."""
    if not isinstance(model, PreTrainedModel):
        raise UserError(f"expected a Hugging Face PreTrainedModel, got {type(model).__name__}")
    check_bert_family(getattr(model.config, "model_type", None))
    modules = [m for m in model.modules() if _is_self_attention(m)]
    layers = sorted(m.layer_idx for m in modules)
    if layers != list(range(model.config.num_hidden_layers)):
        raise UserError(
            f"{type(model).__name__}: found self-attention layers {layers}, expected one for each of "
            f"0..{model.config.num_hidden_layers - 1}"
        )
    return sorted(modules, key=lambda m: m.layer_idx)



def _is_self_attention(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("SelfAttention") and hasattr(module, "layer_idx")


def self_attention_of(model: PreTrainedModel, layer: int) -> torch.nn.Module:
    """Layer ``layer``'s self-attention module (also inside ``start_at_layer``, where fewer layers are listed)."""
    found = [m for m in model.modules() if _is_self_attention(m) and m.layer_idx == layer]
    if len(found) != 1:
        raise UserError(f"{type(model).__name__}: found {len(found)} self-attention modules for layer {layer}")
    return found[0]


def encoder_layers(model: PreTrainedModel) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
    """The encoder module and its list of layers."""
    encoder = getattr(model.base_model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) != model.config.num_hidden_layers:
        raise UserError(f"{type(model).__name__}: expected base_model.encoder.layer, a list of "
                        f"{model.config.num_hidden_layers} layers")
    return encoder, layers


@contextmanager
def layer_inputs(model: PreTrainedModel) -> Iterator[list[torch.Tensor]]:
    """A list that the next forward fills with the hidden states entering each layer (``[batch, seq, hidden]``)."""
    _, layers = encoder_layers(model)
    seen: list[torch.Tensor] = []
    handles = [layer.register_forward_pre_hook(lambda module, args: seen.append(args[0])) for layer in layers]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def self_attention_output(model: PreTrainedModel, layer: int, stop: type[Exception] | None = None) -> Iterator[list]:
    """A list that the next forward fills with layer ``layer``'s self-attention output
    ``[batch, seq, heads * head_dim]`` (the heads' context vectors side by side, before the output
    projection); ``stop``: raised right after it."""
    seen: list[torch.Tensor] = []

    def record(module, args, output):
        seen.append(output[0])
        if stop is not None:
            raise stop

    handle = self_attention_of(model, layer).register_forward_hook(record)
    try:
        yield seen
    finally:
        handle.remove()


@contextmanager
def replay_self_attention(model: PreTrainedModel, layer: int, output: torch.Tensor) -> Iterator[PreTrainedModel]:
    """Inside the block, layer ``layer``'s self-attention returns ``output`` ``[batch, seq, heads * head_dim]``
    without computing anything (no query, key or value projections)."""
    module = self_attention_of(model, layer)
    module.forward = lambda *args, **kwargs: (output, None)  # an instance attribute shadows the class's forward
    try:
        yield model
    finally:
        del module.forward


@contextmanager
def start_at_layer(model: PreTrainedModel, layer: int, hidden_states: torch.Tensor) -> Iterator[PreTrainedModel]:
    """Inside the block, a forward feeds ``hidden_states`` to layer ``layer`` and runs only the layers from it on.

    The other inputs (attention mask, unit ids, plan ids) are given to the forward as usual; the embeddings
    still run (cheap) but their output is replaced.
    """
    encoder, layers = encoder_layers(model)

    def replace_input(module, args, kwargs):
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": hidden_states}
        return (hidden_states, *args[1:]), kwargs

    handle = encoder.register_forward_pre_hook(replace_input, with_kwargs=True)
    encoder.layer = layers[layer:]  # the same modules (their layer_idx unchanged), fewer of them
    try:
        yield model
    finally:
        encoder.layer = layers
        handle.remove()
