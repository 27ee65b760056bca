"""An independent float64 BERT forward written from the definitions (DESIGN.md section 2).

Nothing here calls headlab or transformers' attention: the weights are read from the
state dict and every head's attention matrix is built explicitly, one example and one head
at a time, then changed by its policy. Tests compare headlab against this.
"""

from __future__ import annotations

import math

import torch


def params_of(model) -> dict[str, torch.Tensor]:
    """float64 copies of a model's weights, named without the task model's ``bert.`` prefix."""
    state = {}
    for name, tensor in model.state_dict().items():
        state[name.removeprefix("bert.")] = tensor.detach().double().clone()
    return state


def _layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def head_attention(scores, valid, units, policy, renormalize):
    """Attention matrix ``[n, n]`` of one head of one example under ``policy``.

    scores: raw scaled scores ``[n, n]``; valid: bool ``[n, n]``, the keys each query may see
    (non-padding keys); units: ``[n]`` unit ids (or None).
    """
    n = scores.shape[0]
    if policy in ("prune", "mean", "resample", "optimal"):  # substituted: no attention, the context from elsewhere
        return torch.zeros(n, n, dtype=scores.dtype)
    if policy == "uniform":
        return valid.double() / valid.sum(-1, keepdim=True).clamp(min=1)

    def softmax_over(allowed):  # softmax over the allowed keys of each row; a row with none is 0
        out = torch.zeros(n, n, dtype=scores.dtype)
        for i in range(n):
            keys = allowed[i].nonzero().flatten()
            if len(keys):
                s = scores[i, keys]
                e = torch.exp(s - s.max())
                out[i, keys] = e / e.sum()
        return out

    full = valid.bool()
    if policy == "keep":
        return softmax_over(full)
    same = units[:, None] == units[None, :]
    shared = units == -2  # a special token: in every unit, neither policy takes its pairs
    keep = full & (shared[:, None] | shared[None, :] | (same == (policy == "drop_inter")))
    if renormalize:
        return softmax_over(keep)
    probs = softmax_over(full)
    return probs * keep.to(scores.dtype)


def bert_forward(params, config, input_ids, attention_mask, token_type_ids, policy_of, sentence_ids=None,
                 renormalize=False, gates=None, record=None, substitutes=None):
    """Last hidden states ``[batch, seq, hidden]`` in float64; ``policy_of(layer, head) -> policy``.

    ``attention_mask``: ``[batch, seq]`` (1 = real token) or ``[batch, seq, seq]`` (query x key).
    ``gates`` ``[batch, layers, heads]``: multiply each head's context vector. ``record``: a dict; its
    ``"contexts"`` list gets each layer's (gated) context ``[batch, seq, hidden]``, the graph node, and for
    every other key (a policy) each layer's context with every head under that policy, on the same input;
    an ``"attention"`` list gets ``(layer, example, head, zeros [n, n])``: leaves added to each attention
    matrix, so their gradients are those of the attention weights; a ``"weights"`` list gets
    ``(layer, example, head, weights [n, n])`` (after the policy, detached). ``substitutes(layer, example, head,
    policy)``: the context ``[n, head_dim]`` a ``mean`` / ``resample`` head takes (``substitutes_from``).
    """
    p = params
    eps = config.layer_norm_eps
    num_heads = config.num_attention_heads
    head_dim = config.hidden_size // num_heads
    batch, n = input_ids.shape
    positions = torch.arange(n)
    x = (
        p["embeddings.word_embeddings.weight"][input_ids]
        + p["embeddings.position_embeddings.weight"][positions]
        + p["embeddings.token_type_embeddings.weight"][token_type_ids]
    )
    x = _layer_norm(x, p["embeddings.LayerNorm.weight"], p["embeddings.LayerNorm.bias"], eps)
    for layer in range(config.num_hidden_layers):
        pre = f"encoder.layer.{layer}."

        def lin(h, name, pre=pre):
            return h @ p[pre + name + ".weight"].T + p[pre + name + ".bias"]

        q, k, v = (lin(x, f"attention.self.{m}") for m in ("query", "key", "value"))
        context = torch.zeros_like(x)
        others = {policy: torch.zeros_like(x) for policy in record or ()
                  if policy not in ("contexts", "attention", "weights")}
        for b in range(batch):
            valid = attention_mask[b].bool()
            valid = valid.expand(n, n) if valid.dim() == 1 else valid
            units = None if sentence_ids is None else sentence_ids[b]
            for h in range(num_heads):
                cols = slice(h * head_dim, (h + 1) * head_dim)
                scores = q[b, :, cols] @ k[b, :, cols].T / math.sqrt(head_dim)
                attention = head_attention(scores, valid, units, policy_of(layer, h), renormalize)
                if record is not None and "weights" in record:
                    record["weights"].append((layer, b, h, attention.detach().clone()))
                if record is not None and "attention" in record:  # + a zero leaf: d loss / d it = d loss / d A
                    nudge = torch.zeros_like(attention, requires_grad=True)
                    attention = attention + nudge
                    record["attention"].append((layer, b, h, nudge))
                gate = 1.0 if gates is None else gates[b, layer, h]
                own = policy_of(layer, h)
                put = substitutes(layer, b, h, own) if own in ("mean", "resample", "optimal") else 0.0  # [n, head_dim]
                context[b, :, cols] = gate * (attention @ v[b, :, cols] + put)
                for policy, other in others.items():
                    with torch.no_grad():
                        taken = substitutes(layer, b, h, policy) if policy in ("mean", "resample", "optimal") else 0.0
                        other[b, :, cols] = head_attention(scores, valid, units, policy, renormalize) @ v[b, :, cols] \
                            + taken
        if record is not None:
            record.setdefault("contexts", []).append(context)
            for policy, other in others.items():
                record[policy].append(other)
        x = _layer_norm(lin(context, "attention.output.dense") + x,
                        p[pre + "attention.output.LayerNorm.weight"], p[pre + "attention.output.LayerNorm.bias"], eps)
        ffn = lin(_gelu(lin(x, "intermediate.dense")), "output.dense")
        x = _layer_norm(ffn + x, p[pre + "output.LayerNorm.weight"], p[pre + "output.LayerNorm.bias"], eps)
    return x


