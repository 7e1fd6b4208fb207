"""How much of the shipped "none of these" score is the class distance, chosen per data set by
holding classes out of the run's own features.

The shipped score mixes two standardised parts (app.models.ood): `energy` (the head cannot place
the photo) and `relative_mahalanobis` (its features lie away from every class). Which part
separates unseen classes better depends on the photos: no one mix was best on every photo set
measured (benchmarks/README.md, "None of these on every set"). So the run measures it: about
a third of the classes at a time are held out; a linear probe (the head's stand-in) and the
feature statistics are fitted on the training rows of the rest; each mix's AUROC of the held-in
val photos against the held-out classes' photos is averaged over the folds, and the best mix is
shipped. It reads the pooled features the fit already has, so it costs seconds, not a pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import softmax

from app.models import ood

MIXES = (0.0, 0.25, 0.5, 0.75, 1.0)  # share of the class distance; 0 = energy alone, 1 = the distance alone
FEW_CLASSES_MIX = 0.0  # energy alone (with the gate): where classes are too few to hold any out, and on ties
MIN_CLASSES = 6  # with fewer, a probe on the two to four left behaves unlike the head (eurosat5's 5 classes)
FOLDS = 3
PROBE_ROWS = 4000  # training rows the probe fits on, at most (a seeded sample)


@dataclass(frozen=True)
class MixChoice:
    mix: float
    auroc: dict[float, float]  # each mix's mean AUROC over the folds (empty: not measured)
    reason: str

    def to_dict(self) -> dict:
        return {"mix": self.mix, "auroc_by_mix": {f"{m:g}": round(a, 4) for m, a in self.auroc.items()},
                "reason": self.reason}  # fmt: skip


def choose_mix(
    train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray], seed: int = 0, energy_head: bool = True
) -> MixChoice:
    """The mix with the best mean held-out-classes AUROC; `train` and `val` are (features, labels);
    the head's part is energy, or MSP without `energy_head` (what exports shipped before)."""
    classes = np.unique(train[1])
    if len(classes) < MIN_CLASSES:
        return MixChoice(FEW_CLASSES_MIX, {}, f"{len(classes)} classes: too few to hold a third out, so energy alone")
    folds = np.array_split(np.random.default_rng(seed).permutation(classes), min(FOLDS, len(classes)))
    per_fold = [_fold_aurocs(train, val, held_out, seed, energy_head) for held_out in folds]
    auroc = {m: float(np.mean([fold[m] for fold in per_fold])) for m in MIXES}
    best = max(MIXES, key=lambda m: (round(auroc[m], 3), -m))  # ties: the smaller share of the distance
    reason = (
        f"held out a third of the classes at a time ({len(folds)} folds): mean AUROC {auroc[best]:.3f} at"
        f" mix {best:g}, energy alone {auroc[0.0]:.3f}, the even mix {auroc[0.5]:.3f}"
    )
    return MixChoice(best, auroc, reason)


def _fold_aurocs(
    train: tuple[np.ndarray, np.ndarray],
    val: tuple[np.ndarray, np.ndarray],
    held_out: np.ndarray,
    seed: int,
    energy_head: bool,
) -> dict[float, float]:
    """Each mix's AUROC: probe and statistics fitted on the held-in training rows; in distribution,
    the held-in val photos; out of it, every photo of the held-out classes."""
    inside, known = ~np.isin(train[1], held_out), ~np.isin(val[1], held_out)
    features, labels = train[0][inside], train[1][inside]
    probe = _fit_probe(features, labels, seed)
    distance = ood.fit_feature_stats(features, labels, seed).distance(relative=True)
    unseen = np.concatenate([val[0][~known], train[0][~inside]])
    head = ood.energy if energy_head else (lambda logits: ood.msp(softmax(logits, axis=1)))
    parts_known, parts_unseen = (ood.score_parts(head(probe(x)), distance, x) for x in (val[0][known], unseen))
    scales = ood.part_scales(parts_known)
    z_known, z_unseen = ood.z_scores(parts_known, scales), ood.z_scores(parts_unseen, scales)
    gate_at = ood.gate_opening(z_known)

    def mixed(z: ood.ZScores, mix: float) -> np.ndarray:
        return ood.combined(z, 2 * (1 - mix), 2 * mix, gate_at, ood.GATE_WEIGHT)

    return {m: ood.auroc(mixed(z_known, m), mixed(z_unseen, m)) for m in MIXES}


def _fit_probe(features: np.ndarray, labels: np.ndarray, seed: int):
    """A multinomial logistic regression on the L2-normalised features: features → logits."""
    from sklearn.linear_model import LogisticRegression

    if len(features) > PROBE_ROWS:
        keep = np.sort(np.random.default_rng(seed).choice(len(features), PROBE_ROWS, replace=False))
        features, labels = features[keep], labels[keep]
    scale = 16.0  # unit-length features scaled so that an L2 penalty of C = 1 leaves the classes apart
    model = LogisticRegression(C=1.0, max_iter=300).fit(scale * ood.l2_normalise(features), labels)

    def logits(x: np.ndarray) -> np.ndarray:
        found = model.decision_function(scale * ood.l2_normalise(x))
        return np.stack([np.zeros_like(found), found], axis=1) if found.ndim == 1 else found  # two classes: one column

    return logits
