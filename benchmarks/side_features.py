"""Do side features pay? Image-only, side-features-only and fused models, on held-out test photos.

    python -m benchmarks.side_features --weights mobilenet_v2.weights.h5
    python -m benchmarks.side_features --weights W --seeds 0,1,2 --per-class 100 --noise 0.6

The data is generated (app/data/side_demo.py): circles and squares, each row with a numeric
`reading` and a categorical `site`; the label is the shape together with a level that only the
side features carry, so neither the photo nor the side features alone can be right more than
about half the time (with --task threshold the level is exactly the sign of `reading`, and the
table adds the ceiling: the image-only model's accuracy on the shape alone). Prints one line
per run, a table (mean ± sd over seeds) and one JSON line.

Do side features pay? Image-only, side-features-only and fused models on a generated dataset
whose label needs both (app/data/side_demo.py), over seeds, on the held-out test split.

The dataset is written to TFRecords twice from one manifest and one split: with its side
features (the fused model, as fine_tune.py trains it) and without (the image-only model, the
same phases on the same images). The side-features-only model is the fused model's side
branch and head alone (SideFeatureEncoding → Dense → logits), trained with Adam on the same
training rows and stopped on validation loss. Validation chose every kept epoch; test chose nothing.

The ceiling is the image-only model's accuracy on the shape alone (a prediction counts when it
names the right shape, whatever its level): with `task="threshold"` the level is exactly the
sign of one column, so a fused model that learnt the threshold reaches it.

With `--photos DIR` (a real photo set split into train/, val/ and test/ class folders) the
photos are real and the side features carry nothing: two numeric columns drawn from N(0, 1) and
one categorical column of five values, drawn once per photo and independent of its class. A
side path that costs accuracy there costs it on every dataset whose columns say little.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.cli import add_weights_and_seeds, run_cli
from app.config import load_config
from app.table import mean_sd

MODELS = ("image only", "side features only", "fused")
CEILING = "ceiling (image only, shape)"


def _records(tmp: Path, per_class: int, noise: float, task: str) -> tuple[Path, Path]:
    from app.data.side_demo import FEATURE_COLUMNS, generate_side_feature_dataset

    manifest = generate_side_feature_dataset(tmp / "photos", per_class=per_class, noise=noise, task=task)
    return _written_twice(manifest, tmp, FEATURE_COLUMNS, val_fraction=0.2, test_fraction=0.2)


def _written_twice(manifest: Path, tmp: Path, columns: str, **split: float) -> tuple[Path, Path]:
    """The manifest's photos as TFRecords with its side-feature `columns` and without, in one split."""
    from app.data.writer import write_tfrecords

    fused, image_only = tmp / "records-fused", tmp / "records-image-only"
    for out, written in ((fused, columns), (image_only, None)):
        write_tfrecords(manifest, out, num_shards=2, feature_columns=written, **split)
    return fused, image_only


NOISE_COLUMNS = "n1,n2,site:categorical"


def noise_manifest(photos: Path, manifest: Path, train_per_class: int, seed: int = 0) -> Path:
    """A manifest of `photos` (train/, val/, test/ of class folders; the first `train_per_class`
    training photos of each class, sorted by name) with columns that carry nothing: n1 and n2
    from N(0, 1), site one of five values, drawn per photo from `seed` alone."""
    from app.data.sources import class_dirs, list_files

    rng = np.random.default_rng(seed)
    rows = []
    for split in ("train", "val", "test"):
        for folder in class_dirs(photos / split):
            files = list_files(folder)
            for f in files[:train_per_class] if split == "train" else files:
                n1, n2 = rng.normal(size=2)
                rows.append([str(f.resolve()), folder.name, split, f"{n1:.4f}", f"{n2:.4f}", "abcde"[rng.integers(5)]])
    with manifest.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerows([["path", "label", "split", "n1", "n2", "site"], *rows])
    return manifest


def _photo_records(tmp: Path, photos: Path, train_per_class: int) -> tuple[Path, Path]:
    return _written_twice(noise_manifest(photos, tmp / "noise.csv", train_per_class), tmp, NOISE_COLUMNS)


def shape_accuracy(confusion: np.ndarray, classes: list[str]) -> float:
    """Share of predictions that name the right shape ("circle_low" for "circle_high" counts)."""
    shapes = np.array([c.split("_")[0] for c in classes])
    return float(confusion[shapes[:, None] == shapes[None, :]].sum() / confusion.sum())


def _trained_test_accuracy(
    data: Path, out: Path, seed: int, weights: str, fixed: dict
) -> tuple[float, float, float, bool | None]:
    """(val, test, test shape) accuracy of fine_tune.py's phases (no export) on `data`, and
    whether the side features stayed in the model (None without them)."""
    from app.training.context import setup
    from app.training.side_check import SidePath
    from app.training.train import evaluate_split, run_phase1, run_phase2

    cfg = load_config(
        None, {"data": str(data), "out": str(out), "weights": weights, "seed": seed, "calibrate": False, **fixed}
    )
    ctx = setup(cfg, overwrite=True)
    side_path = SidePath.of_run(ctx)
    with contextlib.redirect_stdout(sys.stderr):  # progress bars; stdout is for the result
        kept = run_phase1(ctx, side_path=side_path)
        if cfg.epochs_finetune:
            kept = run_phase2(ctx, kept)
        test = evaluate_split(ctx, "test")
        side_kept = side_path.open if side_path else None
        return kept.val_accuracy, test.accuracy, shape_accuracy(test.confusion_matrix, ctx.info.classes), side_kept


