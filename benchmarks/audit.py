"""Injection benchmark for scripts/audit.py: plant known problems in a real photo folder, audit it, score it.

    python -m benchmarks.audit ../shared/data/cats-dogs --weights mobilenet_v2.weights.h5

Plants 20 near duplicates in train (half size, JPEG quality 30, 90% crop, mirror, brighter and
more saturated; 4 of each), 10 copies of train photos in val (leaks), 20 flipped labels and
5 non-photos, in a temporary manifest (the folder is not touched). Prints precision and recall
per kind, the share of flipped labels among the 2x20 lowest-confidence images, how many
non-photos were flagged, and images/s of the whole audit, as one JSON line.

Injection benchmark for the audit: plant known problems in a real photo folder, audit it, and
score what was found (precision and recall per kind, rank of flipped labels, outliers, speed).

The planted copy of a photo is one of five edits (half size, JPEG quality 30, 90% centre crop,
mirror, +25% brightness and colour). The folder itself is never modified: the benchmark writes
a CSV manifest over the originals plus the planted files in a temporary folder.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageDraw, ImageEnhance, ImageOps

from app.audit.audit import audit
from app.cli import run_cli
from app.data.sources import scan_source
from app.errors import UserError

EDITS: dict[str, Callable[[Image.Image], Image.Image]] = {
    "resized": lambda im: im.resize((max(1, im.width // 2), max(1, im.height // 2))),
    "recompressed": lambda im: im,  # saved at quality 30 below
    "cropped": lambda im: im.crop(
        (im.width // 20, im.height // 20, im.width - im.width // 20, im.height - im.height // 20)
    ),
    "mirrored": ImageOps.mirror,
    "colour-shifted": lambda im: ImageEnhance.Color(ImageEnhance.Brightness(im).enhance(1.25)).enhance(1.25),
}


def _non_photos(size: tuple[int, int] = (400, 300)) -> dict[str, Image.Image]:
    blank = Image.new("RGB", size, (128, 128, 128))
    missing = Image.new("RGB", size, (230, 230, 230))
    ImageDraw.Draw(missing).text((120, 140), "image not found", fill=(90, 90, 90))
    screenshot = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(screenshot)
    for y in range(10, size[1], 16):
        draw.text((10, y), "Lorem ipsum dolor sit amet, consectetur adipiscing", fill=(0, 0, 0))
    gradient = Image.linear_gradient("L").resize(size).convert("RGB")
    chart = Image.new("RGB", size, (255, 255, 255))
    for k in range(8):
        ImageDraw.Draw(chart).rectangle((20 + 45 * k, 280 - 30 * k, 50 + 45 * k, 280), fill=(40, 90, 200))
    return {
        "blank": blank,
        "image-not-found": missing,
        "screenshot": screenshot,
        "gradient": gradient,
        "bar-chart": chart,
    }


def plant(
    folder: Path, out: Path, seed: int = 0, near: int = 20, leaks: int = 10, flips: int = 20
) -> tuple[Path, dict]:
    """Write OUT/manifest.csv (the folder's photos plus planted problems) and return it with the truth."""
    source = scan_source(folder)
    names = [i.path.name for i in source.images]
    if len(set(names)) != len(names):
        raise UserError(f"{folder}: the benchmark matches findings by file name; file names must be unique")
    rng = random.Random(seed)
    train = [i for i in source.images if i.split == "train"]
    picked = rng.sample(train, near + leaks + flips)
    rows = [[str(i.path), i.class_name, i.split] for i in source.images]
    truth: dict = {"near": [], "leak": [], "flipped": [], "non_photo": []}
    kinds = list(EDITS)
    for k, original in enumerate(picked[: near + leaks]):
        kind = kinds[k % len(kinds)]
        edited = EDITS[kind](ImageOps.exif_transpose(Image.open(original.path)).convert("RGB"))
        path = out / f"planted-{k:03d}-{kind}.jpg"
        edited.save(path, quality=30 if kind == "recompressed" else 92)
        split = "train" if k < near else "val"
        rows.append([str(path), original.class_name, split])
        truth["near" if k < near else "leak"].append({"original": original.relpath, "copy": path.name, "kind": kind})
    flipped = {i.relpath for i in picked[near + leaks :]}
    for row, image in zip(rows, source.images):
        if image.relpath in flipped:
            row[1] = next(c for c in source.classes if c != image.class_name)
            truth["flipped"].append(image.relpath)
    for name, image in _non_photos().items():
        path = out / f"nonphoto-{name}.png"
        image.save(path)
        rows.append([str(path), rng.choice(source.classes), "train"])
        truth["non_photo"].append(path.name)
    manifest = out / "manifest.csv"
    with manifest.open("w", newline="") as f:
        csv.writer(f).writerows([["path", "label", "split"], *rows])
    return manifest, truth


def _base(path: str) -> str:
    return Path(path).name


def score(result: dict, truth: dict) -> dict:
    """Recall and precision of planted duplicates and leaks, flipped labels in the top 2x, outliers."""
    found = {
        frozenset((_base(p["a"]["path"]), _base(p["b"]["path"])))
        for p in result["exact_duplicates"] + result["near_duplicates"]
    }
    leaks = {frozenset((_base(p["a"]["path"]), _base(p["b"]["path"]))) for p in result["leaks"]}
    scores: dict = {}
    for group, reported in (("near", found), ("leak", leaks)):
        planted = {frozenset((_base(t["original"]), t["copy"])): t["kind"] for t in truth[group]}
        hits = [pair for pair in planted if pair in reported]
        scores[f"{group}_recall"] = round(len(hits) / len(planted), 3)
        scores[f"{group}_by_kind"] = {
            kind: sum(1 for p, k in planted.items() if k == kind and p in reported)
            for kind in EDITS
            if kind in planted.values()
        }
        if group == "leak":
            scores["leak_precision"] = round(len(hits) / max(len(reported), 1), 3)
    all_planted = {frozenset((_base(t["original"]), t["copy"])) for t in truth["near"] + truth["leak"]}
    scores["duplicate_precision"] = round(len(found & all_planted) / max(len(found), 1), 3)
    top = {_base(r["path"]) for r in result["label_ranking"][: 2 * len(truth["flipped"])]}
    scores["flipped_in_top_2x"] = round(sum(_base(f) in top for f in truth["flipped"]) / len(truth["flipped"]), 3)
    flagged = {_base(o["path"]) for o in result["outliers"]} | {_base(m["path"]) for m in result["likely_mislabels"]}
    scores["non_photos_flagged"] = f"{sum(n in flagged for n in truth['non_photo'])}/{len(truth['non_photo'])}"
    return scores


def run_audit_benchmark(folder: Path, seed: int = 0, weights: str = "auto") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        manifest, truth = plant(Path(folder), Path(tmp), seed)
        start = time.perf_counter()
        result = audit(manifest, Path(tmp) / "report", weights=weights)
        seconds = time.perf_counter() - start
    return {
        **score(result, truth),
        "images": result["images"],
        "seconds": round(seconds, 1),
        "images_per_s": round(result["images"] / seconds, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="class folders or a train/val[/test] tree of real photos")
    p.add_argument("--weights", default="auto", help="auto | imagenet | PATH (default auto)")
    p.add_argument("--seed", type=int, default=0, help="which photos are copied and flipped (default 0)")
    args = p.parse_args()

    print(json.dumps(run_audit_benchmark(args.folder, seed=args.seed, weights=args.weights)))


if __name__ == "__main__":
    run_cli(main)
