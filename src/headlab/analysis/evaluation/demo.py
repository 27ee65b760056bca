"""``ablate.py mode=demo``: how a model's output moves under a few head plans.

For each plan it reports, over a handful of text pairs, the relative change of the last
hidden states (non-padding tokens) and the cosine between the mean-pooled sentence
embedding and the unablated one (all-MiniLM-L6-v2 is trained for exactly that pooling).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from headlab.analysis.evaluation.checks import demo_plans
from headlab.core.model_files import model_shape
from headlab.core.models import apply_runtime_options, load_model, load_tokenizer
from headlab.core.patch.ablate import ablate
from headlab.core.plans import HeadPlan
from headlab.core.units import unit_ids
from headlab.files import write_json_atomic


def run(cfg: Any, output_dir: str | Path) -> list[dict[str, Any]]:
    masks, plans = demo_plans(cfg)
    num_layers, num_heads = model_shape(cfg.model)

    tokenizer, model = load_tokenizer(cfg.model), load_model(cfg.model)
    apply_runtime_options(model, cfg)
    texts, pairs = list(cfg.demo.texts), list(cfg.demo.text_pairs)
    encoding = tokenizer(texts, pairs, padding=True, truncation=True, return_offsets_mapping=True, return_tensors="pt")
    inputs = {k: encoding[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoding}
    baseline = _outputs(model, HeadPlan.keep_all(num_layers, num_heads), inputs, None, False)
    sentence_ids = {unit: unit_ids(encoding, texts, pairs, unit=unit) for unit in {m.unit for m in masks.values()}}

    records = []
    for name, plan in plans.items():
        mask = masks[name]
        hidden = _outputs(model, plan, inputs, sentence_ids[mask.unit], mask.renormalize)
        records.append(
            {
                "plan": name,
                **plan.to_dict(),
                "counts": plan.counts(),
                "renormalize": mask.renormalize,
                "unit": mask.unit,
                **_compare(baseline, hidden, inputs["attention_mask"]),
            }
        )
    write_json_atomic(Path(output_dir) / "demo.json", {"model": cfg.model.name, "records": records})
    _print(records, cfg.model.name, Path(output_dir) / "demo.json")
    return records


@torch.no_grad()
def _outputs(model, plan, inputs, sentence_ids, renormalize) -> torch.Tensor:
    with ablate(model, plan, renormalize=renormalize):
        return model(**inputs, sentence_ids=sentence_ids).last_hidden_state  # [batch, seq, hidden]


def _compare(baseline, hidden, attention_mask) -> dict[str, float]:
    valid = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [batch, seq, 1]
    change = ((hidden - baseline) * valid).norm() / (baseline * valid).norm()
    pooled = lambda h: (h * valid).sum(1) / valid.sum(1)  # noqa: E731  [batch, hidden]
    cosine = torch.nn.functional.cosine_similarity(pooled(hidden), pooled(baseline), dim=-1)
    return {"relative_hidden_change": change.item(), "embedding_cosine": cosine.mean().item()}


def _print(records, model_name, path) -> None:
    table = Table(title=f"{model_name}: output under head plans (vs. no ablation)")
    for column in ("plan", "heads changed", "renormalize", "unit", "|dh|/|h|", "cos(embedding)"):
        table.add_column(column, justify="left" if column == "plan" else "right")
    for r in records:
        changed = sum(v for k, v in r["counts"].items() if k != "keep")
        table.add_row(
            r["plan"], str(changed), str(r["renormalize"]).lower(), r["unit"],
            f"{r['relative_hidden_change']:.4f}", f"{r['embedding_cosine']:.4f}",
        )
    natural = Console(width=1000).measure(table).maximum  # logs get 80 columns, which would cut the plan names
    console = Console(width=max(Console().width, natural))
    console.print(table)
    console.print(f"records written to {path}", soft_wrap=True)
