"""Per-example records as parquet files, written atomically (temp file + rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def write_records(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` (one dict per example and split) as a parquet table at ``path``; readers never see a part."""
    import pandas as pd  # pandas loads only where tables are written

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_records(path: str | Path):
    """The records table at ``path`` (a ``pandas.DataFrame``)."""
    import pandas as pd

    return pd.read_parquet(path)
