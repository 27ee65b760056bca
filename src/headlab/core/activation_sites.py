"""The activations activation patching reads and writes (``Site``), found through the model's family.

Seven kinds of site per layer, each an activation ``[batch, seq, width]`` at one module of the layer:

=============  ======================================================================================
``head``       a head's context vector: its ``head_dim`` columns of the output projection's input (the
               heads' contexts side by side, ``[batch, seq, heads * head_dim]``)
``attention``  the attention block's output: the output projection's output, before the residual
               connection (and, in post-LN families, before the LayerNorm)
``mlp``        the feed-forward block's output: its last linear map's output, before the residual connection
``residual``   the residual stream after the layer: the next layer's input (the layer's output, or DeBERTa-v2's
               convolution's after the first layer)
``query``,     a head's query, key or value: its ``head_dim`` columns of that projection's output (ModernBERT's
``key``,       one ``Wqkv`` holds the three, side by side), before any position rotation; path patching's
``value``      receivers
=============  ======================================================================================

``recorded`` keeps a forward's activations at some sites; ``patched`` makes a forward use another run's activations
there, at every position or at chosen ones (``positions``: ``[batch, seq]`` booleans), a head's columns only for a
head site. A module that serves several depths (ALBERT) is hooked at the call of the site's depth only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from headlab.core.families import family_of
from headlab.core.families.base import module_at
from headlab.core.model_parts import head_width, hook_at_depth, projection_inside, self_attention_of
from headlab.errors import UserError

SITE_KINDS = ("head", "attention", "mlp", "residual", "query", "key", "value")
INPUTS = ("query", "key", "value")  # a head's inputs, each a projection's columns
HEAD_KINDS = ("head", *INPUTS)  # the kinds of site that belong to one head


@dataclass(frozen=True)
class Site:
    """One activation: ``kind`` (``SITE_KINDS``) at depth ``layer``; ``head`` for a head's kinds only."""

    kind: str
    layer: int
    head: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in SITE_KINDS:
            raise UserError(f"site kind {self.kind!r} is not one of {', '.join(SITE_KINDS)}")
        if (self.head is None) != (self.kind not in HEAD_KINDS):
            raise UserError(f"a {self.kind} site {'needs' if self.kind in HEAD_KINDS else 'takes no'} head")

    @property
    def name(self) -> str:
        """``L3H2`` for a head's context, ``L3H2.query`` for its inputs, ``L3.mlp`` for the others."""
        if self.kind not in HEAD_KINDS:
            return f"L{self.layer}.{self.kind}"
        return f"L{self.layer}H{self.head}" + ("" if self.kind == "head" else f".{self.kind}")

    def check(self, model: PreTrainedModel) -> None:
        """A ``UserError`` when the model has no such layer or head."""
        layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
        if not 0 <= self.layer < layers or (self.head is not None and not 0 <= self.head < heads):
            raise UserError(f"site {self.name}: the model has layers 0-{layers - 1} and heads 0-{heads - 1}")


@dataclass(frozen=True)
class Patch:
    """Site ``site`` takes ``source``'s values (the site's whole activation in another run, as ``recorded`` gives it:
    ``[batch, seq, width]``) at ``positions`` (``[batch, seq]`` booleans; None: every position)."""

    site: Site
    source: torch.Tensor
    positions: torch.Tensor | None = None


@contextmanager
def recorded(model: PreTrainedModel, sites: Iterable[Site]) -> Iterator[dict[tuple[str, int], torch.Tensor]]:
    """A dict the next forward fills with the whole activation ``[batch, seq, width]`` of each site's
    ``(kind, layer)`` (a head site's: every head's contexts; ``columns`` picks one head's)."""
    seen: dict[tuple[str, int], torch.Tensor] = {}
    with ExitStack() as stack:
        for kind, layer in dict.fromkeys((site.kind, site.layer) for site in _checked(model, sites)):
            def keep(activation: torch.Tensor, key=(kind, layer)) -> None:
                seen[key] = activation
            stack.enter_context(_at_site(model, kind, layer, keep))
        yield seen


@contextmanager
def patched(model: PreTrainedModel, patches: Sequence[Patch]) -> Iterator[PreTrainedModel]:
    """Inside the block, a forward uses each patch's source at its site (module docstring)."""
    by_module: dict[tuple[str, int], list[Patch]] = {}
    for patch in patches:
        by_module.setdefault((patch.site.kind, patch.site.layer), []).append(patch)
    _checked(model, (patch.site for patch in patches))
    width = head_width(model)
    fused = model.config.num_attention_heads if family_of(model).fused else None
    with ExitStack() as stack:
        for (kind, layer), mine in by_module.items():
            def change(activation: torch.Tensor, mine=mine) -> torch.Tensor:
                return _replaced(activation, mine, width, fused)
            stack.enter_context(_at_site(model, kind, layer, change))
        yield model


