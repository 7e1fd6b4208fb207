"""benchmarks/gradcam.py: the generated photos' boxes lie inside the model's centre crop, and the
table reports each seed's pointing game and cost."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from benchmarks.gradcam import PHOTO_SIZE, format_rows, make_photos


def test_each_photo_has_one_small_shape_inside_the_centre_crop(tmp_path: Path):
    boxes = make_photos(tmp_path, photos=8)
    assert len(boxes) == 8 and {name.split("/")[0] for name in boxes} == {"circle", "square", "star", "triangle"}
    for name, (top, left, bottom, right) in boxes.items():
        assert 0.0 <= top < bottom <= 1.0 and 0.0 <= left < right <= 1.0
        assert 0.15 < bottom - top < 0.25  # radius 9% of 256 px, over the 224 px crop
        with Image.open(tmp_path / name) as photo:
            assert photo.size == (PHOTO_SIZE, PHOTO_SIZE)


def test_the_table_has_one_row_per_seed():
    rows = [{"seed": 0, "photos": 120, "pointing": 0.85, "pointing_one_cell": 0.97, "ms_per_image_forward": 20.0,
             "ms_per_image_gradcam": 24.0, "cost_ratio": 1.2}]  # fmt: skip
    assert format_rows(rows).splitlines()[-1].split() == ["0", "120", "0.850", "0.970", "20.0", "24.0", "1.20x"]
