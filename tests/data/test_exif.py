"""EXIF orientation: a phone's sideways-stored photo reaches the model upright, as convert stores it."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from app.data.display import open_photo
from app.data.exif import jpeg_orientation, upright
from app.data.preprocess import decode_for_eval

SIZE = 32


def _scene() -> Image.Image:
    """Not symmetric under any turn or mirror: a gradient, a block in one corner, a bar on one side."""
    y, x = np.mgrid[0:64, 0:96]  # the crop centred exactly either way up: (96 - 56) and (64 - 56) even
    pixels = np.stack([x * 2.5, y * 3.0, (x + y) * 1.2], -1)
    pixels[5:25, 8:30] = (250, 20, 20)
    pixels[44:60, 70:74] = (20, 20, 250)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


def _jpeg(image: Image.Image, orientation: int | None = None) -> bytes:
    buffer = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    image.save(buffer, "JPEG", quality=95, exif=exif.tobytes())
    return buffer.getvalue()


def _stored_as_a_phone_would(image: Image.Image, orientation: int) -> Image.Image:
    """The pixels a camera writes for a scene it tags `orientation`: exif_transpose undoes it."""
    inverse = {2: 2, 3: 3, 4: 4, 5: 5, 6: 8, 7: 7, 8: 6}.get(orientation)
    if inverse is None:
        return image
    tagged = image.copy()
    tagged.getexif()[0x0112] = inverse
    return ImageOps.exif_transpose(tagged)


def _big_endian_exif(jpeg: bytes, orientation: int) -> bytes:
    """The same tag written as a Motorola-order ("MM") TIFF block, before a JFIF APP0."""
    tiff = b"MM\x00*" + struct.pack(">I", 8) + struct.pack(">H", 1)
    tiff += struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0)
    body = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body + jpeg[2:]


@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_tag_is_read_as_pil_reads_it_and_turned_as_pil_turns_it(orientation: int):
    data = _jpeg(_scene(), orientation)
    assert int(jpeg_orientation(tf.constant(data))) == orientation == Image.open(io.BytesIO(data)).getexif()[0x0112]
    raw = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    expected = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    np.testing.assert_array_equal(upright(tf.constant(raw), tf.constant(orientation)).numpy(), expected)


def test_big_endian_tags_and_headers_without_one_or_broken_read_as_they_should():
    plain = _jpeg(_scene())
    assert int(jpeg_orientation(tf.constant(plain))) == 1
    assert int(jpeg_orientation(tf.constant(_big_endian_exif(plain, 6)))) == 6
    tagged = _big_endian_exif(plain, 8)
    icc = b"\xff\xe2" + struct.pack(">H", 65_535) + bytes(65_533)  # a whole APPn block before the tag's
    assert int(jpeg_orientation(tf.constant(tagged[:2] + icc + tagged[2:]))) == 8
    for broken in (b"", b"\xff\xd8\xff", _big_endian_exif(plain, 6)[:30], _big_endian_exif(plain, 9)):
        assert int(jpeg_orientation(tf.constant(broken))) == 1


@pytest.mark.parametrize("orientation", range(2, 9))
def test_a_sideways_stored_photo_decodes_as_its_upright_twin_and_not_without_the_tag(orientation: int):
    scene = _scene()
    stored = _stored_as_a_phone_would(scene, orientation)
    want = decode_for_eval(tf.constant(_jpeg(scene)), SIZE).numpy().astype(float)
    tagged = decode_for_eval(tf.constant(_jpeg(stored, orientation)), SIZE).numpy().astype(float)
    untagged = decode_for_eval(tf.constant(_jpeg(stored)), SIZE).numpy().astype(float)
    assert np.abs(tagged - want).mean() < 1  # JPEG's loss on differently placed blocks
    assert np.abs(untagged - want).mean() > 20


def test_photos_shown_to_people_are_upright_too():
    scene = _scene()
    shown = open_photo(_jpeg(_stored_as_a_phone_would(scene, 6), 6))
    assert shown.shape == (64, 96, 3)
    assert np.abs(shown.astype(float) - np.asarray(scene, float)).mean() < 3
