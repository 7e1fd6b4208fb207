"""A generated dataset whose label needs both the photo and its side features.

Each image is a circle or a square (demo.py's drawings); each row also has a numeric `reading`
and a categorical `site`. The label is the shape and a hidden level together
(circle_low, circle_high, square_low, square_high): the image shows the shape but not the level;
`reading` is drawn around -1 (low) or +1 (high) with noise, and `site` leans towards the level.
So an image-only model can reach about half, a side-features-only model about half, and a fused
model far more. Some cells are left empty, as real manifests have them. Same seed → same files.

`task="threshold"` makes the level exactly the sign of `reading` (drawn as |N(0, 1)| with the
level's sign, never missing) and `site` uninformative: one linear threshold on one column,
crossed with the photo's shape. A fused model can then be as right as an image-only model is
on the shape alone, the ceiling the side-features benchmark reports.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from app.data.demo import draw_image, encode_image, staged_folder

SHAPES, LEVELS = ("circle", "square"), ("low", "high")
SITES = {"low": ("north", "north", "south", "east"), "high": ("south", "south", "north", "east")}
FEATURE_COLUMNS = "reading,site:categorical"
MISSING_RATE = 0.05
TASKS = ("levels", "threshold")


def _row(rng: np.random.Generator, image_name: str, shape: str, level: str, noise: float, task: str) -> list[str]:
    sign = 1.0 if level == "high" else -1.0
    if task == "threshold":
        reading, site = sign * abs(rng.normal(0.0, 1.0)), str(rng.choice(sorted(set(SITES["low"]))))
    else:
        reading, site = rng.normal(sign, noise), str(rng.choice(SITES[level]))
    cells = [f"{reading:.4f}", site]
    for i in range(2):
        if rng.random() < MISSING_RATE and not (task == "threshold" and i == 0):
            cells[i] = "" if i == 0 else "NA"
    return [image_name, f"{shape}_{level}", *cells]


def generate_side_feature_dataset(
    out: Path, per_class: int = 60, seed: int = 0, image_size: int = 128, noise: float = 0.6, task: str = "levels"
) -> Path:
    """Write `out/images/*.jpg` and `out/manifest.csv` (path,label,reading,site); returns the
    manifest. Written to a temp folder, then renamed."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    with staged_folder(out) as staging:
        (staging / "images").mkdir()
        rows = []
        for shape_index, shape in enumerate(SHAPES):
            for level_index, level in enumerate(LEVELS):
                rng = np.random.default_rng([seed, shape_index, level_index])
                for i in range(per_class):
                    name = f"images/{shape}_{level}_{i:04d}.jpg"
                    (staging / name).write_bytes(encode_image(draw_image(shape, rng, (image_size, image_size)), "JPEG"))
                    rows.append(_row(rng, name, shape, level, noise, task))
        with (staging / "manifest.csv").open("w", newline="") as f:
            csv.writer(f).writerows([["path", "label", "reading", "site"], *rows])
    return Path(out) / "manifest.csv"
