"""``ablate.py mode=study`` (the default): the whole study of one model on one task, in one process.

The stages (``headlab.study.stages``) run in order, each in its own folder of the study folder, each one the
same ``train.py`` or ``ablate.py`` code a person would run by hand. A stage whose jobs all hold complete results of
their current config (the jobs' hashes) and whose ``stage.json`` says so is skipped: a killed study resumes by
running the same command, and a changed setting reruns the stages whose configs or input files it changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console

from headlab.errors import UserError
from headlab.files import config_hash, folder_lock, read_json, short_name, write_json_atomic
from headlab.study.checks import check_study
from headlab.study.interrupts import stopping_on_signals
from headlab.study.stage_files import manifest_problems, stage_manifest
from headlab.study.stages import ABOUT, MARKER, READS, STAGES, Job, Study, stage_jobs

LOCK_FILE = ".study.lock"
NO_JOBS = {"refits": "the clusters are not Guan et al.'s four named types, or cluster.bootstrap_fits is 0",
           "controls": "the clusters have no type Table 2's orderings say matters"}  # why a stage has no jobs
REPORT_FORMAT = 9  # raised when study.md says more (2: findings, caveats; 3: the summary kept; 4: robustness; 5:
# orderings only where intervals separate them; 6: no verdict at a floor or ceiling or in a smoke run, the findings
# read the tables' intervals; 7: the papers' claims at their scale, equivalence, Holm per table, rank tests; 8:
# controls' excess CIs, the refits section, the offset control's bar; 9: the gates findings' zero-width, records and
# Monte Carlo rules, the gates jobs' baselines for the floor): a finished study's report is rewritten


def study_group(folder: Path) -> str:
    """The W&B group of every run of the study: ``study-<task>-<model>-<folder name>`` (the last three folders; at
    most W&B's 128 characters)."""
    folder = folder.absolute()
    return short_name("-".join(["study", *folder.parts[1:][-3:]]), 128)


def job_hash(job: Job) -> str:
    """The hash of what ``job`` computes (its ``results.json`` carries it when the job is done); analysis configs
    are checked first (``check_mode``, which also lays a preset's plan over the mask)."""
    if job.kind == "train":
        from headlab.training.finetune import finetune_identity

        return finetune_identity(job.cfg)[3]
    from headlab.analysis.jobs.identity import hashed_config
    from headlab.analysis.modes import check_mode

    check_mode(job.cfg)
    return hashed_config(job.cfg)[2]


def run_job(job: Job) -> None:
    job.folder.mkdir(parents=True, exist_ok=True)  # as Hydra makes a job's folder before it runs
    if job.kind == "train":
        from headlab.training.finetune import run_finetuning

        run_finetuning(job.cfg, job.folder)
    else:
        from headlab.analysis.modes import run_mode

        run_mode(job.cfg, job.folder)


class SayOnce(logging.Filter):
    """Lets each message through once: Lightning's lines about the devices, said by every job's trainer."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        new = message not in self.said
        self.said.add(message)
        return new


class StudyRun:
    """Runs the stages in order with a progress line as each starts and ends."""

    def __init__(self, study: Study, stages: list[str]) -> None:
        self.study, self.stages, self.start = study, stages, time.monotonic()
        self.ran: list[tuple[str, float, float]] = []  # (stage, share of its jobs run, seconds): jobs ran in this run
        self.work: Callable[[str], float] | None = None  # stage -> passes (``study.progress``), once sizes are known
        self.tracked = False  # a W&B run of this study ran in this process
        self.wandb = study.cfg.logger is not None and "WandbLogger" in str(study.cfg.logger.get("_target_"))
        self.quiet_tracking()
        self.position = "the start"  # the stage (and job) running: said when a signal stops it
        self.console = Console(soft_wrap=True, highlight=False)
        logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(SayOnce())  # "GPU available: ..."

    def say(self, text: str) -> None:
        self.console.print(text, markup=False)

    def elapsed(self, since: float | None = None) -> str:
        return str(timedelta(seconds=round(time.monotonic() - (self.start if since is None else since))))

    def run(self) -> dict[str, Any]:
        self.check_inputs_current()
        with stopping_on_signals(self.say, lambda: self.position) as self.interrupts:
            for number, stage in enumerate(self.stages, start=1):
                where = self.position = f"[{number}/{len(self.stages)}] {stage}"
                if stage == "report":
                    self.report(where)
                    continue
                self.run_stage(stage, where, number)
                self.interrupts.check()
        if self.tracked and self.study.cfg.logger.offline:
            self.say(f"W&B: the study's runs are in group {self.study.group}, offline; upload them with: wandb sync "
                     f"{self.study.folder / 'wandb'}/offline-run-*")
        if "report" in self.stages:
            self.say(f"study done in {self.elapsed()}: {self.study.folder / 'study.md'}")
        else:  # study.md, if there, is of an earlier run: not this one's
            self.say(f"study stages {', '.join(self.stages)} done in {self.elapsed()} ({self.study.folder}); no report "
                     "in this run: add report to study.stages to write study.md")
        return read_json(self.study.folder / "study.json", "study") if (self.study.folder / "study.json").is_file() \
            else {}

    def report(self, where: str) -> None:
        """``study.md``, unless ``study.json`` says it was written from the stages' current results."""
        from headlab.study.report import write_study_report

        stale = self.stale_stages()
        key, summary = {**self.inputs_key(), "stale": sorted(stale)}, self.study.folder / "study.json"
        done = read_json(summary, "study") if summary.is_file() else {}
        if done.get("inputs") == key and (self.study.folder / "study.md").is_file():
            self.say(f"{where}: skipped, done ({self.study.folder / 'study.md'})")
            for line in done.get("summary", []):  # what the run that wrote it printed
                self.say(line)
            return
        self.say(f"{where}: {ABOUT['report']} (elapsed {self.elapsed()})")
        write_study_report(self.study, self.console, key, stale)

    def stale_stages(self) -> dict[str, str | None]:
        """The stages left out of this run whose files are there but not of this command's settings and inputs:
        ``{stage: None}`` for its own jobs or settings, ``{stage: input}`` for one that read the files of a stale
        stage (``READS``, in the study's order: a stale stage's readers are stale in turn)."""
        stale: dict[str, str | None] = {}
        for stage in STAGES[:-1]:
            if stage in self.stages or not (self.study.folder / stage / MARKER).is_file():
                continue
            read = next((need for need in READS[stage] if need in stale), None)
            if read is not None:
                stale[stage] = read
                continue
            try:
                current = self.is_done(stage, self.stage_key(stage, stage_jobs(self.study, stage)))
            except UserError:  # an input of its jobs is gone
                current = False
            if not current:
                stale[stage] = None
        return stale

    def check_inputs_current(self) -> None:
        """A ``UserError`` for a stage of this run that would read the files of a stale stage left out of it (the
        tables of k = 3 from the clusters of k = 4), before any stage runs."""
        reads = {need for stage in self.stages for need in READS[stage] if need not in self.stages}
        if not any((self.study.folder / need / MARKER).is_file() for need in reads):
            return
        stale = self.stale_stages()
        for stage in self.stages:
            need = next((need for need in READS[stage] if need in stale), None)
            if need is not None:
                root = need
                while stale[root] is not None:
                    root = stale[root]
                why = f" (it read {root}'s)" * (root != need)
                raise UserError(f"study.stages: {stage} reads the files of {need}, which are of other settings or "
                                f"inputs than this command's{why}: add {root} to study.stages (and the stages "
                                f"between), or leave {stage} out")

    def stage_key(self, stage: str, jobs: list[Job]) -> dict[str, Any]:
        """What a finished stage's marker holds: its jobs' hashes, and what its own files depend on."""
        return {"jobs": {self.name(job): job_hash(job) for job in jobs}, **self.extra_key(stage)}

    def time_left(self, number: int) -> str:
        """``; about M minutes left`` after the ``number``-th stage of this run: the work of the later stages that
        have not finished in this folder, at the rate of those that ran (``study.progress``)."""
        from headlab.study.progress import about, seconds_left, study_work

        self.work = self.work or study_work(self.study)
        if self.work is None:
            return ""
        later = [stage for stage in self.stages[number:] if not self.done_now(stage)]
        left = seconds_left([(share * self.work(stage), seconds) for stage, share, seconds in self.ran],
                            sum(self.work(stage) for stage in later))
        return "" if left is None else f"; {about(left)}"

    def done_now(self, stage: str) -> bool:
        """Whether ``stage``'s marker is of its jobs as they would be built now (a copied or changed study's stages
        of other settings or inputs run again, and count in the time left); False when its inputs are not there
        yet."""
        marker = self.marker(stage)
        if marker is None:
            return False
        try:
            return marker.get("key") == self.stage_key(stage, stage_jobs(self.study, stage))
        except (UserError, OSError):
            return False

    def run_stage(self, stage: str, where: str, number: int) -> None:
        """Run ``stage``'s jobs that are not done (then its reports), unless its marker says all are done."""
        from headlab.reporting.results import read_complete
        from headlab.study.stage_reports import RETIRED, retire_other_jobs

        jobs = stage_jobs(self.study, stage)
        if not jobs and stage == "finetune":  # study.checkpoint gives the fine-tuned model
            self.say(f"{where}: skipped, study.checkpoint={self.study.cfg.study.checkpoint} is the fine-tuned model")
            return
        if not jobs:  # its marker says so: the stage is done as it is now
            write_json_atomic(self.study.folder / stage / MARKER, {"stage": stage, "key": self.stage_key(stage, []),
                                                                   "files": {}})
            self.say(f"{where}: nothing to run, {NO_JOBS.get(stage, 'no jobs')}")
            return
        key = self.stage_key(stage, jobs)
        hashes = key["jobs"]
        problems = self.file_problems(stage)
        if not problems and self.is_done(stage, key, check_files=False):
            self.say(f"{where}: skipped, done ({self.study.folder / stage})")
            return
        began = time.monotonic()
        self.say(f"{where}: {ABOUT[stage]}, {len(jobs)} job{'s' * (len(jobs) != 1)} (elapsed {self.elapsed()})")
        self.redo_jobs_of(problems, jobs)
        retired = retire_other_jobs(self.study, stage, [job.folder for job in jobs])
        if retired:
            self.say(f"note: {len(retired)} job folder(s) of plans this study no longer has moved to "
                     f"{self.study.folder / stage / RETIRED} ({', '.join(retired[:3])}{' ...' * (len(retired) > 3)})")
        ran, running = 0, 0.0  # jobs run now and their seconds: a resumed stage's finished jobs, its reports and
        for job in jobs:  # its files' digests are not in the rate the time left is read at
            if read_complete(job.folder / "results.json", hashes[self.name(job)]) is None:
                self.position = f"{where}, job {self.name(job)}"
                self.interrupts.listen()
                started = time.monotonic()
                run_job(job)
                running += time.monotonic() - started
                self.interrupts.check()
                self.tracked = self.tracked or self.wandb
                ran += 1
        self.position = where
        from headlab.study.stage_reports import REPORTED, write_stage_reports

        if stage in REPORTED:
            write_stage_reports(self.study, stage)
        write_json_atomic(self.study.folder / stage / MARKER,
                          {"stage": stage, "key": key, "files": stage_manifest(self.study.folder, stage, MARKER)})
        if ran:
            self.ran.append((stage, ran / len(jobs), running))
        self.say(f"{where}: done in {self.elapsed(began)} (elapsed {self.elapsed()}){self.time_left(number)}")

    def marker(self, stage: str) -> dict[str, Any] | None:
        path = self.study.folder / stage / MARKER
        return read_json(path, "stage marker") if path.is_file() else None

    def file_problems(self, stage: str) -> dict[str, str]:
        """The files ``stage``'s marker lists that are gone or changed (``stage_files``); a marker of an older headlab
        lists none: every one of its files counts as unchecked (``{"": "unlisted"}``)."""
        marker = self.marker(stage)
        if marker is None:
            return {}
        if "files" not in marker:
            return {"": "unlisted"}
        return manifest_problems(self.study.folder, marker["files"])

    def redo_jobs_of(self, problems: dict[str, str], jobs: list[Job]) -> None:
        """Each job holding a gone or changed file runs again (its ``results.json`` goes), with a note per job."""
        owners: dict[Path | None, list[str]] = {}  # the job's folder (None: the stage's reports) -> its files
        for name in filter(None, problems):
            folder = next((job.folder for job in jobs if (self.study.folder / name).is_relative_to(job.folder)), None)
            owners.setdefault(folder, []).append(f"{name} {problems[name]}")
        for folder, names in owners.items():
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            self.say(f"note: since the stage finished, {names[0]}{more}: " + (
                f"{folder.relative_to(self.study.folder)} runs again" if folder else "its reports are written again"))
            if folder is not None:
                (folder / "results.json").unlink(missing_ok=True)

    def quiet_tracking(self) -> None:
        """The study's W&B runs print one line each (``build_logger``), not W&B's banner and summary; the study
        says at its end how to upload them all."""
        logger = self.study.cfg.logger
        if self.wandb:
            logger.settings = {**(logger.get("settings") or {}), "silent": True}

    def name(self, job: Job) -> str:
        return str(job.folder.relative_to(self.study.folder))

    def extra_key(self, stage: str) -> dict[str, Any]:
        """What a stage's own files depend on beyond its jobs (the tables' and the sweep's reports: their settings)."""
        from headlab.study.stage_reports import REPORTED, stage_report_settings

        if stage not in REPORTED:
            return {}
        from omegaconf import OmegaConf

        return {"report": config_hash(OmegaConf.to_container(stage_report_settings(self.study, stage), resolve=True))}

    def inputs_key(self) -> dict[str, Any]:
        """The report's inputs: every other stage's marker (its jobs' hashes and its files' digests), the findings'
        settings, and the study's folder (study.md names it: a copied study writes its own)."""
        from omegaconf import OmegaConf

        markers = {}
        for stage in STAGES[:-1]:
            marker = self.marker(stage)
            markers[stage] = None if marker is None else [marker.get("key"), marker.get("files")]
        return {"stages": config_hash(markers), "format": REPORT_FORMAT, "folder": str(self.study.folder.absolute()),
                "smoke": bool(self.study.cfg.study.get("smoke", False)),
                "findings": OmegaConf.to_container(self.study.cfg.study.findings, resolve=True)}

    def is_done(self, stage: str, key: dict[str, Any], check_files: bool = True) -> bool:
        """The stage's marker holds ``key``, each of its jobs' results are complete for its hash, and (unless
        ``check_files=False``: checked already) every file it lists is there with the content it had."""
        from headlab.reporting.results import read_complete

        marker = self.marker(stage)
        if marker is None or marker.get("key") != key or (check_files and self.file_problems(stage)):
            return False
        return all(read_complete(self.study.folder / name / "results.json", hash_) is not None
                   for name, hash_ in key["jobs"].items())


def run_study(cfg: Any, folder: str | Path, stages: list[str] | None = None) -> dict[str, Any]:
    """Run the study of ``cfg`` (a config that passed ``check_study``) in ``folder``, one study per folder at a
    time (``.study.lock``: a second one started meanwhile stops with an error)."""
    folder = Path(folder)
    stages = check_study(cfg, folder) if stages is None else stages
    study = Study(cfg, folder, study_group(folder))
    with folder_lock(folder, LOCK_FILE, f"another study is running in {str(folder)!r} (it holds {LOCK_FILE}); wait "
                     "for it to end, then run this one again (the stages done are skipped), or give this one another "
                     "hydra.run.dir"):
        return StudyRun(study, stages).run()
