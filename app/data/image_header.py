"""Image size from the header, before any pixel is decoded: the image-bomb guard.

A JPEG of a few megabytes can decode to 144 megapixels (three bytes a pixel). `header_size`
reads height, width and the pixel count the decoder would allocate from the first bytes of a
JPEG, PNG, GIF, BMP or WebP, with
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

# Phone cameras' full-resolution modes write 48-64 megapixel photos (8064x6048, 8192x6144, 9248x6936):
# they must pass. A JPEG decodes DCT-scaled near the input size; a PNG decodes whole, three bytes a pixel.
DEFAULT_MAX_MEGAPIXELS = 70.0
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


UNRECOGNISED = "not a JPEG, PNG, GIF, BMP or WebP image"
# Why a header cannot be read; code i + 1 in `header_fields` is _REASONS[i] (0: read).
_REASONS = (
    UNRECOGNISED,
    "truncated JPEG header",
    "truncated PNG header",
    "truncated GIF header",
    "truncated BMP header",
    "PNG without an IHDR chunk first",
    f"GIF with more than {GIF_MAX_BLOCKS} blocks; refused",
    "truncated WebP header",
    "WebP without a VP8, VP8L or VP8X chunk first",
    "animated WebP; refused (its frames are decoded whole)",
    "BMP that is compressed, or not of 24 or 32 bits per pixel; save it as PNG or JPEG",
)
_PAD = 32  # zeros after the bytes: every fixed-offset read of a short header stays in range
_UNKNOWN, _SHORT_PNG, _SHORT_GIF, _SHORT_BMP, _NO_IHDR, _LONG_GIF = 1, 3, 4, 5, 6, 7
_SHORT_WEBP, _NO_VP8, _ANIMATED_WEBP, _BMP_UNREAD = 8, 9, 10, 11
_BMP_INFO_SIZE = 40  # BITMAPINFOHEADER: the oldest info header whose fields TensorFlow's decoder reads


def _area(height: tf.Tensor, width: tf.Tensor) -> tf.Tensor:
    """height × width of int64 sizes, negative sides as 0, saturating at the int64 maximum: a
    header's two 32-bit sides can overflow the product into a negative number, which would pass
    any pixel limit (found by python -m fuzz image_header)."""
    height, width = tf.maximum(height, 0), tf.maximum(width, 0)
    huge = tf.logical_or(height >= 2**31, width >= 2**31)
    return tf.where(huge, tf.constant(tf.int64.max, tf.int64), height * tf.minimum(width, 2**31 - 1))


def _fields(height: tf.Tensor, width: tf.Tensor, pixels: tf.Tensor, failed: tf.Tensor, code: int) -> tf.Tensor:
    return tf.stack([height, width, pixels, tf.where(failed, tf.constant(code, tf.int64), 0)])


def _png(data: tf.Tensor) -> tf.Tensor:
    chunk = tf.strings.reduce_join(tf.strings.as_string(data[12:16]), separator=",")
    width, height = _uint(data, 16, 4, True), _uint(data, 20, 4, True)
    short = tf.size(data, out_type=tf.int64) < 24 + _PAD
    fields = _fields(height, width, _area(height, width), tf.not_equal(chunk, "73,72,68,82"), _NO_IHDR)
    return tf.where(short, tf.constant([0, 0, 0, _SHORT_PNG], tf.int64), fields)


def _bmp(data: tf.Tensor) -> tf.Tensor:
    """As TensorFlow's BMP decoder reads it: int32 width and height at 18 and 22 (height < 0: top-down).
    What that decoder misreads is refused: a compressed BMP (it reads RLE codes as pixels), one of
    8 bits per pixel (it ignores the colour table: a red photo came out near black), of 1, 4 or
    16 (it fails) and one whose info header predates BITMAPINFOHEADER. `predict` and `evaluate`
    read such a file as `photoclf convert` does (app.inference.runtime)."""
    width = tf.cast(tf.bitcast(tf.cast(_uint(data, 18, 4, False), tf.uint32), tf.int32), tf.int64)
    height = tf.abs(tf.cast(tf.bitcast(tf.cast(_uint(data, 22, 4, False), tf.uint32), tf.int32), tf.int64))
    short = tf.size(data, out_type=tf.int64) < 34 + _PAD  # int32's abs(-2**31) < 0: cast first
    bits, compression = _uint(data, 28, 2, False), _uint(data, 30, 4, False)
    unread = tf.reduce_any(
        [
            _uint(data, 14, 4, False) < _BMP_INFO_SIZE,
            tf.logical_not(tf.reduce_any(tf.equal(bits, [24, 32]))),
            tf.logical_not(tf.reduce_any(tf.equal(compression, [0, 3]))),  # BI_RGB, BI_BITFIELDS
        ]
    )
    fields = _fields(height, width, _area(height, width), unread, _BMP_UNREAD)
    return tf.where(short, tf.constant([0, 0, 0, _SHORT_BMP], tf.int64), fields)


def _jpeg(encoded: tf.Tensor) -> tf.Tensor:
    """libjpeg's own header parser, so a header cannot claim one size and decode to another; the
    one reader that raises (InvalidArgumentError) on a header it cannot read."""
    shape = tf.cast(tf.image.extract_jpeg_shape(encoded), tf.int64)
    return tf.stack([shape[0], shape[1], shape[0] * shape[1], tf.constant(0, tf.int64)])


def _gif_frames_area(data: tf.Tensor, start: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(sum of width × height over the frames, whether the walk finished), walking the block
    structure from `start`.

    A state machine: at a record (0x21 extension, 0x2C image, 0x3B end) or inside a chain of
    sub-blocks (length byte, data, ..., 0). Bounded by GIF_MAX_BLOCKS steps.
    """
    size = tf.size(data, out_type=tf.int64)

    def step(pos, in_blocks, area, done, steps):
        byte = tf.cast(data[pos], tf.int64)
        packed = tf.cast(data[pos + 9], tf.int64)
        local_table = tf.where(packed >= 128, 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), packed % 8), 0)
        frame = _uint(data, pos + 5, 2, False) * _uint(data, pos + 7, 2, False)
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
        return tf.logical_and(tf.logical_not(done), pos < size - _PAD)

    _, _, area, done, steps = tf.while_loop(
        more,
        step,
        (start, tf.constant(False), tf.constant(0, tf.int64), tf.constant(False), tf.constant(0, tf.int64)),
        maximum_iterations=GIF_MAX_BLOCKS,
    )
    return area, tf.logical_or(done, steps < GIF_MAX_BLOCKS)


