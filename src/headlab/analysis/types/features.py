"""``headlab.attention_features``: per-head attention statistics in one streaming pass (DESIGN.md section 5).

Every statistic is document-weighted: averaged over the non-padding queries of a sequence, then over
sequences. The weights come from ``observe_attention`` (the model's own softmax of q k^T, one layer at a
time) and are reduced at once, so memory does not grow with the number of sequences:

- ``distance`` and ``clark`` (but entropy) are sums of A[i, j] times a per-(query, key) table: one
  ``[batch, seq*seq] x [seq*seq, columns]`` product per layer gives every bin and column at once;
- ``sieve`` scores are the same product with per-sequence weights (one value per sequence and head);
- ``js`` needs every head's rows for the same query: the batch's non-padding (query, key) weights of all
  layers are kept until the forward ends (what ``output_attentions=True`` holds), then reduced pairwise.

JS(P, Q) = sum_j [(p ln p + q ln q) / 2 - m ln m], m = (p + q) / 2, is computed per head pair as
(E_a + E_b) / 2 - C_ab with E the weighted sum of p ln p and C_ab that of m ln m = (s ln s) / 2 - s ln 2 / 2
(s = p + q), so only ``s ln s`` is pairwise: on CPU in one fused loop (``log_sums``), elsewhere torch ops.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from headlab.core.head_names import head_name
from headlab.core.observe import observe_attention
from headlab.errors import UserError

FAMILIES = ("distance", "clark", "sieve", "js")
WINDOWS = 16
DISTANCE_BINS = ("self", *(f"window{w}" for w in range(WINDOWS)), "cls", "sep", "comma", "period")
CLARK = ("cls", "sep", "punct", "next", "prev", "entropy", "cls_entropy")
SIEVES = ("local", "delimiter", "delimiter_cls", "delimiter_sep", "block")
_NEXT, _PREV = len(DISTANCE_BINS), len(DISTANCE_BINS) + 1  # columns after the 21 bins
_DOCUMENT_COLUMNS = len(DISTANCE_BINS) + 2
_JS_CHUNK = 1 << 24  # elements of the pairwise buffer
_TINY = 1e-30  # p ln(p + tiny): 0 for p = 0, p ln p to float32 precision otherwise (twice as fast as xlogy)


@dataclass(frozen=True)
class TokenKinds:
    """Token ids the statistics single out: [CLS], [SEP], ``,`` and ``.`` (each alone and after a word boundary:
    byte-level BPE's ``Ġ,``, SentencePiece's ``▁,``; none when the vocabulary lacks it), and every special token."""

    cls: int
    sep: int
    comma: tuple[int, ...]
    period: tuple[int, ...]
    special: tuple[int, ...]

    @classmethod
    def of(cls, tokenizer) -> TokenKinds:
        def token_id(token: str) -> int | None:
            found = tokenizer.convert_tokens_to_ids(token)
            return None if found is None or found == tokenizer.unk_token_id else int(found)

        def spellings(mark: str) -> tuple[int, ...]:
            found = {token_id(piece) for piece in (mark, "\u0120" + mark, "\u2581" + mark)}
            return tuple(sorted(found - {None}))

        if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
            raise UserError("the tokenizer has no [CLS]/[SEP] tokens: attention features need a BERT-family tokenizer")
        return cls(tokenizer.cls_token_id, tokenizer.sep_token_id, spellings(","), spellings("."),
                   tuple(sorted(set(tokenizer.all_special_ids))))


@dataclass
class AttentionFeatures:
    """What ``attention_features`` returns; arrays are float64 on the CPU (module and DESIGN.md section 5)."""

    num_layers: int
    num_heads: int
    num_sequences: int
    families: tuple[str, ...]
    distance: np.ndarray | None = None  # [L, H, 21], order DISTANCE_BINS
    distance_sequences: np.ndarray | None = None  # [num_sequences, L, H, 21]: each sequence's (for stability)
    clark: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [L, H]
    sieve: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [num_sequences, L, H] (NaN: empty sieve)
    js: np.ndarray | None = None  # [L*H, L*H], head index l*H + h
    js_sequences: int = 0  # the first sequences JS averages over (all unless limited)

    def head_names(self) -> list[str]:
        return [head_name(layer, head) for layer in range(self.num_layers) for head in range(self.num_heads)]

    def per_head(self) -> dict[str, np.ndarray]:
        """Every per-head quantity, ``[L, H]`` each: ``dist_<bin>``, ``clark_<name>``, ``sieve_<name>`` (the mean)."""
        columns = {}
        if self.distance is not None:
            columns |= {f"dist_{name}": self.distance[..., i] for i, name in enumerate(DISTANCE_BINS)}
        columns |= {f"clark_{name}": values for name, values in self.clark.items()}
        columns |= {f"sieve_{name}": np.nanmean(values, axis=0) for name, values in self.sieve.items()}
        return columns

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat name -> array mapping (``np.savez``), inverted by ``from_arrays``."""
        arrays = {"shape": np.array([self.num_layers, self.num_heads, self.num_sequences, self.js_sequences]),
                  "families": np.array(self.families)}
        if self.distance is not None:
            arrays |= {"distance": self.distance, "distance_sequences": self.distance_sequences}
        if self.js is not None:
            arrays["js"] = self.js
        arrays |= {f"clark/{k}": v for k, v in self.clark.items()} | {f"sieve/{k}": v for k, v in self.sieve.items()}
        return arrays

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> AttentionFeatures:
        layers, heads, sequences, js_sequences = (int(v) for v in arrays["shape"])
        prefixed = lambda prefix: {k.removeprefix(prefix): np.asarray(v) for k, v in arrays.items()  # noqa: E731
                                   if k.startswith(prefix)}
        return cls(layers, heads, sequences, tuple(str(f) for f in arrays["families"]),
                   arrays.get("distance"), arrays.get("distance_sequences"), prefixed("clark/"), prefixed("sieve/"),
                   arrays.get("js"), js_sequences)


