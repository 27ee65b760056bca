"""Tiny random models of every encoder family, and a float64 reference of a plan written from the definitions.

The reference runs the family's own modules in float64 with an attention function of this file registered in
transformers' ``AttentionInterface``: it computes each head's eager attention (``softmax(q k^T * scaling)`` over the
keys the family's mask lets a query see), one example and one head at a time, and applies the head's policy to
those probabilities by definition (``reference.head_attention``). Nothing of headlab runs in it; a call's depth is
its position among the forward's attention calls (the order every family calls its layers in).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from reference import head_attention
from transformers import AttentionInterface, AutoConfig, AutoModel
from transformers.masking_utils import AttentionMaskInterface, eager_mask

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
}


def tiny_model(name: str, head: type | None = None, seed: int = 0) -> torch.nn.Module:
    """A random model of ``name`` (a key of ``CONFIGS``) in eval mode, with sharp attention: the query and key
    weights scaled up, so that every policy changes the outputs (a fresh init attends almost uniformly)."""
    config = AutoConfig.for_model(name.removesuffix("-groups"), **CONFIGS[name])
    torch.manual_seed(seed)
    model = (head or AutoModel).from_config(config).eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith(("query.weight", "key.weight", "q_lin.weight", "k_lin.weight", "Wqkv.weight")):
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
        out = torch.zeros_like(query)  # [batch, heads, seq, head_dim]
        for b in range(batch_size):
            valid = torch.ones(n, n, dtype=torch.bool) if attention_mask is None else \
                attention_mask[b, 0].expand(n, n) > torch.finfo(attention_mask.dtype).min / 2
            units = None if state["units"] is None else state["units"][b]
            for h in range(heads):
                scores = query[b, h] @ key[b, h].T * scale  # [n, n]
                weights = head_attention(scores, valid, units, state["policy_of"](depth, h), state["renormalize"])
                if state["record"] is not None:
                    state["record"].append((depth, b, h, weights.detach().clone()))
                out[b, h] = weights @ value[b, h]
        return out.transpose(1, 2).contiguous(), None
    return attention


@contextmanager
def reference_of(model: torch.nn.Module, policy_of: Callable[[int, int], str], units: torch.Tensor | None,
                 renormalize: bool, record: list | None = None) -> Iterator[torch.nn.Module]:
    """A float64 copy of ``model`` whose forwards apply ``policy_of(depth, head)`` by definition (module docstring);
    ``record`` gets ``(depth, example, head, weights [seq, seq])`` of every head."""
    state = {"calls": 0, "policy_of": policy_of, "units": units, "renormalize": renormalize, "record": record}
    AttentionInterface.register(REFERENCE, _reference_attention(state))
    AttentionMaskInterface.register(REFERENCE, eager_mask)
    reference = copy.deepcopy(model).double()
    configs = {id(m.config): m.config for m in reference.modules() if hasattr(m, "config")}
    for config in configs.values():
        config._attn_implementation_internal = REFERENCE
    reference.register_forward_pre_hook(lambda *_: state.update(calls=0))
    yield reference
