"""The usual Keras transfer-learning recipe vs fine_tune.py's defaults, on your photos.

    python -m benchmarks.recipes SPLIT_FOLDER --weights mobilenet_v2.weights.h5
    python -m benchmarks.recipes SPLIT_FOLDER --weights W --train-per-class 20   # little data
    python -m benchmarks.recipes SPLIT_FOLDER --weights lite0.npz --backbone efficientnet_lite0

SPLIT_FOLDER holds train/ and val/, each with one folder per class. The usual recipe is
TensorFlow's "Transfer learning and fine-tuning" tutorial (benchmarks/usual_recipe.py); both use
the same backbone (the tutorial's MobileNetV2 unless --backbone), weights file and image size.
Prints per round, then a table (wall time, time to reach the usual recipe's final val accuracy,
final val accuracy, ratios) and one JSON line.

The usual recipe (benchmarks/usual_recipe.py) vs fine_tune.py's defaults on the same photos.

Each run is its own process, timed from its start to its end, imports and set-up included, as
a user waits for them; the variants alternate over rounds and medians are reported. Per run:
wall time, the time until a validation accuracy at least the usual recipe's final one was first
printed, and the final validation accuracy of the model each delivers (the recipe keeps its last
weights, fine_tune.py its best). Converting the JPEG folders to TFRecords, which fine_tune.py
needs and the recipe does not, is timed once and added to fine_tune.py's wall time. Both get the
same photos: train/ and val/ (a test/ folder beside them is left out, as the usual recipe reads
none, so fine_tune.py converts and evaluates no test split either).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.cli import run_cli
from app.errors import UserError
from app.run_dir import RunDir
from benchmarks.common import SCRIPTS, TUTORIAL_BACKBONE, check_split_folder, subset_folder

# The usual recipe runs with TensorFlow's own CPU allocator, as a user's copy of the tutorial
# does (importing `app` switches it to BFC; this keeps the baseline's allocator pinned either way).
USUAL_ENVIRONMENT = {"TF_CPU_ALLOCATOR_USE_BFC": "false"}
VAL_ACCURACY = re.compile(r"\bval_accuracy ([0-9.]+)")  # the per-epoch line both runs print


@dataclass
class Trace:
    seconds: float  # wall time of the whole process
    epochs: list[tuple[float, float]]  # (seconds since start, val accuracy) per finished epoch
    final_val_accuracy: float = float("nan")

    def time_to_reach(self, target: float) -> float | None:
        return next((t for t, accuracy in self.epochs if accuracy >= target - 1e-9), None)


def _trace(cmd: list[str], environment: dict[str, str] | None = None) -> Trace:
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", **(environment or {})},
    )
    epochs, final = [], float("nan")
    for line in proc.stdout:
        if line.startswith("final_val_accuracy"):
            final = float(line.split()[1])
        elif match := VAL_ACCURACY.search(line):
            epochs.append((time.perf_counter() - start, float(match.group(1))))
    stderr = proc.stderr.read()
    if proc.wait():
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {stderr[-2000:]}")
    return Trace(time.perf_counter() - start, epochs, final)


def _ours(records: Path, run: Path, weights: str, backbone: str, image_size: int, seed: int) -> Trace:
    trace = _trace(
        [
            sys.executable,
            str(SCRIPTS / "fine_tune.py"),
            "--data",
            str(records),
            "--out",
            str(run),
            "--backbone",
            backbone,
            "--weights",
            weights,
            "--image-size",
            str(image_size),
            "--set",
            f"seed={seed}",
            "--set",
            "feature_store=run",  # timed cold: no features from an earlier run
            "--overwrite",
        ]
    )
    metrics = RunDir(run).read_metrics()
    trace.final_val_accuracy = (metrics.get("phase2") or metrics["phase1"])["val_accuracy"]
    return trace


def _rounds(
    folder: Path,
    records: Path,
    tmp: Path,
    *,
    weights: str,
    backbone: str,
    image_size: int,
    rounds: int,
    seed: int,
    recipe_epochs: tuple[int, int],
    log: Callable[[str], None],
) -> list[tuple[Trace, Trace]]:
    pairs = []
    for r in range(rounds):
        usual = _trace(
            [
                sys.executable,
                "-m",
                "benchmarks.usual_recipe",
                str(folder),
                weights,
                str(image_size),
                str(seed),
                *map(str, recipe_epochs),
                backbone,
            ],
            USUAL_ENVIRONMENT,
        )
        ours = _ours(records, tmp / f"run{r}", weights, backbone, image_size, seed)
        pairs.append((usual, ours))
        log(
            f"round {r + 1}/{rounds}: usual recipe {usual.seconds:.0f}s val {usual.final_val_accuracy:.4f};"
            f" fine_tune.py {ours.seconds:.0f}s val {ours.final_val_accuracy:.4f}"
        )
    return pairs


def _summary(pairs: list[tuple[Trace, Trace]], convert_seconds: float) -> dict:
    usual_s = statistics.median(u.seconds for u, _ in pairs)
    ours_s = statistics.median(o.seconds for _, o in pairs) + convert_seconds
    reach = [o.time_to_reach(u.final_val_accuracy) for u, o in pairs]
    reach_s = statistics.median(t + convert_seconds for t in reach) if None not in reach else None
    return {
        "usual_seconds": round(usual_s, 1),
        "ours_seconds": round(ours_s, 1),
        "convert_seconds": round(convert_seconds, 1),
        "time_ratio": round(ours_s / usual_s, 3),
        "ours_seconds_to_reach_usual_accuracy": None if reach_s is None else round(reach_s, 1),
        "usual_val_accuracy": round(statistics.mean(u.final_val_accuracy for u, _ in pairs), 4),
        "ours_val_accuracy": round(statistics.mean(o.final_val_accuracy for _, o in pairs), 4),
        "rounds": len(pairs),
    }


def run_recipe_benchmark(
    folder: Path,
    *,
    weights: str,
    backbone: str = TUTORIAL_BACKBONE,
    image_size: int = 224,
    train_per_class: int | None = None,
    rounds: int = 2,
    seed: int = 0,
    recipe_epochs: tuple[int, int] = (10, 10),
    log: Callable[[str], None] = print,
) -> dict:
    """`recipe_epochs`: the usual recipe's epochs per phase, the tutorial's (10, 10) unless a test shortens them."""
    folder = Path(folder)
    check_split_folder(folder)
    if not Path(weights).is_file():
        raise UserError(f"--weights: no such file {weights} (both recipes load the same backbone file)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        # train/ and val/ only: the usual recipe reads no test/, so ours converts and evaluates none either
        folder = subset_folder(folder, tmp / "photos", train_per_class, seed)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, str(SCRIPTS / "make_tfrecords.py"), str(folder), str(tmp / "records")],
            check=True,
            capture_output=True,
        )
        convert_seconds = time.perf_counter() - start
        pairs = _rounds(
            folder,
            tmp / "records",
            tmp,
            weights=weights,
            backbone=backbone,
            image_size=image_size,
            rounds=rounds,
            seed=seed,
            recipe_epochs=recipe_epochs,
            log=log,
        )
    return _summary(pairs, convert_seconds)


def format_result(result: dict) -> str:
    from app.table import format_table

    reach = result["ours_seconds_to_reach_usual_accuracy"]
    rows = [
        ["", "wall time (s)", "time to the usual accuracy (s)", "final val accuracy"],
        [
            "usual recipe",
            f"{result['usual_seconds']:.0f}",
            f"{result['usual_seconds']:.0f}",
            f"{result['usual_val_accuracy']:.4f}",
        ],
        [
            "fine_tune.py",
            f"{result['ours_seconds']:.0f}",
            "never" if reach is None else f"{reach:.0f}",
            f"{result['ours_val_accuracy']:.4f}",
        ],
        [
            "ratio",
            f"{result['time_ratio']:.2f}x",
            "" if reach is None else f"{reach / result['usual_seconds']:.2f}x",
            f"{result['ours_val_accuracy'] - result['usual_val_accuracy']:+.4f}",
        ],
    ]
    return (
        format_table(rows)
        + f"\n(fine_tune.py times include {result['convert_seconds']:.0f}s of make_tfrecords.py)\n"
        + json.dumps(result)
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="folder with train/ and val/ class folders")
    p.add_argument("--weights", required=True, help="the backbone's (no top) weights file both recipes start from")
    p.add_argument(
        "--backbone",
        default=TUTORIAL_BACKBONE,
        help=f"registry key of the backbone both recipes use (default {TUTORIAL_BACKBONE}, the tutorial's)",
    )
    p.add_argument("--image-size", type=int, default=224, help="input size for both (default 224)")
    p.add_argument(
        "--train-per-class", type=int, default=None, help="train on this many photos per class (default all)"
    )
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds; medians reported (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed for both recipes and the subset (default 0)")
    args = p.parse_args()

    result = run_recipe_benchmark(
        args.folder,
        weights=args.weights,
        backbone=args.backbone,
        image_size=args.image_size,
        train_per_class=args.train_per_class,
        rounds=args.rounds,
        seed=args.seed,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(format_result(result))


if __name__ == "__main__":
    run_cli(main)
