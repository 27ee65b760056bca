"""The parts of an encoder headlab reaches into, found through its family (``headlab.core.families``).

``self_attention_modules`` lists, per depth, the module that calls the attention function; ``layer_inputs`` records
the hidden states entering each layer during a forward; ``start_at_layer`` runs a forward from a given layer's input,
skipping the layers below it (they would compute the same thing again); ``self_attention_output`` records a layer's
heads' context vectors (the input of its output projection) and ``replay_self_attention`` makes the layer use given
ones instead of computing them. Head sweeps combine them: an ablation in layer l leaves layers 0..l-1 as they were,
so its forward can start from layer l, and it changes only some heads' columns of layer l's contexts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from headlab.core.families import family_of
from headlab.errors import UserError

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what a bare model's forward takes of a batch
DEPTH = "_headlab_depth"  # on each attention module of a family without shared modules: its depth


def self_attention_modules(model: PreTrainedModel) -> list[torch.nn.Module]:
    """Per depth, the module that calls the attention function (ALBERT: one module at every depth of a group). Each
    module of a family without shared modules is marked with its depth (``depth_of``)."""
    if not isinstance(model, PreTrainedModel):
        raise UserError(f"expected a Hugging Face PreTrainedModel, got {type(model).__name__}")
    family = family_of(model)
    modules = family.attention_modules(model)
    if len(modules) != model.config.num_hidden_layers:
        raise UserError(f"{type(model).__name__}: found {len(modules)} layers, expected "
                        f"num_hidden_layers={model.config.num_hidden_layers}")
    if not family.shared:
        for depth, module in enumerate(modules):
            module.__dict__[DEPTH] = depth
    return modules


def head_width(model: PreTrainedModel) -> int:
    """The width of each head's context vector (``head_dim``), as the attention modules have it (DeBERTa's may differ
    from ``hidden_size / heads``)."""
    return getattr(self_attention_modules(model)[0], family_of(model).head_width)


def depth_of(module: torch.nn.Module) -> int | None:
    """The depth of an attention module listed by ``self_attention_modules`` (None: shared by several depths)."""
    return module.__dict__.get(DEPTH)


def self_attention_of(model: PreTrainedModel, layer: int) -> torch.nn.Module:
    """Layer ``layer``'s attention module (also inside ``start_at_layer``, where fewer layers are listed)."""
    family = family_of(model)
    modules = family.attention_modules(model)
    if len(modules) == model.config.num_hidden_layers:  # not inside start_at_layer: the list is whole
        return self_attention_modules(model)[layer]
    found = [m for m in modules if depth_of(m) == layer]
    if len(found) != 1:
        raise UserError(f"{type(model).__name__}: found {len(found)} attention modules for layer {layer}")
    return found[0]


def encoder_layers(model: PreTrainedModel) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
    """The module holding the layer list, and the list (families whose layers share modules have none)."""
    family = family_of(model)
    try:
        encoder, name = family.encoder(model)
    except NotImplementedError as error:
        raise UserError(f"{type(model).__name__}: {error}; this needs a family with a layer list") from None
    layers = getattr(encoder, name, None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) != model.config.num_hidden_layers:
        raise UserError(f"{type(model).__name__}: expected {family.layers_path}, a list of "
                        f"{model.config.num_hidden_layers} layers")
    self_attention_modules(model)  # marks the depths while the list is whole
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


def projection_inside(model: PreTrainedModel) -> str | None:
    """The name of the output projection inside the attention module (DistilBERT, ALBERT), or None (BERT: the
    attention module returns the heads' contexts)."""
    family = family_of(model)
    prefix = family.attention_path + "."
    return family.output_path.removeprefix(prefix) if family.output_path.startswith(prefix) else None


@contextmanager
def hook_at_depth(model: PreTrainedModel, module: torch.nn.Module, layer: int, hook, pre: bool) -> Iterator[None]:
    """``hook`` as a forward (pre-)hook of ``module`` at depth ``layer`` only: a module shared by several depths
    counts its calls from the start of each forward of ``model`` (depth ``layer`` is its call after those of the
    depths below that share it: ALBERT's second group serves depths from its first call)."""
    attention = self_attention_of(model, layer)
    if depth_of(attention) is not None:
        handles = [module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook)]
    else:
        calls = [0]
        call = 1 + sum(self_attention_of(model, depth) is attention for depth in range(layer))

        def reset(*_):
            calls[0] = 0

        def counted(*args):
            calls[0] += 1
            return hook(*args) if calls[0] == call else None

        handles = [model.register_forward_pre_hook(reset),
                   module.register_forward_pre_hook(counted) if pre else module.register_forward_hook(counted)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def self_attention_output(model: PreTrainedModel, layer: int, stop: type[Exception] | None = None) -> Iterator[list]:
    """A list that the next forward fills with layer ``layer``'s heads' context vectors ``[batch, seq, heads *
    head_dim]`` (side by side, the input of the output projection); ``stop``: raised right after them."""
    seen: list[torch.Tensor] = []

    def record(context: torch.Tensor) -> None:
        seen.append(context)
        if stop is not None:
            raise stop

    module, inside = self_attention_of(model, layer), projection_inside(model)
    if inside is None:
        hooked = hook_at_depth(model, module, layer, lambda m, args, output: record(output[0]), pre=False)
    else:
        hooked = hook_at_depth(model, getattr(module, inside), layer, lambda m, args: record(args[0]), pre=True)
    with hooked:
        yield seen


@contextmanager
def replay_self_attention(model: PreTrainedModel, layer: int, output: torch.Tensor) -> Iterator[PreTrainedModel]:
    """Inside the block, layer ``layer``'s output projection gets ``output`` ``[batch, seq, heads * head_dim]`` as
    the heads' contexts; where the attention module returns the contexts (BERT), nothing of it is computed (no
    query, key or value projections)."""
    module, inside = self_attention_of(model, layer), projection_inside(model)
    if inside is None:
        module.forward = lambda *args, **kwargs: (output, None)  # an instance attribute shadows the class's forward
        try:
            yield model
        finally:
            del module.forward
        return
    with hook_at_depth(model, getattr(module, inside), layer, lambda m, args: (output,), pre=True):
        yield model


@contextmanager
def start_at_layer(model: PreTrainedModel, layer: int, hidden_states: torch.Tensor) -> Iterator[PreTrainedModel]:
    """Inside the block, a forward feeds ``hidden_states`` to layer ``layer`` and runs only the layers from it on.

    The other inputs (attention mask, unit ids, plan ids) are given to the forward as usual; the embeddings
    still run (cheap), and layer ``layer`` gets ``hidden_states`` in place of what they give.
    """
    encoder, layers = encoder_layers(model)

    def replace_input(module, args, kwargs):
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": hidden_states}
        return (hidden_states, *args[1:]), kwargs

    handle = layers[layer].register_forward_pre_hook(replace_input, with_kwargs=True)  # the first layer that runs
    family = family_of(model)
    name = family.encoder(model)[1]
    setattr(encoder, name, layers[layer:])  # the same modules (their depth marks unchanged), fewer of them
    extras = {extra: getattr(encoder, extra, None) for extra in family.first_layer_only} if layer else {}
    try:
        for extra in extras:  # DeBERTa's conv follows its first layer: not the first that runs here
            setattr(encoder, extra, None)
        yield model
    finally:
        for extra, module in extras.items():
            setattr(encoder, extra, module)
        setattr(encoder, name, layers)
        handle.remove()
