"""Per-example records as parquet files, written atomically (temp file + rename)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from headlab.files import temporary_beside


def write_records(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` (one dict per example and split) as a parquet table at ``path``; readers never see a part."""
    import pandas as pd  # pandas loads only where tables are written

    path = Path(path)
    fd, tmp = temporary_beside(path)
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
