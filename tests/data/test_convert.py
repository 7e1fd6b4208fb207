"""convert_image: what is kept byte for byte, what is converted, what is rejected and why."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, features

from app.data.convert import ImageRejected, convert_image, read_heif


def _photo(width: int = 64, height: int = 48, noise: float = 10.0) -> Image.Image:
    rng = np.random.default_rng(0)
    base = np.linspace(0, 255, width * height * 3).reshape(height, width, 3)
    return Image.fromarray(np.clip(base + rng.normal(0, noise, base.shape), 0, 255).astype(np.uint8))


def _encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    read_heif()  # Pillow writes HEIC once taught it
    out = io.BytesIO()
    image.save(out, format=fmt, **kwargs)
    return out.getvalue()


def _decode(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_rgb_jpeg_is_kept_byte_for_byte():
    data = _encode(_photo(), "JPEG", quality=90)
    out = convert_image(data)
    assert out.jpeg == data and not out.reencoded
    assert (out.height, out.width) == (48, 64)


@pytest.mark.parametrize(
    "mode,fmt",
    [
        ("RGB", "PNG"),
        ("RGB", "GIF"),
        ("RGB", "BMP"),
        ("RGB", "WEBP"),
        ("RGB", "TIFF"),
        ("RGB", "HEIF"),  # an iPhone's own format, read through pillow-heif
        pytest.param(
            "RGB", "AVIF", marks=pytest.mark.skipif(not features.check("avif"), reason="this Pillow lacks AVIF")
        ),
        ("L", "JPEG"),
        ("P", "PNG"),
        ("CMYK", "JPEG"),
        ("RGBA", "PNG"),
        ("LA", "PNG"),
    ],
)
def test_other_formats_and_modes_become_rgb_jpeg(mode: str, fmt: str):
    data = _encode(_photo().convert(mode), fmt)
    out = convert_image(data)
    decoded = _decode(out.jpeg)
    assert out.reencoded
    assert decoded.format == "JPEG" and decoded.mode == "RGB"
    assert decoded.size == (64, 48) == (out.width, out.height)


def test_alpha_is_flattened_onto_white():
    transparent = Image.new("RGBA", (32, 32), (255, 0, 0, 0))
    pixels = np.asarray(_decode(convert_image(_encode(transparent, "PNG")).jpeg))
    assert pixels.min() > 245  # white, not black


def test_exif_rotated_jpeg_is_stored_upright():
    image = _photo(64, 48, noise=0)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    out = convert_image(_encode(image, "JPEG", exif=exif.tobytes(), quality=95))
    stored = np.asarray(_decode(out.jpeg), dtype=float)
    upright = np.asarray(image.transpose(Image.Transpose.ROTATE_270), dtype=float)
    wrong_way = np.asarray(image.transpose(Image.Transpose.ROTATE_90), dtype=float)
    assert (out.width, out.height) == (48, 64)
    assert np.abs(stored - upright).mean() < 3 < np.abs(stored - wrong_way).mean()


def test_max_side_downsizes_keeping_aspect():
    out = convert_image(_encode(_photo(400, 200), "JPEG"), max_side=100)
    assert (out.width, out.height) == (100, 50) and out.reencoded


def test_small_jpeg_is_untouched_by_max_side():
    data = _encode(_photo(64, 48), "JPEG")
    assert convert_image(data, max_side=100).jpeg == data


@pytest.mark.parametrize("data,reason", [(b"", "zero-byte"), (b"plain text, not an image\n", "not an image")])
def test_bad_files_are_rejected_with_reason(data: bytes, reason: str):
    with pytest.raises(ImageRejected, match=reason):
        convert_image(data)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_image_is_rejected(fmt: str):
    data = _encode(_photo(), fmt)
    with pytest.raises(ImageRejected, match="undecodable"):
        convert_image(data[: len(data) // 2])


def test_decompression_bomb_is_rejected_before_decoding():
    with pytest.raises(ImageRejected, match="decompression bomb"):
        convert_image(_encode(_photo(64, 48), "PNG"), max_pixels=1000)


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_a_16_bit_grey_photo_keeps_its_tones_as_the_eval_decode_reads_them(fmt: str):
    """Pillow's own conversion clips 16-bit grey at 255: an X-ray or a scan became all white for
    training, while the eval decode (TensorFlow's, the high byte) showed its tones."""
    import tensorflow as tf

    from app.data.preprocess import decode_for_eval

    tones = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (48, 1))
    data = _encode(Image.fromarray(tones), fmt)
    stored = np.asarray(_decode(convert_image(data).jpeg).convert("L"), dtype=int)
    assert np.abs(stored - (tones >> 8)).max() <= 3  # JPEG's loss only
    if fmt == "PNG":  # the eval decode reads PNG itself: training and evaluation see one picture
        ours = decode_for_eval(tf.constant(data), 32, 1.0).numpy().astype(int)
        trained = decode_for_eval(tf.constant(convert_image(data).jpeg), 32, 1.0).numpy().astype(int)
        assert np.abs(ours - trained).max() <= 3