def _side_rows(data: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    from app.data.pipeline import make_eval_dataset

    sides, labels = [], []
    for inputs, y in make_eval_dataset(data, split=split, image_size=32, batch_size=256):
        sides.append(inputs["side"].numpy())
        labels.append(y.numpy())
    return np.concatenate(sides), np.concatenate(labels)


def _side_only_accuracy(data: Path, seed: int) -> tuple[float, float]:
    """(val, test) accuracy of the side branch and head alone, early-stopped on val loss."""
    import keras

    from app.data.pipeline import load_dataset_info
    from app.models.classifier import SIDE_UNITS
    from app.models.layers import SideFeatureEncoding

    info = load_dataset_info(data)
    keras.utils.set_random_seed(seed)
    side = keras.Input((info.side_width,), name="side")
    hidden = keras.layers.Dense(SIDE_UNITS, activation="relu")(SideFeatureEncoding(info.side_features)(side))
    model = keras.Model(side, keras.layers.Dense(len(info.classes))(hidden))
    model.compile(
        keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    (x, y), val, test = (_side_rows(data, s) for s in ("train", "val", "test"))
    stop = keras.callbacks.EarlyStopping(patience=20, restore_best_weights=True)
    model.fit(x, y, validation_data=val, epochs=300, batch_size=32, callbacks=[stop], verbose=0)
    return model.evaluate(*val, verbose=0)[1], model.evaluate(*test, verbose=0)[1]


def run_side_benchmark(
    *,
    weights: str,
    seeds: tuple[int, ...],
    per_class: int = 100,
    noise: float = 0.6,
    task: str = "levels",
    photos: Path | None = None,
    log: Callable[[str], None] = print,
    **fixed: object,
) -> list[dict]:
    """One row per (model, seed), the three models alternating within each seed, and the ceiling
    (generated shapes only). `photos`: real photos with columns that carry nothing instead, the
    first `per_class` training photos of each class."""
    load_config(None, {"weights": weights, **fixed})  # a bad key or value fails now
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        fused, image_only = _photo_records(tmp, photos, per_class) if photos else _records(tmp, per_class, noise, task)
        for seed in seeds:
            for model in MODELS:
                side_kept = None
                if model == "side features only":
                    val, test = _side_only_accuracy(fused, seed)
                else:
                    data = fused if model == "fused" else image_only
                    val, test, shape, side_kept = _trained_test_accuracy(data, tmp / "run", seed, weights, fixed)
                    if model == "image only" and not photos:
                        rows.append({"model": CEILING, "seed": seed, "val_accuracy": None, "test_accuracy": shape})
                rows.append({"model": model, "seed": seed, "val_accuracy": val, "test_accuracy": test})
                said = "" if side_kept is None else f" (side features {'kept' if side_kept else 'left out'})"
                log(f"{model}, seed {seed}: val {val:.3f}, test {test:.3f}{said}")
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for model in (*MODELS, CEILING):
        group = [r for r in rows if r["model"] == model]
        if not group:
            continue
        vals = [r["val_accuracy"] for r in group if r["val_accuracy"] is not None]
        out.append(
            {
                "model": model,
                "seeds": len(group),
                "val_accuracy": mean_sd(vals) if vals else "-",
                "test_accuracy": mean_sd([r["test_accuracy"] for r in group]),
            }
        )
    return out


def format_summary(summary: list[dict]) -> str:
    from app.table import format_table

    head = ["model", "seeds", "val accuracy", "test accuracy"]
    return format_table(
        [head] + [[str(s[k]) for k in ("model", "seeds", "val_accuracy", "test_accuracy")] for s in summary]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weights_and_seeds(p)
    p.add_argument(
        "--per-class",
        type=int,
        default=100,
        help="generated photos per class, 4 classes; with --photos, training photos per class (default 100)",
    )
    p.add_argument(
        "--photos",
        type=Path,
        help="real photos (train/, val/, test/ of class folders) with side features that carry nothing",
    )
    p.add_argument(
        "--noise", type=float, default=0.6, help="sd of `reading` around its level's mean of ±1 (default 0.6)"
    )
    p.add_argument(
        "--task",
        choices=("levels", "threshold"),
        default="levels",
        help="levels: `reading` drawn around the level's mean (default); threshold: the level is exactly"
        " the sign of `reading`, and the table's ceiling is reachable",
    )
    p.add_argument("--image-size", type=int, default=128, help="input size (default 128)")
    p.add_argument("--epochs-head", type=int, default=15, help="phase-1 epochs (default 15)")
    p.add_argument("--epochs-finetune", type=int, default=0, help="phase-2 epochs (default 0: phase 1 only)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other fine_tune.py config key for the image-only and fused runs; repeatable",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from app.config import parse_set

    rows = run_side_benchmark(
        weights=args.weights,
        seeds=args.seeds,
        per_class=args.per_class,
        noise=args.noise,
        task=args.task,
        photos=args.photos,
        log=lambda m: print(m, file=sys.stderr),
        **{
            "image_size": args.image_size,
            "epochs_head": args.epochs_head,
            "epochs_finetune": args.epochs_finetune,
            **parse_set(args.set),
        },
    )
    summary = summarise(rows)
    print(format_summary(summary))
    print(json.dumps({"summary": summary, "runs": rows}))


if __name__ == "__main__":
    run_cli(main)
