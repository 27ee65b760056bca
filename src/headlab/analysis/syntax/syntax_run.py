"""``ablate.py mode=syntax``: which heads track which dependency relation of a treebank (Clark et al. 2019, §4).

The treebank (``syntax.conllu``, or the bundled ``demo_syntax`` dev split) is read, checked and tokenised before the
weights load; the checkpoint's encoder (``ckpt_path=null``: the model's own pre-trained weights) then runs once over
its sentences, one per sequence, under the mask's plan if any, and every head's word-level attention is scored as
it comes (the heads the plan changes are not scored). The job directory gets:

=========================  ==============================================================================
``syntax.json``            every head x relation x direction accuracy, the offset baselines per relation,
                           the counts and what was skipped
``syntax.csv`` / ``.md``   Clark et al.'s table: per relation the best head and direction, its accuracy, the
                           best offset baseline, the difference with an interval and a one-sided p-value that
                           allow for the head being the best of all (``best_head_test``; Holm across the rows)
``syntax_heads_*.png``     per direction, each head's best relation and its accuracy
``syntax_examples.png``    the best heads of the top relations on example sentences (Clark et al.'s Fig. 5)
``sieve_roles.csv``        Pande et al.'s syntactic roles: per head and role (syntactic, nsubj, obj, amod, advmod)
                           the sentences, mean sieve score, t, p, adjusted p, role; ``syntax_roles.png``
``probe.json``             with ``syntax.probe``: the attention probe's UAS and the right-branching baseline's
``results.json``           the summary (with the plan); a complete one for the same config makes a rerun skip it
=========================  ==============================================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console

from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.syntax.best_head_test import best_head_test
from headlab.analysis.syntax.checks import require_scorable, syntax_plan
from headlab.analysis.syntax.data import EncodedTreebank, encode_treebank
from headlab.analysis.syntax.heads import (
    SyntaxScores,
    best_heads,
    head_accuracies,
    left_out_sentence,
    relation_counts,
    relations_below,
    syntax_scores,
    word_maps,
)
from headlab.analysis.syntax.plots import attention_lines, best_relation_heatmap
from headlab.analysis.syntax.probe import attachment, probe_sentences, right_branching, train_probe
from headlab.analysis.syntax.sources import evaluation_source, read_evaluation, read_training, training_source
from headlab.analysis.syntax.treebank import sentences_digest
from headlab.analysis.syntax.word_attention import DIRECTIONS
from headlab.analysis.types.feature_data import model_max_length
from headlab.analysis.types.features_run import encoder, feature_device
from headlab.analysis.types.sieve_roles import sieve_roles, with_offset_control
from headlab.core.model_files import architecture, model_shape
from headlab.core.models import load_tokenizer, model_config
from headlab.files import write_frame_atomic, write_json_atomic, write_text_atomic
from headlab.reporting.head_plots import role_panels
from headlab.reporting.layouts import clark_layout, to_markdown
from headlab.reporting.statistics import adjust_p_values
from headlab.training.checkpoints import locate_checkpoint, tokenizer_config, weights_model_config
from headlab.training.progress import ProgressLines, counted_batches
from headlab.training.tracking import log_artifacts


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Syntax heads of ``cfg.ckpt_path`` on the treebank; ``cfg`` passed ``check``."""
    checkpoint = locate_checkpoint(cfg.ckpt_path, cfg.model, cfg.task)
    tokenizer = load_tokenizer(tokenizer_config(checkpoint, cfg.model))
    limit = model_max_length(tokenizer, model_config(weights_model_config(checkpoint, cfg.model)))
    max_length = limit if cfg.syntax.max_length is None else min(cfg.syntax.max_length, limit)
    if max_length < (cfg.syntax.max_length or 0):
        Console().print(f"note: syntax.max_length={cfg.syntax.max_length} is more than the model takes: {limit} word "
                        "pieces", markup=False)
    source = evaluation_source(cfg.syntax)
    sentences = read_evaluation(cfg.syntax)
    encoded = encode_treebank(sentences, tokenizer, max_length, str(source))
    skipped = encoded.too_long + encoded.no_pieces
    require_scorable(encoded.sentences, f"the {len(encoded.sentences)} sentences of {source} that fit max_length="
                     f"{max_length} have")
    if skipped:
        Console().print(f"note: {skipped} sentences skipped ({encoded.too_long} longer than {max_length} word "
                        f"pieces, {encoded.no_pieces} with a word of no piece); {len(encoded.sentences)} scored",
                        markup=False)
    train = None  # the probe's training treebank, tokenised before the weights load (bad input is said first)
    if cfg.syntax.probe is not None:
        train = encode_treebank(read_training(cfg.syntax, sentences), tokenizer, max_length,
                                str(training_source(cfg.syntax)))
    model = encoder(checkpoint, cfg).to(feature_device(cfg.trainer))
    logger = identity.logger(cfg.logger, f"syntax-{source.path.stem}-{cfg.model.name}")
    batches = counted_batches(encoded.batches(cfg.syntax.batch_size, tokenizer.pad_token_id),
                              ProgressLines("syntax", len(encoded.sentences), "sentences"))
    plan = syntax_plan(cfg)
    scores = syntax_scores(model, encoded, batches, plan, bool(cfg.mask.renormalize), cfg.syntax.sieve,
                           cfg.syntax.sieve_direction)
    counts = relation_counts(scores, cfg.syntax.min_count, cfg.syntax.relations)
    below = relations_below(scores, cfg.syntax.min_count, cfg.syntax.relations)
    accuracies = head_accuracies(scores, counts.index)
    table = best_heads(scores, counts, head_test(cfg.syntax, cfg.seed))
    table["p_adjusted"] = adjust_p_values(table["p_value"].to_numpy(), "holm")
    unscored = [r for r in cfg.syntax.relations or () if r not in counts.index]
    remarks = resolution_warning(table, cfg.syntax) + unscored_note(unscored, len(encoded.sentences), skipped)
    for line in remarks:
        Console(stderr=True, soft_wrap=True).print(line, markup=False)
    out = identity.output_dir
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "syntax.json", syntax_record(scores, accuracies, counts, encoded, table))
    write_frame_atomic(table, out / "syntax.csv")
    title = f"{cfg.model.name} on {source.path.name}: {len(encoded.sentences)} sentences"
    if plan is not None:
        title += f", under {plan.describe()} (those heads not scored)"
    left_out = left_out_sentence(below, cfg.syntax.min_count)
    skipped_line = f"{skipped} sentences skipped ({encoded.too_long} longer than {max_length} word pieces, " \
        f"{encoded.no_pieces} with a word of no piece)." if skipped else ""
    after = "".join(f"\n{line}\n" for line in (left_out, skipped_line, *remarks) if line)
    write_text_atomic(out / "syntax.md", f"Syntax heads, {title}\n\n" + to_markdown(clark_layout(table)) + after)
    options = cfg.syntax
    roles = sieve_roles(scores.sieve, options.sieve_tau, options.sieve_alpha, options.sieve_correction)
    if scores.beyond_offset:  # each role's fixed-offset control (``sieves.offset_means``)
        roles = with_offset_control(roles, scores.beyond_offset, options.sieve_tau, options.sieve_alpha,
                                    options.sieve_correction)
    write_frame_atomic(roles, out / "sieve_roles.csv")
    write_text_atomic(out / "syntax.md", (out / "syntax.md").read_text() + "\n" + roles_sentence(roles) + "\n")
    formats = tuple(cfg.report.formats)
    images = {}
    if len(counts) > 1:  # relations besides "all" (none with min_count words: no per-relation figure)
        images |= {f"heads_{d}": best_relation_heatmap(accuracies, d, f"best relation per head ({d}), {title}",
                                                       out / f"syntax_heads_{d.replace('->', '_to_')}", formats)[0]
                   for d in DIRECTIONS}
    images["roles"] = role_panels(roles, f"syntactic sieve scores and roles (Pande et al.), {title}",
                                  out / "syntax_roles", formats)[0]
    if cfg.syntax.examples and len(table) > 1:
        images["examples"] = example_figure(model, encoded, table, cfg.syntax.examples, tokenizer.pad_token_id,
                                            title, out / "syntax_examples", formats)
    log_artifacts(logger, {"syntax": table}, images)
    probe = None
    if train is not None:
        probe = run_probe(cfg, model, train, encoded, tokenizer.pad_token_id)
        write_json_atomic(out / "probe.json", probe)
        write_text_atomic(out / "syntax.md", (out / "syntax.md").read_text() + "\n" + probe_sentence(probe) + "\n")
    best = table.set_index("relation")[["head", "direction", "accuracy", "baseline_accuracy"]].to_dict("index")
    summary = identity.complete({
        "kind": "syntax", "model": cfg.model.name, "architecture": architecture(cfg.model),
        "treebank": str(source.path.absolute()),
        "shape": list(model_shape(cfg.model)),
        "num_sentences": len(encoded.sentences), "sentences": sentences_digest(encoded.sentences),
        "num_words": encoded.num_words, "too_long": encoded.too_long,
        "no_pieces": encoded.no_pieces, "plan": None if plan is None else plan.to_dict(), "best": best,
        "probe": probe, "roles": role_counts(roles), "left_out": {"min_count": cfg.syntax.min_count,
                                                                 "relations": below.to_dict()},
        "checkpoint": checkpoint.record(cfg.ckpt_path),
        "files": ["syntax.json", "syntax.csv", "syntax.md", "sieve_roles.csv", *(["probe.json"] if probe else []),
                  *(p.name for p in images.values())]})
    write_json_atomic(out / "results.json", summary)
    Console(soft_wrap=True).print(f"{title}\n" + to_markdown(clark_layout(table)) + (left_out and f"{left_out}\n")
                                  + roles_sentence(roles) + "\n"
                                  + (probe_sentence(probe) + "\n" if probe else "") + f"-> {out / 'syntax.md'}",
                                  markup=False)
    if logger:
        logger.finalize("success")
    return summary


