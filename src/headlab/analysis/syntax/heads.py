"""Which heads track which dependency relation (Clark et al. 2019, section 4.2).

Each head is a parser: a word's predicted head is the word it attends to most (``dep->head``), or the word that
attends to it most (``head->dep``; ``word_attention``). Per word, head and direction: is the prediction
the gold head (``judged`` by the possessive's ``'s`` token where ``data`` says so)? The baselines predict the
word a fixed offset away, clipped to the sentence as Clark et al.'s code does (offsets -3..+2; 0, the word itself,
is never a head). Accuracies per relation are means of these per-word outcomes, which also feed the paired bootstrap.

Under a plan (``headlab.ablate``), every head is scored on the attention it computes from what the plan's earlier
layers passed on; the heads the plan itself changes get no accuracy (NaN): their attention is not theirs to show.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from headlab.analysis.syntax.data import EncodedTreebank
from headlab.analysis.syntax.sieves import (
    SYNTACTIC_SIEVES,
    beyond_offset,
    dependency_pairs,
    mean_over_pairs,
    pande_pair_scores,
    sieve_members,
    sieve_scores,
)
from headlab.analysis.syntax.treebank import LEFT_OUT_RELATIONS
from headlab.analysis.syntax.word_attention import DIRECTIONS, most_attended, slot_matrix, word_level
from headlab.core.head_names import head_name
from headlab.core.observe import observe_attention
from headlab.core.patch.ablate import ablate
from headlab.core.plans import HeadPlan

OFFSETS = (-3, -2, -1, 1, 2)
LEFT_OUT = LEFT_OUT_RELATIONS  # not in the table (Clark et al.); "all" is every other word


@dataclass
class SyntaxScores:
    """Per-word outcomes: ``correct[word, layer, head, direction]`` and ``offsets[offset][word]``."""

    correct: np.ndarray  # bool [words, layers, heads, 2]
    offsets: dict[int, np.ndarray]  # offset -> bool [words]
    relations: np.ndarray  # str [words]
    changed: np.ndarray | None = None  # bool [layers, heads]: heads the plan changes (no accuracy)
    sieve: dict[str, np.ndarray] = field(default_factory=dict)  # role -> [sentences, layers, heads] (syntax_sieves)
    beyond_offset: dict[str, np.ndarray] = field(default_factory=dict)  # role -> the same, less the offset pattern's
    sentences: np.ndarray | None = None  # int [words]: each word's sentence (the unit a treebank samples)

    def accuracy(self, words: np.ndarray) -> np.ndarray:
        """``[layers, heads, 2]`` share of ``words`` each head predicts right; NaN for the heads the plan changes."""
        accuracy = self.correct[words].mean(0)
        if self.changed is not None:
            accuracy[self.changed] = np.nan
        return accuracy

    def scope(self, relation: str) -> np.ndarray:
        """The words a table row counts: one relation, or ``all`` (every word but root and punct)."""
        if relation == "all":
            return ~np.isin(self.relations, LEFT_OUT)
        return self.relations == relation


def offset_outcomes(encoded: EncodedTreebank) -> dict[int, np.ndarray]:
    """Per offset, whether the word ``offset`` away (from the judged slot, clipped to 0..n) is the gold head."""
    return {offset: np.clip(encoded.judged + offset, 0, encoded.length) == encoded.gold for offset in OFFSETS}


class WordOutcomes:
    """Observer of every layer's attention: each word's outcome under every head and direction, batch by batch."""

    def __init__(self, encoded: EncodedTreebank, layers: int, heads: int, device: torch.device,
                 sieve: str = "pande", direction: str = "l2r"):
        self.encoded, self.device, self.kind, self.direction = encoded, device, sieve, direction
        self.correct = np.zeros((encoded.num_words, layers, heads, len(DIRECTIONS)), dtype=bool)
        self.sieve = {role: np.full((len(encoded.sentences), layers, heads), np.nan) for role in SYNTACTIC_SIEVES}
        self.beyond_offset = {role: np.full_like(scores, np.nan) for role, scores in self.sieve.items()} \
            if sieve == "pande" else {}  # the fixed-offset control (``sieves.beyond_offset``)
        self.start = self.first_sentence = 0  # the batch's first word in the flat order, its first sentence

    def begin(self, batch: dict[str, torch.Tensor]) -> None:
        lengths = batch["lengths"].to(self.device)
        slots = int(lengths.max()) + 2
        self.onehot = slot_matrix(batch["token_slots"].to(self.device), slots)  # [batch, T, slots]
        index = torch.arange(slots, device=self.device)
        self.words = (index >= 1) & (index <= lengths.unsqueeze(-1))  # [batch, slots]
        count = int(self.words.sum())
        self.range = slice(self.start, self.start + count)
        self.lengths = lengths
        self.judged = self._scatter(self.encoded.judged)  # [batch, slots]
        self.gold = self._scatter(self.encoded.gold)
        self.start += count
        sentences = slice(self.first_sentence, self.first_sentence + len(lengths))
        self.sentences, self.first_sentence = sentences, sentences.stop
        arcs = dependency_pairs if self.kind == "pande" else sieve_members
        self.members = arcs(self.gold, [s.relations for s in self.encoded.sentences[sentences]], self.words)
        self.pieces = self.onehot.sum(1)  # [batch, slots]
        self.tokens = self.pieces.sum(-1)  # [batch]: the sequence length in pieces, [CLS] and [SEP] included

    def _scatter(self, values: np.ndarray) -> torch.Tensor:
        out = torch.zeros(self.words.shape, dtype=torch.long, device=self.device)
        out[self.words] = torch.as_tensor(values[self.range], device=self.device)
        return out

    def layer(self, layer: int, weights: torch.Tensor) -> None:
        """``weights`` ``[batch, heads, T, T]``: this layer's outcomes of the batch's words."""
        words = word_level(weights, self.onehot)  # [batch, heads, slots, slots]
        predicted = most_attended(words, self.lengths)
        pair_scores = pande_pair_scores(words, self.pieces, self.tokens, self.direction) if self.kind == "pande" \
            else None
        for role, members in self.members.items():
            scores = sieve_scores(words, members, self.lengths) if pair_scores is None else \
                mean_over_pairs(pair_scores, members)
            self.sieve[role][self.sentences, layer] = scores.cpu().numpy()
            if pair_scores is not None:
                excess = beyond_offset(pair_scores, self.words, members)  # [batch, heads]
                self.beyond_offset[role][self.sentences, layer] = excess.cpu().numpy()
        heads = weights.shape[1]
        judged = self.judged.unsqueeze(1).expand(-1, heads, -1)  # [batch, heads, slots]
        for number, direction in enumerate(DIRECTIONS):
            right = predicted[direction].gather(-1, judged) == self.gold.unsqueeze(1)  # [batch, heads, slots]
            self.correct[self.range, layer, :, number] = right.transpose(1, 2)[self.words].cpu().numpy()


def syntax_scores(model, encoded: EncodedTreebank, batches: Iterable[dict[str, torch.Tensor]],
                  plan: HeadPlan | None = None, renormalize: bool = False, sieve: str = "pande",
                  direction: str = "l2r") -> SyntaxScores:
    """Every head's per-word outcomes on ``encoded`` (``batches``: its ``batches()``, in order) and the offsets',
    under ``plan`` when given (one sentence per sequence: the ``drop_*`` policies' units are that sentence); the
    syntactic sieve scores by ``sieve`` (``pande`` in ``direction``, or ``relatives``: ``sieves``)."""
    device = next(model.parameters()).device
    config = model.config
    outcomes = WordOutcomes(encoded, config.num_hidden_layers, config.num_attention_heads, device, sieve, direction)
    under_plan = ablate(model, plan, renormalize) if plan is not None else contextlib.nullcontext()
    with torch.inference_mode(), under_plan, observe_attention(model, outcomes.layer):
        for batch in batches:
            outcomes.begin(batch)
            mask = batch["attention_mask"].to(device)
            extra = {"sentence_ids": torch.where(mask.bool(), 0, -1)} if plan is not None else {}
            model(input_ids=batch["input_ids"].to(device), attention_mask=mask, **extra)
    changed = None if plan is None else np.array([[plan.policy_of(layer, head) != "keep"
                                                   for head in range(config.num_attention_heads)]
                                                  for layer in range(config.num_hidden_layers)])
    if changed is not None:
        for scores in (*outcomes.sieve.values(), *outcomes.beyond_offset.values()):
            scores[:, changed] = np.nan
    return SyntaxScores(outcomes.correct, offset_outcomes(encoded), np.asarray(encoded.relations), changed,
                        outcomes.sieve, outcomes.beyond_offset, np.asarray(encoded.sentence))


def word_maps(model, encoded: EncodedTreebank, sentences: list[int], layer: int, head: int,
              pad_id: int) -> list[np.ndarray]:
    """Word attention ``[n, n]`` (row word attends to column word; [CLS] and [SEP] left out) of one head on the
    sentences numbered ``sentences``."""
    subset = EncodedTreebank([encoded.sentences[i] for i in sentences], [encoded.input_ids[i] for i in sentences],
                             [encoded.token_slots[i] for i in sentences])
    batch = next(subset.batches(len(sentences), pad_id))
    device = next(model.parameters()).device
    captured = {}

    def observe(number: int, weights: torch.Tensor) -> None:
        if number == layer:
            slots = int(batch["lengths"].max()) + 2
            captured["words"] = word_level(weights[:, head:head + 1], slot_matrix(batch["token_slots"].to(device),
                                                                                    slots))[:, 0]
    with torch.inference_mode(), observe_attention(model, observe):
        model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    return [captured["words"][i, 1:n + 1, 1:n + 1].cpu().numpy() for i, n in enumerate(batch["lengths"].tolist())]


def relation_counts(scores: SyntaxScores, min_count: int, relations: Iterable[str] | None = None) -> pd.Series:
    """Words per relation in the table: ``all`` first, then by count. ``relations`` named: those (whatever their
    count); else every relation with at least ``min_count`` words but root and punct."""
    counts = pd.Series(scores.relations).value_counts()
    if relations is not None:
        counts = counts[counts.index.isin(list(relations))]
    else:
        counts = counts[~counts.index.isin(LEFT_OUT) & (counts >= min_count)]
    return pd.concat([pd.Series({"all": int(scores.scope("all").sum())}), counts.astype(int)])


def relations_below(scores: SyntaxScores, min_count: int, relations: Iterable[str] | None = None) -> pd.Series:
    """Words per relation that ``relation_counts`` leaves out for having fewer than ``min_count`` (none when
    ``relations`` names the relations), most first, ties by name."""
    if relations is not None:
        return pd.Series(dtype=int)
    counts = pd.Series(scores.relations).value_counts()
    below = counts[~counts.index.isin(LEFT_OUT) & (counts < min_count)].astype(int)
    return below.sort_index().sort_values(ascending=False, kind="stable")  # ties by name


def left_out_sentence(below: pd.Series, min_count: int) -> str:
    """``Left out, fewer than 10 words each (syntax.min_count): iobj 4, csubj 2.`` (empty when none is)."""
    if below.empty:
        return ""
    listed = ", ".join(f"{relation} {count}" for relation, count in below.items())
    return f"Left out, fewer than {min_count} words each (syntax.min_count): {listed}."


def head_accuracies(scores: SyntaxScores, relations: Iterable[str]) -> pd.DataFrame:
    """One row per head, direction and relation: layer, head, name, direction, relation, count, accuracy."""
    layers, heads = scores.correct.shape[1:3]
    frames = []
    for relation in relations:
        words = scores.scope(relation)
        accuracy = scores.accuracy(words)  # [layers, heads, 2]
        for number, direction in enumerate(DIRECTIONS):
            frames.append(pd.DataFrame({
                "layer": np.repeat(np.arange(layers), heads), "head": np.tile(np.arange(heads), layers),
                "name": [head_name(l, h) for l in range(layers) for h in range(heads)], "direction": direction,
                "relation": relation, "count": int(words.sum()), "accuracy": accuracy[:, :, number].ravel()}))
    return pd.concat(frames, ignore_index=True)


def best_heads(scores: SyntaxScores, counts: pd.Series,
               tested: Callable[[np.ndarray, int, np.ndarray, np.ndarray | None], dict[str, float]]) -> pd.DataFrame:
    """Clark et al.'s table: per relation the best head (either direction) and the best offset baseline, with
    ``tested(candidates, chosen, baseline_outcomes, sentences)`` merged in (per word: every scored head's outcomes
    ``[words, heads x directions]``, the chosen one's column, the words' sentences; ``best_head_test``: the
    difference, its interval and p-value)."""
    rows = []
    scored = np.ones(scores.correct.shape[1:], dtype=bool) if scores.changed is None else \
        np.broadcast_to(~scores.changed[..., None], scores.correct.shape[1:])  # [layers, heads, 2]
    for relation, count in counts.items():
        words = scores.scope(relation)
        accuracy = scores.accuracy(words)  # [layers, heads, 2]
        layer, head, direction = np.unravel_index(np.nanargmax(accuracy), accuracy.shape)
        offset = max(OFFSETS, key=lambda o: (scores.offsets[o][words].mean(), -abs(o)))
        chosen, base = scores.correct[words, layer, head, direction], scores.offsets[offset][words]
        candidates = scores.correct[words][:, scored]  # [words, scored heads x directions], C order
        column = int(scored[:layer].sum() + scored[layer, :head].sum() + scored[layer, head, :direction].sum())
        rows.append({"relation": relation, "count": int(count), "head": head_name(int(layer), int(head)),
                     "direction": DIRECTIONS[direction], "accuracy": float(chosen.mean()),
                     "tied": int((candidates.sum(0) == chosen.sum()).sum()),  # heads as right as the one named
                     "baseline_offset": offset, "baseline_accuracy": float(base.mean()),
                     **tested(candidates, column, base,
                              None if scores.sentences is None else scores.sentences[words])})
    return pd.DataFrame(rows)
