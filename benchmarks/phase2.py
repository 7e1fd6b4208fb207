"""Does phase 2 pay on your photos? Phase 1 vs kept (after phase 2) validation accuracy and loss.

    python -m benchmarks.phase2 SPLIT_FOLDER --weights mobilenet_v2.weights.h5
    python -m benchmarks.phase2 SPLIT_FOLDER --weights W --per-class 10,20,50 \\
        --variant defaults --variant ema:ema_decay=0.99 --variant acc:select_by=val_accuracy

SPLIT_FOLDER holds train/ and val/, each with one folder per class. For each size (photos per
class in train/; val/ is used whole) and seed, every variant trains on the same subset, through
fine_tune.py's phases (no export). Up to --test-per-class of the training photos a subset
leaves out are its held-out test split (validation chose the kept epochs; test chose nothing).
Prints one line per run, a table (mean ± sd over seeds; the gain of phase 2 in validation
images; test accuracy after phase 1 and at the end) and one JSON line.

Does phase 2 pay? Phase 1 vs phase 2 validation accuracy and loss, per training-set size and
config variant, over seeds, on the user's own photos.

For each photos-per-class size and seed, the training split is cut to that many photos per
class (a seeded choice; validation stays whole), written to TFRecords once, and every variant
trains on it in turn (variants alternate within each seed), through the same phases as
fine_tune.py without the export. Validation chose each kept epoch, so its figures flatter a
variant that selects more eagerly (e.g. by accuracy); up to `test_per_class` of the training
photos the subset left out form a held-out test split, read once after phase 1 and once at the
end, which chose nothing. Accuracy and loss are of the kept weights; "phase 2's own best" is
the best epoch phase 2 reached, whether or not it was kept.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.cli import add_weights_and_seeds, int_list, run_cli
from app.config import TrainConfig, load_config
from app.errors import UserError
from app.table import mean_sd
from benchmarks.common import Variant, check_split_folder, parse_variant, subset_folder


def _records(folder: Path, per_class: int, seed: int, tmp: Path, test_per_class: int) -> tuple[Path, int]:
    """TFRecords of the subset, and how many training photos it holds (unreadable files are skipped)."""
    from app.data.writer import write_tfrecords

    photos = subset_folder(folder, tmp / f"photos-{per_class}-{seed}", per_class, seed, test_per_class)
    out = tmp / f"records-{per_class}-{seed}"
    metadata = write_tfrecords(photos, out, num_shards=2)
    return out, sum(metadata["counts"]["train"].values())


def _batch_size(train_images: int) -> dict[str, int]:
    """The default 32, or the largest power of two that fits a smaller training split
    (fine_tune.py refuses a batch larger than the split)."""
    return {} if train_images >= 32 else {"batch_size": 2 ** (train_images.bit_length() - 1)}


def _one_run(cfg: TrainConfig) -> dict:
    from app.run_dir import read_history
    from app.training.context import setup
    from app.training.train import evaluate_split, run_phase1, run_phase2

    ctx = setup(cfg, overwrite=True)
    held_out = ctx.info.num_examples("test") > 0
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # progress bars; stdout is for the result
        phase1 = run_phase1(ctx)
        test1 = evaluate_split(ctx, "test").accuracy if held_out else None  # phase 1's kept weights
        phase2 = run_phase2(ctx, phase1)
        test2 = evaluate_split(ctx, "test").accuracy if held_out else None
    own = [float(row["val_accuracy"]) for row in read_history(ctx.run.history) if row["phase"] == "2"]
    return {
        "p1_accuracy": phase1.val_accuracy,
        "p1_loss": phase1.val_loss,
        "p2_accuracy": phase2.val_accuracy,
        "p2_loss": phase2.val_loss,
        "p1_test_accuracy": test1,
        "p2_test_accuracy": test2,
        "test_images": ctx.info.num_examples("test"),
        "p2_own_best_accuracy": max(own),
        "p2_epochs": phase2.epochs,
        "p2_seconds": phase2.seconds,
        "seconds": time.perf_counter() - start,
        "val_images": ctx.info.num_examples("val"),
    }


def run_phase2_benchmark(
    folder: Path,
    *,
    weights: str,
    variants: list[Variant],
    per_class: tuple[int, ...],
    seeds: tuple[int, ...],
    test_per_class: int = 100,
    log: Callable[[str], None] = print,
    **fixed: object,
) -> list[dict]:
    """One row per (variant, size, seed). `fixed`: config keys for every run (e.g. image_size)."""
    folder = Path(folder)
    check_split_folder(folder)
    if weights not in ("auto", "imagenet", "none") and not Path(weights).is_file():
        raise UserError(f"--weights: no such file {weights}")
    for _, overrides in variants:  # a bad key or value fails now, not after the first runs
        load_config(None, {**fixed, **overrides})
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for n in per_class:
            for seed in seeds:
                records, train_images = _records(folder, n, seed, tmp, test_per_class)
                for name, overrides in variants:
                    cfg = load_config(
                        None,
                        {
                            "data": str(records),
                            "out": str(tmp / "run"),
                            "weights": weights,
                            "seed": seed,
                            "calibrate": False,
                            "feature_store": "run",  # timed cold: no features from the variant before
                            **_batch_size(train_images),
                            **fixed,
                            **overrides,
                        },
                    )
                    row = {"variant": name, "per_class": n, "seed": seed, **_one_run(cfg)}
                    rows.append(row)
                    test = (
                        f"; test {row['p1_test_accuracy']:.3f} -> {row['p2_test_accuracy']:.3f}"
                        if row["test_images"]
                        else ""
                    )
                    log(
                        f"{name} {n}/class seed {seed}: val {row['p1_accuracy']:.3f} -> kept {row['p2_accuracy']:.3f}"
                        f" (phase 2's own best {row['p2_own_best_accuracy']:.3f}){test}, {row['seconds']:.0f}s"
                    )
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per (variant, size): mean and spread over seeds; the phase-2 gain also in validation images."""
    out = []
    for key in dict.fromkeys((r["variant"], r["per_class"]) for r in rows):
        group = [r for r in rows if (r["variant"], r["per_class"]) == key]
        gain = statistics.mean((r["p2_accuracy"] - r["p1_accuracy"]) * r["val_images"] for r in group)
        out.append(
            {
                "variant": key[0],
                "per_class": key[1],
                "seeds": len(group),
                "phase1_accuracy": mean_sd([r["p1_accuracy"] for r in group]),
                "phase2_accuracy": mean_sd([r["p2_accuracy"] for r in group]),
                "gain_images": round(gain, 1),
                **_test_summary(group),
                "phase1_loss": mean_sd([r["p1_loss"] for r in group]),
                "phase2_loss": mean_sd([r["p2_loss"] for r in group]),
                "phase2_own_best": mean_sd([r["p2_own_best_accuracy"] for r in group]),
                "phase2_epochs": round(statistics.mean(r["p2_epochs"] for r in group), 1),
                "phase2_seconds": round(statistics.median(r["p2_seconds"] for r in group), 1),
            }
        )
    return out