def attention_features(model, tokenizer, batches: Iterable[Mapping[str, torch.Tensor]],
                       families: Iterable[str] = FAMILIES, js_max_sequences: int | None = None) -> AttentionFeatures:
    """Per-head attention statistics of ``model`` over ``batches`` (dicts with ``input_ids``, ``attention_mask``
    and optionally ``token_type_ids``), in one pass; ``tokenizer`` names the [CLS], [SEP], ``,`` and ``.`` ids.
    ``js_max_sequences``: JS over the first N sequences only (the other families use all)."""
    families = tuple(dict.fromkeys(families))
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise UserError(f"unknown attention feature families {unknown or '[]'}; allowed: {', '.join(FAMILIES)}")
    config = model.config
    accumulator = FeatureAccumulator(config.num_hidden_layers, config.num_attention_heads, families,
                                     TokenKinds.of(tokenizer), next(model.parameters()).device, js_max_sequences)
    with torch.inference_mode(), observe_attention(model, accumulator.layer):
        for number, batch in enumerate(batches):
            inputs = {k: batch[k].to(accumulator.device) for k in ("input_ids", "attention_mask", "token_type_ids")
                      if batch.get(k) is not None}
            accumulator.begin(inputs["input_ids"], inputs.get("attention_mask"), number)
            model(**inputs)
            accumulator.end()
    return accumulator.result()