def run_probe(cfg: Any, model, train: EncodedTreebank, evaluation: EncodedTreebank, pad_id: int) -> dict[str, Any]:
    """Clark et al.'s attention probe trained on ``train``, its UAS on ``evaluation`` and the right-branching one."""
    options = cfg.syntax
    with_embeddings = options.probe == "attn_emb"
    sentences = lambda encoded: probe_sentences(model, encoded, options.batch_size, pad_id, with_embeddings)  # noqa: E731
    heads = model.config.num_hidden_layers * model.config.num_attention_heads
    dim = model.get_input_embeddings().weight.shape[1] if with_embeddings else 0
    probe = train_probe(options.probe, lambda: sentences(train), heads, dim, options.probe_epochs, options.probe_lr,
                        cfg.seed)
    return {"kind": options.probe, "epochs": options.probe_epochs, "lr": options.probe_lr,
            "train_treebank": str(training_source(cfg.syntax).path.absolute()), "train_sentences": len(train.sentences),
            "probe": attachment(probe, sentences(evaluation)), "right_branching": right_branching(evaluation)}


def role_counts(roles: pd.DataFrame) -> dict[str, int]:
    return {sieve: int(flags.sum()) for sieve, flags in roles.groupby("sieve", sort=False)["role"]}


def roles_sentence(roles: pd.DataFrame) -> str:
    counts = ", ".join(f"{sieve} {count}" for sieve, count in role_counts(roles).items())
    settings = roles.attrs
    line = (f"Syntactic roles (Pande et al.; heads whose mean sieve score is above {settings['tau']:g}, one-sided "
            f"t-test over sentences, {settings['correction']} at {settings['alpha']:g}; `sieve_roles.csv`): {counts} "
            f"of {roles['name'].nunique()} heads.")
    if "beyond_offset" in roles:
        kept = roles[roles["role"]].groupby("sieve", sort=False)["beyond_offset"].sum()
        line += (" Of them, beyond what their fixed-offset pattern gives the same word pairs (`beyond_offset`): "
                 + ", ".join(f"{sieve} {int(kept.get(sieve, 0))}" for sieve in role_counts(roles)) + ".")
    return line


