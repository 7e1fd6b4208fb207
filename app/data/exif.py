"""A JPEG's EXIF orientation, read and applied with TensorFlow ops only.

Phones store a portrait photo as landscape pixels and an EXIF tag saying how to turn them; every
viewer, and `photoclf convert` (PIL's `exif_transpose`), shows it upright. The evaluation decode
applies the same tag, so a model that trained on upright photos is served them upright too, in
the exported graph (TF Serving) as on the host. A photo without the tag, or with one that cannot
be read, is left as it is (orientation 1).
"""

from __future__ import annotations

import tensorflow as tf

SCAN_BYTES = 2 + 2 * (2 + 65_535) + 4096  # SOI, two whole segments before APP1 at most, then its IFD0
MAX_SEGMENTS = 3  # markers looked at for the EXIF block (it follows at most a JFIF and one other block)
MAX_ENTRIES = 64  # IFD0 entries searched for the orientation tag
ORIENTATION_TAG = 0x0112
_APP1 = 0xE1


def _bytes(data: tf.Tensor, offsets: tf.Tensor) -> tf.Tensor:
    """int32 bytes of uint8 `data` (never empty) at `offsets`; past either end a byte reads as 0."""
    inside = tf.logical_and(offsets >= 0, offsets < tf.size(data))
    return tf.where(inside, tf.gather(tf.cast(data, tf.int32), tf.clip_by_value(offsets, 0, tf.size(data) - 1)), 0)


def _uint(data: tf.Tensor, offset: tf.Tensor, length: int, little: tf.Tensor) -> tf.Tensor:
    """Unsigned integer of `length` bytes at `offset`, little- or big-endian by `little`."""
    raw = _bytes(data, offset + tf.range(length))
    order = tf.range(length)
    shifts = 8 * tf.where(little, order, length - 1 - order)
    return tf.reduce_sum(tf.bitwise.left_shift(raw, shifts))


def _exif_start(data: tf.Tensor) -> tf.Tensor:
    """Offset of the TIFF header inside the APP1 "Exif" segment, or -1. The segment comes first
    after the start-of-image marker, or after a JFIF (APP0) or other APPn block or two: the first
    MAX_SEGMENTS markers are looked at, unrolled, since a loop in the graph cost more than this."""
    pos, found = tf.constant(2), tf.constant(-1)
    for _ in range(MAX_SEGMENTS):
        marker, length = _bytes(data, pos + 1), _uint(data, pos + 2, 2, tf.constant(False))
        is_exif = tf.logical_and(
            tf.logical_and(tf.equal(_bytes(data, pos), 0xFF), tf.equal(marker, _APP1)),
            tf.reduce_all(tf.equal(_bytes(data, pos + 4 + tf.range(6)), list(b"Exif\0\0"))),
        )
        found = tf.where(tf.logical_and(found < 0, is_exif), pos + 10, found)
        pos = pos + 2 + length
    return found


def jpeg_orientation(encoded: tf.Tensor) -> tf.Tensor:
    """int32 1..8: the orientation tag of a JPEG's IFD0, 1 where there is none or it is unreadable."""
    data = tf.concat([tf.io.decode_raw(tf.strings.substr(encoded, 0, SCAN_BYTES), tf.uint8), [0]], 0)
    tiff = _exif_start(data)
    order = _bytes(data, tiff + tf.range(2))
    little = tf.reduce_all(tf.equal(order, list(b"II")))
    valid = tf.logical_and(tiff >= 0, tf.logical_or(little, tf.reduce_all(tf.equal(order, list(b"MM")))))
    ifd = tiff + _uint(data, tiff + 4, 4, little)
    count = tf.minimum(_uint(data, ifd, 2, little), MAX_ENTRIES)
    entries = ifd + 2 + 12 * tf.range(MAX_ENTRIES)
    first_byte, second_byte = _bytes(data, entries), _bytes(data, entries + 1)
    tags = tf.where(little, first_byte + 256 * second_byte, 256 * first_byte + second_byte)
    hits = tf.logical_and(tf.equal(tags, ORIENTATION_TAG), tf.range(MAX_ENTRIES) < count)
    first = tf.argmax(tf.cast(hits, tf.int32), output_type=tf.int32)
    value = _uint(data, entries[first] + 8, 2, little)
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
