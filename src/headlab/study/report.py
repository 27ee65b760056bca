"""The study's report: ``study.md`` (GitHub markdown, figures by relative path), ``study.json``, a terminal summary.

Every number is read from a stage's files, named under the table or sentence that shows it: the fine-tuning's
``results.json``, the tables' ``report/`` (plan grids with paired CIs and adjusted p-values), the clusters'
and the comparison's ``results.json``, ``importance.json`` and ``agreement.csv``, ``prune_curve.csv``. A stage
that did not run is said to be missing, not left out silently.
"""


from __future__ import annotations

from typing import Any

from rich.console import Console

from headlab.files import write_json_atomic, write_text_atomic
from headlab.study.findings import finding_lines, findings_json, study_files, study_findings
from headlab.study.findings.caveats import study_caveats
from headlab.study.findings.claims_table import claims_table
from headlab.study.findings.verdicts import RULE
from headlab.study.report_base import StudyReport
from headlab.study.report_heads import gates, importance, prune_curve, syntax
from headlab.study.report_robustness import robustness
from headlab.study.report_types import baseline, comparison, controls, head_types, refits, tables
from headlab.study.schema import is_stage_setting
from headlab.study.stages import Study

COLLAPSE = 5  # files of this many sibling folders (a table's plans, a sweep's heads) are listed as one line
SMOKE = ("A smoke run (study.smoke=true, as study=quick sets): it checks that the stages chain, not the science. Its "
         "verdicts are not findings: every claim reads not tested (quick run). Run the study without study=quick "
         "for findings.")


def files(report: StudyReport) -> None:
    """Every file the study wrote (W&B's offline runs as one line; a folder of many alike, a sweep's plans, as one)."""
    report.section("Files")
    lines, runs = [], set()
    for path in sorted(report.study.folder.rglob("*")):
        parts = path.relative_to(report.study.folder).parts
        if not path.is_file() or any(part.startswith(".") for part in parts) or parts[0] in report.stale:
            continue
        if parts[0] == "wandb":
            runs |= {parts[1]} if parts[1].startswith("offline-run-") else set()
            continue
        lines.append(report.link(path))
    lines = sorted({*lines, "study.md", "study.json"})  # the report's own files, written after this list
    wandb = [f"wandb/{{{len(runs)} offline runs: upload with wandb sync}}/"] if runs else []
    left_out = f" (not those of {', '.join(sorted(report.stale))}: of other settings)" if report.stale else ""
    report.markdown += [f"{len(lines)} files under `{report.study.folder}`{left_out}:", "", "```", *collapse(lines),
                        *wandb, "```"]


def collapse(paths: list[str]) -> list[str]:
    """Paths whose folders differ only by a plan's name (``sweep/seed0/L3H7/results.json``) shown once per pattern
    when ``COLLAPSE`` or more folders share it."""
    groups: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        parts = path.split("/")
        key = ("/".join(parts[:-2]), parts[-1]) if len(parts) >= 3 else (path, "")
        groups.setdefault(key, []).append(parts[-2] if len(parts) >= 3 else "")
    lines = []
    for (parent, name), folders in groups.items():
        if not name:
            lines.append(parent)
        elif len(folders) < COLLAPSE:
            lines += [f"{parent}/{folder}/{name}" for folder in folders]
        else:
            lines.append(f"{parent}/{{{len(folders)} folders: {folders[0]} ... {folders[-1]}}}/{name}")
    return lines


def findings(report: StudyReport) -> None:
    """The findings claim by claim, and the caveats: at the top of study.md, at the end of the terminal's summary."""
    files = study_files(report.study, report.stale)
    found = study_findings(files)
    report.section("Findings")
    report.markdown += ["Each claim of the papers this study's stages test, with its verdict from this run and the "
                        "stage files its numbers come from (the rule below the list).", ""]
    for finding in found:
        report.markdown += finding_lines(finding)
    report.markdown += ["", RULE, "", "**The claims**, each as its paper states it:", "", claims_table()]
    report.numbers["findings"] = findings_json(found)
    report.closing += ["findings (verdict: claim, source; numbers in study.md):",
                       *(f"  {finding.counted().replace('`', '')}: {finding.claim.text} ({finding.claim.source})"
                         for finding in found)]
    model = report.study.cfg.model
    caveats = study_caveats(files, study_command(report.study), model.name,
                            model.get("pretraining"))
    report.section("Caveats")
    report.markdown += [line for caveat in caveats for line in (caveat, "")] or ["None found by the checks."]
    report.numbers["caveats"] = caveats
    report.closing += [f"caveat: {caveat.replace('**', '').replace('`', '')}" for caveat in caveats]