def probe_sentence(probe: dict[str, Any]) -> str:
    return (f"Attention probe ({probe['kind']}, Clark et al. section 6; trained {probe['epochs']} epoch(s) on "
            f"{probe['train_sentences']} sentences): UAS {100 * probe['probe']['uas']:.1f} "
            f"({probe['probe']['words']} words, punctuation left out) against the right-branching baseline's "
            f"{100 * probe['right_branching']['uas']:.1f}.")


def head_test(options: Any, seed: int):
    """Per relation: the best head's accuracy minus the baseline's, with an interval and a one-sided p-value that
    allow for the head being the best of all (``best_head_test``)."""
    def tested(candidates: np.ndarray, chosen: int, baseline: np.ndarray, sentences: np.ndarray | None
               ) -> dict[str, float]:
        units = sentences if options.get("unit", "sentence") == "sentence" else None
        return best_head_test(candidates, chosen, baseline, options.resamples, options.confidence, seed, units)
    return tested


def resolution_warning(table: pd.DataFrame, options: Any) -> list[str]:
    """A warning when no row's Holm-adjusted p-value can fall below 1 - confidence: the smallest p-value
    ``syntax.resamples`` can give is 1 / (resamples + 1), and Holm multiplies the smallest by the number of rows."""
    rows = int(np.isfinite(table["p_value"]).sum())
    floor = rows / (options.resamples + 1)
    if rows == 0 or floor <= 1 - options.confidence:
        return []
    needed = int(np.ceil(rows / (1 - options.confidence)))
    return [f"warning: with syntax.resamples={options.resamples}, no row can reach p (Holm) < "
            f"{1 - options.confidence:g} (the smallest possible is {rows} rows / {options.resamples + 1} = "
            f"{floor:.3g}): no relation can show its head beating the baseline; use syntax.resamples={needed} or more"]


