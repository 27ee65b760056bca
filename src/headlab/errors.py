"""The one error type for bad input.

``UserError`` means "the user asked for something that cannot be done": a bad config value, a
missing or malformed file, a hub model that cannot be reached. The entry scripts print it as one
line, ``error: ...``, and exit with status 2; every other exception is a bug and keeps its
traceback. It subclasses ``ValueError`` so Python callers can catch either.
"""

from pathlib import Path


class UserError(ValueError):
    """Bad input: the message names the bad value and what is allowed (one line)."""


def not_a_file(path: str | Path) -> str:
    """Why a path that should name a file does not: ``is a folder, not a file`` or ``does not exist``."""
    return "is a folder, not a file" if Path(path).is_dir() else "does not exist"


def one_of(key: str, value: object, allowed: tuple | list) -> None:
    """``UserError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        choices = ", ".join(map(str, dict.fromkeys(allowed)))  # a task's train split may also be named "train"
        raise UserError(f"{key}={value!r} is not allowed; choose one of: {choices}")


def at_least(key: str, value: object, lowest: float, allow_none: bool = False) -> None:
    """``UserError`` unless ``value >= lowest`` (or None, if ``allow_none``)."""
    if value is None and allow_none:
        return
    if value is None or value < lowest:
        nothing = " or null" if allow_none else ""
        raise UserError(f"{key}={value!r} is out of range; it must be >= {lowest}{nothing}")


def within(key: str, value: float, low: float, high: float, why: str = "") -> None:
    """``UserError`` unless ``low <= value <= high``; ``why``: the reason for the upper bound, said above it."""
    if not low <= value <= high:
        reason = f": {why}" if why and value > high else ""
        raise UserError(f"{key}={value!r} is out of range; it must be in [{low}, {high}]{reason}")


SEED_RANGE = (0, 2**32 - 1)  # what Lightning's seed_everything and numpy's generators take


def check_seed(key: str, value: object) -> None:
    """``UserError`` unless ``value`` is a seed numpy and Lightning take: an integer in 0 .. 2^32 - 1."""
    low, high = SEED_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"{key}={value!r} is not a seed: give an integer from {low} to {high}")