def study_command(study: Study) -> str:
    """The command that ran the study, without its seeds, stages and checkpoint (for the caveat that says how to run
    more seeds: every stage runs for them, and a given checkpoint is one model), with its folder when one was given
    (``hydra.run.dir``: the stages done are reused only there)."""
    overrides = [f"model={study.cfg.model.name}", f"task={study.cfg.task.name}"]
    try:
        from hydra.core.hydra_config import HydraConfig

        given = HydraConfig.get().overrides
        overrides = [o.removeprefix("++") if is_stage_setting(o.removeprefix("++")) else o  # as the user typed it
                     for o in given.task
                     if not o.startswith(("study.seeds", "study.stages", "study.checkpoint", "hydra."))]
        overrides += [o for o in given.hydra if o.startswith("hydra.run.dir=")]
    except ValueError:  # not under Hydra (the report written by hand)
        pass
    return " ".join(["python ablate.py", *(f"'{o}'" if any(c in o for c in "[]{}, ") else o for o in overrides)])


def write_study_report(study: Study, console: Console, inputs: dict[str, Any],
                       stale: dict[str, str | None] | None = None) -> dict[str, Any]:
    """``study.md`` and ``study.json`` (with ``inputs``: what the stages' markers said) in the study folder; the
    summary printed to ``console``. ``stale``: stages left out of this run whose files are of other settings
    (``None``) or were computed from such a stage's files (its name; ``StudyRun.stale_stages``)."""
    stale = stale or {}
    report = StudyReport(study, stale=frozenset(stale), stale_reads={k: v for k, v in stale.items() if v})
    cfg = study.cfg
    names = ", ".join(name for name, _ in study.models)
    report.markdown += [f"# headlab study: {cfg.model.name} on {cfg.task.name}", "",
                        f"Fine-tuned model(s): {names}. Every number is read from the stage file named beside it; "
                        f"paths are relative to `{study.folder}`."]
    if cfg.study.get("smoke", False):
        report.markdown += ["", f"**{SMOKE}**"]
        report.console.append(f"note: {SMOKE}")
    if stale:
        own = [stage for stage, read in stale.items() if read is None]
        readers = [stage for stage, read in stale.items() if read is not None]
        warning = (f"Not this command's settings: the files of {', '.join(own)} were computed with other settings "
                   f"(or inputs){', and ' + ', '.join(readers) + ' read them' if readers else ''}: this report "
                   "leaves them out; run those stages again to update them.")
        report.markdown += ["", f"**{warning}**"]
        report.console.append(f"note: {warning}")
    findings(report)
    for part in (baseline, tables, controls, refits, head_types, comparison, syntax, importance, robustness, gates,
                 prune_curve, files):
        part(report)
    report.console += report.closing
    write_text_atomic(study.folder / "study.md", "\n".join(report.markdown) + "\n")
    summary = {"model": cfg.model.name, "task": cfg.task.name, "models": names.split(", "), **report.numbers,
               "summary": report.console, "inputs": inputs}
    write_json_atomic(study.folder / "study.json", summary)
    for line in report.console:
        console.print(line, markup=False)
    log_report(study, report, inputs)
    return summary


def log_report(study: Study, report: StudyReport, inputs: dict[str, Any]) -> None:
    """The report's tables and figures in the study's last W&B run (``job_type=report``, the study's group)."""
    from omegaconf import OmegaConf

    from headlab.files import config_hash
    from headlab.training.tracking import build_logger, log_artifacts, tracked_job

    logger_cfg = study.cfg.logger
    if logger_cfg is None or "WandbLogger" not in str(logger_cfg.get("_target_")):
        return
    logger_cfg = OmegaConf.merge(logger_cfg, {"group": study.group, "job_type": "report"})
    run_id = config_hash({"study": str(study.folder.absolute()), "inputs": inputs})
    with tracked_job():
        logger = build_logger(logger_cfg, run_id=run_id, run_name=f"report-{study.group}")
        log_artifacts(logger, report.tables, report.images)
        logger.finalize("success")
