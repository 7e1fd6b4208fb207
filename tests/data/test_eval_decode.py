"""The one eval decode: a JPEG's centre crop decoded at the smallest DCT scale that keeps it at
least the model's input, so phone photos cost a fraction of a full decode and give the same
picture; web-sized photos and other formats decode as before, and a photo smaller than the
input is enlarged as before to a rounding step."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from app.data.preprocess import decode_for_eval, eval_scale


def photo_like(width: int, height: int, seed: int = 0) -> Image.Image:
    """Smooth colour fields with a few sharp-edged shapes, upscaled as a phone's pixels are dense."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray((rng.random((12, 16, 3)) * 255).astype(np.uint8)).resize((160, 120), Image.BICUBIC)
    pixels = np.asarray(small).copy()
    for _ in range(6):
        y, x, r = rng.integers(10, 110), rng.integers(10, 150), rng.integers(5, 25)
        yy, xx = np.ogrid[:120, :160]
        pixels[(yy - y) ** 2 + (xx - x) ** 2 < r**2] = rng.integers(0, 256, 3)
    image = Image.fromarray(pixels)
    if width < height:
        image = image.transpose(Image.Transpose.ROTATE_90)
    return image.resize((width, height), Image.BICUBIC)


def encoded(image: Image.Image, fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, quality=92) if fmt == "JPEG" else image.save(buffer, format=fmt)
    return buffer.getvalue()


def full_decode_reference(data: bytes, size: int, crop_fraction: float = 0.875) -> np.ndarray:
    """What evaluation did before: decode every pixel, centre-crop, antialiased resize."""
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    height, width = image.shape[:2]
    side = max(int(min(height, width) * crop_fraction), 1)
    top, left = (height - side) // 2, (width - side) // 2
    resized = tf.image.resize(image[top : top + side, left : left + side], [size, size], antialias=True)
    return tf.saturate_cast(tf.round(resized), tf.uint8).numpy()


@pytest.mark.parametrize(
    "height,width,size,scale",
    [
        (375, 500, 224, 1),  # a web photo: its crop (328) is under 2 x 224
        (511, 511, 224, 1),  # crop 447: half of it would be under 224
        (512, 512, 224, 2),  # crop 448: half is exactly 224
        (600, 800, 224, 2),  # crop 525 >= 2 x 224
        (1200, 1600, 224, 4),  # crop 1050 >= 4 x 224
        (3000, 4000, 224, 8),  # a 12-megapixel phone photo: crop 2625, at 1/8 still 328
        (4000, 3000, 224, 8),  # portrait
        (3000, 4000, 384, 4),  # a bigger input keeps a finer scale
        (100, 100, 224, 1),  # smaller than the input: upsampled, never scaled down
    ],
)
def test_the_scale_is_the_smallest_that_keeps_the_centre_crop_at_least_the_input(
    height: int, width: int, size: int, scale: int
):
    assert eval_scale(height, width, size) == scale
    assert int(min(height, width) * 0.875) // scale >= min(size, int(min(height, width) * 0.875))


def test_a_small_jpeg_decodes_exactly_as_a_full_decode_did():
    data = encoded(photo_like(500, 375))
    np.testing.assert_array_equal(decode_for_eval(tf.constant(data), 224).numpy(), full_decode_reference(data, 224))


@pytest.mark.parametrize("width,height", [(4000, 3000), (3000, 4000)])
def test_a_12_megapixel_jpeg_decodes_close_to_a_full_decode(width: int, height: int):
    data = encoded(photo_like(width, height))
    ours, before = decode_for_eval(tf.constant(data), 224).numpy(), full_decode_reference(data, 224)
    difference = np.abs(ours.astype(int) - before.astype(int))
    assert ours.shape == (224, 224, 3) and ours.dtype == np.uint8
    assert difference.mean() < 1.5  # levels of 255: the same picture, low-passed by the DCT instead
    assert np.percentile(difference, 99) < 8


