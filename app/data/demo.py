"""A small synthetic photo-like dataset, drawn by code so nothing is ever downloaded.

Four classes of shapes (circle, square, triangle, star) in random colours, sizes, positions and
rotations, on textured backgrounds (gradients, noise, clutter strokes), at varied image sizes.
A few files are deliberately awkward (PNG, grayscale JPEG, corrupt, zero-byte, hidden) so the
writer's conversion and skip paths run on the demo too. Same seed → same bytes.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CLASSES = ("circle", "square", "star", "triangle")
DEFAULT_PER_CLASS = 100
# 80 validation images rather than the converter's default 10% (40): on 40, one image moves
# accuracy by 0.025, and a perfectly calibrated model's 15-bin ECE averages ~0.06 (sampling
# noise alone), too coarse to choose epochs or to show what calibration does.
DEMO_VAL_FRACTION = 0.2
HOME_ENV = "PHOTOCLF_DEMO_HOME"  # where datasets/demo and runs/demo go; default: the project checkout


def demo_home() -> Path:
    """The folder holding datasets/demo (generated images and TFRecords) and runs/demo (the
    notebook's default model): the checkout, or $PHOTOCLF_DEMO_HOME (tests point it elsewhere)."""
    return Path(os.environ.get(HOME_ENV) or Path(__file__).resolve().parents[2])


def demo_root() -> Path:
    return demo_home() / "datasets" / "demo"


def demo_run_dir() -> Path:
    return demo_home() / "runs" / "demo"


def _background(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Two-colour gradient + per-pixel noise + blurred clutter strokes: photo-ish texture."""
    c0, c1 = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:height, 0:width]
    t = (np.cos(angle) * xx / width + np.sin(angle) * yy / height + 1) / 2
    pixels = c0[None, None, :] * (1 - t[..., None]) + c1[None, None, :] * t[..., None]
    pixels += rng.normal(0, rng.uniform(4, 20), pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 8))):
        xy = [tuple(rng.integers(0, [width, height])) for _ in range(2)]
        draw.line(xy, fill=tuple(int(v) for v in rng.integers(0, 256, 3)), width=int(rng.integers(1, 6)))
    return image.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 2.0)))


def _shape_points(kind: str, cx: float, cy: float, r: float, rot: float) -> list[tuple[float, float]]:
    if kind == "square":
        angles, radii = [rot + k * math.pi / 2 + math.pi / 4 for k in range(4)], [r] * 4
    elif kind == "triangle":
        angles, radii = [rot + k * 2 * math.pi / 3 for k in range(3)], [r] * 3
    elif kind == "star":
        angles = [rot + k * math.pi / 5 for k in range(10)]
        radii = [r if k % 2 == 0 else r * 0.45 for k in range(10)]
    else:
        raise ValueError(kind)
    return [(cx + rad * math.cos(a), cy + rad * math.sin(a)) for a, rad in zip(angles, radii)]


def _draw_shape(
    draw: ImageDraw.ImageDraw, kind: str, cx: float, cy: float, r: float, rng: np.random.Generator, width: int
) -> None:
    """One filled shape in a random colour with the opposite outline (a polygon randomly rotated)."""
    color = tuple(int(v) for v in rng.integers(0, 256, 3))
    outline = tuple(255 - v for v in color)
    if kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=color, outline=outline, width=width)
    else:
        draw.polygon(
            _shape_points(kind, cx, cy, r, rng.uniform(0, 2 * math.pi)), fill=color, outline=outline, width=width
        )


def draw_image(kind: str, rng: np.random.Generator, size: tuple[int, int] | None = None) -> Image.Image:
    """One image of `kind`; `size` (width, height) is random in 160..480 unless given."""
    width, height = size or tuple(int(v) for v in rng.integers(160, 480, 2))
    image = _background(rng, width, height)
    draw = ImageDraw.Draw(image)
    r = rng.uniform(0.25, 0.42) * min(width, height)
    cx, cy = rng.uniform(r, width - r), rng.uniform(r, height - r)
    _draw_shape(draw, kind, cx, cy, r, rng, width=3)
    return image.filter(ImageFilter.GaussianBlur(0.7))


def draw_small_object(
    kind: str, rng: np.random.Generator, size: int, radius: float, within: tuple[float, float] = (0.0, 1.0)
) -> tuple[Image.Image, tuple[float, float, float, float]]:
    """A square image with one small shape of `kind` (radius `radius` × size) at a random place
    inside the band `within` (fractions of the side), on the demo's cluttered background, and the
    shape's box (top, left, bottom, right) in pixels: data where the class is decided by a
    small thing, for checking where a model looks (benchmarks.gradcam)."""
    image = _background(rng, size, size)
    r = radius * size
    low, high = within[0] * size + r, within[1] * size - r
    cx, cy = rng.uniform(low, high), rng.uniform(low, high)
    _draw_shape(ImageDraw.Draw(image), kind, cx, cy, r, rng, width=2)
    return image.filter(ImageFilter.GaussianBlur(0.7)), (cy - r, cx - r, cy + r, cx + r)


def draw_scene(kinds: list[str], rng: np.random.Generator, size: int) -> Image.Image:
    """Several shapes in one square image (multi-label data): each of `kinds` in its own cell of
    a 2x2 grid, chosen at random, with a random colour, size and rotation."""
    image = _background(rng, size, size)
    draw = ImageDraw.Draw(image)
    cells = rng.permutation(4)[: len(kinds)]
    for kind, cell in zip(kinds, cells):
        r = rng.uniform(0.14, 0.22) * size
        cx = (cell % 2 + 0.5) * size / 2 + rng.uniform(-0.04, 0.04) * size
        cy = (cell // 2 + 0.5) * size / 2 + rng.uniform(-0.04, 0.04) * size
        _draw_shape(draw, kind, cx, cy, r, rng, width=2)
    return image.filter(ImageFilter.GaussianBlur(0.7))


def encode_image(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, quality=90) if fmt == "JPEG" else image.save(out, format=fmt)
    return out.getvalue()


@contextlib.contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A hidden temp folder beside `out`, renamed to `out` (replacing it) when the block ends
    without an error, removed otherwise: generated data is never seen half-written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield staging
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def generate_demo_images(out: Path, per_class: int = DEFAULT_PER_CLASS, seed: int = 0) -> Path:
    """Write `out/<class>/*.{jpg,png}` plus a few bad files. Written to a temp dir, then renamed."""
    with staged_folder(out) as staging:
        for class_index, kind in enumerate(CLASSES):
            class_dir = staging / kind
            class_dir.mkdir()
            rng = np.random.default_rng([seed, class_index])
            for i in range(per_class):
                image = draw_image(kind, rng)
                if i % 15 == 7:
                    (class_dir / f"{kind}_{i:03d}.png").write_bytes(encode_image(image, "PNG"))
                elif i % 15 == 11:
                    (class_dir / f"{kind}_{i:03d}.jpg").write_bytes(encode_image(image.convert("L"), "JPEG"))
                else:
                    (class_dir / f"{kind}_{i:03d}.jpg").write_bytes(encode_image(image, "JPEG"))
        good = (staging / CLASSES[0] / f"{CLASSES[0]}_000.jpg").read_bytes()
        (staging / CLASSES[0] / "truncated.jpg").write_bytes(good[: len(good) // 3])
        (staging / CLASSES[1] / "not_an_image.jpg").write_bytes(b"this is a text file, not a JPEG\n")
        (staging / CLASSES[2] / "empty.jpg").write_bytes(b"")
        (staging / CLASSES[3] / ".DS_Store").write_bytes(b"\0hidden")
    return Path(out)


def ensure_demo_records(root: Path | None = None) -> Path:
    """The demo TFRecords under `root` (default demo_root()), generating images and shards first if missing."""
    from app.data.schema import METADATA_FILE
    from app.data.writer import write_tfrecords

    root = root or demo_root()
    records = root / "tfrecords"
    if (records / METADATA_FILE).exists():
        return records
    images = root / "images"
    if not images.exists():
        print(f"Generating demo images in {images}", flush=True)
        generate_demo_images(images)
    print(f"Writing demo TFRecords to {records}", flush=True)
    write_tfrecords(images, records, overwrite=True, val_fraction=DEMO_VAL_FRACTION)
    return records
