"""Cached rows on disk: `DiskRows` reads and writes as a numpy array does, leaves no file behind,
and a run whose rows are more than memory may hold keeps caching them, with the same rows and the
same training as in memory."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from app.config import TrainConfig
from app.training.context import setup
from app.training.frozen import DiskRows, FrozenBackbone, decide
from app.training.frozen import rows as rows_module
from app.training.inputs import row_batches, shuffled_rows
from app.training.train import run_phase1


def _pair(tmp_path: Path, count: int = 50, shape=(3, 2)) -> tuple[np.ndarray, DiskRows]:
    values = np.random.default_rng(0).normal(size=(count, *shape)).astype(np.float32)
    on_disk = DiskRows.scratch(tmp_path, count, shape, np.float32)
    on_disk[:] = values
    return values, on_disk


def test_disk_rows_read_as_the_array_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    values, on_disk = _pair(tmp_path)
    monkeypatch.setattr(rows_module, "READ_LIMIT", 3 * 6 * 4)  # three rows a read: long runs are split
    for index in (slice(None), slice(5, 17), slice(40, 60), np.array([7, 3, 3, 49, 0, 8, 9, 10]),
                  values[:, 0, 0] > 0, np.array([], np.int64)):  # fmt: skip
        np.testing.assert_array_equal(on_disk[index], values[index])
    assert on_disk.shape == values.shape and on_disk.nbytes == values.nbytes and len(on_disk) == 50
    with pytest.raises(IndexError, match="of 50"):
        on_disk[np.array([3, 50])]


def test_disk_rows_write_as_the_array_does(tmp_path: Path):
    values, on_disk = _pair(tmp_path)
    more = np.arange(4 * 6, dtype=np.float32).reshape(4, 3, 2)
    at = np.array([30, 2, 31, 9])
    values[at], on_disk[at] = more, more
    mask = np.zeros(50, bool)
    mask[[0, 1, 44]] = True
    values[mask], on_disk[mask] = -1.0, -1.0
    np.testing.assert_array_equal(on_disk[:], values)


def test_disk_rows_leave_no_file_behind(tmp_path: Path):
    _, on_disk = _pair(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the file has no name: nothing to pick up or clean
    del on_disk


def test_shuffled_batches_read_from_disk_are_those_read_from_memory(tmp_path: Path):
    values, on_disk = _pair(tmp_path, count=40)
    labels = np.arange(40, dtype=np.int32)
    from_memory = shuffled_rows((values, labels), seed=3, batch_size=8)
    from_disk = shuffled_rows((on_disk, labels), seed=3, batch_size=8)
    assert from_disk.element_spec == from_memory.element_spec
    for (a, la), (b, lb) in zip(from_memory.take(10), from_disk.take(10)):  # two passes, reshuffled
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    ordered = np.concatenate([batch.numpy() for batch in row_batches(on_disk, 16)])
    np.testing.assert_array_equal(ordered, values)


@pytest.mark.slow  # whole phases on the tiny backbone: the fast tier's budget
def test_a_run_whose_rows_exceed_memory_still_caches_them_on_disk(
    tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """The rows are more than ROWS_IN_MEMORY: the run keeps phase 1 on cached features and phase 2
    on the views, with the rows in files beside the run, and trains the head as it does with them
    in memory."""
    cfg = tiny_config.replace(feature_views="auto", phase2_mode="views", feature_store="run")
    in_memory = setup(cfg.replace(out=cfg.out + "-memory"))
    memory_door = FrozenBackbone(in_memory)
    assert memory_door.decision.rows_on_disk is None
    run_phase1(in_memory, memory_door)

    monkeypatch.setattr(decide, "ROWS_IN_MEMORY", 1000)
    ctx = setup(cfg)
    with caplog.at_level(logging.INFO, logger="app.training.frozen"):
        door = FrozenBackbone(ctx)
    d = door.decision
    assert d.phase1_cached and d.keeps_views and d.rows_on_disk == ctx.run.root
    assert "they are kept on disk beside the run" in caplog.text
    run_phase1(ctx, door)

    features, expected = door.phase1_features(), memory_door.phase1_features()
    held = [features.train_features, features.val_features, door._train.activations, door._val.activations]
    assert all(isinstance(rows, DiskRows) for rows in held)  # none read back into memory whole
    np.testing.assert_array_equal(features.train_features[:], expected.train_features)
    np.testing.assert_array_equal(door._val.activations[:], memory_door._val.activations)
    np.testing.assert_array_equal(door._train.activations[:], memory_door._train.activations)
    for a, b in zip(ctx.clf.head_model.weights, in_memory.clf.head_model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not [p for p in Path(ctx.run.root).iterdir() if p.name.startswith(".rows-")]


def test_auto_trains_phase1_on_images_only_when_the_rows_would_not_fit_on_disk(
    tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(decide, "ROWS_IN_MEMORY", 1000)
    monkeypatch.setattr(decide.shutil, "disk_usage", lambda _: type("Usage", (), {"free": decide.DISK_SPARE + 2000}))
    door = FrozenBackbone(setup(tiny_config.replace(feature_views="auto")))
    assert not door.decision.phase1_cached and door.decision.rows_on_disk is None
    assert "GiB free beside the run; set a number of views to cache anyway" in door.decision.phase1_reason


@pytest.mark.slow  # whole phases on the tiny backbone: the fast tier's budget
def test_phase2s_val_activations_made_apart_from_phase1_go_to_disk_too(
    tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch
):
    """Phase 1 on images (or finished in an earlier process): phase 2 computes the val photos'
    activations itself, into a file where the run's rows are on disk, the same as in memory."""
    ctx = setup(tiny_config.replace(feature_views="0"))
    in_memory = FrozenBackbone(ctx)
    in_memory._gather_for_phase2()
    monkeypatch.setattr(decide, "ROWS_IN_MEMORY", 1000)
    door = FrozenBackbone(ctx)
    assert not door.decision.phase1_cached and door.decision.rows_on_disk == ctx.run.root
    door._gather_for_phase2()
    assert isinstance(door._val.activations, DiskRows) and len(door._val.labels) == ctx.info.num_examples("val")
    np.testing.assert_allclose(door._val.activations[:], in_memory._val.activations, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(door._val.labels, in_memory._val.labels)
