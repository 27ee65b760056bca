"""Guan et al. 2020's claims, read from the cluster, tables and compare stages: the stability of the head types
(Table 1), Tables 2 and 3 (``guan_tables``: the orderings, Holm-adjusted per table, and the costs at the paper's
scale), and what fine-tuning changes. Stability gets the range of Guan et al.'s procedure repeated; the change of
types by layer, Newcombe's interval for a difference of two proportions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from statsmodels.stats.proportion import confint_proportions_2indep

from headlab.files import read_json
from headlab.study.findings.guan_tables import GUAN, cost_findings, ordering_findings
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import NOT_TESTED, Claim, Evidence, Finding, interval, not_tested, verdict

STABLE = 0.94  # the low end of Table 1 (94.37% on MNLI; 95.98% pre-trained, 96.26% SQuAD, 95.98% MRPC)
STABILITY = Claim("guan_stability", "Heads fall into stable distance types: at least 94% of the heads keep their "
                  "type in every one of the clustering fits on random halves of the heads", f"{GUAN}, Table 1 "
                  "(94.37-96.26%: \"over 95% attention heads are clustered stably\")")
FINE_TUNING = Claim("guan_finetuning_later_layers", "Fine-tuning changes the types of the later layers more than "
                    "those of the earlier layers", f"{GUAN}, Section 4 (Figure 4); Kovaleva et al. 2019", learned=True)


def stability_finding(files: StudyFiles) -> Finding:
    """Each model's share of heads labelled alike in every fit (Guan et al.'s procedure: fits on random halves),
    with the range of the whole procedure repeated (``cluster.stability_repeats``: its central ``confidence`` share),
    against the low end of Table 1; no verdict where the procedure ran once (its spread unknown). Heads that did not
    separate into named types keep theirs (unstable clusters are how the claim fails), with a note."""
    evidence = []
    alpha = 1 - files.resampling.confidence
    for model, job in files.model_jobs("cluster", ["pretrained", *files.models]):
        result = read_json(job / "results.json", "cluster results")
        clusters = read_json(job / "clusters.json", "clusters") if (job / "clusters.json").is_file() else {}
        settings = result["config"]["cluster"]
        runs = [result["stability"], *(result.get("stability_repeats") or [])]
        split = settings.get("stability_split", "sequences")
        low, high = (float(q) for q in np.quantile(runs, [alpha / 2, 1 - alpha / 2]))
        fits = settings["stability_fits"]
        numbers = (f"stability {result['stability']:.4f}, {len(runs)} runs of the procedure ({fits} fits on random "
                   f"halves of the {split} each) range {low:.4f}-{high:.4f} (their central "
                   f"{1 - alpha:.0%}; boundary {STABLE:g})")
        outcome, note = verdict(low, high, STABLE), ""
        if len(runs) < 2:
            outcome, note = NOT_TESTED, ("the procedure ran once, so its spread is unknown: give "
                                         "cluster.stability_repeats (the study's default: 20)")
        if not (clusters.get("named") or clusters.get("named_by_hand")):
            note = "; ".join(filter(None, [note, "its heads did not separate into Guan et al.'s types (numbered "
                                           "clusters): the stability is of the clusters there are"]))
        evidence.append(Evidence(model, outcome, numbers, files.link(job / "results.json"),
                                 {"value": result["stability"], "low": low, "high": high, "boundary": STABLE,
                                  "runs": len(runs), "split": split}, note=note))
    return Finding(STABILITY, tuple(evidence)) if evidence else not_tested(STABILITY, files.absent("cluster"))


def fine_tuning_finding(files: StudyFiles) -> Finding:
    """The share of heads whose type changed in the later half of the layers minus the earlier half (the middle
    layer of an odd count left out), Newcombe's interval, above 0. Only between named types: numbered clusters of two
    fits are not the same types, so a change of label is not a change of type."""
    evidence, unnamed = [], []
    for model, job in files.model_jobs("compare", files.models):
        heads = pd.read_csv(job / "heads.csv")
        changed = next(column for column in heads.columns if column.startswith("changed/"))
        if heads[changed].isna().any():  # a run's clusters are numbered: cluster0 of one fit is not of another
            unnamed.append(model)
            continue
        layers = int(heads["layer"].max()) + 1
        half = layers // 2
        if not half:
            continue
        later = heads.loc[heads["layer"] >= layers - half, changed].astype(bool)
        earlier = heads.loc[heads["layer"] < half, changed].astype(bool)
        low, high = confint_proportions_2indep(int(later.sum()), len(later), int(earlier.sum()), len(earlier),
                                               method="newcomb", compare="diff",
                                               alpha=1 - files.resampling.confidence)
        value = later.mean() - earlier.mean()
        numbers = (f"type changed: {int(later.sum())} of {len(later)} heads in layers {layers - half}-{layers - 1} vs "
                   f"{int(earlier.sum())} of {len(earlier)} in layers 0-{half - 1}; difference "
                   f"{interval(value, float(low), float(high), 4)} (boundary 0)")
        evidence.append(Evidence(model, verdict(float(low), float(high), 0.0), numbers,
                                 files.link(job / "heads.csv"), {"value": float(value), "low": float(low),
                                                                 "high": float(high), "boundary": 0.0}))
    if evidence:
        return Finding(FINE_TUNING, tuple(evidence))
    if unnamed:
        return not_tested(FINE_TUNING, "the pre-trained or the fine-tuned model's heads did not separate into named "
                          f"types (compare/{', '.join(unnamed)}), and numbered clusters of two fits are not the same "
                          "types")
    return not_tested(FINE_TUNING, files.absent("compare") if not files.jobs("compare") else
                      "the model has a single layer")


def guan_findings(files: StudyFiles) -> list[Finding]:
    return [stability_finding(files), *ordering_findings(files), *cost_findings(files), fine_tuning_finding(files)]

