"""What the README's commands give on the small photo sets people bring (25 photos a class), and
how honest its confidences are on other photos of the same classes.

python -m benchmarks.small_data ../shared/data/flowers17 ../shared/data/food10 --seeds 0,1

For each set and seed: the first `--classes` classes, `--per-class` training photos of each
(seeded choice), converted with the README's fractions (`--val-fraction 0.1 --test-fraction 0.1`)
and trained with the defaults; then the model is evaluated on the set's own held-out photos of
those classes (its test/ split, else val/), which chose nothing. Printed per run and as a mean:
the split sizes the converter made, the temperature the run serves (1 where it fitted none)
and the one a fit on its val photos finds, and on the held-out photos accuracy, log loss and
expected calibration error as served, at T = 1 and at the fitted T.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from app.table import format_table, mean_sd

README_FRACTIONS = ["--val-fraction", "0.1", "--test-fraction", "0.1"]


def _photos(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _link(files: list[Path], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        (folder / f.name).symlink_to(f.resolve())


def make_sets(source: Path, work: Path, classes: int, per_class: int, seed: int) -> tuple[Path, Path]:
    """(a class-folder set of `per_class` photos a class, a pre-split tree whose test/ holds the
    source's held-out photos of those classes)."""
    names = sorted(p.name for p in (source / "train").iterdir() if p.is_dir())[:classes]
    held_split = "test" if (source / "test").is_dir() else "val"
    small, held = work / "photos", work / "held"
    for name in names:
        files = _photos(source / "train" / name)
        random.Random(f"{seed}:{name}").shuffle(files)
        _link(files[:per_class], small / name)
        _link(files[:2], held / "train" / name)  # the converter needs a train and a val split
        _link(files[2:4], held / "val" / name)
        _link(_photos(source / held_split / name), held / "test" / name)
    return small, held


def photoclf(*args: str, log: Path) -> None:
    with log.open("a") as sink:
        command = [sys.executable, "-c", "from app.commands import main; main()", *args]
        subprocess.run(command, check=True, stdout=sink, stderr=subprocess.STDOUT)


def run_one(source: Path, seed: int, classes: int, per_class: int, work: Path) -> dict:
    from app.evaluation.evaluate import evaluate

    small, held = make_sets(source, work, classes, per_class, seed)
    log = work / "log.txt"
    photoclf("convert", str(small), str(work / "data"), *README_FRACTIONS, "--seed", str(seed), log=log)
    photoclf("convert", str(held), str(work / "held-data"), log=log)
    photoclf("train", "--data", str(work / "data"), "--out", str(work / "run"), "--set", f"seed={seed}", log=log)
    dataset = json.loads((work / "data" / "dataset.json").read_text())
    metrics = json.loads((work / "run" / "metrics.json").read_text())
    result = evaluate(work / "run", work / "held-data", split="test", report_dir=work / "report")
    found, calibration = result.metrics, result.metrics.get("calibration") or {}
    return {
        **_with_a_fitted_temperature(work / "run", result.predictions, metrics),
        "set": source.name,
        "seed": seed,
        "val_photos": sum(dataset["counts"]["val"].values()),
        "test_photos": sum(dataset["counts"].get("test", {}).values()),
        "temperature": (metrics.get("calibration") or {}).get("temperature", 1.0),
        "held_photos": found["num_examples"],
        "accuracy": found["accuracy"],
        "log_loss": found["log_loss"],
        "log_loss_without_t": calibration.get("log_loss_uncalibrated", found["log_loss"]),
        "ece": found["ece"],
        "ece_without_t": calibration.get("ece_uncalibrated", found["ece"]),
    }


def _with_a_fitted_temperature(run: Path, predictions, metrics: dict) -> dict:
    """What a temperature fitted on the run's val photos (the kept epoch's saved val outputs)
    gives on the held-out photos: shown beside the run's own choice, whatever it was."""
    import numpy as np

    from app.evaluation.metrics import expected_calibration_error, log_loss, reliability_bins, softmax
    from app.training.calibration import fit_temperature

    saved = sorted((run / "checkpoints").glob("phase2_best_*.val_outputs.npz")) or sorted(
        (run / "checkpoints").glob("phase1_best_*.val_outputs.npz")
    )
    with np.load(saved[-1]) as val:
        fitted = fit_temperature(val["logits"].astype(np.float64), val["labels"])
    served_t = (metrics.get("calibration") or {}).get("temperature", 1.0)
    logits = np.log(np.clip(predictions.probabilities.astype(np.float64), 1e-30, 1.0)) * served_t  # T undone
    probabilities = softmax(logits / fitted)
    return {
        "fitted_temperature": fitted,
        "log_loss_fitted_t": log_loss(predictions.labels, probabilities),
        "ece_fitted_t": expected_calibration_error(reliability_bins(predictions.labels, probabilities)),
    }


def table(rows: list[dict]) -> str:
    head = ["set", "seed", "val", "test", "T served", "T fitted", "held", "accuracy"]
    head += ["log loss served", "T = 1", "T fitted", "ECE served", "T = 1", "T fitted"]
    keys = ("accuracy", "log_loss", "log_loss_without_t", "log_loss_fitted_t", "ece", "ece_without_t", "ece_fitted_t")
    lines = [
        [r["set"], r["seed"], r["val_photos"], r["test_photos"], f"{r['temperature']:.3f}"]
        + [f"{r['fitted_temperature']:.3f}", r["held_photos"]]
        + [f"{r[k]:.4f}" for k in keys]
        for r in rows
    ]
    lines.append(["mean ± sd", "", "", "", "", "", ""] + [mean_sd([r[k] for r in rows]) for k in keys])
    return format_table([head, *lines])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sets", nargs="+", type=Path, help="split photo folders (train/, val/[, test/] of class folders)")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    p.add_argument("--classes", type=int, default=6, help="classes taken from each set (default 6)")
    p.add_argument("--per-class", type=int, default=25, help="photos a class (default 25)")
    args = p.parse_args()
    rows = []
    for source in args.sets:
        for seed in (int(s) for s in args.seeds.split(",")):
            with tempfile.TemporaryDirectory(prefix="photoclf-small-") as work:
                rows.append(run_one(source, seed, args.classes, args.per_class, Path(work)))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
