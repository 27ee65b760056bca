"""``ablate.py``: check the config (no weights read), then run the ``mode=`` stage (``headlab.analysis``, or the
whole study: ``headlab.study``); Ctrl-C or SIGTERM ends it with status 130 or 143 and a note of where."""

from __future__ import annotations

from typing import Any

from headlab.analysis.modes import ANALYSIS_MODES, ONE_PROCESS, check_mode, run_mode
from headlab.cli.errors import say
from headlab.cli.hydra_glue import job_dir, log_lightning_once, point_latest, progress_bars_follow
from headlab.cli.schema import check_config
from headlab.cli.unread_config import refuse_unread_model_config
from headlab.errors import UserError
from headlab.study.interrupts import stopping_on_signals
from headlab.training.processes import several_processes

MODES = ("study", *ANALYSIS_MODES)  # what --help lists, in this order
RERUN = "run the same command to go on from there (finished jobs are skipped, a job resumes from what it saved)"


def run_ablate(cfg: Any) -> Any:
    with stopping_on_signals(say, lambda: f"ablate.py mode={cfg.mode}, job {job_dir()}", RERUN):
        return _run_ablate(cfg)


def _run_ablate(cfg: Any) -> Any:
    check_config(cfg)
    if cfg.mode == "study":
        from headlab.cli.train import check_train_config
        from headlab.study.checks import check_stage_alone, check_study
        from headlab.study.run import run_study

        stages = check_study(cfg, job_dir())
        from headlab.study.stages import check_reference, preview_configs, stage_setting_error

        for stage, stage_cfg in preview_configs(cfg, stages):  # every stage's settings typed and in range, first
            try:
                if stage == "finetune":  # all of train.py's checks: a refused mask must not reach the job first
                    check_train_config(stage_cfg)  # (which would retire the finished results, then fail)
                else:
                    check_config(stage_cfg)
                check_stage_alone(stage, stage_cfg)
            except UserError as error:
                raise UserError(stage_setting_error(stage, str(error))) from None
        try:
            check_reference(cfg, stages)
        except UserError as error:
            raise UserError(stage_setting_error("robustness", str(error))) from None
        import lightning.pytorch  # noqa: F401  (log_lightning_once quiets it)

        log_lightning_once()
        point_latest(job_dir())
        return run_study(cfg, job_dir(), stages)
    refuse_unread_model_config(cfg)
    if cfg.mode in ONE_PROCESS and several_processes(cfg.trainer):  # a prune curve's processes waited forever
        raise UserError(f"mode={cfg.mode} runs in one process; trainer.strategy={cfg.trainer.strategy}, "
                        f"trainer.devices={cfg.trainer.devices}, trainer.num_nodes={cfg.trainer.num_nodes} would "
                        "start several: use trainer=cpu or trainer=gpu (DDP takes mode=eval, sweep_heads, "
                        "importance, features, syntax and gates)")
    check_mode(cfg)
    log_lightning_once()
    progress_bars_follow(cfg.trainer)
    return run_mode(cfg, job_dir())
