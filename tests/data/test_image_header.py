"""The image-bomb guard reads sizes from headers: every format, cut-short headers, lying headers."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

from app.data.image_header import (
    DEFAULT_MAX_MEGAPIXELS,
    GIF_MAX_BLOCKS,
    HeaderSize,
    ImageRejected,
    check_size,
    read_header,
)


def encode(fmt: str, width: int, height: int, **options) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 60)).save(buffer, fmt, **options)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "fmt,options", [("JPEG", {}), ("JPEG", {"progressive": True}), ("PNG", {}), ("GIF", {}), ("BMP", {})]
)
def test_each_format_gives_its_size(fmt: str, options: dict):
    assert read_header(encode(fmt, 300, 200, **options)) == HeaderSize(height=200, width=300, pixels=60_000)


def test_an_animated_gif_counts_every_frame():
    frames = [Image.new("RGB", (100, 80), (40 * i, 0, 0)) for i in range(5)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    assert read_header(buffer.getvalue()) == HeaderSize(height=80, width=100, pixels=5 * 100 * 80)


@pytest.mark.parametrize(
    "fmt,keep,reason",
    [
        ("JPEG", 10, "not a valid JPEG header"),
        ("PNG", 20, "truncated PNG header"),
        ("GIF", 11, "truncated GIF header"),
        ("BMP", 20, "truncated BMP header"),
    ],
)
def test_cut_short_headers_are_refused_with_a_reason(fmt: str, keep: int, reason: str):
    with pytest.raises(ImageRejected, match=reason) as err:
        read_header(encode(fmt, 64, 64)[:keep])
    assert err.value.status == 400


@pytest.mark.parametrize("data", [b"", b"hello, world", b"RIFF\x00\x00\x00\x00WAVEfmt "])
def test_other_bytes_are_not_images(data: bytes):
    with pytest.raises(ImageRejected, match="not a JPEG, PNG, GIF, BMP or WebP image"):
        read_header(data)


def test_a_huge_header_over_a_tiny_body_is_refused_before_decoding():
    """A PNG that claims 50000x50000 (2.5 gigapixels) in 40 bytes: refused from its header, with 413."""
    png = (
        b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", 50_000, 50_000) + b"\x08\x02\x00\x00\x00" + b"\0" * 8
    )
    with pytest.raises(ImageRejected, match="image is 50000x50000 pixels; the limit is 40 megapixels") as err:
        check_size(png, 40)
    assert err.value.status == 413


def test_a_small_screen_cannot_hide_a_huge_gif_frame():
    """The decoder allocates each frame's own size, whatever the logical screen says."""
    gif = bytearray(encode("GIF", 10, 10))
    frame = gif.index(b"\x2c")  # image descriptor: 0x2C, left, top, width, height (little-endian)
    gif[frame + 5 : frame + 9] = struct.pack("<HH", 30_000, 30_000)
    size = read_header(bytes(gif))
    assert (size.width, size.height, size.pixels) == (10, 10, 900_000_000)
    with pytest.raises(ImageRejected, match=r"10x10 pixels, 900.0 megapixels with every frame") as err:
        check_size(bytes(gif), 40)
    assert err.value.status == 413


def test_a_bmp_stored_top_down_has_a_positive_height():
    bmp = bytearray(encode("BMP", 30, 20))
    bmp[22:26] = struct.pack("<i", -20)
    assert read_header(bytes(bmp)) == HeaderSize(height=20, width=30, pixels=600)


@pytest.mark.parametrize(
    ("what", "change"),
    [
        ("1 bit per pixel", lambda bmp: bmp[:28] + struct.pack("<H", 1) + bmp[30:]),
        ("16 bits per pixel", lambda bmp: bmp[:28] + struct.pack("<H", 16) + bmp[30:]),
        ("RLE8-compressed", lambda bmp: bmp[:28] + struct.pack("<HI", 8, 1) + bmp[34:]),
        ("an OS/2 core header", lambda bmp: bmp[:14] + struct.pack("<I", 12) + bmp[18:]),
    ],
)
def test_a_bmp_tensorflows_decoder_misreads_is_refused_saying_so(what: str, change):
    """TensorFlow's decoder fails on 1, 4 and 16 bits per pixel with a message about channels, and
    reads RLE codes as pixels: each is refused from its header, saying what to do."""
    with pytest.raises(
        ImageRejected, match="BMP that is compressed, or not of 24 or 32 bits per pixel; save it as PNG"
    ):
        read_header(change(encode("BMP", 30, 20)))


def test_a_gif_built_to_make_the_walk_slow_is_refused_after_a_bounded_walk():
    gif = encode("GIF", 10, 10)
    frame = gif.index(b"\x2c")
    hostile = gif[:frame] + b"\x21\xfe" + b"\x01A" * (GIF_MAX_BLOCKS + 10) + b"\x00" + gif[frame:]
    with pytest.raises(ImageRejected, match=f"GIF with more than {GIF_MAX_BLOCKS} blocks"):
        read_header(hostile)


def test_within_the_limit_passes_and_returns_the_size():
    assert check_size(encode("JPEG", 64, 48), 40) == HeaderSize(height=48, width=64, pixels=3072)


