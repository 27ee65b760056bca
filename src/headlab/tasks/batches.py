"""A tokenised split served as padded batches: one gather per column, no Python loop over rows.

``Collator`` pads a list of row dicts, which the DataLoader first reads one by one out of the Arrow table: at 128
rows a batch that costs ~10 ms of the main process, about what a BERT-base forward costs on a GPU, so the GPU
waits for its next batch. ``PaddedRows`` reads each column out of the Arrow table once (per-token columns as flat
values and row offsets, int32 where they fit) and makes a batch with numpy indexing: the same tensors, equal in
value and dtype, in a fraction of the time (``benchmarks/eval_speed.py collate``). It holds the split in memory
(a few tens of MB for SQuAD's development set), so it serves evaluation splits; training batches keep the collator.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from headlab.tasks.encoding import PAD_VALUES


class PaddedRows(torch.utils.data.Dataset):
    """A tokenised split (a HF ``Dataset``) whose ``__getitems__(rows)`` is ``Collator(pad_token_id,
    regression)([split[i] for i in rows])``. Use it with ``collate_fn=collated`` (the DataLoader hands each batch
    of rows to ``__getitems__``, then the result to ``collate_fn``)."""

    def __init__(self, features: Any, pad_token_id: int, regression: bool = False):
        table = features.flatten_indices().data.table if features._indices is not None else features.data.table
        self.size = table.num_rows
        self.pad_values = {"input_ids": pad_token_id, **PAD_VALUES}
        self.regression = regression
        self.tokens: dict[str, np.ndarray] = {}  # per-token column: its values, [tokens] or [tokens, 2]
        self.rows: dict[str, np.ndarray] = {}  # per-row column: [rows]
        self.offsets = np.zeros(1, dtype=np.int64)
        for name in table.column_names:
            column = table.column(name).combine_chunks()
            if name in self.pad_values:
                if name == "input_ids":
                    offsets = column.offsets.to_numpy().astype(np.int64)  # [rows + 1]
                    self.offsets = offsets - offsets[0]
                values = column.flatten()
                if pa.types.is_list(values.type):  # context_offsets: a pair per token
                    values = values.flatten().to_numpy().reshape(-1, 2)
                else:
                    values = values.to_numpy()
                self.tokens[name] = _compact(values)
            else:
                self.rows[name] = column.to_numpy(zero_copy_only=False)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, row: int) -> dict[str, torch.Tensor]:
        """A batch of one row (``[1, seq]`` columns), as ``__getitems__([row])``."""
        return self.__getitems__([row])

    def __getitems__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """The padded batch of ``rows``: per-token columns ``[batch, seq]`` (``context_offsets`` ``[batch, seq, 2]``),
        per-row columns ``[batch]``; seq is the longest row's length."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, lengths = self.offsets[rows], self.offsets[rows + 1] - self.offsets[rows]
        positions = np.arange(lengths.max() if len(rows) else 0)
        valid = positions[None, :] < lengths[:, None]  # [batch, seq]
        index = np.where(valid, starts[:, None] + positions[None, :], 0)  # [batch, seq]: flat positions
        batch = {}
        for name, values in self.tokens.items():
            taken = values[index] if len(values) else np.zeros((*index.shape, *values.shape[1:]), values.dtype)
            pad = valid if taken.ndim == 2 else valid[..., None]
            batch[name] = torch.from_numpy(np.where(pad, taken, self.pad_values[name]).astype(np.int64))
        for name, values in self.rows.items():
            batch[name] = torch.from_numpy(_as_torch_dtype(values[rows], name == "labels", self.regression))
        return batch


def column_values(data: Any, name: str) -> list:
    """A HF ``Dataset``'s column as a list, read from Arrow at once (``data[name]`` is read row by row)."""
    return data.with_format("arrow")[name].to_pylist()


def collated(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The DataLoader's ``collate_fn`` for ``PaddedRows``: its batches come collated."""
    return batch


def _compact(values: np.ndarray) -> np.ndarray:
    """Token values as int32 when they fit (half the memory of Arrow's int64; batches are int64 again)."""
    info = np.iinfo(np.int32)
    if values.size and (values.min() < info.min or values.max() > info.max):
        return values
    return values.astype(np.int32)


def _as_torch_dtype(values: np.ndarray, labels: bool, regression: bool) -> np.ndarray:
    """What ``torch.tensor`` makes of the column's Python values: int64, float32, bool; labels float32 for
    regression, else int64."""
    if labels:
        return values.astype(np.float32 if regression else np.int64)
    if values.dtype == np.bool_:
        return values
    if np.issubdtype(values.dtype, np.floating):
        return values.astype(np.float32)
    return values.astype(np.int64)