def _test_summary(group: list[dict]) -> dict:
    """Held-out test accuracy after phase 1 and of the kept model, where every seed had a test split."""
    if not all(r["test_images"] for r in group):
        return {"phase1_test_accuracy": "-", "phase2_test_accuracy": "-", "test_images": 0}
    return {
        "phase1_test_accuracy": mean_sd([r["p1_test_accuracy"] for r in group]),
        "phase2_test_accuracy": mean_sd([r["p2_test_accuracy"] for r in group]),
        "test_images": min(r["test_images"] for r in group),
    }


def format_summary(summary: list[dict]) -> str:
    from app.table import format_table

    head = [
        "variant",
        "per class",
        "phase 1 val acc",
        "kept val acc",
        "gain (images)",
        "phase 1 val loss",
        "kept val loss",
        "phase 2's own best",
        "phase 1 test acc",
        "kept test acc",
        "phase-2 epochs",
        "phase-2 s",
    ]
    keys = [
        "variant",
        "per_class",
        "phase1_accuracy",
        "phase2_accuracy",
        "gain_images",
        "phase1_loss",
        "phase2_loss",
        "phase2_own_best",
        "phase1_test_accuracy",
        "phase2_test_accuracy",
        "phase2_epochs",
        "phase2_seconds",
    ]
    return format_table([head] + [[str(s[k]) for k in keys] for s in summary])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="folder with train/ and val/ class folders")
    add_weights_and_seeds(p)
    p.add_argument(
        "--per-class", type=int_list, default=(10, 20, 50), help="training photos per class (default 10,20,50)"
    )
    p.add_argument(
        "--test-per-class",
        type=int,
        default=100,
        help="training photos left out of a subset that form its held-out test split (default 100; 0 = none)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=None,
        help="NAME or NAME:key=value,... (config keys, as fine_tune.py --set); repeatable (default: defaults)",
    )
    p.add_argument("--image-size", type=int, default=224, help="input size (default 224)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    try:
        variants = [parse_variant(v) for v in args.variant or ["defaults"]]
    except ValueError as err:
        p.error(str(err))
    rows = run_phase2_benchmark(
        args.folder,
        weights=args.weights,
        variants=variants,
        per_class=args.per_class,
        seeds=args.seeds,
        test_per_class=args.test_per_class,
        image_size=args.image_size,
        log=lambda m: print(m, file=sys.stderr),
    )
    summary = summarise(rows)
    print(format_summary(summary))
    print(json.dumps({"summary": summary, "runs": rows}))


if __name__ == "__main__":
    run_cli(main)
