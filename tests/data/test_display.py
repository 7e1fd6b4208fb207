"""Photos decoded for figures: small, the right way up in size, the whole photo without a limit."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from app.data.display import open_photo


def _jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    gradient = np.linspace(0, 255, width, dtype=np.uint8)[None, :, None].repeat(height, 0).repeat(3, 2)
    Image.fromarray(gradient).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_a_big_photo_is_decoded_at_most_max_side_pixels_a_side_keeping_its_shape():
    data = _jpeg(1600, 1200)
    small = open_photo(data, 256)
    assert small.shape == (192, 256, 3) and small.dtype == np.uint8
    whole = open_photo(data)
    assert whole.shape == (1200, 1600, 3)
    # the same picture: the left-to-right gradient survives the reduced-scale decode
    assert abs(int(small[96, 10, 0]) - int(whole[600, 62, 0])) < 8


def test_a_small_photo_is_not_enlarged():
    assert open_photo(_jpeg(100, 60), 256).shape == (60, 100, 3)
