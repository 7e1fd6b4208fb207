"""Does Grad-CAM point at what decides the class? The pointing game on generated photos, and what a
map costs against a forward pass.

    python -m benchmarks.gradcam --weights mobilenet_v2.weights.h5 [--seeds 0,1,2] [--photos 480]

Each photo (256 × 256) holds one small shape (circle, square, star or triangle; radius 9% of the
side) at a random place inside the model's centre crop, on the demo's cluttered background: the
shape is the class. For every seed a model is trained with `photoclf train`'s defaults, then for
each test photo the map of its true class is computed (app.models.gradcam) and counted as a hit
when its peak falls inside the shape's box, grown by 15 pixels of 224 (Zhang et al. 2016), and
(a second column) grown by one cell of the map, the most its grid alone can move the peak. The
cost is the time of a batch of maps against the same Keras model's forward pass of that batch,
alternated over rounds (medians). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.cli import add_weights_and_seeds, run_cli
from app.export.rebuild import rebuild_served_model
from app.table import format_table

PHOTO_SIZE, RADIUS = 256, 0.09
TOLERANCE = 15 / 224


def make_photos(folder: Path, photos: int, seed: int = 0) -> dict[str, tuple[float, float, float, float]]:
    """Class folders of generated photos; {relative path: shape box as fractions of the centre crop}."""
    from app.data.demo import CLASSES, draw_small_object
    from app.data.preprocess import DEFAULT_CROP_FRACTION

    margin = (1 - DEFAULT_CROP_FRACTION) / 2  # the centre crop keeps [margin, 1 - margin] of each side
    rng = np.random.default_rng(seed)
    boxes = {}
    for k in range(photos):
        kind = CLASSES[k % len(CLASSES)]
        image, box = draw_small_object(kind, rng, PHOTO_SIZE, RADIUS, within=(margin, 1 - margin))
        relative = f"{kind}/{k:05d}.jpg"
        (folder / kind).mkdir(parents=True, exist_ok=True)
        image.save(folder / relative, quality=92)
        side = DEFAULT_CROP_FRACTION * PHOTO_SIZE
        offset = margin * PHOTO_SIZE
        boxes[relative] = tuple((v - offset) / side for v in box)
    return boxes


def pointing_and_cost(run_dir: Path, photos: Path, names: list[str], boxes: dict, rounds: int = 5) -> dict:
    """Hits of the true class's map, and the seconds per batch of maps and of forward passes."""
    import tensorflow as tf

    from app.data.demo import CLASSES
    from app.data.preprocess import DEFAULT_CROP_FRACTION, decode_batch
    from app.models import gradcam
    from app.run_dir import RunDir

    finished = RunDir(run_dir).load()
    model = rebuild_served_model(finished)
    maps = gradcam.explainer(model)
    pixels = tf.cast(
        decode_batch(tf.constant([(photos / n).read_bytes() for n in names]), finished.image_size,
                     DEFAULT_CROP_FRACTION, 40.0), tf.float32,
    ).numpy()  # fmt: skip
    truth = [CLASSES.index(n.split("/")[0]) for n in names]
    cams = np.concatenate([maps(pixels[i : i + 32], truth[i : i + 32])[0] for i in range(0, len(names), 32)])
    hits = [gradcam.peak_inside(cam, boxes[n], TOLERANCE) for cam, n in zip(cams, names)]
    cell = 1.0 / cams.shape[1]  # one cell of the map: how far its grid alone can put the peak
    near = [gradcam.peak_inside(cam, boxes[n], cell) for cam, n in zip(cams, names)]
    batch, ids = pixels[:32], truth[:32]
    forward = tf.function(lambda x: model(x, training=False))
    forward(batch)
    seconds: dict[str, list[float]] = {"forward": [], "gradcam": []}
    for _ in range(rounds):
        for name, call in (("forward", lambda: tf.nest.map_structure(np.asarray, forward(batch))),
                           ("gradcam", lambda: maps(batch, ids))):  # fmt: skip
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    forward_s, gradcam_s = (statistics.median(seconds[k]) for k in ("forward", "gradcam"))
    return {
        "photos": len(names),
        "pointing": float(np.mean(hits)),
        "pointing_one_cell": float(np.mean(near)),
        "map_cells": int(cams.shape[1]),
        "ms_per_image_forward": 1000 * forward_s / len(batch),
        "ms_per_image_gradcam": 1000 * gradcam_s / len(batch),
        "cost_ratio": gradcam_s / forward_s,
    }


def run_gradcam_benchmark(
    weights: str, seeds: tuple[int, ...], photos: int, log: Callable[[str], None] = print, **fixed: object
) -> list[dict]:
    from app.config import load_config
    from app.data.writer import write_tfrecords
    from app.training.train import train

    rows = []
    with tempfile.TemporaryDirectory(prefix="photoclf-gradcam-") as tmp_name:
        tmp = Path(tmp_name)
        boxes = make_photos(tmp / "photos", photos)
        records = tmp / "records"
        with contextlib.redirect_stdout(sys.stderr):
            write_tfrecords(tmp / "photos", records, val_fraction=0.15, test_fraction=0.25, num_shards=4)
        test = _test_files(records)
        for seed in seeds:
            cfg = load_config(None, {"data": str(records), "out": str(tmp / f"run-{seed}"), "weights": weights,
                                     "seed": seed, **fixed})  # fmt: skip
            with contextlib.redirect_stdout(sys.stderr):
                train(cfg)
            row = {"seed": seed, **pointing_and_cost(Path(cfg.out), tmp / "photos", test, boxes)}
            log(f"seed {seed}: pointing game {row['pointing']:.3f}, cost {row['cost_ratio']:.2f}x a forward pass")
            rows.append(row)
    return rows


def _test_files(records: Path) -> list[str]:
    """The test split's photos, relative to the photo folder, as the converter recorded them."""
    from app.data.pipeline import make_eval_dataset

    batches = make_eval_dataset(records, split="test", image_size=32, batch_size=64, with_filenames=True)
    return [name.decode() for _, _, names in batches for name in names.numpy()]


def format_rows(rows: list[dict]) -> str:
    header = ["seed", "test photos", "pointing game", "within one cell", "ms/image forward", "ms/image Grad-CAM",
              "Grad-CAM / forward"]  # fmt: skip
    body = [[str(r["seed"]), str(r["photos"]), f"{r['pointing']:.3f}", f"{r['pointing_one_cell']:.3f}",
             f"{r['ms_per_image_forward']:.1f}", f"{r['ms_per_image_gradcam']:.1f}", f"{r['cost_ratio']:.2f}x"]
            for r in rows]  # fmt: skip
    return format_table([header, *body])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weights_and_seeds(p)
    p.add_argument("--photos", type=int, default=480, help="generated photos, 4 classes (default 480)")
    args = p.parse_args()
    rows = run_gradcam_benchmark(args.weights, args.seeds, args.photos, log=lambda m: print(m, file=sys.stderr))
    print(format_rows(rows))
    print(json.dumps({"runs": rows}))


if __name__ == "__main__":
    run_cli(main)
