"""Rows held in memory (cached features, activations at the cut) reach a phase batch by batch,
read from their arrays: the same batches as a dataset of the rows themselves, without its copies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from app.training.inputs import row_batches, shuffled_rows


def _rows(count: int):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(count, 5)).astype(np.float32)
    side = rng.normal(size=(count, 2)).astype(np.float32)
    return {"features": features, "side": side}, np.arange(count, dtype=np.int32)


def _taken(dataset: tf.data.Dataset, batches: int) -> list:
    return [tf.nest.map_structure(lambda t: t.numpy(), b) for b in dataset.take(batches)]


@pytest.mark.parametrize("seed", [0, 7])
def test_shuffled_rows_are_the_batches_shuffling_the_rows_themselves_gives(seed: int):
    """Over three passes (each reshuffled), batch for batch and row for row, and with the same
    element spec, as `from_tensor_slices(rows).shuffle(count, seed)`: a run's batches do not
    change with it."""
    rows, count, size = _rows(50), 50, 8
    shuffled = shuffled_rows(rows, seed, size)
    before = tf.data.Dataset.from_tensor_slices(rows).shuffle(count, seed=seed).repeat()
    before = before.batch(size, drop_remainder=True)
    assert shuffled.element_spec == before.element_spec  # full batches' size known, as the train step was traced with
    ours, theirs = _taken(shuffled, 3 * count // size), _taken(before, 3 * count // size)
    assert len(ours) == len(theirs) == 18
    for (x, y), (x2, y2) in zip(ours, theirs):
        np.testing.assert_array_equal(y, y2)
        for key in ("features", "side"):
            np.testing.assert_array_equal(x[key], x2[key])
    first_pass = np.concatenate([y for _, y in ours[:6]])
    assert len(set(first_pass)) == 48 and sorted(first_pass) != list(first_pass)  # 6 full batches, shuffled


def test_row_batches_are_every_row_in_order_the_last_batch_short():
    rows = _rows(10)
    found = _taken(row_batches(rows, 4), 10)
    assert [len(y) for _, y in found] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([y for _, y in found]), np.arange(10))
    np.testing.assert_array_equal(np.concatenate([x["features"] for x, _ in found]), rows[0]["features"])
    assert found[0][0]["side"].shape == (4, 2) and found[0][0]["side"].dtype == np.float32


def test_a_row_dataset_keeps_its_shapes_known_to_the_model():
    """Keras builds the head from the element spec: the row shape must not be lost."""
    (x, y) = row_batches((np.zeros((6, 1280), np.float32), np.zeros(6, np.int32)), 4).element_spec
    assert x.shape.as_list() == [None, 1280] and y.shape.as_list() == [None] and y.dtype == tf.int32


@pytest.mark.slow  # a subprocess: the fast tier stays under 3 minutes
def test_reading_rows_leaves_no_autograph_source_for_a_killed_run_to_leave_behind(tmp_path):
    """tf.data would convert the row reader with AutoGraph, which writes its rewrite to the temp
    folder and removes it only at a clean exit: a killed run left it there. A fresh process (the
    conversion is cached per process), ended as a killed one would be, without clean-up."""
    code = (
        "import os, numpy as np; from app.training.inputs import row_batches, shuffled_rows\n"
        "rows = {'x': np.zeros((6, 2), np.float32)}\n"
        "assert len(list(row_batches(rows, 4))) == 2 and len(list(shuffled_rows(rows, 0, 4).take(3))) == 3\n"
        "os._exit(0)"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=Path(__file__).parents[2], timeout=120)
    assert not list(tmp_path.glob("__autograph_generated_file*"))
