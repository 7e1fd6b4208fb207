"""Multi-label on generated scenes: mAP, exact match and the per-label table on held-out photos.

    python -m benchmarks.multilabel --weights mobilenet_v2.weights.h5
    python -m benchmarks.multilabel --weights W --seeds 0,1,2 --photos 600 --image-size 128

Each generated photo holds any of four shapes (circle 50% of photos, square 40%, star 30%,
triangle 20%; some hold none); the split is 60/20/20. Every seed runs fine_tune.py's whole run
(thresholds chosen on validation) and evaluate.py on the test split. Prints one line per seed,
the tables (mean ± sd over seeds) and one JSON line.

How well does a multi-label model find the shapes in a scene? fine_tune.py's whole run (both
phases, thresholds chosen on validation, export) on generated scenes (app/data/multilabel_demo.py),
then evaluate.py on the held-out test split, over seeds: mAP, exact match and per-label F1/AP.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from app.cli import add_weights_and_seeds, run_cli
from app.config import load_config
from app.table import format_table, mean_sd


def _records(tmp: Path, photos: int, image_size: int) -> Path:
    from app.data.multilabel_demo import generate_multilabel_dataset
    from app.data.writer import write_tfrecords

    manifest = generate_multilabel_dataset(tmp / "photos", photos=photos, image_size=image_size)
    write_tfrecords(manifest, tmp / "records", multi_label=True, val_fraction=0.2, test_fraction=0.2, num_shards=2)
    return tmp / "records"


def run_multilabel_benchmark(
    *,
    weights: str,
    seeds: tuple[int, ...],
    photos: int = 600,
    photo_size: int = 128,
    log: Callable[[str], None] = print,
    **fixed: object,
) -> list[dict]:
    """One row per seed: the test split's multi-label metrics (app.evaluation.multilabel)."""
    from app.evaluation.evaluate import evaluate
    from app.training.train import train

    load_config(None, {"weights": weights, **fixed})  # a bad key or value fails now
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        records = _records(tmp, photos, photo_size)
        for seed in seeds:
            cfg = load_config(
                None, {"data": str(records), "out": str(tmp / f"run-{seed}"), "weights": weights, "seed": seed, **fixed}
            )
            with contextlib.redirect_stdout(sys.stderr):  # progress bars; stdout is for the result
                train(cfg)
                metrics = evaluate(cfg.out, records, split="test", report_dir=tmp / f"report-{seed}").metrics
            rows.append(
                {
                    "seed": seed,
                    **{k: metrics[k] for k in ("count", "macro_map", "micro_map", "macro_f1", "exact_match")},
                    "labels": metrics["labels"],
                }
            )
            log(f"seed {seed}: macro mAP {metrics['macro_map']:.3f}, exact match {metrics['exact_match']:.3f}")
    return rows


def format_summary(rows: list[dict]) -> str:
    """Overall figures, then per label (mean ± sd over seeds)."""
    overall = [
        ["test photos", "macro mAP", "micro mAP", "macro F1", "exact match"],
        [
            str(rows[0]["count"]),
            *(mean_sd([r[k] for r in rows]) for k in ("macro_map", "micro_map", "macro_f1", "exact_match")),
        ],
    ]
    per_label = [["label", "support", "threshold", "precision", "recall", "F1", "AP"]]
    for i, label in enumerate(rows[0]["labels"]):
        cells = [
            [r["labels"][i][k] for r in rows] for k in ("threshold", "precision", "recall", "f1", "average_precision")
        ]
        per_label.append(
            [
                label["label"],
                str(label["support"]),
                f"{statistics.mean(cells[0]):.2f}",
                *(mean_sd([v for v in c if v is not None]) for c in cells[1:]),
            ]
        )
    return format_table(overall) + "\n\n" + format_table(per_label)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weights_and_seeds(p)
    p.add_argument("--photos", type=int, default=600, help="generated photos (default 600)")
    p.add_argument("--image-size", type=int, default=128, help="generated and input size in pixels (default 128)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    rows = run_multilabel_benchmark(
        weights=args.weights,
        seeds=args.seeds,
        photos=args.photos,
        photo_size=args.image_size,
        image_size=args.image_size,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(format_summary(rows))
    print(json.dumps({"runs": rows}))


if __name__ == "__main__":
    run_cli(main)
