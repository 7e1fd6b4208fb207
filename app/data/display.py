"""Photos for people to look at (figures, overlays): decoded small, without TensorFlow."""

from __future__ import annotations

import numpy as np
from PIL import ImageOps

from app.data.convert import open_any, to_rgb

MISTAKE_SIDE = 256  # pixels a side of each photo in the report's mistakes figures


def open_photo(data: bytes, max_side: int | None = None) -> np.ndarray:
    """uint8 RGB [H, W, 3] of a decodable photo; with `max_side`, at most that many pixels a side,
    a JPEG decoded at libjpeg's reduced scale: a figure of a 12 MP photo then costs milliseconds,
    not a full decode and an overlay of 12 million pixels. Upright by its EXIF orientation, as the
    model sees it (`app.data.exif`)."""
    with open_any(data) as opened:
        if max_side:
            opened.draft("RGB", (max_side, max_side))
        image = to_rgb(ImageOps.exif_transpose(opened))  # as convert makes it for training
    if max_side:
        image.thumbnail((max_side, max_side))
    return np.asarray(image)
