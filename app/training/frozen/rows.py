"""What the frozen backbone hands a phase, row for row: phase 1's pooled features of each view,
and the activations at phase 2's cut. They are held in memory, or past a size (decide.py) in
files on disk (`DiskRows`), read a batch at a time: then what can be cached is bounded by the
disk, not by memory."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

READ_LIMIT = 2**30  # bytes of one read or write: os.pread and os.pwrite move at most about 2 GiB
COPY_BYTES = 64 * 2**20  # bytes of rows a copy holds at once


class DiskRows:
    """Rows of one shape and dtype in a file, indexed as an array is and read or written with
    pread and pwrite: a run's scratch file with no name (the system removes it when it is closed
    or the process ends: nothing is left behind), or a store shard's `.npy` file, read-only. The
    rows then live in the page cache, which the system shrinks as it needs to, instead of in this
    process's memory (a memory map would count each page read in its resident size)."""

    def __init__(self, file, shape: tuple[int, ...], dtype: np.dtype, offset: int = 0) -> None:
        """Rows of `shape` and `dtype` from byte `offset` of the open `file`: see `scratch` and `npy`."""
        self._file, self.shape, self.dtype, self._offset = file, tuple(shape), np.dtype(dtype), offset
        self._row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    @classmethod
    def scratch(cls, directory: Path, count: int, row_shape: tuple[int, ...], dtype: np.dtype) -> DiskRows:
        """Room for `count` rows in a new file with no name in `directory`."""
        file = tempfile.TemporaryFile(dir=directory, prefix=".rows-")  # noqa: SIM115 (open while the rows live)
        rows = cls(file, (count, *row_shape), dtype)
        file.truncate(rows.nbytes)
        return rows

    @classmethod
    def npy(cls, path: Path) -> DiskRows:
        """The rows of a `.npy` file, read-only; ValueError where the file is not whole."""
        file = open(path, "rb")  # noqa: SIM115 (open while the rows live)
        try:
            version = np.lib.format.read_magic(file)
            readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in readers:
                raise ValueError(f"npy format {version}")
            shape, fortran_order, dtype = readers[version](file)
            rows = cls(file, shape if shape else (0,), dtype, file.tell())
            if fortran_order or len(shape) < 1 or os.fstat(file.fileno()).st_size != rows._offset + rows.nbytes:
                raise ValueError(f"{path}: not {shape} rows of {dtype} in C order")
        except BaseException:
            file.close()
            raise
        return rows

    ndim = property(lambda self: len(self.shape))
    nbytes = property(lambda self: self.shape[0] * self._row_bytes)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> np.ndarray:
        """The rows at `index` (a slice, an integer array or a boolean mask), in its order."""
        positions = self._positions(index)
        out = np.empty((len(positions), *self.shape[1:]), self.dtype)
        for at, first, count in _runs(positions, self._rows_per_call()):
            data = os.pread(self._file.fileno(), count * self._row_bytes, self._offset + first * self._row_bytes)
            if len(data) != count * self._row_bytes:
                raise OSError(f"{self._file.name}: read {len(data)} bytes of rows, expected {count * self._row_bytes}")
            out[at] = np.frombuffer(data, self.dtype).reshape(count, *self.shape[1:])
        return out

    def __setitem__(self, index, values) -> None:
        positions = self._positions(index)
        values = np.broadcast_to(np.asarray(values, self.dtype), (len(positions), *self.shape[1:]))
        for at, first, _ in _runs(positions, self._rows_per_call()):
            data = np.ascontiguousarray(values[at]).data.cast("B")
            written = 0
            while written < len(data):
                written += os.pwrite(
                    self._file.fileno(), data[written:], self._offset + first * self._row_bytes + written
                )

    def _positions(self, index) -> np.ndarray:
        if isinstance(index, slice):
            return np.arange(*index.indices(len(self)))
        positions = np.asarray(index)
        if positions.dtype == bool:
            return np.flatnonzero(positions)
        if positions.ndim != 1 or (len(positions) and not 0 <= positions.min() <= positions.max() < len(self)):
            raise IndexError(f"rows {index!r} of {len(self)}: expected a slice, a mask or row numbers in range")
        return positions.astype(np.int64)

    def _rows_per_call(self) -> int:
        return max(1, READ_LIMIT // max(1, self._row_bytes))


def _runs(positions: np.ndarray, longest: int):
    """(where in `positions`, first row, count) of each run of consecutive rows among them, in
    row order and at most `longest` rows: one read or write for each."""
    order = np.argsort(positions, kind="stable")
    rows = positions[order]
    starts = np.flatnonzero(np.diff(rows, prepend=-2) != 1)
    for start, stop in zip(starts, [*starts[1:], len(rows)]):
        for first in range(start, stop, longest):
            last = min(stop, first + longest)
            yield order[first:last], int(rows[first]), last - first


class RowsAt:
    """The rows of `rows` (in memory or on disk) that `where` marks, read only as they are
    indexed: a batch at a time, not all at once."""

    def __init__(self, rows: np.ndarray | DiskRows, where: np.ndarray) -> None:
        self.rows, self.positions = rows, np.flatnonzero(where) if where.dtype == bool else where
        self.shape, self.dtype = (len(self.positions), *rows.shape[1:]), rows.dtype

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, index) -> np.ndarray:
        return self.rows[self.positions[index]]


