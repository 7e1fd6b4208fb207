"""Image size from the header, before any pixel is decoded: the image-bomb guard.

A 2 MB JPEG can decode to 144 megapixels (430 MB of RGB). `header_size` reads height, width and
the pixel count the decoder would allocate from the first bytes of a JPEG, PNG, GIF or BMP, with
TensorFlow ops only, so the same check runs inside the exported serving graph (TF Serving gets
the protection) and on the host (the local server, batch prediction, evaluation).

For a GIF the pixel count is the larger of the logical screen and the sum of every frame's
area: the decoder reads all frames, so an animation of many frames is as heavy as one big image.
Headers are read as the decoders read them (BMP's height may be negative; JPEG through
`tf.image.extract_jpeg_shape`, libjpeg's own header parser), so a header cannot claim one size
and decode to another.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

DEFAULT_MAX_MEGAPIXELS = 40.0
GIF_MAX_BLOCKS = 20_000  # sub-blocks walked (~20 µs each) before a GIF is refused as too costly to check

_PNG = b"\x89PNG\r\n\x1a\n"
_GIF87, _GIF89 = b"GIF87a", b"GIF89a"


class ImageRejected(ValueError):
    """An image refused before decoding; `status` is the HTTP answer (400 unreadable, 413 too big)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class HeaderSize:
    height: int
    width: int
    pixels: int  # what decoding allocates (for a GIF, every frame counts)

    @property
    def megapixels(self) -> float:
        return self.pixels / 1e6


def _uint(data: tf.Tensor, offset, length: int, big_endian: bool) -> tf.Tensor:
    """Unsigned integer from `length` bytes of uint8 `data` at `offset` (the caller checked bounds)."""
    raw = tf.cast(data[offset : offset + length], tf.int64)
    order = tf.range(length, dtype=tf.int64)
    shifts = 8 * (length - 1 - order) if big_endian else 8 * order
    return tf.reduce_sum(tf.bitwise.left_shift(raw, shifts))


def _need(data: tf.Tensor, length: int, what: str) -> tf.Operation:
    return tf.debugging.assert_greater_equal(
        tf.size(data, out_type=tf.int64), tf.constant(length, tf.int64), message=f"truncated {what} header"
    )


def _area(height: tf.Tensor, width: tf.Tensor) -> tf.Tensor:
    """height × width of int64 sizes, negative sides as 0, saturating at the int64 maximum: a
    header's two 32-bit sides can overflow the product into a negative number, which would pass
    any pixel limit (found by python -m fuzz image_header)."""
    height, width = tf.maximum(height, 0), tf.maximum(width, 0)
    huge = tf.logical_or(height >= 2**31, width >= 2**31)
    return tf.where(huge, tf.constant(tf.int64.max, tf.int64), height * tf.minimum(width, 2**31 - 1))


def _png(data: tf.Tensor) -> tf.Tensor:
    with tf.control_dependencies([_need(data, 24, "PNG")]):
        chunk = tf.strings.reduce_join(tf.strings.as_string(data[12:16]), separator=",")
        is_ihdr = tf.debugging.Assert(tf.equal(chunk, "73,72,68,82"), ["PNG without an IHDR chunk first"])
        with tf.control_dependencies([is_ihdr]):
            width, height = _uint(data, 16, 4, True), _uint(data, 20, 4, True)
    return tf.stack([height, width, _area(height, width)])


def _bmp(data: tf.Tensor) -> tf.Tensor:
    """As TensorFlow's BMP decoder reads it: int32 width and height at 18 and 22 (height < 0: top-down)."""
    with tf.control_dependencies([_need(data, 26, "BMP")]):
        width = tf.bitcast(tf.cast(_uint(data, 18, 4, False), tf.uint32), tf.int32)
        height = tf.bitcast(tf.cast(_uint(data, 22, 4, False), tf.uint32), tf.int32)
    width, height = tf.cast(width, tf.int64), tf.abs(tf.cast(height, tf.int64))  # int32's abs(-2**31) < 0
    return tf.stack([height, width, _area(height, width)])


def _jpeg(encoded: tf.Tensor) -> tf.Tensor:
    shape = tf.cast(tf.image.extract_jpeg_shape(encoded), tf.int64)
    return tf.stack([shape[0], shape[1], shape[0] * shape[1]])


