""" "None of these" on every suite set and both backbones: each score, with a third of the classes
held out, on the frozen pretrained backbone's features.

    python -m benchmarks.ood_suite --shared ../shared                 # every set, both backbones
    python -m benchmarks.ood_suite --shared ../shared --sets food10 --backbones efficientnet_lite0
    python -m benchmarks.ood_suite --shared ../shared --stand-in smoothed   # the probe trained as the head is

Per set (cut as benchmarks.suite cuts it) and backbone, the pooled features of every photo are
computed once with the export's eval decode. Then, per fold (seeds 0, 1, 2: which third of the
classes is held out), a linear probe (the head's stand-in: a multinomial logistic regression,
or with `--stand-in smoothed` one trained with the app's label smoothing, as the head is) and
the feature statistics are fitted on the held-in training photos; in
distribution, the held-in test photos; near, every photo of the held-out classes; far, the test
photos of another suite set (unlike: eurosat5's satellite tiles for the photo sets, flowers17
for eurosat5). Scores: MSP, energy, kNN, Mahalanobis, relative Mahalanobis, the features' length (the log
norm's distance from the val photos', either way, which the shipped gate also reads), their even sum (what
exports shipped before), ASH-S (Djurisic et al. 2023: the top 10% of the pooled activations,
rescaled, then energy), SCALE (Xu et al. 2024: all activations rescaled by the same factor), the
mix a run chooses (app.models.ood_choice: held-out classes within the held-in training and val
photos only), and each of the two with the gate of app.models.ood.combined (what is shipped: the
chosen mix with the gate). The models here are the frozen backbone and a probe, not fine-tuned runs: the
scores' ranking on these features, not a run's figures. Prints per set and backbone the near
and far AUROC of each (mean ± sd over the folds), then a JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy.optimize import minimize
from scipy.special import log_softmax, softmax

from app.cli import run_cli
from app.config import TrainConfig
from app.errors import UserError
from app.models import ood
from app.models.ood_choice import choose_mix
from app.table import format_table, mean_sd
from benchmarks.ood import folder_photos
from benchmarks.suite import SETS, WEIGHTS, cut_folder

SCORES = ("msp", "energy", "knn", "mahalanobis", "relative_mahalanobis", "feature length", "ash_s", "scale",
          "msp+distance, even (shipped before)", "msp+distance, chosen mix + gate",
          "shipped: energy+distance, chosen mix + gate")  # fmt: skip
FAR = {name: "eurosat5" for name in SETS} | {"eurosat5": "flowers17"}
ASH_KEEP, SCALE_KEEP = 0.10, 0.15  # the share of activations ASH-S keeps; SCALE's percentile (85th)
FAR_PHOTOS = 400
PROBE_C = 0.1  # the stand-in's L2 penalty, as scikit-learn's C
SMOOTHING = TrainConfig().label_smoothing  # the head's, by default


def features_model(backbone: str, weights: str):
    """images 0..255 → the frozen backbone's pooled features, at the backbone's own size; built once a set."""
    import keras

    from app.models.backbones import get_backbone
    from app.models.pretrained import load_backbone

    spec = get_backbone(backbone)
    size = spec.default_size
    model, _ = load_backbone(spec, size, weights)
    images = keras.Input((size, size, 3))
    return keras.Model(images, keras.layers.GlobalAveragePooling2D()(model(spec.normalization_layer()(images))))


def pooled_features(paths: list[Path], model, batch: int = 32) -> np.ndarray:
    """`model`'s features of each photo, decoded as the export decodes."""
    import tensorflow as tf

    from app.data.preprocess import DEFAULT_CROP_FRACTION, decode_batch

    size = model.input.shape[1]
    decode = tf.function(lambda b: decode_batch(b, size, DEFAULT_CROP_FRACTION, 100.0), autograph=False)
    rows = []
    for start in range(0, len(paths), batch):
        decoded = decode(tf.constant([p.read_bytes() for p in paths[start : start + batch]]))
        rows.append(model(tf.cast(decoded, tf.float32), training=False).numpy())
    return np.concatenate(rows)


def rescaled(features: np.ndarray, keep: float, prune: bool) -> np.ndarray:
    """ASH-S (prune: only the top `keep` share survives) or SCALE (all kept): scaled by e^(sum / top sum)."""
    k = max(1, int(round(keep * features.shape[1])))
    cut = np.sort(features, axis=1)[:, -k][:, None]
    top = np.where(features >= cut, features, 0.0)
    factor = np.exp(features.sum(axis=1, keepdims=True) / np.maximum(top.sum(axis=1, keepdims=True), 1e-12))
    return (top if prune else features) * factor


