"""Resume reads the newest checkpoint that is whole: a damaged one is named and skipped."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import tensorflow as tf

from app.errors import UserError
from app.training.phase_weights import restore_newest_whole


def _saved_epochs(folder: Path) -> tf.train.Checkpoint:
    """Checkpoints after epochs 1 and 2 (the manager keeps two), as the phase loop writes them."""
    epoch = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(epoch=epoch), str(folder), max_to_keep=2)
    for done in (1, 2):
        epoch.assign(done)
        manager.save()
    return tf.train.Checkpoint(epoch=tf.Variable(0, dtype=tf.int64))


def _flip_a_byte(checkpoint_path: str) -> Path:
    (data,) = Path(checkpoint_path).parent.glob(Path(checkpoint_path).name + ".data-*")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    return data


def test_the_newest_whole_checkpoint_is_restored(tmp_path: Path):
    fresh = _saved_epochs(tmp_path)
    assert restore_newest_whole(fresh, tmp_path).endswith("ckpt-2") and int(fresh.epoch) == 2
    assert restore_newest_whole(tf.train.Checkpoint(epoch=tf.Variable(0, dtype=tf.int64)), tmp_path / "none") is None


def test_a_damaged_newest_checkpoint_is_named_and_the_one_before_it_used(tmp_path: Path, caplog):
    fresh = _saved_epochs(tmp_path)
    newest = tf.train.latest_checkpoint(str(tmp_path))
    _flip_a_byte(newest)
    with caplog.at_level(logging.WARNING):
        restored = restore_newest_whole(fresh, tmp_path)
    assert restored.endswith("ckpt-1") and int(fresh.epoch) == 1
    assert f"checkpoint {newest} is damaged" in caplog.text


def test_when_no_checkpoint_reads_back_it_says_so_in_one_line(tmp_path: Path):
    fresh = _saved_epochs(tmp_path)
    for path in tf.train.get_checkpoint_state(str(tmp_path)).all_model_checkpoint_paths:
        _flip_a_byte(path)
    with pytest.raises(UserError, match=r"no checkpoint reads back whole \(2 damaged\); pass --overwrite"):
        restore_newest_whole(fresh, tmp_path)


def test_checkpoints_of_another_layout_are_not_called_damaged(tmp_path: Path, caplog):
    """A run resumed by a version that keeps more state (a variable its checkpoints lack) says so."""
    _saved_epochs(tmp_path)
    more = tf.train.Checkpoint(epoch=tf.Variable(0, dtype=tf.int64), own_best_epoch=tf.Variable(0, dtype=tf.int64))
    with caplog.at_level(logging.WARNING), pytest.raises(UserError) as err:
        restore_newest_whole(more, tmp_path)
    assert str(err.value) == (
        f"{tmp_path}: its checkpoints hold other state than this version of photoclf saves (written by another"
        " version?); pass --overwrite to start over"
    )
    assert "is damaged" not in caplog.text and "holds other state than this version saves" in caplog.text