def _gif_frames_area(data: tf.Tensor, start: tf.Tensor) -> tf.Tensor:
    """Sum of width × height over the frames, walking the block structure from `start`.

    A state machine: at a record (0x21 extension, 0x2C image, 0x3B end) or inside a chain of
    sub-blocks (length byte, data, ..., 0). Bounded by GIF_MAX_BLOCKS steps.
    """
    size = tf.size(data, out_type=tf.int64)
    padded = tf.concat([data, tf.zeros([16], tf.uint8)], 0)  # reads just past the end see zeros

    def step(pos, in_blocks, area, done, steps):
        byte = tf.cast(padded[pos], tf.int64)
        packed = tf.cast(padded[pos + 9], tf.int64)
        local_table = tf.where(packed >= 128, 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), packed % 8), 0)
        frame = _uint(padded, pos + 5, 2, False) * _uint(padded, pos + 7, 2, False)
        is_image, known = byte == 0x2C, tf.logical_or(byte == 0x2C, byte == 0x21)
        if_blocks = (tf.where(byte == 0, pos + 1, pos + byte + 1), byte != 0, area, done)
        if_record = (
            tf.where(is_image, pos + 10 + local_table + 1, pos + 2),
            known,
            tf.where(is_image, area + frame, area),
            tf.logical_not(known),
        )
        chosen = [tf.where(in_blocks, a, b) for a, b in zip(if_blocks, if_record)]
        return (*chosen, steps + 1)

    def more(pos, in_blocks, area, done, steps):
        return tf.logical_and(tf.logical_not(done), pos < size)

    _, _, area, done, steps = tf.while_loop(
        more,
        step,
        (start, tf.constant(False), tf.constant(0, tf.int64), tf.constant(False), tf.constant(0, tf.int64)),
        maximum_iterations=GIF_MAX_BLOCKS,
    )
    finished = tf.logical_or(done, steps < GIF_MAX_BLOCKS)
    check = tf.debugging.Assert(finished, [f"GIF with more than {GIF_MAX_BLOCKS} blocks; refused"])
    with tf.control_dependencies([check]):
        return tf.identity(area)


def _gif(data: tf.Tensor) -> tf.Tensor:
    with tf.control_dependencies([_need(data, 13, "GIF")]):
        width, height = _uint(data, 6, 2, False), _uint(data, 8, 2, False)
        packed = tf.cast(data[10], tf.int64)
    global_table = tf.where(packed >= 128, 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), packed % 8), 0)
    frames = _gif_frames_area(data, 13 + global_table)
    return tf.stack([height, width, tf.maximum(height * width, frames)])


def header_size(encoded: tf.Tensor) -> tf.Tensor:
    """Scalar string of image bytes → int64 [height, width, pixels]; InvalidArgumentError when the
    bytes are not a JPEG, PNG, GIF or BMP or the header is cut short."""
    data = tf.io.decode_raw(encoded, tf.uint8)
    head = tf.strings.substr(encoded, 0, 8)
    is_jpeg = tf.strings.substr(head, 0, 3) == b"\xff\xd8\xff"
    is_png = head == _PNG
    is_gif = tf.logical_or(tf.strings.substr(head, 0, 6) == _GIF87, tf.strings.substr(head, 0, 6) == _GIF89)
    is_bmp = tf.strings.substr(head, 0, 2) == b"BM"

    def unknown() -> tf.Tensor:
        check = tf.debugging.Assert(False, ["not a JPEG, PNG, GIF or BMP image"])
        with tf.control_dependencies([check]):
            return tf.zeros([3], tf.int64)

    return tf.case(
        [
            (is_jpeg, lambda: _jpeg(encoded)),
            (is_png, lambda: _png(data)),
            (is_gif, lambda: _gif(data)),
            (is_bmp, lambda: _bmp(data)),
        ],
        default=unknown,
        exclusive=True,
    )


def max_pixels(max_megapixels: float) -> int:
    return int(max_megapixels * 1e6)


def assert_within(size: tf.Tensor, max_megapixels: float) -> tf.Operation:
    """In-graph refusal: the error names the limit and carries [height, width, pixels]."""
    return tf.debugging.Assert(
        size[2] <= max_pixels(max_megapixels),
        [f"image too large: over the {max_megapixels:g} megapixel limit; [height width pixels] =", size],
    )


@tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
def _header_size_fn(encoded: tf.Tensor) -> tf.Tensor:
    return header_size(encoded)


def read_header(data: bytes) -> HeaderSize:
    """Host-side: the header's size, or ImageRejected(400) saying why it cannot be read."""
    try:
        height, width, pixels = (int(v) for v in _header_size_fn(tf.constant(data)).numpy())
    except tf.errors.InvalidArgumentError as err:
        raise ImageRejected(f"cannot read the image header: {_reason(err)}") from None
    return HeaderSize(height, width, pixels)


def check_size(data: bytes, max_megapixels: float) -> HeaderSize:
    """Host-side guard: the header's size, or ImageRejected (413) naming the size and the limit."""
    size = read_header(data)
    if size.pixels > max_pixels(max_megapixels):
        frames = (
            f", {size.megapixels:.1f} megapixels with every frame"
            if size.pixels not in (size.height * size.width, tf.int64.max)
            else ""
        )
        raise ImageRejected(
            f"image is {size.width}x{size.height} pixels{frames}; the limit is {max_megapixels:g} megapixels",
            status=413,
        )
    return size


_REASONS = (
    "not a JPEG, PNG, GIF or BMP image",
    "truncated JPEG header",
    "truncated PNG header",
    "truncated GIF header",
    "truncated BMP header",
    "PNG without an IHDR chunk first",
    f"GIF with more than {GIF_MAX_BLOCKS} blocks; refused",
)


def _reason(err: tf.errors.InvalidArgumentError) -> str:
    message = getattr(err, "message", str(err))
    known = [reason for reason in _REASONS if reason in message]
    if known:
        return known[0]
    return "not a valid JPEG header" if "jpeg" in message.lower() else message.strip().splitlines()[0]
