"""``ablate.py mode=compare``: head types of two or more ``mode=cluster`` jobs side by side (Guan et al. 2020, Fig. 4).

E.g. the pre-trained model against the same model fine-tuned on SQuAD, MRPC and MNLI. Every run must come
from a model of the same shape (layers x heads). The job directory gets:

=========================  ==============================================================================
``ari.csv`` / .md          adjusted Rand index of every pair of runs' labels (1: the same partition)
``transitions.csv`` / .md  heads of type A in the first run that have type B in each other run
``stability.csv`` / .md    each run's clustering stability and silhouette (Guan Table 1 layout: a column per run)
``types_per_layer.csv``    heads of each type per layer and run; ``types_per_layer.png`` side by side (Fig. 4),
                           each cluster in the colour of the first run's cluster it shares the most heads with
``heads.parquet`` / .csv   per head: each run's label, whether it differs from the first run's (empty unless both
                           runs' clusters are named: numbered clusters of two fits are not the same types), the shift of
                           its distance features from the first run (L2 norm of the 21-dim difference), and
                           when every run's clusters are named: the type most runs give it (ties: the earliest
                           run's) and the share of runs that agree (e.g. over fine-tuning seeds)
``roles.csv`` / .md        per sieve role (Pande et al.: local, delimiter, block from the features jobs; syntactic,
                           nsubj, obj, amod, advmod from ``compare.syntax``): heads with it in each run, and
                           kept / gained / lost from the first run; ``heads`` gets ``role_<role>/<run>``
``results.json``           the summary; a complete one for the same config makes a rerun skip the job
=========================  ==============================================================================
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from sklearn.metrics import adjusted_rand_score

from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.types.checks import read_inputs
from headlab.analysis.types.compare_roles import role_tables
from headlab.files import write_frame_atomic, write_json_atomic, write_text_atomic
from headlab.reporting import head_plots
from headlab.reporting.layouts import to_markdown
from headlab.training.tracking import log_artifacts


def comparison_tables(runs: list[dict[str, Any]], syntax: list[Path] | None = None) -> dict[str, pd.DataFrame]:
    """ARI, transitions from the first run, stability, types per layer, sieve roles and the per-head table."""
    heads = list(runs[0]["labels"])
    labels = {run["name"]: [run["labels"][h] for h in heads] for run in runs}
    names = list(labels)
    ari = pd.DataFrame([[adjusted_rand_score(labels[a], labels[b]) for b in names] for a in names],
                       index=pd.Index(names, name="run"), columns=names).reset_index()
    first = names[0]
    transitions = pd.concat([pd.crosstab(pd.Series(labels[first], name=f"type in {first}"),
                                         pd.Series(labels[other], name="type")).stack().rename("heads")
                             .reset_index().assign(run=other) for other in names[1:]], ignore_index=True)
    stability = pd.DataFrame([{"": quality, **{run["name"]: run.get(quality) for run in runs}}
                              for quality in ("stability", "silhouette")])
    per_layer = pd.concat([pd.DataFrame(run["counts_per_layer"]).fillna(0).assign(model=run["name"])
                           for run in runs], ignore_index=True).fillna(0)
    table = pd.DataFrame({"name": heads})
    table["layer"] = [int(h[1:].split("H")[0]) for h in heads]
    table["head"] = [int(h.split("H")[1]) for h in heads]
    reference = _distance(runs[0], heads)
    for run in runs:
        table[f"type/{run['name']}"] = labels[run["name"]]
    for run in runs[1:]:
        changed = np.array(labels[run["name"]]) != np.array(labels[first])
        table[f"changed/{run['name']}"] = pd.array(changed if named(runs[0]) and named(run) else [pd.NA] * len(heads),
                                                   dtype="boolean")
        shift = None if reference is None else _distance(run, heads)
        table[f"shift/{run['name']}"] = np.nan if shift is None else np.linalg.norm(shift - reference, axis=1)
    if all(named(run) for run in runs):  # the same names mean the same types
        types = [Counter(row) for row in zip(*labels.values())]  # per head: runs per type, in run order
        table["modal_type"] = [count.most_common(1)[0][0] for count in types]
        table["agreement"] = [count.most_common(1)[0][1] / len(runs) for count in types]
    roles, role_columns = role_tables(runs, syntax)
    table = pd.concat([table, role_columns], axis=1)
    table = table[["layer", "head", "name", *table.columns[3:]]]
    return {"ari": ari, "transitions": transitions, "stability": stability, "types_per_layer": per_layer,
            "roles": roles, "heads": table}


def named(run: dict[str, Any]) -> bool:
    """The run's clusters carry type names (Guan et al.'s, or given by hand): the same name is the same type in
    another named run, while ``cluster0`` of one fit is not ``cluster0`` of another."""
    return bool(run.get("named") or run.get("named_by_hand"))


def _distance(run: dict[str, Any], heads: list[str]) -> np.ndarray | None:
    """``[heads, 21]`` distance features of the run's features job (None when it is gone)."""
    path = Path(run.get("features", "")) / "heads.parquet"
    if not path.is_file():
        return None
    table = pd.read_parquet(path).set_index("name").loc[heads]
    return table[[c for c in table.columns if c.startswith("dist_")]].to_numpy()


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Compare the head types of ``cfg.compare.runs``; ``cfg`` passed ``check_mode``."""
    runs, syntax = read_inputs(cfg)
    gone = [run["name"] for run in runs if not (Path(run.get("features") or "") / "heads.parquet").is_file()]
    if gone:
        Console().print(f"note: the features job of {', '.join(gone)} is gone (moved or deleted): the shifts from "
                        "or to it are left empty", markup=False, soft_wrap=True)
    logger = identity.logger(cfg.logger, f"compare-{runs[0]['model']}")
    tables = comparison_tables(runs, syntax)
    output_dir = identity.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    for name in ("ari", "transitions", "stability", "roles"):
        write_frame_atomic(tables[name], output_dir / f"{name}.csv")
        write_text_atomic(output_dir / f"{name}.md", to_markdown(tables[name].round(4)))
    write_frame_atomic(tables["types_per_layer"], output_dir / "types_per_layer.csv")
    write_frame_atomic(tables["heads"], output_dir / "heads.parquet")
    write_frame_atomic(tables["heads"], output_dir / "heads.csv")
    colours = head_plots.matched_colours({run["name"]: tables["heads"][f"type/{run['name']}"] for run in runs})
    image = head_plots.types_per_layer(tables["types_per_layer"], "head types per layer",
                                       output_dir / "types_per_layer", tuple(cfg.report.formats), colours)[0]
    log_artifacts(logger, {name: tables[name] for name in ("ari", "transitions", "stability", "roles", "heads")},
                  {"types_per_layer": image})
    ari = tables["ari"].set_index("run")
    heads = tables["heads"]
    agreed = int((heads["agreement"] == 1).sum()) if "agreement" in heads else None
    summary = identity.complete({
        "kind": "compare", "group": cfg.group,
        "runs": [{"name": r["name"], "path": r["path"], "model": r["model"], "task": r["task"]} for r in runs],
        "ari": {f"{a} vs {b}": float(ari.loc[a, b]) for i, a in enumerate(ari.index) for b in ari.index[i + 1:]},
        "changed": {r["name"]: int(tables["heads"][f"changed/{r['name']}"].sum()) if named(runs[0]) and named(r)
                    else None for r in runs[1:]},  # None: numbered clusters, types not comparable
        "same_type_in_every_run": agreed,
        "roles": tables["roles"].set_index("role")[[r["name"] for r in runs]].to_dict("index"),
        "syntax": None if syntax is None else [str(path.absolute()) for path in syntax],
        "files": ["ari.csv", "ari.md", "transitions.csv", "transitions.md", "stability.csv", "stability.md",
                  "roles.csv", "roles.md",
                  "types_per_layer.csv", image.name, "heads.parquet", "heads.csv"]})
    write_json_atomic(output_dir / "results.json", summary)
    same = "" if agreed is None else f"\n\nHeads of the same type in every run: {agreed} of {len(heads)}"
    roles = "" if tables["roles"].empty else f"\n\nHeads per sieve role\n{to_markdown(tables['roles'])}"
    Console().print(f"Adjusted Rand index\n{to_markdown(tables['ari'].round(4))}\n\nStability\n"
                    f"{to_markdown(tables['stability'].round(4))}{same}{roles}\n-> {output_dir}", markup=False,
                    soft_wrap=True)
    if logger:
        logger.finalize("success")
    return summary