def _gif(data: tf.Tensor) -> tf.Tensor:
    width, height = _uint(data, 6, 2, False), _uint(data, 8, 2, False)
    packed = tf.cast(data[10], tf.int64)
    global_table = tf.where(packed >= 128, 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), packed % 8), 0)
    frames, finished = _gif_frames_area(data, 13 + global_table)
    fields = _fields(height, width, tf.maximum(height * width, frames), tf.logical_not(finished), _LONG_GIF)
    short = tf.size(data, out_type=tf.int64) < 13 + _PAD
    return tf.where(short, tf.constant([0, 0, 0, _SHORT_GIF], tf.int64), fields)


def _at(data: tf.Tensor, offset: int, literal: bytes) -> tf.Tensor:
    """Whether `literal` is at `offset` of the padded bytes (a short input reads the zero padding)."""
    return tf.reduce_all(tf.equal(data[offset : offset + len(literal)], tf.constant(list(literal), tf.uint8)))


def _webp(data: tf.Tensor) -> tf.Tensor:
    """As libwebp reads the first chunk: VP8X's canvas (24-bit sides minus one; its animation flag
    refused), VP8's 14-bit sides after the start code, or VP8L's packed 14-bit sides minus one."""
    extended, lossless = _at(data, 12, b"VP8X"), _at(data, 12, b"VP8L")
    packed = _uint(data, 21, 4, False)  # VP8L: width - 1 in bits 0-13, height - 1 in bits 14-27
    mask = tf.constant(0x3FFF, tf.int64)
    width = tf.where(
        extended,
        _uint(data, 24, 3, False) + 1,
        tf.where(
            lossless, tf.bitwise.bitwise_and(packed, mask) + 1, tf.bitwise.bitwise_and(_uint(data, 26, 2, False), mask)
        ),
    )
    height = tf.where(
        extended,
        _uint(data, 27, 3, False) + 1,
        tf.where(
            lossless,
            tf.bitwise.bitwise_and(tf.bitwise.right_shift(packed, 14), mask) + 1,
            tf.bitwise.bitwise_and(_uint(data, 28, 2, False), mask),
        ),
    )
    animated = tf.logical_and(extended, tf.bitwise.bitwise_and(tf.cast(data[20], tf.int64), 2) > 0)
    known = tf.logical_or(tf.logical_or(extended, lossless), _at(data, 12, b"VP8 "))
    code = tf.where(tf.logical_not(known), _NO_VP8, tf.where(animated, _ANIMATED_WEBP, 0))
    fields = tf.stack([height, width, _area(height, width), tf.cast(code, tf.int64)])
    short = tf.size(data, out_type=tf.int64) < 30 + _PAD
    return tf.where(short, tf.constant([0, 0, 0, _SHORT_WEBP], tf.int64), fields)