@pytest.mark.parametrize("width,height,fmt", [(64, 64, "JPEG"), (300, 200, "JPEG"), (150, 149, "PNG"), (5, 3, "PNG")])
def test_a_photo_smaller_than_the_input_is_enlarged_as_the_antialiased_resize_does(width: int, height: int, fmt: str):
    """Enlarging, plain bilinear (the faster kernel) and the antialiased one are the same filter:
    they may differ by one rounding step, in a few pixels."""
    data = encoded(photo_like(width, height), fmt)
    ours, before = decode_for_eval(tf.constant(data), 224).numpy(), full_decode_reference(data, 224)
    difference = np.abs(ours.astype(int) - before.astype(int))
    assert difference.max() <= 1
    assert (difference > 0).mean() < 0.002


def test_other_formats_decode_exactly_as_before():
    image = photo_like(640, 480)
    for fmt in ("PNG", "BMP"):
        data = encoded(image, fmt)
        np.testing.assert_array_equal(decode_for_eval(tf.constant(data), 224).numpy(), full_decode_reference(data, 224))


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_a_transparent_background_is_white_as_convert_makes_it_for_training(fmt: str):
    """A cut-out product photo: its transparent pixels hold black, which the model never saw
    in training (convert lays them on white); a WebP with alpha was refused outright."""
    from app.data.convert import convert_image

    rgba = np.zeros((120, 160, 4), np.uint8)  # transparent black around
    rgba[30:90, 40:120] = (200, 40, 40, 255)  # an opaque red object
    rgba[30:90, 40:50, 3] = 128  # with a half-transparent edge
    buffer = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buffer, format=fmt, lossless=True)  # PNG ignores the option
    data = buffer.getvalue()
    ours = decode_for_eval(tf.constant(data), 32).numpy()
    trained = decode_for_eval(tf.constant(convert_image(data).jpeg), 32).numpy()  # the photo as convert stores it
    assert ours[1, 1].tolist() == [255, 255, 255]  # the background: white, not black
    assert abs(ours[16, 16].astype(int) - [200, 40, 40]).max() <= 2  # the object as it is
    assert np.abs(ours.astype(int) - trained.astype(int)).mean() < 3  # the picture training saw (a JPEG of it)


def _bmp_32_bits_fourth_byte_zero(rgb: np.ndarray) -> bytes:
    """A 32-bit BI_RGB BMP as Windows writes it: blue, green, red and an unused byte left 0."""
    height, width, _ = rgb.shape
    pixels = np.concatenate([rgb[::-1, :, ::-1], np.zeros((height, width, 1), np.uint8)], axis=2).tobytes()
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 32, 0, len(pixels), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info) + len(pixels), 0, 0, 14 + len(info)) + info + pixels


def test_a_32_bit_bmp_decodes_to_the_colours_pillow_shows_and_convert_trains_on():
    """Its fourth byte is unused and often 0: read as alpha, it laid the whole photo on white."""
    data = _bmp_32_bits_fourth_byte_zero(np.asarray(photo_like(64, 48)))
    as_pillow_reads_it = encoded(Image.open(io.BytesIO(data)).convert("RGB"), "PNG")
    np.testing.assert_array_equal(
        decode_for_eval(tf.constant(data), 32).numpy(), decode_for_eval(tf.constant(as_pillow_reads_it), 32).numpy()
    )


@pytest.mark.parametrize("colours", [256, 16])
def test_a_palette_bmp_is_refused_by_the_served_decode_and_predicted_as_convert_reads_it(colours: int):
    """TensorFlow's decoder returns an 8-bit BMP's palette indices as grey levels (a red photo
    came out near black): the header check refuses it, saying so."""
    from app.data.image_header import ImageRejected, read_header

    image = Image.fromarray(np.asarray(photo_like(64, 48))).convert("P", palette=Image.ADAPTIVE, colors=colours)
    with pytest.raises(ImageRejected, match="BMP that is compressed, or not of 24 or 32 bits per pixel"):
        read_header(encoded(image, "BMP"))


def test_a_truncated_jpeg_still_fails_the_decode():
    data = encoded(photo_like(4000, 3000))[:5000]
    with pytest.raises(tf.errors.InvalidArgumentError):
        decode_for_eval(tf.constant(data), 224).numpy()
