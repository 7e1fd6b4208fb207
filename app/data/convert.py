"""Turn one source file into upright RGB JPEG bytes, or say why it cannot be used.

A JPEG that is already upright RGB and small enough is kept byte for byte (no re-encode loss);
everything else (PNG, GIF, BMP, WebP, TIFF, HEIC/HEIF, AVIF, grayscale, palette, CMYK, alpha,
EXIF-rotated) is converted once here, so readers only ever decode RGB JPEG.
"""

from __future__ import annotations

import functools
import io
import struct
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

JPEG_QUALITY = 95
# Pillow's own default bomb threshold (~89 Mpx). Above it we refuse rather than decode.
DEFAULT_MAX_PIXELS = 89_478_485
_EXIF_ORIENTATION = 0x0112
SIXTEEN_BIT_GREY = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # Pillow's modes for a 16-bit grey PNG or TIFF


# What Pillow's readers raise on a corrupt file, beyond OSError: a truncated GIF's frame count
# raised IndexError (found by python -m fuzz convert).
UNDECODABLE = (OSError, SyntaxError, ValueError, IndexError, EOFError, struct.error)


class ImageRejected(Exception):
    """The file is not a usable image; the message is the reason recorded in dataset.json."""


class TooLarge(ImageRejected):
    """Over the pixel limit, said from the header before decoding."""


@dataclass(frozen=True)
class ConvertedImage:
    jpeg: bytes
    height: int
    width: int
    reencoded: bool


@functools.cache
def read_heif() -> None:
    """Teach Pillow HEIC/HEIF, an iPhone's own photo format (recent Pillow reads AVIF itself); on
    first use, as the import is not free."""
    from pillow_heif import register_heif_opener

    register_heif_opener()


def open_any(data: bytes) -> Image.Image:
    """Pillow's image of `data`, HEIC/HEIF included: every reader of photo files opens them here."""
    read_heif()
    return Image.open(io.BytesIO(data))


def _open_checked(data: bytes, max_pixels: int) -> Image.Image:
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        image = open_any(data)
        if image.width * image.height > max_pixels:
            raise TooLarge(f"decompression bomb: {image.width}x{image.height} exceeds {max_pixels} pixels")
        image.load()  # full decode: catches truncated and corrupt files
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """Flatten alpha onto white (black fringes look like a class cue), palette/CMYK/L to RGB, and
    16-bit grey to its high byte as TensorFlow's PNG decoder (the eval decode) reads it: Pillow's
    own conversion clips every value over 255, which made a 16-bit X-ray or scan all white."""
    if image.mode in SIXTEEN_BIT_GREY:
        high_byte = np.right_shift(np.asarray(image, dtype=np.uint32), 8).clip(0, 255).astype(np.uint8)
        return Image.fromarray(high_byte, "L").convert("RGB")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def convert_image(data: bytes, max_side: int | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> ConvertedImage:
    """Validate and normalise one encoded image. Raises ImageRejected with the reason."""
    if not data:
        raise ImageRejected("zero-byte file")
    try:
        return _normalised(data, max_side, max_pixels)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise TooLarge(f"decompression bomb: {err}") from None
    except Image.UnidentifiedImageError:
        raise ImageRejected("not an image (unrecognised format)") from None
    except UNDECODABLE as err:
        raise ImageRejected(f"undecodable: {err or type(err).__name__}") from None


def _pipeline_decodes(jpeg: bytes) -> bool:
    """Whether TensorFlow's decoder, the training pipeline's, reads these bytes. Pillow forgives
    damage TensorFlow refuses (python -m fuzz convert found a JPEG with junk before a marker that
    Pillow decodes and TensorFlow does not): such a file is re-encoded from Pillow's pixels instead
    of kept byte for byte. Checked at 1/8 scale: the coded data is read whole, the IDCT mostly not."""
    import tensorflow as tf

    try:
        tf.io.decode_jpeg(jpeg, channels=3, ratio=8)
    except tf.errors.InvalidArgumentError:
        return False
    return True


def _normalised(data: bytes, max_side: int | None, max_pixels: int) -> ConvertedImage:
    image = _open_checked(data, max_pixels)
    orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
    too_big = max_side is not None and max(image.size) > max_side
    if image.format == "JPEG" and image.mode == "RGB" and orientation == 1 and not too_big and _pipeline_decodes(data):
        return ConvertedImage(jpeg=data, height=image.height, width=image.width, reencoded=False)
    if getattr(image, "n_frames", 1) > 1:
        image.seek(0)  # animated GIF/WebP/TIFF: first frame
    image = ImageOps.exif_transpose(image)
    image = to_rgb(image)
    if too_big:
        image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=JPEG_QUALITY)
    return ConvertedImage(jpeg=out.getvalue(), height=image.height, width=image.width, reencoded=True)