class FeatureAccumulator:
    """Running sums of every family on the model's device: ``begin(batch)``, ``layer(l, weights)``, ``end()``."""

    def __init__(self, num_layers: int, num_heads: int, families: tuple[str, ...], kinds: TokenKinds,
                 device: torch.device, js_max_sequences: int | None = None):
        self.shape, self.families, self.kinds, self.device = (num_layers, num_heads), families, kinds, device
        self.sequences = 0
        self.cls_rows = 0  # sequences with a [CLS] query (cls_entropy's denominator)
        acc = lambda *shape: torch.zeros(*shape, dtype=torch.float64, device=device)  # noqa: E731
        self.document = acc(num_layers, num_heads, _DOCUMENT_COLUMNS)  # bin / next / prev sums
        self.entropy, self.cls_entropy = acc(num_layers, num_heads), acc(num_layers, num_heads)
        self.sieve: list[torch.Tensor] = []  # per batch [L, batch, H, len(SIEVES)]
        self.distance: list[torch.Tensor] = []  # per batch [L, batch, H, 21] (float32)
        self.js = acc(num_layers * num_heads, num_layers * num_heads) if "js" in families else None
        self.js_limit, self.js_sequences, self.js_rows = js_max_sequences, 0, 0  # js_rows: this batch's
        self._batch_sieve: list[torch.Tensor | None] = []
        self._rows: torch.Tensor | None = None  # js: [L*H, valid (query, key) pairs] of the batch, filled per layer
        self._storage: torch.Tensor | None = None  # what _rows views: the largest batch's size so far
        self._js_blocks: list[tuple[int, int]] | None = None  # (first column, length) per sequence; None: gather

    # ---------------------------------------------------------------- one batch

    def begin(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, number: int = 0) -> None:
        """Per-(query, key) tables of the batch ``input_ids`` ``[batch, seq]``, shared by its layers."""
        valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        lengths = valid.sum(1)  # [batch]
        empty = (lengths == 0).nonzero().flatten().tolist()
        if empty:
            raise UserError(f"sequence {empty[0]} of batch {number} is all padding (no token to attend from)")
        self.valid, self.lengths = valid, lengths
        query_weight = valid / lengths[:, None]  # [batch, seq]: 1/n on non-padding queries
        self.query_weight = query_weight
        tables = []
        if {"distance", "clark"} & set(self.families):
            tables.append(self._document_table(input_ids, valid, lengths) * query_weight[:, :, None, None])
        if "sieve" in self.families:
            tables.append(self._sieve_table(input_ids, valid, lengths))
        batch, seq = input_ids.shape
        self.table = torch.cat(tables, -1).view(batch, seq * seq, -1) if tables else None  # [batch, seq*seq, cols]
        first_cls = (input_ids == self.kinds.cls).cumsum(1) == 1
        self.cls_query = first_cls & (input_ids == self.kinds.cls)  # [batch, seq]: each sequence's [CLS] row
        self.js_rows = self._js_rows(batch)
        if self.js_rows:
            used = torch.arange(batch, device=valid.device) < self.js_rows  # [batch]: the sequences JS takes
            pairs = (valid[:, :, None] & valid[:, None, :] & used[:, None, None]).flatten()  # [batch*seq*seq]
            self.pair_index = pairs.nonzero().flatten()
            self.pair_weight = query_weight[:, :, None].expand(batch, seq, seq).flatten()[self.pair_index]
            prefix = bool((valid == (torch.arange(seq, device=valid.device) < lengths[:, None])).all())
            sizes = lengths[: self.js_rows].tolist()  # right padding: sequence b's pairs are its first n x n block
            starts = itertools.accumulate((n * n for n in sizes[:-1]), initial=0)
            self._js_blocks = list(zip(starts, sizes)) if prefix else None
            size = self.shape[0] * self.shape[1] * len(self.pair_index)
            if self._storage is None or self._storage.numel() < size:  # kept across batches: no new pages each time
                self._storage = torch.empty(size, device=valid.device)
            self._rows = self._storage[:size].view(-1, len(self.pair_index))
        self._batch_sieve, self._batch_distance = [None] * self.shape[0], [None] * self.shape[0]

    def _js_rows(self, batch: int) -> int:
        """How many of the batch's sequences (its first ones) JS takes: all, or what ``js_max_sequences`` leaves."""
        if self.js is None:
            return 0
        return batch if self.js_limit is None else max(0, min(batch, self.js_limit - self.js_sequences))

    def layer(self, layer: int, weights: torch.Tensor) -> None:
        """Reduce one layer's weights ``[batch, heads, seq, seq]`` into the sums."""
        batch, heads, seq, _ = weights.shape
        if self.table is not None:
            columns = torch.bmm(weights.reshape(batch, heads, seq * seq), self.table)  # [batch, heads, cols]
            if {"distance", "clark"} & set(self.families):
                self.document[layer] += columns[..., :_DOCUMENT_COLUMNS].sum(0)
            if "distance" in self.families:
                self._batch_distance[layer] = columns[..., : len(DISTANCE_BINS)]
            if "sieve" in self.families:
                self._batch_sieve[layer] = columns[..., -len(SIEVES):]
        if "clark" in self.families:
            entropy = _entropy(weights)  # [batch, heads, seq]
            self.entropy[layer] += torch.einsum("bhs,bs->h", entropy, self.query_weight.to(entropy.dtype))
            self.cls_entropy[layer] += torch.einsum("bhs,bs->h", entropy, self.cls_query.to(entropy.dtype))
        if self.js_rows:
            rows = self._rows[layer * heads:(layer + 1) * heads]  # [heads, pairs]
            if self._js_blocks is None:
                torch.index_select(weights.transpose(0, 1).reshape(heads, -1), 1, self.pair_index, out=rows)
            else:  # each sequence's valid (query, key) block, copied without a transposed copy of the weights
                for b, (start, n) in enumerate(self._js_blocks):
                    rows[:, start:start + n * n].view(heads, n, n).copy_(weights[b, :, :n, :n])

    def end(self) -> None:
        """Close the batch: its sieve scores and JS sums."""
        self.sequences += len(self.lengths)
        self.cls_rows += int(self.cls_query.any(1).sum())
        if "sieve" in self.families:
            scores = torch.stack(self._batch_sieve)  # [L, batch, H, sieves]
            no_query = self._sieve_queries == 0  # [batch, sieves]: empty sieve for every query: no score
            self.sieve.append(scores.masked_fill(no_query[None, :, None, :], float("nan")))
        if "distance" in self.families:
            self.distance.append(torch.stack(self._batch_distance))
        if self.js_rows:
            self.js += _js_sums(self._rows, self.pair_weight)
            self.js_sequences += self.js_rows
        self._rows, self._batch_sieve, self._batch_distance, self.table = None, [], [], None

    # ---------------------------------------------------------------- tables

    def _document_table(self, input_ids, valid, lengths) -> torch.Tensor:
        """``[batch, seq, seq, 23]`` one-hot of each key's distance bin, then next / prev indicators."""
        seq = input_ids.shape[1]
        position = torch.arange(seq, device=input_ids.device)
        distance = (position[:, None] - position[None, :]).abs()  # [seq, seq]
        n = lengths[:, None, None]
        window = (WINDOWS * distance + n - 1) // n - 1  # ceil(16 |i-j| / n) - 1, [batch, seq, seq]
        bins = torch.where(distance == 0, 0, 1 + window.clamp(0, WINDOWS - 1))
        kinds = self.kinds
        for column, tokens in ((17, (kinds.cls,)), (18, (kinds.sep,)), (19, kinds.comma), (20, kinds.period)):
            if tokens:
                of_kind = torch.isin(input_ids, torch.tensor(tokens, device=input_ids.device))  # [batch, seq]
                bins = torch.where(of_kind[:, None, :], column, bins)  # a key of that kind
        bins = bins.masked_fill(~valid[:, None, :], 0)  # padding keys carry no weight
        table = torch.nn.functional.one_hot(bins, _DOCUMENT_COLUMNS).float()
        table[..., _NEXT] = (position[None, :] - position[:, None] == 1).float()  # key j = i + 1
        table[..., _PREV] = (position[None, :] - position[:, None] == -1).float()  # key j = i - 1
        return table

    def _sieve_table(self, input_ids, valid, lengths) -> torch.Tensor:
        """``[batch, seq, seq, sieves]``: n / |S(i)| / (queries with a sieve) for keys in S(i), else 0."""
        batch, seq = input_ids.shape
        position = torch.arange(seq, device=input_ids.device)
        kinds = self.kinds
        is_cls, is_sep = input_ids == kinds.cls, input_ids == kinds.sep
        special = torch.isin(input_ids, torch.tensor(kinds.special, device=input_ids.device))
        # a segment starts at a token right after a [SEP]: [CLS] and a segment's closing [SEP]s (RoBERTa's </s></s>)
        # count with the segment they close, as the units of drop_* do (headlab.core.units)
        opening = ~is_sep & torch.nn.functional.pad(is_sep[:, :-1], (1, 0), value=False)
        segment = opening.cumsum(1)
        key_valid = valid[:, None, :]
        sieves = {
            "local": ((position[:, None] - position[None, :]).abs() <= 2)[None] & key_valid,
            "delimiter": ((is_cls | is_sep)[:, None, :]).expand(batch, seq, seq),
            "delimiter_cls": is_cls[:, None, :].expand(batch, seq, seq),
            "delimiter_sep": is_sep[:, None, :].expand(batch, seq, seq),
            "block": (segment[:, :, None] == segment[:, None, :]) & (~special & valid)[:, None, :],
        }
        tables, queries = [], []
        for name in SIEVES:
            member = sieves[name] & valid[:, :, None]  # [batch, query, key]
            size = member.sum(-1)  # [batch, query]
            has = size > 0
            count = has.sum(-1)  # [batch]: queries with a non-empty sieve
            weight = lengths[:, None] / size.clamp(min=1) / count.clamp(min=1)[:, None]  # [batch, query]
            tables.append(member * weight[:, :, None])
            queries.append(count)
        self._sieve_queries = torch.stack(queries, -1)  # [batch, sieves]
        return torch.stack(tables, -1).float()

    # ---------------------------------------------------------------- result

    def result(self) -> AttentionFeatures:
        layers, heads = self.shape
        if self.sequences == 0:
            raise UserError("attention features need at least one sequence; the batches were empty")
        numpy = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
        features = AttentionFeatures(layers, heads, self.sequences, self.families)
        document = numpy(self.document) / self.sequences  # [L, H, 23]
        if "distance" in self.families:
            features.distance = document[..., : len(DISTANCE_BINS)]
            features.distance_sequences = numpy(torch.cat(self.distance, 1)).transpose(1, 0, 2, 3)
        if "clark" in self.families:
            bins = {name: document[..., i] for i, name in enumerate(DISTANCE_BINS)}
            features.clark = {"cls": bins["cls"], "sep": bins["sep"], "punct": bins["comma"] + bins["period"],
                              "next": document[..., _NEXT], "prev": document[..., _PREV],
                              "entropy": numpy(self.entropy) / self.sequences,
                              "cls_entropy": numpy(self.cls_entropy) / max(self.cls_rows, 1)}
        if "sieve" in self.families:
            scores = numpy(torch.cat(self.sieve, 1))  # [L, sequences, H, sieves]
            features.sieve = {name: scores[..., i].transpose(1, 0, 2) for i, name in enumerate(SIEVES)}
        if self.js is not None:
            js = numpy(self.js) / self.js_sequences
            features.js_sequences = self.js_sequences
            js = np.clip(js + js.T, 0.0, None)  # sums were kept for a < b
            np.fill_diagonal(js, 0.0)
            features.js = js
        return features


