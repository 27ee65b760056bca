"""``ablate.py mode=patch``: activation patching between clean and corrupted inputs (docs/patching.md).

Each example of a paired data file (``patch.pairs``, or the task's first eval split) runs clean and corrupted; every
site of ``patch.sites`` in every layer (each head's context, the attention block's and the MLP's output, the
residual stream after the layer) is patched in turn, at every position or at each position (``patch.positions``),
noising (the clean run takes the corrupted activation) or denoising (the reverse). The effect of a patch is its mean
logit difference normalised so that 0 is the corrupted run's and 1 the clean run's, with a paired bootstrap interval
over the examples (patches at every position). Files in the job directory:

=====================  ===========================================================================================
``effects.csv``        per patch: site, kind, layer, head, position, unit, examples, mean logit difference, normalised
                       effect and its interval, the delta to the base run and its permutation p-value, loss, accuracy
``patches.parquet``    per run (clean, corrupted, each patch) and example: logit difference, loss, prediction
``patch_heads``        the heads' normalised effects, layers x heads (PNG; also a W&B image)
``patch_layers``       the other sites' normalised effects, layers x kind (patches at every position)
``patch_<kind>``       layers x positions (units) of a kind's normalised effect (``patch.positions=each`` or
                       ``units``; not heads)
``results.json``       the runs' means, the normaliser, every patch's effect; a complete one makes a rerun skip it
=====================  ===========================================================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf, open_dict
from rich.console import Console
from torch.utils.data import DataLoader

from headlab.analysis.jobs.eval_job import EvalJob
from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.patching.paired_data import PairedRows, corrupted_features
from headlab.analysis.patching.patch_evaluator import PatchEvaluator, PatchSpec, patch_specs
from headlab.core.model_files import model_shape
from headlab.files import write_frame_atomic, write_json_atomic
from headlab.reporting import plots
from headlab.reporting.statistics import Resampling, paired_tests
from headlab.tasks.batches import collated
from headlab.training.checkpoints import tokenizer_config
from headlab.training.datamodule import ExactlyOnceSampler
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
    corrupted, labelled = corrupted_features(data, split, tokenizer_config(job.checkpoint, job.cfg.model))
    return PairedRows(data.eval_features[split], corrupted, data.collator.pad_token_id,
                      data.task.type == "regression", labelled)


def paired_loader(rows: PairedRows, job: EvalJob) -> DataLoader:
    """Batches of rows of similar lengths, each example once over the processes (as the eval loaders)."""
    trainer = job.trainer
    sampler = ExactlyOnceSampler(list(range(len(rows))), trainer.world_size, trainer.global_rank, rows.lengths())
    return DataLoader(rows, batch_size=job.data.eval_batch_size, sampler=sampler, collate_fn=collated,
                      num_workers=job.data.num_workers, pin_memory=trainer.strategy.root_device.type == "cuda")


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Every patch of ``cfg.patch`` on the paired data; ``cfg`` passed ``check_mode``."""
    options = cfg.patch
    with open_dict(cfg):
        cfg.task = paired_task(cfg.task, options.pairs)
    job = EvalJob(cfg, identity, prepare=paired_rows)
    rows = job.prepared
    layers, heads = model_shape(cfg.model)
    positions = int(rows.lengths().max()) if options.positions == "each" else None
    units = rows.units() if options.positions == "units" else None
    specs = patch_specs(list(options.sites), layers, heads, positions, units)
    evaluator = PatchEvaluator(job.model, cfg.task.type, specs, options.direction, options.patches_per_forward)
    job.trainer.validate(evaluator, dataloaders=paired_loader(rows, job), verbose=False)
    table, summary = effects(evaluator.scores, specs, options, cfg.seed, cfg.task.type)
    split = cfg.task.eval_splits[0]
    result = {"kind": "patch", "group": cfg.group, "task": cfg.task.name, "model": cfg.model.name, "split": split,
              "direction": options.direction, "sites": list(options.sites), "positions": options.positions,
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


def effects(scores: dict, specs: list[PatchSpec], options: Any, seed: int, task_type: str
            ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per patch its effect (module docstring), and the clean and corrupted runs' means with the normaliser."""
    clean, corrupted = scores["clean"], scores["corrupted"]
    base = clean if options.direction == "noising" else corrupted
    labels = scores["labels"]["label"] if task_type != "regression" else None  # accuracy of classifications
    summary = {run: {"logit_diff": float(s["logit_diff"].mean()), "loss": float(s["loss"].mean()),
                     **({} if labels is None else {"accuracy": float(np.mean(s["prediction"] == labels))})}
               for run, s in (("clean", clean), ("corrupted", corrupted))}
    normaliser = summary["clean"]["logit_diff"] - summary["corrupted"]["logit_diff"]
    summary |= {"normaliser": normaliser, "examples": len(clean["logit_diff"])}
    whole = [i for i, spec in enumerate(specs) if spec.position is None and spec.unit is None]  # every example
    intervals = {}
    if whole and len(base["logit_diff"]) >= 2:
        config = Resampling(options.resamples, options.resamples, options.confidence, "bca", seed)
        tests = paired_tests("logit_diff", [{"logit_diff": scores[i]["logit_diff"]} for i in whole],
                             {"logit_diff": base["logit_diff"]}, config, [specs[i].name for i in whole])
        intervals = dict(zip(whole, tests))
    rows = []
    for index, spec in enumerate(specs):
        patched = scores[index]
        reached = ~np.isnan(patched["logit_diff"])  # per position: the examples that reach it
        means = {run: float(s["logit_diff"][reached].mean()) if reached.any() else np.nan
                 for run, s in (("clean", clean), ("corrupted", corrupted), ("base", base))}
        value = float(patched["logit_diff"][reached].mean()) if reached.any() else np.nan
        scale = means["clean"] - means["corrupted"]
        normalise = lambda v, scale=scale, floor=means["corrupted"]: (v - floor) / scale if scale else np.nan  # noqa: E731
        test = intervals.get(index)
        bounds = sorted(normalise(means["base"] + bound) for bound in (test.ci_low, test.ci_high)) if test else \
            [np.nan, np.nan]  # a negative normaliser reverses them
        rows.append({"site": spec.name, "kind": spec.site.kind, "layer": spec.site.layer, "head": spec.site.head,
                     "position": spec.position, "unit": spec.unit, "examples": int(reached.sum()), "logit_diff": value,
                     "effect": normalise(value), "effect_low": bounds[0], "effect_high": bounds[1],
                     "delta": value - means["base"], "p_value": test.p_value if test else np.nan,
                     "loss": float(np.nanmean(patched["loss"])) if reached.any() else np.nan,
                     **({} if labels is None else {"accuracy": float(np.mean(
                         patched["prediction"][reached] == labels[reached])) if reached.any() else np.nan})})
    table = pd.DataFrame(rows).astype({"head": "Int64", "position": "Int64", "unit": "Int64"})
    difference = clean["logit_diff"] - corrupted["logit_diff"]  # per example: how far apart the two runs are
    spread = difference.std(ddof=1) / np.sqrt(len(difference)) if len(difference) > 1 else np.nan
    if not abs(normaliser) > 2 * spread:
        summary["warning"] = (f"the clean and corrupted runs' mean logit differences are {normaliser:+.4g} apart, "
                              f"within 2 standard errors ({spread:.3g}): the normalised effects divide by noise")
    return table, summary


def per_example(scores: dict, specs: list[PatchSpec]) -> pd.DataFrame:
    """``patches.parquet``: every run's scores per example."""
    frames = []
    for run in ("clean", "corrupted", *range(len(specs))):
        frame = pd.DataFrame({name: values for name, values in scores[run].items()})
        frame.insert(0, "run", run if isinstance(run, str) else specs[run].name)
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    out["example"] = out["example"].astype(int)
    return out


def write_heatmaps(table: pd.DataFrame, layers: int, heads: int, options: Any, cfg: Any, folder: Path
                   ) -> dict[str, Path]:
    """The heatmaps of the module docstring; ``{name: first file}``."""
    formats, images = tuple(cfg.report.formats), {}
    title = f"{cfg.model.name} on {cfg.task.name}: {options.direction}, normalised effect"
    label = "effect (0: corrupted, 1: clean)"
    whole = table[table["position"].isna() & table["unit"].isna()]
    rows = [f"L{layer}" for layer in range(layers)]
    mine = whole[whole["kind"] == "head"]
    if len(mine):
        grid = np.full((layers, heads), np.nan)
        grid[mine["layer"].to_numpy(int), mine["head"].to_numpy(int)] = mine["effect"].to_numpy()
        images["patch_heads"] = plots.grid_heatmap(grid, rows, [f"H{h}" for h in range(heads)], "head", label,
                                                   title, folder / "patch_heads", formats)[0]
    others = [kind for kind in options.sites if kind != "head" and (whole["kind"] == kind).any()]
    if others:
        grid = np.full((layers, len(others)), np.nan)
        for column, kind in enumerate(others):
            mine = whole[whole["kind"] == kind]
            grid[mine["layer"].to_numpy(int), column] = mine["effect"].to_numpy()
        images["patch_layers"] = plots.grid_heatmap(grid, rows, others, "site", label, title,
                                                    folder / "patch_layers", formats)[0]
    for column, prefix in (("position", ""), ("unit", "u")):  # layers x positions (or units) of each kind
        each = table[table[column].notna() & (table["kind"] != "head")]
        for kind in dict.fromkeys(each["kind"]):
            mine = each[each["kind"] == kind]
            width = int(mine[column].max()) + 1
            grid = np.full((layers, width), np.nan)
            grid[mine["layer"].to_numpy(int), mine[column].to_numpy(int)] = mine["effect"].to_numpy()
            images[f"patch_{kind}"] = plots.grid_heatmap(grid, rows, [f"{prefix}{p}" for p in range(width)], column,
                                                         label, f"{title} ({kind})", folder / f"patch_{kind}",
                                                         formats)[0]
    return images


def summary_line(table: pd.DataFrame, summary: dict, options: Any, split: str, folder: Path) -> str:
    """``patch (noising, N patches) on split: logit difference clean C, corrupted K; largest effect S (E) -> dir``."""
    ranked = table.dropna(subset=["effect"])
    far = ranked.iloc[int(np.argmax(np.abs(ranked["effect"].to_numpy(float) - (
        1.0 if options.direction == "noising" else 0.0))))] if len(ranked) else None
    largest = f"; largest change: {far['site']} (effect {far['effect']:.3f})" if far is not None else ""
    return (f"patch ({options.direction}, {len(table)} patches, positions {options.positions}) on {split}: logit "
            f"difference clean {summary['clean']['logit_diff']:.4f}, corrupted {summary['corrupted']['logit_diff']:.4f}"
            f"{largest} -> {folder / 'results.json'}")
