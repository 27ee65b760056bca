"""The study's findings: each claim of the seeds its stages can test, with a verdict from this run.

``verdicts`` holds the rule that turns an interval into a verdict; ``guan`` and ``heads`` read the stage files of
each claim; ``caveats`` says what limits the run's numbers.
"""

from __future__ import annotations

from typing import Any

from headlab.reporting.report import report_settings
from headlab.study.findings.guan import guan_findings
from headlab.study.findings.heads import clark_findings, michel_findings, pande_findings
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import Finding
from headlab.study.stage_reports import REPORTED, stage_report_settings
from headlab.study.stages import Study


def study_files(study: Study) -> StudyFiles:
    """The study's stage files, scored with the tables' report settings (the sweep's report, with its own)."""
    cfg = study.cfg
    reports = {stage: report_settings(stage_report_settings(study, stage))[:2] for stage in REPORTED}
    scale = 100.0 if cfg.task.type == "extractive_qa" else 1.0
    return StudyFiles(study.folder, [name for name, _ in study.models], str(cfg.task.main_metric),
                      str(cfg.task.eval_splits[0]), scale, reports["tables"][0], reports)


def study_findings(files: StudyFiles) -> list[Finding]:
    """Every claim, in the order of the papers: Guan et al., Clark et al., Michel et al., Pande et al."""
    return [*guan_findings(files), *clark_findings(files), *michel_findings(files), *pande_findings(files)]


def finding_lines(finding: Finding, code: str = "`") -> list[str]:
    """A finding as a list item: verdict, claim, source; then each model's numbers and stage file."""
    head = f"- **{finding.counted()}**: {finding.claim.text} ({finding.claim.source})."
    several = len(finding.evidence) > 1
    return [head, *(f"  - {e.model}: {e.numbers} ({code}{e.file}{code}){': ' + e.verdict if several else ''}"
                    for e in finding.evidence)]


def findings_json(findings: list[Finding]) -> dict[str, Any]:
    return {finding.claim.key: finding.as_json() for finding in findings}
