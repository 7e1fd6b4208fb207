"""A generated multi-label dataset: each photo holds any of four shapes (demo.py's drawings).

Each shape is in a photo independently with its own rate (circle 0.5, square 0.4, star 0.3,
triangle 0.2), so labels differ in frequency as real ones do, and some photos hold none. The
manifest's label cell lists them as 'circle|star'. Same seed → same files.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from app.data.demo import draw_scene, encode_image, staged_folder

RATES = {"circle": 0.5, "square": 0.4, "star": 0.3, "triangle": 0.2}


def generate_multilabel_dataset(out: Path, photos: int = 400, seed: int = 0, image_size: int = 128) -> Path:
    """Write `out/images/*.jpg` and `out/manifest.csv` (path,label); returns the manifest.
    Written to a temp folder, then renamed."""
    rng = np.random.default_rng(seed)
    with staged_folder(out) as staging:
        (staging / "images").mkdir()
        rows = []
        for i in range(photos):
            kinds = [kind for kind, rate in RATES.items() if rng.random() < rate]
            name = f"images/scene_{i:05d}.jpg"
            (staging / name).write_bytes(encode_image(draw_scene(kinds, rng, image_size), "JPEG"))
            rows.append([name, "|".join(kinds)])
        with (staging / "manifest.csv").open("w", newline="") as f:
            csv.writer(f).writerows([["path", "label"], *rows])
    return Path(out) / "manifest.csv"