def _plogp(p: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``p ln p`` elementwise (0 for p = 0), written into ``out`` when given."""
    logs = torch.log(torch.add(p, _TINY, out=out), out=out)
    return logs.mul_(p)


def _entropy(weights: torch.Tensor) -> torch.Tensor:
    """``[..., seq]`` entropy -sum p ln p of each row of ``weights`` ``[..., seq, seq]``; on CPU one fused loop."""
    if weights.device.type == "cpu" and weights.dtype == torch.float32:
        from headlab.analysis.types.log_sums import entropy_cpu

        return entropy_cpu(weights)
    return -_plogp(weights).sum(-1)


def _js_sums(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``[N, N]`` weighted sums over pairs t of JS(rows[a, t], rows[b, t]) terms (module docstring), upper triangle;
    float64. ``rows`` ``[N heads, T]``: weights of every (query, key) pair; ``weight`` ``[T]``: its query's weight.
    On CPU one fused loop (``log_sums``), elsewhere torch ops (``_js_sums_torch``)."""
    if rows.device.type == "cpu" and rows.dtype == torch.float32:
        from headlab.analysis.types.log_sums import js_sums_cpu  # numba: imported (0.2 s) only when needed

        cross, plogp, mass = js_sums_cpu(rows, weight)
    else:
        cross, plogp, mass = _js_sums_torch(rows, weight)
    m_log_m = cross / 2 - math.log(2) / 2 * (mass[:, None] + mass[None, :])
    js = (plogp[:, None] + plogp[None, :]) / 2 - m_log_m
    return torch.triu(js, diagonal=1)  # the upper triangle; result() symmetrises


def _js_sums_torch(rows: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cross ``[N, N]``: sum w s ln s for a < b, s = p_a + p_b; own ``[N]``: sum w p ln p; mass ``[N]``: sum w p),
    float64, as ``log_sums.js_sums_cpu`` computes them: chunks of the pairwise buffer (GPUs, other dtypes)."""
    count, pairs = rows.shape
    plogp = (_plogp(rows) @ weight).double()  # [N]: sum w p ln p
    mass = (rows @ weight).double()  # [N]: sum w p
    cross = torch.zeros(count, count, dtype=torch.float64, device=rows.device)
    step = max(1, _JS_CHUNK // count)
    sums = torch.empty(count, min(step, pairs), dtype=rows.dtype, device=rows.device)
    logs = torch.empty_like(sums)
    for start in range(0, pairs, step):
        chunk, w = rows[:, start:start + step].contiguous(), weight[start:start + step]
        width = chunk.shape[1]
        for a in range(count - 1):
            s = torch.add(chunk[a + 1:], chunk[a] + _TINY, out=sums[: count - a - 1, :width])  # p + q
            s_log_s = torch.log(s, out=logs[: count - a - 1, :width]).mul_(s)
            cross[a, a + 1:] += (s_log_s @ w).double()  # sum w s ln s
    return cross, plogp, mass
