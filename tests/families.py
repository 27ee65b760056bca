"""Tiny random models of every encoder family, and a float64 reference of a plan written from the definitions.

The reference runs the family's own modules in float64 with an attention function of this file registered in
transformers' ``AttentionInterface``: it computes each head's eager attention (``softmax(q k^T * scaling)`` over the
keys the family's mask lets a query see), one example and one head at a time, and applies the head's policy to
those probabilities by definition (``reference.head_attention``). Nothing of headlab runs in it; a call's depth is
its position among the forward's attention calls (the order every family calls its layers in). DeBERTa, which calls
no attention function, gets a forward of this file on its attention modules: the module's own content and relative
scores, then the same per-head attention.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import MethodType

import torch
from reference import head_attention
from transformers import AttentionInterface, AutoConfig, AutoModel
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

REFERENCE = "headlab_tests_reference"
VOCAB = 120
SIZES = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 37,
         "max_position_embeddings": 80, "vocab_size": VOCAB}
CONFIGS = {  # model_type -> its config fields (a tiny one: 3 layers x 4 heads unless said)
    "bert": SIZES,
    "roberta": SIZES | {"pad_token_id": 1},
    "xlm-roberta": SIZES | {"pad_token_id": 1},
    "electra": SIZES | {"embedding_size": 16},
    "distilbert": {"dim": 32, "n_layers": 3, "n_heads": 4, "hidden_dim": 37, "max_position_embeddings": 80,
                   "vocab_size": VOCAB},
    "albert": SIZES | {"embedding_size": 16},  # one group: the same attention module at every depth
    "albert-groups": SIZES | {"embedding_size": 16, "num_hidden_layers": 4, "num_hidden_groups": 2},
    # layers 1 and 2 attend within a window of 2 tokens either way, layer 0 globally
    "modernbert": SIZES | {"local_attention": 4, "global_attn_every_n_layers": 3, "pad_token_id": 0,
                           "bos_token_id": 2, "cls_token_id": 2, "eos_token_id": 3, "sep_token_id": 3},
    # as deberta-v3-base: relative positions only (6 buckets, so sequences reach past them), shared position keys
    "deberta-v3": SIZES | {"relative_attention": True, "position_buckets": 6, "max_relative_positions": -1,
                           "pos_att_type": "p2c|c2p", "share_att_key": True, "position_biased_input": False,
                           "norm_rel_ebd": "layer_norm", "type_vocab_size": 0},
    # as deberta-v2-xlarge: own position projections, absolute positions too, the convolution after layer 0
    "deberta-v2": SIZES | {"relative_attention": True, "max_relative_positions": 5, "pos_att_type": "c2p|p2c",
                           "share_att_key": False, "position_biased_input": True, "conv_kernel_size": 3,
                           "type_vocab_size": 2},
}
MODEL_TYPES = {"albert-groups": "albert", "deberta-v3": "deberta-v2"}  # a CONFIGS key that is no model_type
SHARPENED = ("query.weight", "key.weight", "q_lin.weight", "k_lin.weight", "Wqkv.weight", "query_proj.weight",
             "key_proj.weight")  # DeBERTa's pos_key_proj / pos_query_proj end so too


def tiny_model(name: str, head: type | None = None, seed: int = 0) -> torch.nn.Module:
    """A random model of ``name`` (a key of ``CONFIGS``) in eval mode, with sharp attention: the query and key
    weights scaled up, so that every policy changes the outputs (a fresh init attends almost uniformly)."""
    config = AutoConfig.for_model(MODEL_TYPES.get(name, name), **CONFIGS[name])
    torch.manual_seed(seed)
    model = (head or AutoModel).from_config(config).eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith(SHARPENED):
                parameter.mul_(12.0)
    return model


def batch(seed: int = 1) -> dict[str, torch.Tensor]:
    """Three rows of 11, 8 and 5 tokens (padded on the right), their attention mask and unit ids."""
    generator = torch.Generator().manual_seed(seed)
    lengths, n = [11, 8, 5], 11
    input_ids = torch.randint(5, VOCAB, (3, n), generator=generator)
    mask = torch.tensor([[1] * length + [0] * (n - length) for length in lengths])
    input_ids[mask == 0] = 0
    units = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], [0, 0, 1, 1, 1, 5, 5, 5, 0, 0, 0],
                          [3, 3, 3, 4, 4, 0, 0, 0, 0, 0, 0]])
    return {"input_ids": input_ids, "attention_mask": mask, "sentence_ids": units.masked_fill(mask == 0, -1)}


def _reference_attention(state: dict) -> Callable:
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        depth = state["calls"]
        state["calls"] += 1
        batch_size, heads, n, head_dim = query.shape
        scale = head_dim ** -0.5 if scaling is None else scaling
        out = query.new_zeros(*query.shape[:3], value.shape[-1])  # [batch, heads, seq, head_dim]
        for b in range(batch_size):
            valid = torch.ones(n, n, dtype=torch.bool) if attention_mask is None else \
                attention_mask[b, 0].expand(n, n) > torch.finfo(attention_mask.dtype).min / 2
            units = None if state["units"] is None else state["units"][b]
            for h in range(heads):
                scores = query[b, h] @ key[b, h].T * scale  # [n, n]
                policy = state["policy_of"](depth, h)
                weights = head_attention(scores, valid, units, policy, state["renormalize"])
                if state["record"] is not None:
                    state["record"].append((depth, b, h, weights.detach().clone()))
                context = weights @ value[b, h]  # [seq, head_dim]
                if policy in ("mean", "resample", "optimal"):  # no attention: the context comes from elsewhere
                    context = context + state["substitutes"](depth, b, h, policy)
                if state["contexts"] is not None:
                    state["contexts"][depth, b, h] = context.detach().clone()
                if state["toward"] is not None:  # gate * (z + step * (z' - z)), z' under the policy
                    policy, gates, steps = state["toward"]
                    alternative = head_attention(scores, valid, units, policy, state["renormalize"]) @ value[b, h]
                    if policy in ("mean", "resample", "optimal"):
                        alternative = alternative + state["substitutes"](depth, b, h, policy)
                    context = gates[b, depth, h] * (context + steps[b, depth, h] * (alternative - context))
                out[b, h] = context
        return out.transpose(1, 2).contiguous(), None
    return attention


@contextmanager
def reference_of(model: torch.nn.Module, policy_of: Callable[[int, int], str], units: torch.Tensor | None,
                 renormalize: bool, record: list | None = None, toward: tuple | None = None,
                 substitutes: Callable | None = None, contexts: dict | None = None) -> Iterator[torch.nn.Module]:
    """A float64 copy of ``model`` whose forwards apply ``policy_of(depth, head)`` by definition (module docstring);
    ``record`` gets ``(depth, example, head, weights [seq, seq])`` of every head. ``toward = (policy, gates, steps)``
    (``[batch, layers, heads]`` each): head h's context z becomes ``gate * (z + step * (z' - z))``, z' its context
    under ``policy``, so the loss's gradients by gate and step are the gate gradient and the first-order estimate.
    ``substitutes(depth, example, head, policy)``: the context ``[seq, head_dim]`` of a ``mean`` / ``resample`` head
    (``reference.substitutes_from``); ``contexts[depth, example, head]`` gets every head's context ``[seq, head_dim]``.
    """
    state = {"calls": 0, "policy_of": policy_of, "units": units, "renormalize": renormalize, "record": record,
             "toward": toward, "substitutes": substitutes, "contexts": contexts}
    AttentionInterface.register(REFERENCE, _reference_attention(state))
    AttentionMaskInterface.register(REFERENCE, eager_mask)
    reference = copy.deepcopy(model).double()
    configs = {id(m.config): m.config for m in reference.modules() if hasattr(m, "config")}
    for config in configs.values():
        config._attn_implementation_internal = REFERENCE
    for module in reference.modules():
        if isinstance(module, DisentangledSelfAttention):  # DeBERTa computes its attention itself
            module.forward = MethodType(_reference_disentangled(state), module)
    reference.register_forward_pre_hook(lambda *_: state.update(calls=0))
    yield reference


def reference_contexts(model: torch.nn.Module, rows: dict) -> torch.Tensor:
    """Every head's context vectors of the unablated ``model`` by the reference: ``[layers, batch, seq, heads,
    head_dim]`` in float64."""
    contexts = {}
    with torch.no_grad(), reference_of(model, lambda depth, head: "keep", None, False, contexts=contexts) as ref:
        ref(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"])
    layers, batch_size, heads = (1 + max(key[i] for key in contexts) for i in range(3))
    return torch.stack([torch.stack([torch.stack([contexts[depth, b, h] for h in range(heads)], dim=1)
                                     for b in range(batch_size)]) for depth in range(layers)])


def _reference_disentangled(state: dict) -> Callable:
    """DeBERTa's attention as its module computes it (content scores over sqrt(head_dim * factor), plus the module's
    own relative terms, the keys its mask shows), one example and head at a time, the policy applied by definition."""
    attention = _reference_attention(state)

    def forward(module, hidden_states, attention_mask, output_attentions=False, query_states=None, relative_pos=None,
                rel_embeddings=None):
        heads = module.num_attention_heads
        q, k, v = (module.transpose_for_scores(projection(hidden_states), heads)  # [batch * heads, seq, head_dim]
                   for projection in (module.query_proj, module.key_proj, module.value_proj))
        factor = 1 + len({"c2p", "p2c"} & set(module.pos_att_type))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1] * factor)
        if module.relative_attention:
            scores = scores + module.disentangled_attention_bias(q, k, relative_pos, rel_embeddings, factor)
        batch, n = hidden_states.shape[:2]
        scores = scores.view(batch, heads, n, n)
        # the reference attention takes scores as query @ key: an identity key of width n carries them
        eye = torch.eye(n, dtype=scores.dtype).expand(batch, heads, n, n)
        mask = torch.zeros(batch, 1, n, n, dtype=scores.dtype).masked_fill(
            ~attention_mask.bool(), torch.finfo(scores.dtype).min)
        out, _ = attention(module, scores, eye, v.view(batch, heads, n, -1), mask, scaling=1.0)
        return out.reshape(batch, n, -1), None
    return forward
