"""The store benchmark grows one space batch by batch and reads back what it stored."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.store import grow


def test_each_batch_is_one_add_and_the_space_holds_every_row(tmp_path: Path):
    result = grow(tmp_path, rows=50, batch=20, shape=(3, 2), lookups=10)
    assert len(result["adds_s"]) == 3  # 20 + 20 + 10 rows
    assert result["last_add_s"] == result["adds_s"][-1] and result["lookup_s"] > 0
    rows_bytes = 50 * 3 * 2 * np.dtype(np.float32).itemsize
    assert rows_bytes < result["disk_bytes"] < rows_bytes + 20_000  # the rows, keys and headers