def unscored_note(unscored: list[str], scored: int, skipped: int) -> list[str]:
    """A note for relations ``syntax.relations`` names that no scored sentence has (theirs were skipped)."""
    if not unscored:
        return []
    return [f"note: syntax.relations names {', '.join(unscored)}, but none of the {scored} sentences scored has "
            f"{'it' if len(unscored) == 1 else 'them'} ({skipped} sentences skipped): no row"]


def syntax_record(scores: SyntaxScores, accuracies: pd.DataFrame, counts: pd.Series, encoded: EncodedTreebank,
                  table: pd.DataFrame) -> dict[str, Any]:
    offsets = {relation: {str(o): float(v[scores.scope(relation)].mean()) for o, v in scores.offsets.items()}
               for relation in counts.index}
    return {"counts": {k: int(v) for k, v in counts.items()}, "offsets": offsets,
            "heads": accuracies.to_dict("records"), "table": table.to_dict("records"),
            "sentences": len(encoded.sentences), "too_long": encoded.too_long, "no_pieces": encoded.no_pieces}


def example_figure(model, encoded: EncodedTreebank, table: pd.DataFrame, examples: int, pad_id: int, title: str,
                   path: Path, formats) -> Path:
    """The best heads of the three relations the heads beat their baseline by most, each on the first ``examples``
    sentences that have the relation."""
    rows = table[table["relation"] != "all"].sort_values("difference", ascending=False).head(3)
    panels = []
    for row in rows.itertuples():
        chosen = [i for i, s in enumerate(encoded.sentences) if row.relation in s.relations][:examples]
        layer, head = (int(part) for part in row.head[1:].split("H"))
        maps = word_maps(model, encoded, chosen, layer, head, pad_id)
        for number, weights in zip(chosen, maps):
            sentence = encoded.sentences[number]
            arcs = [(i, h - 1) for i, (h, r) in enumerate(zip(sentence.heads, sentence.relations))
                    if r == row.relation and h > 0]
            if row.direction == "head->dep":
                arcs = [(h, i) for i, h in arcs]
            panels.append({"words": sentence.words, "weights": weights, "arcs": arcs,
                           "label": f"{row.relation}: {row.head} ({row.direction})"})
    return attention_lines(panels, f"best heads (blue: attention; red: gold arcs), {title}", path, formats)[0]

