"""The files a finished stage promises: what its marker lists, and what of that is gone or changed since.

A stage is done only when every file it wrote is still there with the content it had (size and BLAKE2 digest): a
hand-deleted ``syntax.csv`` or ``clusters.json``, or a report rewritten by hand with other settings over a stage's
files, makes the stage run again (the jobs whose files they are, and the stage's own reports). Contents, not
modification times, so a study folder copied without its times (``cp -r``) is still done. Logs, hidden files
(locks, temporary files) and the marker itself are not results.
"""

from __future__ import annotations

from pathlib import Path

from headlab.files import file_digest


def is_result(path: Path, stage_folder: Path, marker: str) -> bool:
    parts = path.relative_to(stage_folder).parts
    return path.is_file() and not path.is_symlink() and path.suffix != ".log" and \
        not any(part.startswith(".") for part in parts) and parts != (marker,)


def stage_manifest(study_folder: Path, stage: str, marker: str) -> dict[str, list]:
    """``{path relative to the study: [size, digest]}`` of every result file under ``study_folder/stage``."""
    folder = study_folder / stage
    return {str(path.relative_to(study_folder)): [path.stat().st_size, file_digest(path)]
            for path in sorted(folder.rglob("*")) if is_result(path, folder, marker)}


def manifest_problems(study_folder: Path, manifest: dict[str, list]) -> dict[str, str]:
    """``{path: "missing" | "changed"}`` of the listed files that are gone, unreadable, or hold other content."""
    problems = {}
    for name, (size, digest) in manifest.items():
        path = study_folder / name
        try:
            if path.stat().st_size != size or file_digest(path) != digest:
                problems[name] = "changed"
        except OSError:
            problems[name] = "missing"
    return problems