def columns(site: Site, width: int, fused: int | None = None) -> slice:
    """The site's columns of its recorded activation: a head's ``head_dim`` (``width``) columns, every column for the
    other kinds; ``fused``: the head count of a projection that holds query, key and value blocks (ModernBERT)."""
    if site.kind not in HEAD_KINDS:
        return slice(None)
    start = (INPUTS.index(site.kind) * fused * width if fused and site.kind in INPUTS else 0) + site.head * width
    return slice(start, start + width)


def _replaced(activation: torch.Tensor, patches: list[Patch], width: int, fused: int | None = None) -> torch.Tensor:
    """``activation`` ``[batch, seq, width]`` with each patch's columns taken from its source where it patches."""
    out = activation.clone()
    for patch in patches:
        if tuple(patch.source.shape) != tuple(activation.shape):
            raise UserError(f"site {patch.site.name}: the source activation has shape {list(patch.source.shape)}; "
                            f"this forward's is {list(activation.shape)} (clean and corrupted inputs must have the "
                            "same length)")
        cols = columns(patch.site, width, fused)
        source = patch.source[..., cols].to(activation.dtype)
        if patch.positions is not None:  # [batch, seq] -> [batch, seq, 1]
            source = torch.where(patch.positions[..., None].to(activation.device), source, out[..., cols])
        out[..., cols] = source
    return out


def _checked(model: PreTrainedModel, sites: Iterable[Site]) -> list[Site]:
    sites = list(sites)
    for site in sites:
        site.check(model)
    return sites


@contextmanager
def _at_site(model: PreTrainedModel, kind: str, layer: int, change) -> Iterator[None]:
    """Hook the module of ``(kind, layer)``: ``change(activation)`` sees the activation and returns None (read) or
    the activation the forward goes on with."""
    family = family_of(model)
    block = family.layers(model)[layer]
    if kind == "head":
        attention, inside = self_attention_of(model, layer), projection_inside(model)
        if inside is None:  # the attention module returns the contexts (BERT): its output's first element
            hook = lambda module, args, output: _first(output, change)  # noqa: E731
            with hook_at_depth(model, attention, layer, hook, pre=False):
                yield
            return
        hook = lambda module, args: _first(args, change)  # noqa: E731  the projection's input
        with hook_at_depth(model, getattr(attention, inside), layer, hook, pre=True):
            yield
        return
    if kind in INPUTS:  # the projection's output
        with _content_projection(model, layer, kind, change):
            yield
        return
    if kind == "residual":
        module = _after_first_layer(model) if layer == 0 else None
        module = block if module is None else module
    else:
        module = module_at(block, family.output_path if kind == "attention" else family.mlp_path)
    with hook_at_depth(model, module, layer, lambda module, args, output: _first(output, change), pre=False):
        yield


@contextmanager
def _content_projection(model: PreTrainedModel, layer: int, kind: str, change) -> Iterator[None]:
    """Hook the query, key or value projection of layer ``layer`` at its first call after the attention module starts:
    the projection of the hidden states (DeBERTa projects its relative position embeddings with the same modules
    afterwards)."""
    family, attention = family_of(model), self_attention_of(model, layer)
    names = family.projections
    projection = getattr(attention, names[0] if family.fused else names[INPUTS.index(kind)])
    started = [False]

    def start(*_) -> None:
        started[0] = True

    def content(module, args, output):
        if not started[0]:
            return None
        started[0] = False
        return _first(output, change)

    with hook_at_depth(model, attention, layer, start, pre=True), \
            hook_at_depth(model, projection, layer, content, pre=False):
        yield


def _after_first_layer(model: PreTrainedModel) -> torch.nn.Module | None:
    """The encoder module applied to the first layer's output, whose output the second layer gets (DeBERTa-v2's
    convolution, where its config has one), or None."""
    family = family_of(model)
    if not family.first_layer_only:
        return None
    encoder, _ = family.encoder(model)
    found = [module for name in family.first_layer_only if (module := getattr(encoder, name, None)) is not None]
    return found[0] if found else None


def _first(values, change):
    """``change`` applied to a module's output (or input) tensor, or to the first element of its tuple; None (keep
    the values) when ``change`` returns None."""
    tensor = values[0] if isinstance(values, tuple) else values
    new = change(tensor)
    if new is None:
        return None
    return (new, *values[1:]) if isinstance(values, tuple) else new