class Probe:
    """The head's stand-in: features → logits and probabilities."""

    def __init__(self, features: np.ndarray, labels: np.ndarray, smoothing: float | None) -> None:
        if smoothing is None:
            from sklearn.linear_model import LogisticRegression

            model = LogisticRegression(C=PROBE_C, max_iter=500).fit(features, labels)
            self.decision_function = model.decision_function
        else:
            self.decision_function = smoothed_probe(features, labels, smoothing, PROBE_C)

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        return softmax(self.decision_function(features), axis=1)


def smoothed_probe(features: np.ndarray, labels: np.ndarray, smoothing: float, c: float):
    """A softmax regression trained towards label-smoothed targets, with scikit-learn's penalty
    (1 / (2 C n) of the squared weights, the biases free): features → logits."""
    x = np.asarray(features, np.float64)
    classes, index = np.unique(labels, return_inverse=True)
    target = np.full((len(x), len(classes)), smoothing / len(classes))
    target[np.arange(len(x)), index] += 1.0 - smoothing
    shape, decay = (x.shape[1] + 1, len(classes)), 1.0 / (c * len(x))  # the weights, then the biases' row

    def loss_and_gradient(flat: np.ndarray) -> tuple[float, np.ndarray]:
        weights = flat.reshape(shape)
        logits = x @ weights[:-1] + weights[-1]
        loss = -(target * log_softmax(logits, axis=1)).sum() / len(x) + 0.5 * decay * (weights[:-1] ** 2).sum()
        error = (softmax(logits, axis=1) - target) / len(x)
        return float(loss), np.vstack([x.T @ error + decay * weights[:-1], error.sum(axis=0)]).ravel()

    fitted = minimize(loss_and_gradient, np.zeros(np.prod(shape)), jac=True, method="L-BFGS-B",
                      options={"maxiter": 500}).x.reshape(shape)  # fmt: skip
    return lambda features: np.asarray(features, np.float64) @ fitted[:-1] + fitted[-1]


def fold_scores(
    data: dict, held_out: np.ndarray, far: np.ndarray, seed: int, smoothing: float | None = None
) -> dict[str, tuple[float, float]]:
    """(near AUROC, far AUROC) of each score for one choice of held-out classes; `smoothing`: the
    stand-in's label smoothing (None: a plain logistic regression)."""
    (train_x, train_y), (val_x, val_y), (test_x, test_y) = data["train"], data["val"], data["test"]
    inside = ~np.isin(train_y, held_out)
    near = np.concatenate([x[np.isin(y, held_out)] for x, y in (data["train"], data["val"], data["test"])])
    known = test_x[~np.isin(test_y, held_out)]
    probe = Probe(train_x[inside], train_y[inside], smoothing)
    stats = ood.fit_feature_stats(train_x[inside], train_y[inside], seed)
    val_in = ~np.isin(val_y, held_out)
    held_in = (train_x[inside], train_y[inside]), (val_x[val_in], val_y[val_in])
    val_probabilities, val_logits = probe.predict_proba(val_x[val_in]), probe.decision_function(val_x[val_in])
    fit = functools.partial(ood.fit_shipped, train_x[inside], train_y[inside], val_x[val_in], val_probabilities)
    msp_even = fit(mix=0.5)
    length_mean, length_sd = msp_even.norm_mean, msp_even.norm_std
    fitted = {
        "msp+distance, even (shipped before)": dataclasses.replace(msp_even, gate_weight=0.0),
        "msp+distance, chosen mix + gate": fit(mix=choose_mix(*held_in, seed, energy_head=False).mix),
        "shipped: energy+distance, chosen mix + gate": fit(mix=choose_mix(*held_in, seed).mix, val_logits=val_logits),
    }

    def score(name: str, x: np.ndarray) -> np.ndarray:
        logits = probe.decision_function(x)
        if name in ("ash_s", "scale"):
            return ood.energy(probe.decision_function(rescaled(x, ASH_KEEP if name == "ash_s" else SCALE_KEEP,
                                                               prune=name == "ash_s")))  # fmt: skip
        if name in fitted:
            return fitted[name](probe.predict_proba(x), x, logits)
        if name == "feature length":  # how far the log norm lies from the val photos', either way
            return np.abs(ood.log_norm(x) - length_mean) / length_sd
        return ood.scores(name, probabilities=probe.predict_proba(x), logits=logits, features=x, stats=stats)

    return {name: (ood.auroc(score(name, known), score(name, near)), ood.auroc(score(name, known), score(name, far)))
            for name in SCORES}  # fmt: skip


