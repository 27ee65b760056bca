"""``ablate.py mode=patch``: activation patching between clean and corrupted inputs (docs/patching.md).

Each example of a paired data file (``patch.pairs``, or the task's first eval split) runs clean and corrupted; every
site of ``patch.sites`` in every layer (each head's context, the attention block's and the MLP's output, the
residual stream after the layer) is patched in turn, at every position or at each position (``patch.positions``),
noising (the clean run takes the corrupted activation) or denoising (the reverse). The effect of a patch is its mean
logit difference normalised so that 0 is the corrupted run's and 1 the clean run's, with a paired bootstrap interval
over the examples (patches at every position); ``patch.method=attribution`` estimates every patch to first order from
one forward and backward (``both``: and how well the estimates rank the exact effects); ``patch.path.senders`` path
patches each sender head's paths to ``patch.path.receivers`` instead (``paths.py``). Files in the job directory:

=====================  ===========================================================================================
``effects.csv``        per patch: site, kind, layer, head, position, unit, examples, mean logit difference, normalised
                       effect and its interval, the delta to the base run and its permutation p-value, loss, accuracy
``patches.parquet``    per run (clean, corrupted, each patch) and example: logit difference, loss, prediction
``patch_heads``        the heads' normalised effects, layers x heads (PNG; also a W&B image)
``patch_layers``       the other sites' normalised effects, layers x kind (patches at every position)
``patch_<kind>``       layers x positions (units) of a kind's normalised effect (``patch.positions=each`` or
                       ``units``); ``patch_head``: the patched heads x positions (units)
``results.json``       the runs' means, the normaliser, every patch's effect; a complete one makes a rerun skip it
=====================  ===========================================================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import OmegaConf, open_dict
from rich.console import Console
from torch.utils.data import DataLoader

from headlab.analysis.jobs.eval_job import EvalJob
from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.patching.checks import path_heads
from headlab.analysis.patching.effects import effects, per_example
from headlab.analysis.patching.paired_data import PairedRows, corrupted_features
from headlab.analysis.patching.patch_evaluator import PatchEvaluator, patch_specs
from headlab.analysis.patching.paths import PathEvaluator, path_specs
from headlab.core.model_files import model_shape
from headlab.files import write_frame_atomic, write_json_atomic
from headlab.reporting import plots
from headlab.tasks.batches import collated
from headlab.training.checkpoints import tokenizer_config
from headlab.training.datamodule import ExactlyOnceSampler
from headlab.training.finetune import make_trainer
from headlab.training.tracking import log_artifacts

PAIRS_SPLIT = "pairs"  # the eval split a patch.pairs file becomes


def paired_task(task: Any, pairs: str | None) -> Any:
    """The task whose only eval split is the paired data: ``pairs`` (a file in the task's format), else its first."""
    paired = OmegaConf.create(OmegaConf.to_container(task, resolve=True))
    if pairs is None:
        paired.eval_splits = [task.eval_splits[0]]
    else:
        paired.data_files, paired.eval_splits = {PAIRS_SPLIT: str(pairs)}, [PAIRS_SPLIT]
    return paired


def paired_rows(job: EvalJob) -> PairedRows:
    """The job's eval split with its corrupted rows, checked alike (before the weights load)."""
    data = job.data
    split = data.eval_splits[0]
    clean, corrupted, labelled = corrupted_features(data, split, tokenizer_config(job.checkpoint, job.cfg.model),
                                                    units=job.cfg.patch.positions == "units")
    left_out = len(data.eval_examples[split]) - len(clean)  # SQuAD questions without a window holding both answers
    if left_out and rank_zero_only.rank == 0:  # no trainer yet
        Console(stderr=True, soft_wrap=True).print(
            f"note: {left_out} of {len(data.eval_examples[split])} questions have no window holding both their answer "
            "and the corrupted one (or are unanswerable); left out", markup=False)
    return PairedRows(clean, corrupted, data.collator.pad_token_id, data.task.type == "regression", labelled)


def paired_loader(rows: PairedRows, trainer: Any, data: Any) -> DataLoader:
    """Batches of rows of similar lengths, each example once over the processes (as the eval loaders)."""
    sampler = ExactlyOnceSampler(list(range(len(rows))), trainer.world_size, trainer.global_rank, rows.lengths())
    return DataLoader(rows, batch_size=data.eval_batch_size, sampler=sampler, collate_fn=collated,
                      num_workers=data.num_workers, pin_memory=trainer.strategy.root_device.type == "cuda")


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Every patch of ``cfg.patch`` on the paired data; ``cfg`` passed ``check_mode``."""
    options = cfg.patch
    with open_dict(cfg):
        cfg.task = paired_task(cfg.task, options.pairs)
    job = EvalJob(cfg, identity, prepare=paired_rows)
    rows = job.prepared
    layers, heads = model_shape(cfg.model)
    exact, attribution = options.method in ("exact", "both"), options.method in ("attribution", "both")
    if options.path.senders is not None:  # path patching
        specs = path_specs(*path_heads(options, layers, heads), list(options.path.inputs))
        evaluator = PathEvaluator(job.model, cfg.task.type, specs, options.direction)
    else:
        positions = int(rows.lengths().max()) if options.positions == "each" else None
        units = rows.units() if options.positions == "units" else None
        specs = patch_specs(list(options.sites), layers, heads, positions, units)
        evaluator = PatchEvaluator(job.model, cfg.task.type, specs, options.direction, options.patches_per_forward,
                                   exact, attribution)
    trainer = job.trainer if not attribution else make_trainer(  # estimates need gradients
        cfg.trainer, [], None, identity.output_dir, inference_mode=False, fitting=False)
    trainer.validate(evaluator, dataloaders=paired_loader(rows, trainer, job.data), verbose=False)
    table, summary = effects(evaluator.scores, specs, options, cfg.seed, cfg.task.type)
    split = cfg.task.eval_splits[0]
    result = {"kind": "patch", "group": cfg.group, "task": cfg.task.name, "model": cfg.model.name, "split": split,
              "direction": options.direction, "sites": list(options.sites), "positions": options.positions,
              "method": options.method, **({"path": OmegaConf.to_container(options.path)}
                                           if options.path.senders is not None else {}),
              "checkpoint": job.checkpoint_record(), "summary": summary,
              "effects": table.replace({np.nan: None}).to_dict("records"), "seed": cfg.seed}
    result = identity.complete(result)
    if job.is_global_zero:
        folder = identity.output_dir
        write_frame_atomic(per_example(evaluator.scores, specs), folder / "patches.parquet")
        write_frame_atomic(table, folder / "effects.csv")
        images = write_heatmaps(table, layers, heads, options, cfg, folder)
        if job.logger:
            job.logger.log_metrics({f"{split}/patch/{run}_logit_diff": summary[run]["logit_diff"]
                                    for run in ("clean", "corrupted")}, step=0)
        log_artifacts(job.logger, {"patching": table}, images)
        write_json_atomic(folder / "results.json", result)
        Console().print(summary_line(table, summary, options, split, folder), markup=False, soft_wrap=True)
        if "warning" in summary:
            Console(stderr=True).print(f"warning: {summary['warning']}", markup=False, soft_wrap=True)
    job.finish()
    return result


def write_heatmaps(table: pd.DataFrame, layers: int, heads: int, options: Any, cfg: Any, folder: Path
                   ) -> dict[str, Path]:
    """The heatmaps of the module docstring; ``{name: first file}``."""
    formats, images, shown = tuple(cfg.report.formats), {}, shown_effect(table)
    title = f"{cfg.model.name} on {cfg.task.name}: {options.direction}, normalised {shown}"
    label = f"{shown} (0: corrupted, 1: clean)"
    whole = table[table["position"].isna() & table["unit"].isna()]
    rows = [f"L{layer}" for layer in range(layers)]
    mine = whole[whole["kind"] == "head"]
    if len(mine):
        grid = np.full((layers, heads), np.nan)
        grid[mine["layer"].to_numpy(int), mine["head"].to_numpy(int)] = mine[shown].to_numpy()
        images["patch_heads"] = plots.grid_heatmap(grid, rows, [f"H{h}" for h in range(heads)], "head", label,
                                                   title, folder / "patch_heads", formats)[0]
    others = [kind for kind in options.sites if kind != "head" and (whole["kind"] == kind).any()]
    if others:
        grid = np.full((layers, len(others)), np.nan)
        for column, kind in enumerate(others):
            mine = whole[whole["kind"] == kind]
            grid[mine["layer"].to_numpy(int), column] = mine[shown].to_numpy()
        images["patch_layers"] = plots.grid_heatmap(grid, rows, others, "site", label, title,
                                                    folder / "patch_layers", formats)[0]
    for column, prefix in (("position", ""), ("unit", "u")):  # layers (heads) x positions (or units) of each kind
        each = table[table[column].notna()]
        for kind in dict.fromkeys(each["kind"]):
            mine = each[each["kind"] == kind]
            width = int(mine[column].max()) + 1
            if kind == "head":  # the patched heads, in order, as rows
                index = mine["layer"].to_numpy(int) * heads + mine["head"].to_numpy(int)
                patched = sorted(set(index.tolist()))
                row_of, names = {h: r for r, h in enumerate(patched)}, [f"L{h // heads}H{h % heads}" for h in patched]
                at, ylabel = [row_of[h] for h in index], "head"
            else:
                at, names, ylabel = mine["layer"].to_numpy(int), rows, "layer"
            grid = np.full((len(names), width), np.nan)
            grid[at, mine[column].to_numpy(int)] = mine[shown].to_numpy()
            images[f"patch_{kind}"] = plots.grid_heatmap(grid, names, [f"{prefix}{p}" for p in range(width)], column,
                                                         label, f"{title} ({kind})", folder / f"patch_{kind}",
                                                         formats, ylabel)[0]
    return images


def summary_line(table: pd.DataFrame, summary: dict, options: Any, split: str, folder: Path) -> str:
    """``patch (noising, N patches) on split: logit difference clean C, corrupted K; largest effect S (E) -> dir``."""
    shown = shown_effect(table)
    ranked = table.dropna(subset=[shown])
    far = ranked.iloc[int(np.argmax(np.abs(ranked[shown].to_numpy(float) - (
        1.0 if options.direction == "noising" else 0.0))))] if len(ranked) else None
    largest = "" if far is None else f"; largest change: {far['site']} ({shown} {_unsigned_zero(far[shown], 3):.3f})"
    agreement = summary.get("attribution")
    agrees = "" if agreement is None else (f"; estimates vs exact: Spearman {agreement['spearman']:.3f}, top "
                                           f"{agreement['top_k']} overlap {agreement['top_k_overlap']:.2f}")
    clean, corrupted = (_unsigned_zero(summary[run]["logit_diff"], 4) for run in ("clean", "corrupted"))
    return (f"patch ({options.direction}, {len(table)} patches, positions {options.positions}, {options.method}) on "
            f"{split}: logit difference clean {clean:.4f}, corrupted {corrupted:.4f}{largest}{agrees} -> "
            f"{folder / 'results.json'}")


def _unsigned_zero(value: float, digits: int) -> float:
    """``value`` rounded to ``digits``, a rounded zero without its sign (``-0.000`` reads as a change)."""
    return round(float(value), digits) + 0.0


def shown_effect(table: pd.DataFrame) -> str:
    """The column the heatmaps and the summary show: the exact effect, else the estimate (``patch.method``)."""
    return "effect" if "effect" in table else "estimate"
