"""Bad input ends as one line, ``error: ...`` on stderr, and exit status 2; bugs keep their traceback.

``run_entry`` runs an entry script's ``@hydra.main`` function with Hydra's own error printing off
(``HYDRA_FULL_ERROR=1`` inside), so composition errors reach it; ``exits_on_user_error`` wraps the
task function, so errors of the job itself exit before Hydra reports them. A ``UserError`` anywhere in the
chain, and the errors libraries raise for bad input (Hydra composition and overrides, OmegaConf
types and missing values, Lightning's invalid arguments, a missing file) become one line; anything
else is re-raised with its traceback. A user who sets ``HYDRA_FULL_ERROR=1`` gets tracebacks always.
Ctrl-C or SIGTERM outside a job (while Hydra composes, between a multirun's jobs) ends the command as inside
one (``headlab.study.interrupts``): status 130 or 143 and a ``note:``.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from headlab.cli.hydra_mode import compose_once
from headlab.cli.schema import RETIRED
from headlab.errors import UserError
from headlab.study.interrupts import stopping_on_signals

EXIT_USER_ERROR = 2
_USER_FULL_ERROR = "HEADLAB_USER_HYDRA_FULL_ERROR"  # the user's own setting, kept for DDP child processes
# train.py's experiment=NAME is only a name, but a name of ablate.py's presets (conf/experiment/) loads that preset
_PRESET_IN_TRAIN = re.compile(r"In 'experiment/([^']+)'.* not in 'TrainConfig'", re.S)
_RETIRED = re.compile(r"Could not override '(" + "|".join(RETIRED) + r")'")


def run_entry(main: Callable[[], Any]) -> None:
    """Call ``main`` (an ``@hydra.main`` function), its config composed once (``hydra_mode``); bad input exits with
    one ``error:`` line and status 2."""
    compose_once()
    os.environ.setdefault(_USER_FULL_ERROR, os.environ.get("HYDRA_FULL_ERROR", ""))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing; we decide what the user sees
    script = os.path.basename(sys.argv[0])
    try:
        with stopping_on_signals(say, lambda: f"{script}, outside its jobs", "run the same command again"):
            main()
    except Exception as error:
        exit_if_user_error(error)
        raise


def say(text: str) -> None:
    """A ``note:`` line on the terminal, at once; by the first process only, in a run of several (DDP), as
    Lightning's ``rank_zero_only`` reads the rank."""
    rank = next((os.environ[key] for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID") if key in os.environ), "0")
    if rank == "0":
        print(text, flush=True)


def exits_on_user_error(task: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Decorate the task function under ``@hydra.main``: a bad-input error exits before Hydra adds its own lines."""

    @functools.wraps(task)
    def run(cfg: Any) -> Any:
        try:
            return task(cfg)
        except Exception as error:
            if user_error_message(error) is not None:
                remove_unused_job_dir()
            exit_if_user_error(error)
            raise

    return run


def remove_unused_job_dir() -> None:
    """After bad input, the job's folder goes if it holds nothing but Hydra's record of the failed command
    (``.hydra/`` and the log), and so do the folders above it that this leaves empty (up to the working folder):
    a failed command leaves no empty folders behind. A folder with anything else in it stays as it is."""
    import shutil
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    try:
        folder = Path(HydraConfig.get().runtime.output_dir).absolute()
        if any(entry.name != ".hydra" and entry.suffix != ".log" for entry in folder.iterdir()):
            return
        shutil.rmtree(folder)
        top = Path.cwd().absolute()
        for parent in folder.parents:
            if parent == top or top not in parent.parents or any(parent.iterdir()):
                break
            parent.rmdir()
    except (OSError, ValueError):  # no Hydra job, a folder that cannot be read or removed: it stays
        return


def exit_if_user_error(error: Exception) -> None:
    """Print ``error: ...`` and exit with status 2 if ``error`` is bad input (and tracebacks are not asked for)."""
    message = user_error_message(error)
    if message is not None and os.environ.get(_USER_FULL_ERROR) != "1":
        print(f"error: {message}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)


def user_error_message(error: BaseException) -> str | None:
    """The one-line message for an error caused by bad input, or None for a bug."""
    chain = list(_chain(error))
    for exc in chain:
        if isinstance(exc, UserError):
            return _one_line(str(exc))
    retired = _RETIRED.search(str(error))
    if retired:
        return f"{retired[1]}: {RETIRED[retired[1]]}"
    preset = _PRESET_IN_TRAIN.search(str(error))
    if preset:
        return (f"experiment={preset[1]} is an ablate.py preset (conf/experiment/); train.py's experiment only "
                f"names the run: choose a name that is not a preset")
    if isinstance(error, MissingConfigException):
        options = f"; available: {', '.join(error.options)}" if error.options else ""
        return _one_line(str(error).split("\n\n")[0]) + options
    for exc in chain:
        if isinstance(exc, OmegaConfBaseException):
            return _omegaconf_message(exc, error)
    if isinstance(error, OverrideParseException):
        key, _, value = error.override.partition("=")
        if value.startswith("["):  # a quoted list would be one string: the items take the quotes
            quoting = f"list items with '=', ',', spaces or brackets need quotes inside the argument: " \
                      f"\"{key}=['item one','item=2']\""
        else:
            quoting = f"a value with '=', ',', spaces or brackets (a multirun job's directory) needs quotes inside " \
                      f"the argument: '{key}=\"{value}\"'"
        return f"cannot read the override {error.override!r}: {_one_line(error.message).split(' See ')[0]}; {quoting}"
    if isinstance(error, HydraException) or _is_lightning_misconfiguration(error):
        return _one_line(str(error))
    if isinstance(error, FileNotFoundError) and error.filename:  # without a name it is a bug (a file that went away)
        return f"file {error.filename!r} does not exist"
    for exc in chain:  # Hydra's log file or .hydra/ in a folder the user may not write (a logging ValueError's cause)
        if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and exc.filename:
            return f"cannot write {exc.filename!r} ({exc.strerror}): give a folder you can write to (hydra.run.dir=...)"
    return None


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _omegaconf_message(exc: OmegaConfBaseException, outer: BaseException) -> str:
    """``KEY: what is wrong`` from OmegaConf's message (its first line), with Hydra's hint if it gave one."""
    text = getattr(exc, "msg", None) or str(exc)
    what = text.strip().splitlines()[0]
    if "Missing mandatory value" in what:
        what = "a value is required here (give KEY=VALUE on the command line)"
    key = getattr(exc, "full_key", None)
    value = getattr(exc, "value", None)
    if "is not a ListConfig, list or tuple" in what and key and isinstance(value, str):  # key=a for key=[a]
        return f"{key}={value} is one value where a list is expected: write it in brackets, {key}=[{value}]"
    message = f"{key}: {what}" if key else what
    if outer is not exc and not isinstance(outer, OmegaConfBaseException):
        merging = re.match(r"Error merging override (\S+)", str(outer))  # Hydra's words, then OmegaConf's key again
        message = f"{merging[1]}: {what}" if merging else f"{_one_line(str(outer))}: {message}"
    return _one_line(message)


def _is_lightning_misconfiguration(error: BaseException) -> bool:
    module = sys.modules.get("lightning.fabric.utilities.exceptions")
    return module is not None and isinstance(error, module.MisconfigurationException)


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())
