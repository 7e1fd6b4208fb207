"""Whether a dataset's shards are whole: every record's CRC read once per process, before a run
trusts them."""

from __future__ import annotations

import tensorflow as tf

from app.errors import UserError

_VERIFIED: set[tuple[str, int, int]] = set()  # (path, bytes, mtime) of shards whose CRCs were read whole


def verify_shards(paths: list[str]) -> None:
    """Read every record's CRC (no decoding) and raise UserError naming the first bad shard: a
    flipped byte in storage would otherwise lose the rest of its shard without a word. Each
    shard is read once per process while its size and time stay the same (phase 1, phase 2 and
    evaluation share the check)."""
    for path in paths:
        stat = tf.io.gfile.stat(path)
        key = (str(path), stat.length, stat.mtime_nsec)
        if key in _VERIFIED:
            continue
        try:
            for _ in tf.data.TFRecordDataset(path, buffer_size=8 * 2**20).batch(4096):
                pass
        except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as err:
            raise UserError(
                f"{path}: corrupt shard ({err.message.strip()}); write the dataset again with photoclf convert"
            ) from None
        _VERIFIED.add(key)