def new_rows(count: int, row_shape: tuple[int, ...], dtype: np.dtype, on_disk: Path | None) -> np.ndarray | DiskRows:
    """Room for `count` rows: in memory, or with `on_disk` a directory, in a file there."""
    if on_disk is None:
        return np.empty((count, *row_shape), dtype)
    return DiskRows.scratch(on_disk, count, tuple(row_shape), dtype)


def copy_rows(target, target_at: np.ndarray, source, source_at: np.ndarray) -> None:
    """target[target_at] = source[source_at], COPY_BYTES of rows at a time: either side may be
    on disk, and all of them at once would be in memory."""
    chunk = max(1, COPY_BYTES // max(1, int(np.prod(target.shape[1:], dtype=np.int64)) * target.dtype.itemsize))
    for start in range(0, len(target_at), chunk):
        target[target_at[start : start + chunk]] = source[source_at[start : start + chunk]]


class RowSink:
    """Rows put in place batch by batch as a pass makes them, in memory or (with `on_disk`) in a
    file there: never the batches and a concatenation of them at once. Room for `count` rows is
    made at the first batch, from its shape and dtype."""

    def __init__(self, count: int, on_disk: Path | None = None) -> None:
        self.count, self.on_disk, self.filled = count, on_disk, 0
        self.rows: np.ndarray | DiskRows | None = None

    def add(self, batch: np.ndarray) -> None:
        if self.rows is None:
            self.rows = new_rows(self.count, batch.shape[1:], batch.dtype, self.on_disk)
        self.rows[self.filled : self.filled + len(batch)] = batch
        self.filled += len(batch)

    def done(self, empty: np.ndarray | None = None) -> np.ndarray | DiskRows | None:
        """The rows filled (fewer than `count` where a pass skipped some); `empty` when no batch came."""
        if self.rows is None:
            return empty
        if len(self.rows) == self.filled:
            return self.rows
        if isinstance(self.rows, np.ndarray):
            return self.rows[: self.filled]
        kept = new_rows(self.filled, self.rows.shape[1:], self.rows.dtype, self.on_disk)
        positions = np.arange(self.filled)
        copy_rows(kept, positions, self.rows, positions)
        return kept


class PartSink:
    """A part's computed rows (gather.py): its photos' keys, pooled features and, where it keeps
    them, the activations at the cut, each put in place batch by batch (at phase 2's cut the rows
    are most of a run's memory)."""

    def __init__(self, count: int, keeps_activations: bool, on_disk: Path | None = None) -> None:
        self.keys = RowSink(count)
        self.features = RowSink(count, on_disk)
        self.activations = RowSink(count, on_disk) if keeps_activations else None

    def add(self, keys: np.ndarray, outputs: dict[str, np.ndarray]) -> None:
        self.keys.add(keys.astype(np.int64))
        self.features.add(outputs["features"])
        if self.activations is not None:
            self.activations.add(outputs["activations"])

    def rows(self) -> dict[str, np.ndarray | DiskRows | None]:
        keys = self.keys.done(empty=np.zeros([0], np.int64))  # the keyed stream skips what the table skips: never fewer
        return {"keys": keys, "features": self.features.done(),
                "activations": None if self.activations is None else self.activations.done()}  # fmt: skip


@dataclass(frozen=True)
class ActivationRows:
    """Activations at phase 2's cut (in memory or `DiskRows`), with their side features (if any)
    and labels, row for row; `keys`: each row's photo content key, where the rows came from the
    gather."""

    activations: np.ndarray | DiskRows
    side: np.ndarray | None
    labels: np.ndarray
    keys: np.ndarray | None = None

    def arrays(self) -> tuple:
        """(inputs, labels) as a phase reads them, row for row."""
        features = {"activations": self.activations, "side": self.side} if self.side is not None else self.activations
        return features, self.labels


@dataclass(frozen=True)
class Phase1Features:
    """Phase 1's input: the pooled backbone features of K views of every training photo, and of
    each val photo once (in memory or `DiskRows`)."""

    train_features: np.ndarray | DiskRows  # [K * N, D] float32: K views of each training image
    train_labels: np.ndarray  # [K * N] int32
    val_features: np.ndarray | DiskRows  # [M, D] float32
    val_labels: np.ndarray  # [M] int32
    train_side: np.ndarray | None = None  # [K * N, F] the side features of each row, when the dataset has them
    val_side: np.ndarray | None = None  # [M, F]

    def arrays(self, split: str) -> tuple:
        """(inputs, labels) of "train" or "val" as phase 1 reads them, row for row."""
        x, y, side = (self.train_features, self.train_labels, self.train_side) if split == "train" else (
            self.val_features, self.val_labels, self.val_side)  # fmt: skip
        return ({"features": x, "side": side} if side is not None else x), y
