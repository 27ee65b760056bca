"""Path patching (Wang et al. 2022): how much of a contrast flows from one head to named receivers.

A sender head's context is taken from the source run while every other head keeps the base run's context (frozen;
the MLPs and LayerNorms are recomputed), so the change can reach later layers only through the residual stream and
the MLPs, not through other heads. What reaches the receivers' queries, keys or values (``inputs``) in that run is
then patched into the base run, where nothing else changes; with the model's output as the receiver, the frozen run's
own output is scored (the sender's paths that avoid every other head). Per batch, one forward of each run records every
head's context; each sender then costs two forwards (one for the output), started at the sender's layer (and at the
lowest receiver's) from the base run's input to it, since nothing below changes (not ALBERT: whole forwards).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from headlab.analysis.patching.patch_evaluator import PatchEvaluator
from headlab.core.activation_sites import Patch, Site, patched, recorded
from headlab.core.model_parts import layer_inputs, start_at_layer
from headlab.errors import UserError

OUTPUT = "output"  # the receiver that is the model's output


@dataclass(frozen=True)
class PathSpec:
    """One path patch: ``sender`` (a head's context site) to ``receivers`` (query / key / value sites of later heads;
    None: the model's output). ``position`` and ``unit`` are None: a path patch acts at every position."""

    sender: Site
    receivers: tuple[Site, ...] | None = None
    label: str = OUTPUT  # how the receivers are named (the selector and inputs)
    position: None = None
    unit: None = None

    @property
    def site(self) -> Site:
        return self.sender

    @property
    def name(self) -> str:
        return f"{self.sender.name}->{self.label}"


def path_specs(senders: list[tuple[int, int]], receivers: list[tuple[int, int]] | None, inputs: list[str]
               ) -> list[PathSpec]:
    """One spec per sender head: to the ``inputs`` of the receivers above it (``receivers`` None: the output)."""
    specs = []
    for layer, head in senders:
        sender = Site("head", layer, head)
        if receivers is None:
            specs.append(PathSpec(sender))
            continue
        chosen = tuple(Site(kind, l, h) for l, h in receivers if l > layer for kind in inputs)
        if not chosen:
            raise UserError(f"patch.path: sender {sender.name} has no receiver in a later layer (receivers: "
                            f"{', '.join(f'L{l}H{h}' for l, h in receivers)}); its paths reach only later heads")
        label = ",".join(f"L{l}H{h}" for l, h in receivers if l > layer) + f" ({'/'.join(inputs)})"
        specs.append(PathSpec(sender, chosen, label))
    return specs


class PathEvaluator(PatchEvaluator):
    """Scores the clean run, the corrupted run and each path patch of ``specs`` (module docstring); ``scores`` as
    ``PatchEvaluator``'s."""

    def __init__(self, model: torch.nn.Module, task_type: str, specs: list[PathSpec], direction: str):
        super().__init__(model, task_type, [], direction, 1)
        self.specs = list(specs)
        config = model.config
        self.heads = [Site("head", layer, head) for layer in range(config.num_hidden_layers)
                      for head in range(config.num_attention_heads)]

    @torch.no_grad()
    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        base, source = self._runs(batch)
        mask = base["attention_mask"]  # [batch, seq]
        with recorded(self.model, self.heads) as source_heads:
            source_logits = self.logits(self.model(**source))
        with recorded(self.model, self.heads) as base_heads, \
                layer_inputs(self.model) if self.prefix else nullcontext([]) as entering:
            base_logits = self.logits(self.model(**base))
        labels, contrast, examples = self._keep_runs(batch, base_logits, source_logits, mask)

        def from_layer(layer: int):  # a forward from ``layer``'s base input (the layers below are the base run's)
            return start_at_layer(self.model, layer, entering[layer]) if self.prefix else nullcontext()

        for index, spec in enumerate(self.specs):
            sender = spec.sender
            frozen = [Patch(site, (source_heads if site == sender else base_heads)[("head", site.layer)])
                      for site in self.heads if site.layer >= sender.layer]  # the sender from the source run
            if spec.receivers is None:
                with patched(self.model, frozen), from_layer(sender.layer):
                    logits = self.logits(self.model(**base))
            else:
                with patched(self.model, frozen), recorded(self.model, spec.receivers) as reaching, \
                        from_layer(sender.layer):  # hooks first: a forward from a layer lists fewer layers
                    self.model(**base)
                receive = [Patch(site, reaching[(site.kind, site.layer)]) for site in spec.receivers]
                with patched(self.model, receive), from_layer(min(site.layer for site in spec.receivers)):
                    logits = self.logits(self.model(**base))
            self._keep(index, examples, self._scored(logits, labels, contrast, mask))
            self.count_patched(1)
