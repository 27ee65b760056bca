"""``ablate.py mode=gates``: the run of ``gates.method`` (docs/gates.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.analysis.gates import chg_run, l0_run, optimal_run

METHOD_RUNS = {"l0": l0_run.run, "chg": chg_run.run, "optimal": optimal_run.run}


def run(cfg: Any, output_dir: str | Path) -> dict[str, Any]:
    """The job of ``cfg.gates.method``; ``cfg`` passed ``check_mode``."""
    return METHOD_RUNS[cfg.gates.method](cfg, output_dir)
