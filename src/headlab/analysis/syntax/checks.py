"""The checks of ``mode=syntax``: the plan against the model's shape, the sentences read (parsed), the checkpoint; no
weights read, no torch imported."""

from __future__ import annotations

from typing import Any

from headlab.analysis.syntax.sources import evaluation_source, read_evaluation, read_training
from headlab.analysis.syntax.treebank import LEFT_OUT_RELATIONS
from headlab.core.masks import check_mask, plan_from_mask, refuse_substituted
from headlab.core.model_files import model_shape
from headlab.core.plans import HeadPlan
from headlab.errors import UserError
from headlab.training.checkpoints import locate_checkpoint


def check_syntax(cfg: Any) -> None:
    """The plan fits the model and keeps a head; the sentences read (parsed); the checkpoint exists."""
    plan = syntax_plan(cfg)
    if cfg.syntax.probe is not None and plan is not None:
        raise UserError(f"syntax.probe={cfg.syntax.probe} reads every head: run it without a plan (mask=none)")
    evaluation = read_evaluation(cfg.syntax)
    require_scorable(evaluation, f"{evaluation_source(cfg.syntax)} has")
    if cfg.syntax.probe is not None:
        read_training(cfg.syntax, evaluation, quiet=True)  # run() says what it shares
    locate_checkpoint(cfg.ckpt_path, cfg.model, cfg.task)


def syntax_plan(cfg: Any) -> HeadPlan | None:
    """The mask's plan (None when every head keeps); a ``UserError`` when it changes every head (none to score)."""
    check_mask(cfg.mask)
    plan = plan_from_mask(cfg.mask, *model_shape(cfg.model), cfg.model)
    refuse_substituted(plan, "mode=syntax")
    if plan.is_identity:
        return None
    if plan.counts()["keep"] == 0:
        raise UserError(f"mode=syntax under a plan that changes every head ({plan.describe()}): no head is left to "
                        "score; keep some heads")
    return plan


def require_scorable(sentences: list[Any], what: str) -> None:
    """A ``UserError`` unless some word is neither a root nor punct (the table's ``all`` row would be empty)."""
    if not any(relation not in LEFT_OUT_RELATIONS for sentence in sentences for relation in sentence.relations):
        raise UserError(f"{what} no word to score: every word is a root or punct (one-word sentences, only "
                        "punctuation, or a parser that labels nothing else); give sentences with dependency relations")
