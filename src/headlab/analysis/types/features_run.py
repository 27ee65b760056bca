"""``ablate.py mode=features``: attention features of every head (DESIGN.md section 5) over a task split or a text file.

The sequences are read and tokenised before the weights load (``features.text_file``, or a seeded random
sample of ``features.max_sequences`` examples of the task's ``features.split``); the checkpoint's model
(or the model's own pre-trained weights with ``ckpt_path=null``) runs once over them on the trainer's
device, and ``headlab.attention_features`` reduces its attention as it goes. The job directory gets:

=========================  ==============================================================================
``features.npz``           every family's arrays (``distance`` [L, H, 21], ``clark/<name>`` [L, H],
                           ``sieve/<name>`` [sequences, L, H], ``js`` [L*H, L*H]), ``source`` (each
                           sequence's line number or example index), ``heads`` (head names)
``heads.parquet`` / .csv   one row per head: ``layer``, ``head``, ``name``, ``dist_*``, ``clark_*``,
                           ``sieve_*`` (mean score) and ``role_*`` (sieve roles)
``sieve_roles.csv``        per head and sieve: sequences, mean, t, p, adjusted p, role
``clark.png``              Clark et al.'s statistics per head; ``sieve_roles.png``: mean scores and roles
``results.json``           the summary; a complete one for the same config makes a rerun skip the job
=========================  ==============================================================================
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from rich.console import Console

from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.types.feature_data import (
    Sequences,
    model_max_length,
    task_sequences,
    text_file_sequences,
)
from headlab.analysis.types.features import AttentionFeatures, attention_features
from headlab.analysis.types.sieve_roles import role_matrix, sieve_roles
from headlab.core.model_files import architecture
from headlab.core.models import load_model_reporting, load_tokenizer, model_config, note_random_weights
from headlab.files import atomic_file, write_frame_atomic, write_json_atomic
from headlab.reporting.head_plots import head_panels, role_panels
from headlab.training.checkpoint_loading import load_checkpoint
from headlab.training.checkpoints import locate_checkpoint, tokenizer_config, weights_model_config
from headlab.training.progress import ProgressLines, counted_batches
from headlab.training.tracking import log_artifacts


def data_name(cfg: Any) -> str:
    """What the features describe: the task, or the text file's name (the task config is not read then)."""
    return Path(cfg.features.text_file).name if cfg.features.text_file else cfg.task.name


def read_sequences(cfg: Any, tokenizer, checkpoint) -> Sequences:
    """What ``features`` names: the text file's lines or a sample of the task split, tokenised."""
    options = cfg.features
    if options.text_file is not None:
        limit = model_max_length(tokenizer, model_config(weights_model_config(checkpoint, cfg.model)))
        max_length = limit if options.max_length is None else min(options.max_length, limit)
        return text_file_sequences(options.text_file, tokenizer, max_length, options.max_sequences, cfg.seed)
    split = cfg.task.train_split if options.split == "train" else options.split
    return task_sequences(cfg.task, split, tokenizer, options.max_sequences, cfg.seed, cfg.data.cache_dir)


def encoder(checkpoint, cfg: Any) -> torch.nn.Module:
    """The checkpoint's model without its task head (not needed), except from a Lightning checkpoint (with it).

    A task checkpoint's head weights go unused and its pooler may be missing (question answering has none): the
    attention needs neither, so transformers' load report is not shown; missing encoder weights are said."""
    if checkpoint.kind == "lightning":
        return load_checkpoint(checkpoint, cfg.model, cfg.task, allow_random_head=True, seed=cfg.seed)
    weights = weights_model_config(checkpoint, cfg.model)
    model, missing = load_model_reporting(weights, quiet=True, seed=cfg.seed)
    note_random_weights([name for name in missing if not name.startswith("pooler.")], weights)
    return model


