"""The study's findings: each claim of the seeds its stages can test, with a verdict from this run.

``verdicts`` holds the rule that turns an interval into a verdict; ``guan`` and ``heads`` read the stage files of
each claim; ``limits`` finds a model at its floor or ceiling (``chance``: the floor of each metric), whose ablation
claims get no verdict, nor does any claim of a smoke run; ``caveats`` says what limits the run's numbers.
"""

from __future__ import annotations

from typing import Any

from headlab.reporting.report import report_settings
from headlab.study.findings.gates import gates_findings
from headlab.study.findings.guan import guan_findings
from headlab.study.findings.heads import clark_findings, michel_findings, pande_findings
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.limits import baseline_limits, floor_reasons, limit_reasons
from headlab.study.findings.verdicts import Finding, quick_run, withheld
from headlab.study.stage_reports import REPORTED, stage_report_settings
from headlab.study.stages import Study


def study_files(study: Study, stale: frozenset[str] = frozenset()) -> StudyFiles:
    """The study's stage files, scored with the tables' report settings (the sweep's report, with its own);
    ``stale``: stages whose files are of other settings, read as not run."""
    cfg = study.cfg
    reports = {stage: report_settings(stage_report_settings(study, stage))[:2] for stage in REPORTED}
    qa = cfg.task.type == "extractive_qa"
    split = str(cfg.task.eval_splits[0])
    return StudyFiles(study.folder, [name for name, _ in study.models], str(cfg.task.main_metric), split,
                      100.0 if qa else 1.0, reports["tables"][0], reports, smoke=bool(cfg.study.get("smoke", False)),
                      version=str(cfg.task.get("version", "v1")), answers=(lambda: gold_answers(cfg.task, split))
                      if qa else None, stale=stale, margin=float(cfg.study.findings.margin))


def gold_answers(task: Any, split: str) -> dict[str, list[str]] | None:
    """``question id -> its gold answer texts`` of the task's ``split`` (for SQuAD's chance); None when the task's
    data cannot be read now."""
    from headlab.errors import UserError
    from headlab.tasks.loading import load_task_data

    try:
        data = load_task_data(task, [split])[split]
    except (UserError, OSError, ValueError):
        return None
    return {str(i): list(answers["text"]) for i, answers in zip(data["id"], data["answers"])}


def study_findings(files: StudyFiles) -> list[Finding]:
    """Every claim, in the order of the papers: Guan et al., Clark et al., Michel et al., Pande et al., then the learned
    measures' (Voita et al., Nam et al., Li & Janson; the gates stage, when it ran). A smoke run's
    are all ``not tested (quick run)``; the ablation claims of a model at its floor or ceiling (or without a baseline)
    are not tested, nor are the fine-tuning claims of a model at its floor."""
    found = [*guan_findings(files), *clark_findings(files), *michel_findings(files), *pande_findings(files),
             *(gates_findings(files) if files.jobs("gates") else [])]
    if files.smoke:
        return [quick_run(finding) for finding in found]
    if any((finding.claim.ablation or finding.claim.learned) and finding.evidence for finding in found):
        limits = baseline_limits(files)
        ablation, learned = limit_reasons(files, limits), floor_reasons(limits)
        found = [withheld(finding, ablation) if finding.claim.ablation else
                 withheld(finding, learned) if finding.claim.learned else finding for finding in found]
    return found


def finding_lines(finding: Finding, code: str = "`") -> list[str]:
    """A finding as a list item: verdict, claim, source; then each model's numbers and stage file, and why its
    verdict is inconclusive or not tested when the numbers alone do not say."""
    head = f"- **{finding.counted()}**: {finding.claim.text} ({finding.claim.source})."
    several = len(finding.evidence) > 1
    lines = [head]
    for e in finding.evidence:
        said = e.verdict if several or (e.note and e.note not in finding.reason) else ""
        why = f" ({e.note})" if e.note and e.note not in finding.reason else ""
        lines.append(f"  - {e.model}: {e.numbers} ({code}{e.file}{code}){': ' + said if said else ''}{why}")
    return lines


def findings_json(findings: list[Finding]) -> dict[str, Any]:
    return {finding.claim.key: finding.as_json() for finding in findings}
