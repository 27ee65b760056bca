"""The torch each optional feature needs, checked before anything loads (a ``UserError``: one ``error:`` line)."""

from __future__ import annotations

import re
from functools import cache
from importlib.metadata import version

from headlab.errors import UserError

# option -> (oldest torch, what to run with instead)
MIN_TORCH = {
    "compile=true": ((2, 4), "compile=false"),  # SDPA with boolean masks under torch.compile, Module.compile
}


def require_torch(option: str, torch_version: str | None = None) -> None:
    """``UserError`` when the installed torch (or ``torch_version``) is older than ``option`` needs."""
    torch_version = torch_version or _installed_torch()
    minimum, instead = MIN_TORCH[option]
    major, minor = (int(part) for part in re.match(r"(\d+)\.(\d+)", torch_version).groups())
    if (major, minor) < minimum:
        raise UserError(f"{option} needs torch >= {'.'.join(map(str, minimum))}; this is torch {torch_version}: "
                        f"upgrade torch, or run with {instead}")


@cache
def _installed_torch() -> str:
    return version("torch")  # reads the package metadata: once per process