def bert_contexts(params, config, inputs) -> torch.Tensor:
    """Every head's context vectors of the unablated model: ``[layers, batch, seq, heads, head_dim]`` in float64."""
    record = {"contexts": []}
    bert_forward(params, config, inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"],
                 lambda layer, head: "keep", record=record)
    heads = config.num_attention_heads
    return torch.stack([c.view(*c.shape[:2], heads, -1) for c in record["contexts"]]).detach()


def substitutes_from(contexts, attention_mask, sources=None):
    """``substitutes(layer, example, head) -> [seq, head_dim]`` by definition from every head's unablated contexts
    ``[layers, batch, seq, heads, head_dim]`` on a reference set with ``attention_mask`` ``[batch, seq]``, and the
    means ``[layers, heads, head_dim]``: a ``mean`` head takes its mean over the set's non-padding tokens at every
    position; a ``resample`` head of example b takes example ``sources[b]``'s contexts position by position, and its
    mean at the positions that example has no token at."""
    layers, batch, n, heads, width = contexts.shape
    means = torch.zeros(layers, heads, width, dtype=torch.float64)
    count = 0
    for b in range(batch):
        for i in range(n):
            if attention_mask[b, i]:
                means += contexts[:, b, i]
                count += 1
    means /= count

    def substitute(layer, b, h, policy):
        if policy == "mean":
            return means[layer, h].expand(n, width)
        source = sources[b]
        return torch.stack([contexts[layer, source, i, h] if attention_mask[source, i] else means[layer, h]
                            for i in range(n)])
    return substitute, means


def classifier_logits(params, hidden):
    """BertForSequenceClassification head: tanh pooler on [CLS], then the classifier."""
    pooled = torch.tanh(hidden[:, 0] @ params["pooler.dense.weight"].T + params["pooler.dense.bias"])
    return pooled @ params["classifier.weight"].T + params["classifier.bias"]


def qa_logits(params, hidden):
    """BertForQuestionAnswering head: (start, end) logits ``[batch, seq]`` each."""
    logits = hidden @ params["qa_outputs.weight"].T + params["qa_outputs.bias"]
    return logits[..., 0], logits[..., 1]
