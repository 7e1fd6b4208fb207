"""A JPEG's EXIF orientation, read and applied with TensorFlow ops only.

Phones store a portrait photo as landscape pixels and an EXIF tag saying how to turn them; every
viewer, and `photoclf convert` (PIL's `exif_transpose`), shows it upright. The evaluation decode
applies the same tag, so a model that trained on upright photos is served them upright too, in
the exported graph (TF Serving) as on the host. A photo without the tag, or with one that cannot
be read, is left as it is (orientation 1).
"""

from __future__ import annotations

import tensorflow as tf

MAX_SEGMENTS = 3  # markers looked at for the EXIF block (it follows at most a JFIF and one other block)
MAX_ENTRIES = 64  # IFD0 entries searched for the orientation tag
ORIENTATION_TAG = 0x0112
_APP1 = 0xE1


def _read(encoded: tf.Tensor, pos: tf.Tensor, count: int) -> tf.Tensor:
    """int32 [count]: the bytes of `encoded` from `pos`, zeros past its end. Small reads at the
    offsets the header gives: copying the whole first segments cost as much as the parse."""
    pos = tf.clip_by_value(pos, 0, tf.strings.length(encoded))
    raw = tf.cast(tf.io.decode_raw(tf.strings.substr(encoded, pos, count), tf.uint8), tf.int32)
    return tf.pad(raw, [[0, count - tf.size(raw)]])


def _uint(raw: tf.Tensor, little: tf.Tensor) -> tf.Tensor:
    """Unsigned integer of the bytes `raw` [N], little- or big-endian by `little`."""
    order = tf.range(tf.size(raw))
    shifts = 8 * tf.where(little, order, tf.size(raw) - 1 - order)
    return tf.reduce_sum(tf.bitwise.left_shift(raw, shifts))


def _exif_start(encoded: tf.Tensor) -> tf.Tensor:
    """Offset of the TIFF header inside the APP1 "Exif" segment, or -1. The segment comes first
    after the start-of-image marker, or after a JFIF (APP0) or other APPn block or two: the first
    MAX_SEGMENTS markers are looked at, unrolled, since a loop in the graph cost more than this."""
    pos, found = tf.constant(2), tf.constant(-1)
    little = tf.constant(False)  # a JPEG's own segment lengths are big-endian
    for _ in range(MAX_SEGMENTS):
        head = _read(encoded, pos, 10)  # FF, marker, length (2), then "Exif\0\0" in an EXIF block
        is_exif = tf.logical_and(
            tf.reduce_all(tf.equal(head[:2], [0xFF, _APP1])), tf.reduce_all(tf.equal(head[4:], list(b"Exif\0\0")))
        )
        found = tf.where(tf.logical_and(found < 0, is_exif), pos + 10, found)
        pos = pos + 2 + _uint(head[2:4], little)
    return found


def jpeg_orientation(encoded: tf.Tensor) -> tf.Tensor:
    """int32 1..8: the orientation tag of a JPEG's IFD0, 1 where there is none or it is unreadable."""
    tiff = _exif_start(encoded)
    header = _read(encoded, tiff, 8)  # byte order, 42, IFD0's offset
    little = tf.reduce_all(tf.equal(header[:2], list(b"II")))
    valid = tf.logical_and(tiff >= 0, tf.logical_or(little, tf.reduce_all(tf.equal(header[:2], list(b"MM")))))
    ifd = _read(encoded, tiff + _uint(header[4:], little), 2 + 12 * MAX_ENTRIES)
    entries = tf.reshape(ifd[2:], [MAX_ENTRIES, 12])
    tags = tf.where(little, entries[:, 0] + 256 * entries[:, 1], 256 * entries[:, 0] + entries[:, 1])
    hits = tf.logical_and(tf.equal(tags, ORIENTATION_TAG), tf.range(MAX_ENTRIES) < _uint(ifd[:2], little))
    value = _uint(entries[tf.argmax(tf.cast(hits, tf.int32), output_type=tf.int32)][8:10], little)
    ok = tf.logical_and(tf.logical_and(valid, tf.reduce_any(hits)), tf.logical_and(value >= 1, value <= 8))
    return tf.where(ok, value, 1)


def upright(image: tf.Tensor, orientation: tf.Tensor) -> tf.Tensor:
    """[H, W, C] as a viewer shows it under EXIF `orientation` (PIL's `exif_transpose`)."""
    turns = [
        lambda: image,  # 1
        lambda: tf.image.flip_left_right(image),  # 2: mirrored
        lambda: tf.image.rot90(image, 2),  # 3: upside down
        lambda: tf.image.flip_up_down(image),  # 4
        lambda: tf.transpose(image, [1, 0, 2]),  # 5: transposed
        lambda: tf.image.rot90(image, 3),  # 6: turned a quarter clockwise to show
        lambda: tf.image.rot90(tf.transpose(image, [1, 0, 2]), 2),  # 7: transversed
        lambda: tf.image.rot90(image, 1),  # 8: turned a quarter anticlockwise to show
    ]
    return tf.switch_case(orientation - 1, turns)