def measure(
    data: dict, far: np.ndarray, folds: int = 3, smoothing: float | None = None
) -> dict[str, list[tuple[float, float]]]:
    classes = np.unique(data["train"][1])
    per_score: dict[str, list[tuple[float, float]]] = {name: [] for name in SCORES}
    for seed in range(folds):
        held_out = np.random.default_rng(seed).permutation(classes)[: max(1, len(classes) // 3)]
        for name, figures in fold_scores(data, held_out, far, seed, smoothing).items():
            per_score[name].append(figures)
    return per_score


def table(where: str, per_score: dict[str, list[tuple[float, float]]]) -> str:
    rows = [["score", "AUROC near", "AUROC far"]]
    for name, figures in per_score.items():
        rows.append([name, mean_sd([f[0] for f in figures]), mean_sd([f[1] for f in figures])])
    return f"{where} ({len(next(iter(per_score.values())))} folds)\n" + format_table(rows)


def features_of_set(
    shared: Path,
    name: str,
    backbone: str,
    weights: str,
    splits: tuple[str, ...] = ("train", "val", "test"),
    sample: int = 0,
    work: Path | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(features, labels) per split of the set as the suite cuts it; `sample`: that many photos
    of each split, a seeded choice across its classes (the far photos). Kept in `work` and read
    back from there by a later run."""
    kept = work / f"{name}-{backbone}-{'-'.join(splits)}-{sample}.npz" if work else None
    if kept is not None and kept.is_file():
        with np.load(kept) as saved:
            return {split: (saved[f"{split}_x"], saved[f"{split}_y"]) for split in splits}
    found = _compute_features(shared, name, backbone, weights, splits, sample)
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(kept.stem + ".partial.npz")
        np.savez(partial, **{f"{s}_{k}": v for s, (x, y) in found.items() for k, v in (("x", x), ("y", y))})
        partial.rename(kept)
    return found


def _compute_features(
    shared: Path, name: str, backbone: str, weights: str, splits: tuple[str, ...], sample: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    model = features_model(backbone, weights)
    with tempfile.TemporaryDirectory() as tmp:
        cut_folder(shared / "data" / name, Path(tmp), SETS[name], quick=False)
        found = {}
        for split in splits:
            paths, labels = folder_photos(Path(tmp) / split)
            if sample and len(paths) > sample:
                keep = np.sort(np.random.default_rng(0).choice(len(paths), sample, replace=False))
                paths, labels = [paths[i] for i in keep], labels[keep]
            found[split] = (pooled_features(paths, model), labels)
            print(f"{name} {backbone} {split}: {len(paths)} photos", file=sys.stderr, flush=True)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", type=Path, default=Path("../shared"), help="folder with data/ and weights/")
    p.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    p.add_argument("--backbones", default=",".join(WEIGHTS), help=f"comma-separated, of {', '.join(WEIGHTS)}")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "photoclf-suite" / "ood-features",
                   help="where each set's features are kept, so that a second run computes none")  # fmt: skip
    p.add_argument("--gate-quantile", type=float, default=ood.GATE_QUANTILE,
                   help=f"where the shipped score's gate opens (default {ood.GATE_QUANTILE}: the app's)")  # fmt: skip
    p.add_argument("--stand-in", choices=("logistic", "smoothed"), default="logistic",
                   help="the head's stand-in: a logistic regression (default), or one trained with the app's"
                        f" label smoothing ({SMOOTHING}), as the head is")  # fmt: skip
    args = p.parse_args()
    smoothing = SMOOTHING if args.stand_in == "smoothed" else None
    if not 0.0 < args.gate_quantile < 1.0:
        raise UserError(f"--gate-quantile: {args.gate_quantile} is not between 0 and 1")
    ood.GATE_QUANTILE = args.gate_quantile  # read by fit_shipped and choose_mix
    for path in (args.shared / WEIGHTS[b] for b in args.backbones.split(",")):
        if not path.is_file():
            raise UserError(f"--shared: no weights file {path}")
    results = {}
    for backbone in args.backbones.split(","):
        weights = str(args.shared / WEIGHTS[backbone])
        far_sets: dict[str, np.ndarray] = {}
        for name in args.sets.split(","):
            if len(list((args.shared / "data" / name / "train").iterdir())) < 3:
                print(f"{name}: fewer than 3 classes, none can be held out", file=sys.stderr)
                continue
            if FAR[name] not in far_sets:
                found = features_of_set(args.shared, FAR[name], backbone, weights, ("test",), FAR_PHOTOS, args.work)
                far_sets[FAR[name]] = found["test"][0]
            data = features_of_set(args.shared, name, backbone, weights, work=args.work)
            per_score = measure(data, far_sets[FAR[name]], smoothing=smoothing)
            results[f"{name} {backbone}"] = per_score
            print(table(f"{name} {backbone}", per_score), end="\n\n", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    run_cli(main)
