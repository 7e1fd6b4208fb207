"""An active-learning curve: labels chosen by `photoclf review`'s ranking against labels chosen at random.

    python -m benchmarks.active_learning ../shared/data/flowers17 --weights $PHOTOCLF_WEIGHTS

FOLDER is a photo folder already split (train/ and test/, one subfolder per class). The
training photos are the unlabelled pool; the test photos are never chosen from. The pretrained
backbone's features of each photo (the evaluation decode) are computed once. Per seed: both
strategies start from the same --start photos per class; each round adds --round photos, chosen
by the review's ranking (uncertainty by margin, one photo of each burst first: app/review/ranking.py)
or at random, and retrains the head warm (logistic regression on standardised features,
starting from the previous round's weights), then scores it on the test photos. This is phase 1
of a run, not a whole run: the ranking is what is measured, not the training. Prints test
accuracy per round (mean ± sd over seeds) and how many labels the ranking needed to reach
random selection's final accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from app.cli import add_weights_and_seeds, run_cli
from app.errors import UserError
from app.table import format_table, mean_sd

STRATEGIES = ("ranked", "random")


def photos_of(folder: Path, split: str) -> tuple[list[Path], np.ndarray, list[str]]:
    classes = sorted(p.name for p in (folder / split).iterdir() if p.is_dir())
    paths, labels = [], []
    for index, name in enumerate(classes):
        for path in sorted(p for p in (folder / split / name).iterdir() if p.is_file()):
            paths.append(path)
            labels.append(index)
    return paths, np.array(labels), classes


def features_and_signatures(paths: list[Path], weights: str, size: int = 224) -> tuple[np.ndarray, np.ndarray]:
    """The pretrained MobileNetV2's pooled features of each photo's evaluation decode, and the
    ranking's near-duplicate signature of each."""
    import tensorflow as tf

    from app.data.display import open_photo
    from app.data.preprocess import decode_for_eval
    from app.models.backbones import get_backbone
    from app.models.classifier import build_classifier
    from app.models.pretrained import load_pretrained_backbone
    from app.review.ranking import SIGNATURE_SIDE, signature

    spec = get_backbone("mobilenet_v2")
    pretrained = load_pretrained_backbone(spec, size, weights)
    if pretrained.warning:
        raise UserError(f"--weights: {pretrained.warning}")
    features_model = build_classifier(spec, pretrained.model, 2, size, 0.0).features_model
    extract = tf.function(lambda images: features_model(tf.cast(images, tf.float32), training=False))
    features, signatures = [], []
    for start in range(0, len(paths), 32):
        data = [p.read_bytes() for p in paths[start : start + 32]]
        features.append(extract(tf.stack([decode_for_eval(d, size) for d in data])).numpy())
        signatures += [signature(open_photo(d, max_side=4 * SIGNATURE_SIDE)) for d in data]
    return np.concatenate(features), np.stack(signatures)


def first_labels(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    return np.concatenate(
        [rng.choice(np.flatnonzero(labels == c), per_class, replace=False) for c in np.unique(labels)]
    )


def choose(strategy: str, probe, pool: np.ndarray, x: np.ndarray, signatures: np.ndarray, count: int, rng):
    """`count` photos of `pool` (indices into x): the review's order, or a random draw."""
    from app.review.ranking import diverse_order, priority

    if strategy == "random":
        return rng.choice(pool, min(count, len(pool)), replace=False)
    order = diverse_order(priority(probe.predict_proba(x[pool]), method="margin"), signatures[pool])
    return pool[order[:count]]


def curve(strategy: str, data: dict, seed: int, start: int, per_round: int, rounds: int) -> list[tuple[int, float]]:
    """(labels, test accuracy) after the first fit and after each round, the head retrained warm."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(seed)
    labelled = first_labels(data["train_y"], start, rng)
    probe = LogisticRegression(C=1.0, max_iter=500, warm_start=True)
    points = []
    for round_no in range(rounds + 1):
        if round_no:
            pool = np.setdiff1d(np.arange(len(data["train_y"])), labelled)
            labelled = np.concatenate([labelled, choose(strategy, probe, pool, data["train_x"],
                                                        data["signatures"], per_round, rng)])  # fmt: skip
        probe.fit(data["train_x"][labelled], data["train_y"][labelled])
        points.append((len(labelled), float((probe.predict(data["test_x"]) == data["test_y"]).mean())))
    return points


def labels_to_reach(points: list[tuple[int, float]], target: float) -> int | None:
    return next((n for n, accuracy in points if accuracy >= target), None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="photos split into train/ and test/, one subfolder per class")
    add_weights_and_seeds(p)
    p.add_argument("--start", type=int, default=5, help="labelled photos per class at the start (default 5)")
    p.add_argument("--round", type=int, default=50, help="photos labelled per round (default 50)")
    p.add_argument("--rounds", type=int, default=8, help="rounds (default 8)")
    args = p.parse_args()
    for split in ("train", "test"):
        if not (args.folder / split).is_dir():
            raise UserError(f"{args.folder}: no {split}/ folder; FOLDER must be split into train/ and test/")
    run_benchmark(args.folder, args.weights, list(args.seeds), args.start, args.round, args.rounds)


def run_benchmark(folder: Path, weights: str, seeds: list[int], start: int, per_round: int, rounds: int) -> dict:
    from sklearn.preprocessing import StandardScaler

    begun = time.perf_counter()
    train_paths, train_y, classes = photos_of(folder, "train")
    test_paths, test_y, _ = photos_of(folder, "test")
    train_x, signatures = features_and_signatures(train_paths, weights)
    test_x, _ = features_and_signatures(test_paths, weights)
    scaler = StandardScaler().fit(train_x)  # unsupervised: the pool's features, no labels
    data = {"train_x": scaler.transform(train_x), "train_y": train_y, "signatures": signatures,
            "test_x": scaler.transform(test_x), "test_y": test_y}  # fmt: skip
    print(f"{len(train_paths)} pool photos, {len(test_paths)} test photos, {len(classes)} classes;"
          f" features in {time.perf_counter() - begun:.0f} s", flush=True)  # fmt: skip
    curves = {s: [curve(s, data, seed, start, per_round, rounds) for seed in seeds] for s in STRATEGIES}
    print(format_table(_table(curves)))
    target = float(np.mean([c[-1][1] for c in curves["random"]]))
    mean_ranked = [(n, float(np.mean([c[i][1] for c in curves["ranked"]]))) for i, (n, _) in
                   enumerate(curves["ranked"][0])]  # fmt: skip
    needed = labels_to_reach(mean_ranked, target)
    final_labels = curves["random"][0][-1][0]
    said = f"{needed} labels ({needed / final_labels:.0%})" if needed else "not within the rounds"
    print(f"\nrandom selection's final mean accuracy {target:.4f} at {final_labels} labels; the ranking reaches it"
          f" with {said}")  # fmt: skip
    return {"curves": curves, "target": target, "needed": needed, "final_labels": final_labels}


def _table(curves: dict) -> list[list[str]]:
    rows = [["labels", "ranked (review)", "random"]]
    for i, (labels, _) in enumerate(curves["ranked"][0]):
        cells = [mean_sd([c[i][1] for c in curves[s]]) for s in STRATEGIES]
        rows.append([str(labels), *cells])
    return rows


if __name__ == "__main__":
    sys.exit(run_cli(main))