@pytest.mark.parametrize(
    ("header", "size"),
    [
        # Found by python -m fuzz image_header: 3267543746² overflows int64 into a negative count.
        (
            b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", 3_267_543_746, 3_267_543_746),
            "3267543746x3267543746",
        ),
        # int32's abs(-2**31) is itself: a top-down BMP of that height had a negative count.
        (b"BM" + b"\0" * 12 + struct.pack("<IiiHH", 40, 100, -(2**31), 1, 24), "100x2147483648"),
    ],
)
def test_sides_whose_product_overflows_are_refused_not_passed(header: bytes, size: str):
    data = header + b"\0" * 32
    assert read_header(data).pixels == 2**63 - 1  # saturated: over any limit
    with pytest.raises(ImageRejected, match=rf"^image is {size} pixels; the limit is 40 megapixels$") as err:
        check_size(data, 40)
    assert err.value.status == 413


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\0" * 50, "not a JPEG, PNG, GIF, BMP or WebP image"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 3, "truncated PNG header"),
        (b"GIF89a\x01", "truncated GIF header"),
        (b"BM\x01", "truncated BMP header"),
    ],
)
def test_refusals_other_than_libjpegs_are_values_not_tensorflow_errors(data: bytes, reason: str):
    """TensorFlow keeps about 1 KB of every call that fails (python -m fuzz image_header grew by
    200 MB over 200,000 refused inputs): the header reader answers with a code instead."""
    import tensorflow as tf

    from app.data.image_header import _REASONS, header_fields

    height, width, pixels, code = header_fields(tf.constant(data)).numpy()
    assert code > 0 and _REASONS[code - 1] == reason
    with pytest.raises(ImageRejected, match=f"^cannot read the image header: {reason}$"):
        read_header(data)


def _png_header(width: int, height: int) -> bytes:
    return (
        b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", width, height) + b"\x08\x02\x00\x00\x00" + b"\0" * 40
    )


@pytest.mark.parametrize(("width", "height"), [(8064, 6048), (8192, 6144), (9248, 6936)])
def test_a_phone_cameras_full_resolution_photo_passes_the_default_limit(width: int, height: int):
    """48, 50 and 64 megapixel modes (an iPhone's 48 MP, the usual 50 MP sensors, 64 MP ones)."""
    assert check_size(_png_header(width, height), DEFAULT_MAX_MEGAPIXELS).pixels == width * height
    with pytest.raises(ImageRejected, match="the limit is 70 megapixels"):
        check_size(_png_header(12_000, 9_000), DEFAULT_MAX_MEGAPIXELS)  # a 108 MP mode is refused


def _iso_media(brand: bytes) -> bytes:
    return struct.pack(">I", 24) + b"ftyp" + brand + b"\0\0\0\0" + brand + b"mif1" + b"\0" * 40


@pytest.mark.parametrize(
    ("data", "name"),
    [
        (_iso_media(b"heic"), "HEIC"),
        (_iso_media(b"mif1"), "HEIF"),
        (_iso_media(b"avif"), "AVIF"),
        (_iso_media(b"qt  "), "MP4 or QuickTime video"),
        (b"II*\x00" + b"\0" * 60, "TIFF"),
        (b"MM\x00*" + b"\0" * 60, "TIFF"),
        (b"%PDF-1.7\n" + b"\0" * 60, "PDF"),
        (b"\x00\x00\x00\x0cjP  \r\n\x87\n" + b"\0" * 60, "JPEG 2000"),
    ],
)
def test_a_format_the_decoders_do_not_read_is_named_in_the_refusal(data: bytes, name: str):
    """The server answers such a file 400: the reason says what was sent, not only what is read."""
    with pytest.raises(ImageRejected, match=f"^cannot read the image header: a {name} file, not a JPEG, PNG, GIF"):
        read_header(data)


def test_a_real_tiff_is_named():
    with pytest.raises(ImageRejected, match="a TIFF file"):
        read_header(encode("TIFF", 40, 30))


def _webp(pixels: np.ndarray, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="WEBP", **options)
    return out.getvalue()


@pytest.mark.parametrize(
    ("options", "chunk"), [({}, b"VP8 "), ({"lossless": True}, b"VP8L"), ({"exif": b"Exif\0\0II*\0"}, b"VP8X")]
)
@pytest.mark.parametrize(("width", "height"), [(1, 1), (24, 16), (16383, 3), (300, 7001)])
def test_webp_headers_give_the_size_pillow_decodes(options: dict, chunk: bytes, width: int, height: int):
    data = _webp(np.full((height, width, 3), 90, np.uint8), **options)
    assert data[12:16] == chunk
    with Image.open(io.BytesIO(data)) as decoded:
        assert decoded.size == (width, height)
    assert read_header(data) == HeaderSize(height, width, width * height)


def test_animated_and_cut_short_webp_are_refused_with_a_reason():
    frames = [Image.fromarray(np.full((8, 9, 3), 40 * i, np.uint8)) for i in range(3)]
    out = io.BytesIO()
    frames[0].save(out, format="WEBP", save_all=True, append_images=frames[1:])
    with pytest.raises(ImageRejected, match="animated WebP; refused"):
        read_header(out.getvalue())
    with pytest.raises(ImageRejected, match="truncated WebP header"):
        read_header(_webp(np.zeros((4, 4, 3), np.uint8))[:20])
    with pytest.raises(ImageRejected, match="WebP without a VP8, VP8L or VP8X chunk first"):
        read_header(b"RIFF\x00\x00\x00\x00WEBPJUNK" + bytes(40))