def header_fields(encoded: tf.Tensor) -> tf.Tensor:
    """Scalar string of image bytes → int64 [height, width, pixels, code]: code 0 when the header
    was read, else 1 + the index of why not in _REASONS. Raises only on a JPEG header libjpeg
    cannot read: TensorFlow keeps a little memory for every failed call (`python -m fuzz
    image_header` grew steadily on refused inputs), so the other refusals are values, not errors."""
    data = tf.concat([tf.io.decode_raw(encoded, tf.uint8), tf.zeros([_PAD], tf.uint8)], 0)
    head = tf.strings.substr(encoded, 0, 8)
    is_jpeg = tf.strings.substr(head, 0, 3) == b"\xff\xd8\xff"
    is_png = head == _PNG
    is_gif = tf.logical_or(tf.strings.substr(head, 0, 6) == _GIF87, tf.strings.substr(head, 0, 6) == _GIF89)
    is_bmp = tf.strings.substr(head, 0, 2) == b"BM"
    is_webp = tf.logical_and(_at(data, 0, b"RIFF"), _at(data, 8, b"WEBP"))
    return tf.case(
        [
            (is_jpeg, lambda: _jpeg(encoded)),
            (is_png, lambda: _png(data)),
            (is_gif, lambda: _gif(data)),
            (is_bmp, lambda: _bmp(data)),
            (is_webp, lambda: _webp(data)),
        ],
        default=lambda: tf.constant([0, 0, 0, _UNKNOWN], tf.int64),
        exclusive=True,
    )


def header_size(encoded: tf.Tensor) -> tf.Tensor:
    """Scalar string of image bytes → int64 [height, width, pixels]; in a graph, an
    InvalidArgumentError saying why when the bytes are not a JPEG, PNG, GIF, BMP or WebP or the header
    cannot be read (the serving signature's refusal)."""
    fields = header_fields(encoded)
    reason = tf.gather(tf.constant(("",) + _REASONS), fields[3])
    check = tf.debugging.Assert(tf.equal(fields[3], 0), ["cannot read the image header:", reason])
    with tf.control_dependencies([check]):
        return tf.identity(fields[:3])


def max_pixels(max_megapixels: float) -> int:
    return int(max_megapixels * 1e6)


def assert_within(size: tf.Tensor, max_megapixels: float) -> tf.Operation:
    """In-graph refusal: the error names the limit and carries [height, width, pixels]."""
    return tf.debugging.Assert(
        size[2] <= max_pixels(max_megapixels),
        [f"image too large: over the {max_megapixels:g} megapixel limit; [height width pixels] =", size],
    )


@tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
def _header_fields_fn(encoded: tf.Tensor) -> tf.Tensor:
    return header_fields(encoded)


def read_header(data: bytes) -> HeaderSize:
    """Host-side: the header's size, or ImageRejected(400) saying why it cannot be read."""
    try:
        height, width, pixels, code = (int(v) for v in _header_fields_fn(tf.constant(data)).numpy())
    except tf.errors.InvalidArgumentError as err:
        raise ImageRejected(f"cannot read the image header: {_reason(err)}") from None
    if code == _UNKNOWN and (name := sniffed_format(data)):
        raise ImageRejected(f"cannot read the image header: a {name} file, {UNRECOGNISED}")
    if code:
        raise ImageRejected(f"cannot read the image header: {_REASONS[code - 1]}")
    return HeaderSize(height, width, pixels)


# Files the decoders do not read, by their first bytes, so a refusal names what was sent.
_MAGIC = (
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"%PDF", "PDF"),
    (b"8BPS", "Photoshop"),
    (b"\xff\x0a", "JPEG XL"),
)
_AT_FOUR = {b"jP  ": "JPEG 2000", b"JXL ": "JPEG XL"}
_FTYP_BRANDS = {b"heic": "HEIC", b"heix": "HEIC", b"hevc": "HEIC", b"mif1": "HEIF", b"msf1": "HEIF", b"avif": "AVIF"}


def sniffed_format(data: bytes) -> str | None:
    """The name of a common format the header reader does not take (an iPhone's HEIC, a scan's
    TIFF, a video), or None."""
    if data[4:8] == b"ftyp":
        return _FTYP_BRANDS.get(data[8:12], "MP4 or QuickTime video")
    return _AT_FOUR.get(data[4:8]) or next((name for magic, name in _MAGIC if data.startswith(magic)), None)


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


def _reason(err: tf.errors.InvalidArgumentError) -> str:
    message = getattr(err, "message", str(err))
    known = [reason for reason in _REASONS if reason in message]
    if known:
        return known[0]
    return "not a valid JPEG header" if "jpeg" in message.lower() else message.strip().splitlines()[0]
