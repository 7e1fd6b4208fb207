"""Phone-sized photos against the web-sized originals: one model's accuracy, top-1 agreement and
the images/s of `photoclf predict` and `photoclf evaluate` on each.

    python -m benchmarks.large_photos PHOTOS RUN_DIR [--runtime litert] [--rounds 3] [--repeat 1]

PHOTOS is a folder of class folders (a held-out split of real photos). Each photo gets a
4000×3000 (or 3000×4000) copy, bicubic, JPEG quality 90, in a temporary folder: upscaled photos
hold less detail than real 12-megapixel ones, but cost the same to decode. Then, over `--rounds`
rounds, each command runs as its own process on the originals and on the copies in turn, timed
from start to end (start-up included, as a user waits for it). `--repeat N` lists every photo N
times (symbolic links), so that a few hundred photos make a workload where the commands' start-up
no longer hides their images/s. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.cli import run_cli
from app.errors import UserError
from app.table import format_table
from benchmarks.common import SCRIPTS

PHONE_SIZE = (4000, 3000)  # a 12-megapixel photo, landscape


def phone_size(width: int, height: int) -> tuple[int, int]:
    """The copy's size: 4000×3000 for a landscape (or square) photo, 3000×4000 for a portrait one."""
    return PHONE_SIZE if width >= height else PHONE_SIZE[::-1]


def upscale_tree(src: Path, out: Path) -> int:
    """A phone-sized JPEG copy of every readable photo under `src`, same relative path (.jpg)."""
    from PIL import Image

    count = 0
    for path in sorted(p for p in src.rglob("*") if p.is_file() and not p.name.startswith(".")):
        try:
            with Image.open(path) as image:
                photo = image.convert("RGB")
        except OSError:
            continue
        dest = (out / path.relative_to(src)).with_suffix(".jpg")
        dest.parent.mkdir(parents=True, exist_ok=True)
        photo.resize(phone_size(*photo.size), Image.Resampling.BICUBIC).save(dest, quality=90)
        count += 1
    return count


def repeated_tree(src: Path, out: Path, times: int) -> Path:
    """`out` holding `times` symbolic links to every file under `src`, as `stem~k.ext` beside
    each other; `src` itself when `times` is 1."""
    if times == 1:
        return src
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        folder = out / path.parent.relative_to(src)
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(times):
            (folder / f"{path.stem}~{k}{path.suffix}").symlink_to(path.resolve())
    return out


def top1_by_photo(predictions_csv: Path) -> dict[str, str]:
    """{class/stem: top-1 label} from `photoclf predict`'s CSV: a photo and its copy share a key."""
    with predictions_csv.open(newline="") as f:
        return {f"{Path(r['path']).parent.name}/{Path(r['path']).stem}": r["label_1"] for r in csv.DictReader(f)}


def accuracy(top1: dict[str, str]) -> float:
    return sum(key.split("/")[0] == label for key, label in top1.items()) / max(len(top1), 1)


def agreement(originals: dict[str, str], copies: dict[str, str]) -> float:
    """The share of photos whose copy gets the same top-1 label."""
    return sum(copies.get(key) == label for key, label in originals.items()) / max(len(originals), 1)


def _timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def run_benchmark(photos: Path, run_dir: Path, runtime: str, rounds: int, tmp: Path, repeat: int = 1) -> dict:
    copies = tmp / "phone"
    count = upscale_tree(photos, copies)
    if not count:
        raise UserError(f"{photos}: no photos found")
    photos, copies = repeated_tree(photos, tmp / "original-x", repeat), repeated_tree(copies, tmp / "phone-x", repeat)
    count *= repeat
    seconds: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, folder in (("original", photos), ("phone", copies)):
            predict = [sys.executable, str(SCRIPTS / "predict.py"), str(run_dir), str(folder), "--runtime", runtime]
            seconds.setdefault(f"predict {name}", []).append(_timed([*predict, "--output", str(tmp / f"{name}.csv")]))
            evaluate = [sys.executable, str(SCRIPTS / "evaluate.py"), str(run_dir), "--data", str(folder)]
            evaluate += ["--runtime", runtime, "--report", str(tmp / f"report-{name}")]
            seconds.setdefault(f"evaluate {name}", []).append(_timed(evaluate))
    originals, phone = top1_by_photo(tmp / "original.csv"), top1_by_photo(tmp / "phone.csv")
    medians = {key: statistics.median(values) for key, values in seconds.items()}
    return {
        "photos": count,
        "runtime": runtime,
        "accuracy_original": round(accuracy(originals), 4),
        "accuracy_phone": round(accuracy(phone), 4),
        "agreement": round(agreement(originals, phone), 4),
        "seconds": {key: round(value, 2) for key, value in medians.items()},
        "images_per_s": {key: round(count / value, 1) for key, value in medians.items()},
    }


def format_result(result: dict) -> str:
    rows = [
        [command, f"{result['seconds'][f'{command} original']:.1f}", f"{result['seconds'][f'{command} phone']:.1f}",
         f"{result['images_per_s'][f'{command} original']:.1f}", f"{result['images_per_s'][f'{command} phone']:.1f}",
         f"{result['seconds'][f'{command} original'] / result['seconds'][f'{command} phone']:.2f}x"]
        for command in ("predict", "evaluate")
    ]  # fmt: skip
    header = ["command", "s, original", "s, phone", "img/s, original", "img/s, phone", "phone / original"]
    table = format_table([header, *rows])
    return (
        f"{result['photos']} photos, runtime {result['runtime']}: accuracy {result['accuracy_original']:.4f} original,"
        f" {result['accuracy_phone']:.4f} phone-sized; top-1 agreement {result['agreement']:.4f}\n{table}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("photos", type=Path, help="folder of class folders (a held-out split)")
    p.add_argument("run_dir", type=Path, help="a finished run (or an export) of a model for those classes")
    p.add_argument("--runtime", choices=["litert", "tf", "auto"], default="litert", help="(default litert)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported (default 3)")
    p.add_argument("--repeat", type=int, default=1, help="times each photo is listed (default 1)")
    args = p.parse_args()
    if not args.photos.is_dir():
        raise UserError(f"{args.photos}: no such folder")
    if args.repeat < 1:
        raise UserError(f"--repeat must be >= 1, got {args.repeat}")
    with tempfile.TemporaryDirectory(prefix="photoclf-large-photos-") as tmp:
        result = run_benchmark(args.photos, args.run_dir, args.runtime, args.rounds, Path(tmp), args.repeat)
    print(format_result(result))
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli(main)
