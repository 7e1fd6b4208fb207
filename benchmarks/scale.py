"""How time, memory and disk grow with the number of photos: the same commands on each size.

    python -m benchmarks.scale --photos ../shared/data/eurosat5/train --weights W --sizes 1000,10000
    python -m benchmarks.scale --photos ../shared/data/eurosat5/train --weights W --quick

The photos of each size come from --photos (class folders): the first N in a seeded order, and
past the folder's count, copies that are each another crop and scale of a photo (new bytes, so
the feature store and the audit see N different photos). Each size runs, each command as its own
process with a feature store of its own: convert (a 10% val and test split), audit, train (the
app's defaults with the --set overrides; --quick trains small: 96 px, 3 + 1 epochs), evaluate
(the test split) and predict (every photo). Per command: wall seconds, milliseconds per photo it
read and peak RSS; per size: the shards' and the feature store's bytes on disk. The last columns compare
the largest size with the one before it: per-photo time and peak memory, largest ÷ next. Prints
the CPU first, then the table, then a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image

from app.cli import run_cli
from app.data.pipeline import load_dataset_info
from app.errors import UserError
from app.inference.runtime_choice import cpu_name
from app.table import format_table
from benchmarks.common import disk_bytes, timed

QUICK_SIZES, QUICK_SET = (1000, 10000), ("image_size=96", "epochs_head=3", "epochs_finetune=1")
PHOTO_SUFFIXES = {".jpg", ".jpeg", ".png"}


@dataclass
class Stage:
    size: int
    command: str
    photos: int  # what the command read: every photo, or evaluate's test split
    seconds: float
    peak_rss_mb: float

    @property
    def ms_per_photo(self) -> float:
        return 1000 * self.seconds / self.photos


def grown_folder(source: Path, out: Path, size: int, seed: int = 0) -> Path:
    """`out`/CLASS/ with `size` photos of `source`'s classes: symlinks to the originals, then
    re-encoded crops of the ones that decode whole (copy k of a photo: k pixels off each side,
    at its size), each copy's pixels unlike the others'."""
    photos = [p for p in sorted(source.rglob("*")) if p.suffix.lower() in PHOTO_SUFFIXES]
    if not photos:
        raise UserError(f"--photos {source}: no photos in its class folders")
    random.Random(seed).shuffle(photos)
    made, tried = 0, 0
    while made < size:
        if tried > 4 * size + len(photos):
            raise UserError(f"--photos {source}: too few photos that decode whole to make {size}")
        original, copy = photos[tried % len(photos)], tried // len(photos)
        tried += 1
        target = out / original.parent.name / (original.name if not copy else f"{original.stem}-{copy}.jpg")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() and not copy:
            target.symlink_to(original.resolve())
        elif not target.exists() and not _cropped_copy(original, target, copy):
            continue
        made += 1
    return out


def _cropped_copy(original: Path, target: Path, copy: int) -> bool:
    """`original` less `copy` pixels off each side (cycling within a quarter of its short side,
    then at a lower JPEG quality each cycle), at its size, as a JPEG: a copy that insets by a
    share of the size would repeat its pixels on small tiles (1% of 64 px rounds to none), and
    an exact duplicate is one photo to the store. False if it does not decode."""
    try:
        with Image.open(original) as image:
            w, h = image.size
            cycle = max(1, min(w, h) // 4)
            inset, quality = 1 + (copy - 1) % cycle, 90 - ((copy - 1) // cycle) % 40
            image.convert("RGB").crop((inset, inset, w - inset, h - inset)).resize((w, h)).save(target, quality=quality)
    except OSError:
        target.unlink(missing_ok=True)
        return False
    return True


def run_size(size: int, args: argparse.Namespace) -> tuple[list[Stage], dict[str, int]]:
    """Every command on `size` photos, each timed as its own process; the disk they used."""
    work = args.work / str(size)
    photos = grown_folder(args.photos, work / "photos", size)
    records, run, cache = work / "records", work / "run", work / "cache"
    overrides = [item for setting in args.set for item in ("--set", setting)]
    commands = {
        "convert": ["convert", str(photos), str(records), "--val-fraction", "0.1", "--test-fraction", "0.1",
                    "--overwrite"],
        "audit": ["audit", str(photos), "--report", str(work / "audit"), "--weights", str(args.weights)],
        "train": ["train", "--data", str(records), "--out", str(run), "--weights", str(args.weights), "--overwrite",
                  *overrides],
        "evaluate": ["evaluate", str(run), "--data", str(records), "--split", "test", "--report", str(work / "eval")],
        "predict": ["predict", str(run), str(photos), "--output", str(work / "predictions.csv")],
    }  # fmt: skip
    stages = []
    for name, command in commands.items():
        seconds, rss = timed(command, work / f"{name}.log", cache)
        read = load_dataset_info(records).num_examples("test") if name == "evaluate" else size
        stages.append(Stage(size, name, read, seconds, rss))
        print(f"{size} photos: {name} {seconds:.1f} s, peak RSS {rss:.0f} MB", flush=True)
    return stages, {"shards": disk_bytes(records), "feature store": disk_bytes(cache / "features")}


def table(stages: list[Stage], disk: dict[int, dict[str, int]]) -> str:
    """Per command: ms per photo and peak RSS at each size, and the largest size's ÷ the one
    before it (the growth the scaling goals are stated in)."""
    sizes = sorted(disk)
    header = ["command", *(f"{n:,}: ms/photo" for n in sizes), *(f"{n:,}: peak MB" for n in sizes),
              "ms/photo ×", "peak MB ×"]  # fmt: skip
    rows = []
    for command in dict.fromkeys(s.command for s in stages):
        by_size = {s.size: s for s in stages if s.command == command}
        first, last = by_size[sizes[-2] if len(sizes) > 1 else sizes[0]], by_size[sizes[-1]]
        growth = [last.ms_per_photo / first.ms_per_photo, last.peak_rss_mb / first.peak_rss_mb]
        rows.append([command, *(f"{by_size[n].ms_per_photo:.1f}" for n in sizes),
                     *(f"{by_size[n].peak_rss_mb:,.0f}" for n in sizes), *(f"{g:.2f}" for g in growth)])  # fmt: skip
    for kind in ("shards", "feature store"):
        per_photo = [disk[n][kind] / n / 1024 for n in sizes]
        before = per_photo[-2] if len(sizes) > 1 else per_photo[0]
        rows.append([f"{kind}, KB/photo", *(f"{v:.1f}" for v in per_photo), *([""] * len(sizes)),
                     f"{per_photo[-1] / before:.2f}" if before else "", ""])  # fmt: skip
    return format_table([header, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True, help="class folders to grow each size from")
    parser.add_argument("--weights", type=Path, required=True, help="the backbone's weights file (train, audit)")
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated photo counts")
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, --set {' '.join(QUICK_SET)}")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for train (repeatable)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/photoclf-scale"), help="photos, records, runs, logs")
    args = parser.parse_args()
    sizes = list(QUICK_SIZES) if args.quick else sorted(int(n) for n in args.sizes.split(","))
    args.set = [*QUICK_SET, *args.set] if args.quick else args.set
    for flag, path in (("--photos", args.photos), ("--weights", args.weights)):
        if not path.exists():
            raise UserError(f"{flag} {path}: not found")
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    stages, disk = [], {}
    for size in sizes:
        done, disk[size] = run_size(size, args)
        stages += done
    print(table(stages, disk))
    print(json.dumps({"stages": [asdict(s) for s in stages], "disk": disk}))


if __name__ == "__main__":
    run_cli(main)