def feature_device(trainer_cfg: Any) -> torch.device:
    """The first GPU when the trainer asks for one (or ``auto`` finds one), else the CPU."""
    wants_gpu = trainer_cfg.accelerator in ("gpu", "cuda") or trainer_cfg.accelerator == "auto"
    return torch.device("cuda") if wants_gpu and torch.cuda.is_available() else torch.device("cpu")


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Features of ``cfg.ckpt_path``'s heads; ``cfg`` passed ``check_mode``."""
    checkpoint = locate_checkpoint(cfg.ckpt_path, cfg.model, cfg.task)
    tokenizer = load_tokenizer(tokenizer_config(checkpoint, cfg.model))
    sequences = read_sequences(cfg, tokenizer, checkpoint)
    if sequences.truncated:
        Console().print(f"note: {sequences.truncated} of {len(sequences)} sequences were longer than "
                        f"{sequences.max_length} tokens and were truncated", markup=False)
    model = encoder(checkpoint, cfg).to(feature_device(cfg.trainer))
    logger = identity.logger(cfg.logger, f"features-{data_name(cfg)}-{cfg.model.name}")
    options = cfg.features
    batches = counted_batches(sequences.batches(options.batch_size, tokenizer.pad_token_id),
                              ProgressLines("features", len(sequences), "sequences"))
    features = attention_features(model, tokenizer, batches, tuple(options.families), options.js_max_sequences)
    summary = write_features(cfg, features, sequences, identity.output_dir, logger)
    summary = identity.complete(summary | {"checkpoint": checkpoint.record(cfg.ckpt_path)})
    write_json_atomic(identity.output_dir / "results.json", summary)
    Console().print(f"features of {features.num_layers * features.num_heads} heads over {len(sequences)} "
                    f"sequences -> {identity.output_dir / 'heads.parquet'}", markup=False, soft_wrap=True)
    if logger:
        logger.finalize("success")
    return summary


def features_table(features: AttentionFeatures, roles: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per head: ``layer``, ``head``, ``name`` and every per-head quantity (with ``role_<sieve>``)."""
    layers, heads = features.num_layers, features.num_heads
    table = pd.DataFrame({"layer": np.repeat(np.arange(layers), heads), "head": np.tile(np.arange(heads), layers),
                          "name": features.head_names()})
    for column, values in features.per_head().items():
        table[column] = np.asarray(values).reshape(-1)
    if roles is not None:
        wide = role_matrix(roles)
        for sieve in roles["sieve"].unique():
            table[f"role_{sieve}"] = wide[sieve].to_numpy()
    return table


def write_features(cfg: Any, features: AttentionFeatures, sequences: Sequences, output_dir: Path,
                   logger) -> dict[str, Any]:
    """Every file of the module docstring; returns the summary for ``results.json`` (without the config)."""
    options, formats = cfg.features, tuple(cfg.report.formats)
    output_dir.mkdir(parents=True, exist_ok=True)
    arrays = features.to_arrays() | {"source": np.array(sequences.source), "heads": np.array(features.head_names())}
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    with atomic_file(output_dir / "features.npz", "wb") as handle:
        handle.write(buffer.getvalue())
    roles = None
    if features.sieve:
        roles = sieve_roles(features.sieve, options.sieve_tau, options.sieve_alpha, options.sieve_correction)
        write_frame_atomic(roles, output_dir / "sieve_roles.csv")
    table = features_table(features, roles)
    write_frame_atomic(table, output_dir / "heads.parquet")
    write_frame_atomic(table, output_dir / "heads.csv")
    title = f"{cfg.model.name}: {features.num_sequences} sequences"
    images = {}
    if features.clark:
        images["clark"] = head_panels(features.clark, f"Clark et al. statistics, {title}", output_dir / "clark",
                                      formats)[0]
    if roles is not None:
        images["sieve_roles"] = role_panels(roles, f"sieve scores and roles, {title}", output_dir / "sieve_roles",
                                            formats)[0]
    log_artifacts(logger, {"heads": table}, images)
    if logger is not None:
        logger.log_metrics({"num_sequences": features.num_sequences, "truncated": sequences.truncated}, step=0)
    source = ({"kind": "text_file", "path": str(Path(options.text_file).absolute())} if options.text_file else
              {"kind": "task", "task": cfg.task.name, "split": options.split})
    role_counts = {} if roles is None else {s: int(r.sum()) for s, r in roles.groupby("sieve", sort=False)["role"]}
    return {"kind": "features", "group": cfg.group, "model": cfg.model.name, "architecture": architecture(cfg.model),
            "task": data_name(cfg),
            "source": source, "num_sequences": features.num_sequences, "js_sequences": features.js_sequences,
            "truncated": sequences.truncated, "families": list(features.families), "shape": [features.num_layers,
                                                                                              features.num_heads],
            "sieve_roles": role_counts, "files": ["features.npz", "heads.parquet", "heads.csv",
                                                  *(["sieve_roles.csv"] if roles is not None else []),
                                                  *(p.name for p in images.values())]}
