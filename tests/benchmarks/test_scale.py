"""The scale benchmark grows a photo folder to each size and times every command on it."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks.scale import PHOTO_SUFFIXES, Stage, grown_folder, run_size, table

pytestmark = pytest.mark.start_first  # its tests take over a minute in all


def test_past_the_folder_s_count_each_copy_is_another_photo_of_the_same_class(demo_images: Path, tmp_path: Path):
    originals = sorted(p for p in demo_images.rglob("*") if p.suffix.lower() in PHOTO_SUFFIXES)
    grown = grown_folder(demo_images, tmp_path / "grown", 2 * len(originals) + 5)
    photos = sorted(p for p in grown.rglob("*") if p.is_file())
    assert len(photos) == 2 * len(originals) + 5
    assert len({hashlib.sha256(p.read_bytes()).digest() for p in photos}) == len(photos)  # new bytes: new keys
    linked = [p for p in photos if p.is_symlink()]
    assert sorted(p.resolve() for p in linked) == sorted(p.resolve() for p in originals)  # each original once
    stems = {(p.parent.name, p.stem) for p in originals}
    assert all((p.parent.name, p.stem.rsplit("-", 1)[0]) in stems for p in photos if not p.is_symlink())
    assert grown_folder(demo_images, tmp_path / "grown", 2 * len(originals) + 5) == grown  # a second call adds nothing


def test_copies_of_a_small_tile_are_each_unlike_the_others_pixel_for_pixel(tmp_path: Path):
    """A share-of-the-size inset rounds to the same crop on small tiles (1% of 64 px is none), so
    copies were exact duplicates: one photo to the store and the audit, not several."""
    source = tmp_path / "tiles" / "field"
    source.mkdir(parents=True)
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 3), np.uint8)
    Image.fromarray(pixels).save(source / "tile.jpg", quality=95)
    grown = grown_folder(source.parent, tmp_path / "grown", 10)  # copies 1..9: past the 4-pixel cycle
    decoded = [np.asarray(Image.open(p).convert("RGB")).tobytes() for p in sorted(grown.rglob("*.jpg"))]
    assert len(decoded) == 10 and len(set(decoded)) == 10


def test_the_table_gives_each_size_per_photo_and_the_growth_from_the_size_before_the_largest():
    stages = [Stage(100, "convert", 100, 5.0, 400), Stage(1000, "convert", 1000, 20.0, 500),
              Stage(10000, "convert", 10000, 100.0, 750),
              Stage(100, "evaluate", 10, 1.0, 400), Stage(1000, "evaluate", 100, 5.0, 400),
              Stage(10000, "evaluate", 1000, 40.0, 400)]  # fmt: skip
    disk = {n: {"shards": n * 1024 * k, "feature store": 0} for n, k in ((100, 1), (1000, 1), (10000, 2))}
    lines = table(stages, disk).splitlines()
    convert = next(line.split() for line in lines if line.startswith("convert"))
    assert convert[1:] == ["50.0", "20.0", "10.0", "400", "500", "750", "0.50", "1.50"]  # against 1,000, not 100
    evaluate = next(line.split() for line in lines if line.startswith("evaluate"))
    assert evaluate[1:4] == ["100.0", "50.0", "40.0"]  # per photo evaluated (its test split), not per photo converted
    shards = next(line for line in lines if line.startswith("shards"))
    assert shards.split()[-4:] == ["1.0", "1.0", "2.0", "2.00"]


@pytest.mark.slow
def test_one_size_runs_every_command_as_a_process_and_measures_it(
    demo_images: Path, pretrained_weights: Path, tmp_path: Path
):
    small = ["image_size=32", "batch_size=8", "epochs_head=1", "epochs_finetune=1", "max_steps_per_epoch=2"]
    args = argparse.Namespace(photos=demo_images, weights=pretrained_weights, work=tmp_path, set=small)
    stages, disk = run_size(60, args)
    assert [s.command for s in stages] == ["convert", "audit", "train", "evaluate", "predict"]
    assert all(s.seconds > 0 and s.peak_rss_mb > 100 for s in stages)  # a process with TensorFlow in it
    evaluated = next(s for s in stages if s.command == "evaluate").photos
    assert 0 < evaluated < 60 and all(s.photos == 60 for s in stages if s.command != "evaluate")
    assert disk["shards"] > 0 and disk["feature store"] > 0
    assert (tmp_path / "60" / "predictions.csv").read_text().count("\n") >= 60  # a row per photo and a header
