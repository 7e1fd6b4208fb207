"""Out-of-distribution scores: how unlike the training photos an image is (higher: less like them).

A classifier must answer one of its classes; these scores let it say "none of these" instead.
Each is computed from what the model already has:

- `msp`: 1 - the largest (calibrated) probability (Hendrycks & Gimpel 2017).
- `energy`: -T·logsumexp(logits / T) (Liu et al. 2020), T the run's calibration temperature.
- `knn`: 1 - the cosine similarity to the k-th nearest training feature vector (Sun et al. 2022),
  the pooled backbone features, L2-normalised; the bank is a bounded sample of the training set.
- `mahalanobis`: the smallest squared Mahalanobis distance to a class mean of the L2-normalised
  features, with one shared covariance (Lee et al. 2018, on normalised features).
- `relative_mahalanobis`: that distance minus the distance to one Gaussian fitted to all the
  training features (Ren et al. 2021): what sets a photo apart from the classes, less what sets
  it apart from photos in general, which separates unseen classes of the same kind better.

What every export ships (`SHIPPED`; measured by benchmarks.ood and, on every suite set and both
backbones, benchmarks.ood_suite) mixes two of them, each standardised by its mean and spread on
the validation split: `energy` (the head's doubt, at the run's temperature; it led MSP on the
held-out classes of most suite sets) sees a photo the head cannot place, `relative_mahalanobis`
one whose features lie away from every class. Which of the two separates unseen classes of the
same kind better depends on the photos, so the run chooses their mix (app.models.ood_choice). A
gate (`combined`) adds to the score where a photo is more atypical than 97% of the val photos,
in its class distance or in its features' length (the log of their norm, either way: the
distances see only the features' direction, while a picture of another kind often moves the
backbone's activations as a whole), so that another kind of picture is answered unknown whatever
the mix.

The threshold accepts the share of the validation split asked for (95% by default), halfway between
two of its scores: an image scoring above it is "unknown". NumPy here, for measuring and fitting; the
export computes the shipped score in its graph (app.models.layers.OutOfDistributionScore).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METHODS = ("msp", "energy", "knn", "mahalanobis", "relative_mahalanobis")
SHIPPED = "energy+relative_mahalanobis"  # what every export computes: benchmarks/README.md, "None of these"
DEFAULT_ACCEPT = 0.95
KNN_K = 10
BANK_SIZE = 2048  # training feature vectors kept for knn (measured by benchmarks.ood, not exported)
STATS_CHUNK = 8192  # rows normalised and centred at a time by fit_feature_stats


def l2_normalise(features: np.ndarray) -> np.ndarray:
    features = np.asarray(features, np.float32)
    return features / np.maximum(np.linalg.norm(features, axis=-1, keepdims=True), 1e-12)


def msp(probabilities: np.ndarray) -> np.ndarray:
    return 1.0 - np.asarray(probabilities, np.float32).max(axis=-1)


def energy(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, np.float64) / temperature
    top = z.max(axis=-1, keepdims=True)
    return (-temperature * (top[:, 0] + np.log(np.exp(z - top).sum(axis=-1)))).astype(np.float32)


def knn(features: np.ndarray, bank: np.ndarray, k: int = KNN_K) -> np.ndarray:
    """`bank` already L2-normalised; 1 - cosine similarity to the k-th nearest."""
    similarity = l2_normalise(features) @ np.asarray(bank, np.float32).T
    k = min(k, similarity.shape[1])
    return 1.0 - np.sort(similarity, axis=1)[:, -k]


@dataclass(frozen=True)
class ClassDistance:
    """d_c(z) = zᵀQz - 2 z·b_c + k_c for the L2-normalised features z, smallest over the classes c:
    the form both Mahalanobis scores take (one [N, D] × [D, D] product, no [N, C, D] differences),
    and what the export's layer computes."""

    quadratic: np.ndarray  # Q [D, D]
    linear: np.ndarray  # b [C, D]
    constant: np.ndarray  # k [C]

    def __call__(self, features: np.ndarray) -> np.ndarray:
        z = l2_normalise(features).astype(np.float64)
        distances = ((z @ self.quadratic) * z).sum(axis=1, keepdims=True) - 2 * z @ self.linear.T
        return (distances + self.constant[None, :]).min(axis=1).astype(np.float32)


def class_distance(
    means: np.ndarray,
    precision: np.ndarray,
    background_mean: np.ndarray | None = None,
    background_precision: np.ndarray | None = None,
) -> ClassDistance:
    """(z - μc)ᵀP(z - μc), less (z - μ0)ᵀP0(z - μ0) where a background Gaussian is given."""
    precision, means = np.asarray(precision, np.float64), np.asarray(means, np.float64)
    linear = means @ precision
    quadratic, constant = precision, (linear * means).sum(axis=1)
    if background_mean is not None:
        p0, m0 = np.asarray(background_precision, np.float64), np.asarray(background_mean, np.float64)
        quadratic, linear, constant = quadratic - p0, linear - m0 @ p0, constant - m0 @ p0 @ m0
    return ClassDistance(quadratic, linear, constant)


@dataclass(frozen=True)
class FeatureStats:
    """What the feature-based scores need from the training set."""

    bank: np.ndarray  # [M, D] L2-normalised training features, M <= BANK_SIZE
    means: np.ndarray  # [C, D] class means of the normalised features
    precision: np.ndarray  # [D, D] inverse of the shared (shrunk) covariance
    background_mean: np.ndarray  # [D] mean of all the normalised features
    background_precision: np.ndarray  # [D, D] inverse of their (shrunk) covariance

    def distance(self, relative: bool) -> ClassDistance:
        background = (self.background_mean, self.background_precision) if relative else ()
        return class_distance(self.means, self.precision, *background)


def fit_feature_stats(features: np.ndarray, labels: np.ndarray, seed: int = 0) -> FeatureStats:
    """The statistics of the L2-normalised features (float64), worked out STATS_CHUNK rows at a
    time: a run's views are held once, as they came, never as normalised and centred copies."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    kept = np.sort(rng.choice(len(features), BANK_SIZE, replace=False)) if len(features) > BANK_SIZE else slice(None)
    classes, place = np.unique(labels, return_inverse=True)
    sums = np.zeros((len(classes), features.shape[1]))
    for at, z in _normalised_chunks(features):
        sums += np.eye(len(classes))[place[at]].T @ z
    means = sums / np.bincount(place, minlength=len(classes))[:, None]
    background_mean = sums.sum(axis=0) / max(len(features), 1)
    within, background = np.zeros((2, features.shape[1], features.shape[1]))
    for at, z in _normalised_chunks(features):
        within += _scatter(z - means[place[at]])
        background += _scatter(z - background_mean)
    precision, background_precision = (_shrunk_precision(m, len(features)) for m in (within, background))
    return FeatureStats(l2_normalise(features[kept]), means, precision, background_mean, background_precision)


def _normalised_chunks(features: np.ndarray):
    for start in range(0, len(features), STATS_CHUNK):
        at = slice(start, start + STATS_CHUNK)
        yield at, l2_normalise(features[at]).astype(np.float64)


def _scatter(centred: np.ndarray) -> np.ndarray:
    return centred.T @ centred


def _shrunk_precision(scatter: np.ndarray, count: int) -> np.ndarray:
    """The inverse of the covariance whose scatter matrix (sum of the centred rows' outer
    products) over `count` rows is given, shrunk towards a multiple of the identity."""
    covariance = scatter / max(count - 1, 1)
    shrink = 0.1 * np.trace(covariance) / covariance.shape[0]  # fewer photos than dimensions: regularise
    return np.linalg.inv(covariance + shrink * np.eye(covariance.shape[0]))


def scores(
    method: str,
    *,
    probabilities: np.ndarray,
    logits: np.ndarray,
    features: np.ndarray,
    stats: FeatureStats,
    temperature: float = 1.0,
) -> np.ndarray:
    if method == "msp":
        return msp(probabilities)
    if method == "energy":
        return energy(logits, temperature)
    if method == "knn":
        return knn(features, stats.bank)
    if method in ("mahalanobis", "relative_mahalanobis"):
        return stats.distance(relative=method == "relative_mahalanobis")(features)
    raise ValueError(f"unknown OOD method '{method}', expected one of {METHODS}")


def log_norm(features: np.ndarray) -> np.ndarray:
    """The log of each feature vector's length: what the L2-normalised distances leave out."""
    return np.log(np.maximum(np.linalg.norm(np.asarray(features, np.float64), axis=-1), 1e-12)).astype(np.float32)


def threshold_for(in_distribution: np.ndarray, accept: float = DEFAULT_ACCEPT) -> float:
    """A threshold at or under which `ceil(accept * n)` of these (validation) photos fall, placed
    halfway between the last score it accepts and the next higher one, never on a photo's score:
    on a score, the last bits of another CPU or runtime would decide that photo's side. Tied
    scores cannot be split, so a tie across the cut is accepted whole (at least `accept`)."""
    if not 0.0 < accept <= 1.0:
        raise ValueError(f"accept must be in (0, 1], got {accept}")
    ordered = np.sort(np.asarray(in_distribution, np.float64))
    if not len(ordered):
        raise ValueError("no scores to place a threshold among")
    last = ordered[max(int(np.ceil(accept * len(ordered) - 1e-9)), 1) - 1]
    higher = ordered[ordered > last]
    if len(higher):
        return float((last + higher[0]) / 2)
    return float(last + _margin(ordered))


def _margin(ordered: np.ndarray) -> float:
    """Past the highest score, as far as the scores' mean gap (a unit of their own scale)."""
    spread = float(ordered[-1] - ordered[0])
    return spread / len(ordered) if spread > 0 else max(abs(float(ordered[-1])), 1.0) * 1e-3


def auroc(in_distribution: np.ndarray, out_of_distribution: np.ndarray) -> float:
    """P(an OOD photo scores higher than an in-distribution one), ties counted half."""
    a, b = np.asarray(in_distribution, np.float64), np.asarray(out_of_distribution, np.float64)
    ranks = _average_ranks(np.concatenate([a, b]))
    return float((ranks[len(a) :].sum() - len(b) * (len(b) + 1) / 2) / (len(a) * len(b)))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    unique, inverse = np.unique(values, return_inverse=True)
    sums = np.bincount(inverse, ranks)
    counts = np.bincount(inverse)
    return (sums / counts)[inverse] if len(unique) < len(values) else ranks


def fpr_at_tpr(in_distribution: np.ndarray, out_of_distribution: np.ndarray, tpr: float = 0.95) -> float:
    """Share of OOD photos accepted when the threshold accepts `tpr` of the in-distribution ones."""
    return float((np.asarray(out_of_distribution) <= threshold_for(in_distribution, tpr)).mean())


@dataclass(frozen=True)
class ShippedScore:
    """Everything the export's score needs: the class distance (relative Mahalanobis) and, per
    part, its validation mean and standard deviation, its weight; the gate; the threshold. The
    head's part is `energy` of the logits at the run's temperature where `energy_head`, else `msp`
    (runs fitted before energy)."""

    distance: ClassDistance
    head_mean: float
    head_std: float
    distance_mean: float
    distance_std: float
    threshold: float
    accept: float
    head_weight: float = 1.0  # 2 x (1 - mix) and 2 x mix (app.models.ood_choice); 1 and 1: the even sum
    distance_weight: float = 1.0
    gate_at: float = 0.0  # the standardised atypicality past which the gate adds (GATE_QUANTILE of val)
    gate_weight: float = 0.0  # what each standard deviation past it adds; 0: no gate (runs fitted before it)
    energy_head: bool = False
    temperature: float = 1.0  # energy's, the run's calibration temperature
    norm_mean: float = 0.0  # the val photos' log feature length, its mean and spread;
    norm_std: float = 0.0  # 0: the gate sees the distance alone (runs fitted before)

    def head(self, probabilities: np.ndarray, logits: np.ndarray | None) -> np.ndarray:
        if not self.energy_head:
            return msp(probabilities)
        if logits is None:
            raise ValueError("this score's head part is energy: it needs the logits")
        return energy(logits, self.temperature)

    @property
    def scales(self) -> Scales:
        return (self.head_mean, self.head_std), (self.distance_mean, self.distance_std), (self.norm_mean, self.norm_std)

    def __call__(self, probabilities: np.ndarray, features: np.ndarray, logits: np.ndarray | None = None) -> np.ndarray:
        z = z_scores(score_parts(self.head(probabilities, logits), self.distance, features), self.scales)
        return combined(z, self.head_weight, self.distance_weight, self.gate_at, self.gate_weight)

    def to_arrays(self) -> dict[str, np.ndarray]:
        scalars = {k: np.float64(v) for k, v in vars(self).items() if k != "distance"}
        return {**{k: np.asarray(v, np.float32) for k, v in vars(self.distance).items()}, **scalars}

    @staticmethod
    def from_arrays(arrays) -> ShippedScore:
        """Also reads the arrays of runs fitted before: the plain Mahalanobis distance (its class
        means and precision), the head part named msp, no weights or gate, so that their exports are
        rebuilt with the score they were fitted with."""
        if "means" in arrays:
            distance = class_distance(arrays["means"], arrays["precision"])
            names = ("msp_mean", "msp_std", "mahalanobis_mean", "mahalanobis_std")
        else:
            distance = ClassDistance(*(np.asarray(arrays[k], np.float64) for k in ("quadratic", "linear", "constant")))
            head = "head" if "head_mean" in arrays else "msp"
            names = (f"{head}_mean", f"{head}_std", "distance_mean", "distance_std")
        parts = (float(arrays[k]) for k in names)
        optional = {"head_weight": arrays.get("head_weight", arrays.get("msp_weight", 1.0)),
                    **{k: arrays.get(k, default) for k, default in (("distance_weight", 1.0), ("gate_at", 0.0),
                       ("gate_weight", 0.0), ("energy_head", 0.0), ("temperature", 1.0), ("norm_mean", 0.0),
                       ("norm_std", 0.0))}}  # fmt: skip
        rest = {k: bool(v) if k == "energy_head" else float(v) for k, v in optional.items()}
        return ShippedScore(distance, *parts, float(arrays["threshold"]), float(arrays["accept"]), **rest)


GATE_QUANTILE = 0.97  # of the val photos' atypicality: where the gate opens (benchmarks/README.md)
GATE_WEIGHT = 4.0

Parts = tuple[np.ndarray, np.ndarray, np.ndarray]  # the head's doubt, the class distance, the log feature length
Scales = tuple[tuple[float, float], tuple[float, float], tuple[float, float]]  # each part's val mean and spread
ZScores = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]


def score_parts(head: np.ndarray, distance: ClassDistance, features: np.ndarray) -> Parts:
    """What the shipped score is made of, for these photos: the head's part as given."""
    return head, distance(features), log_norm(features)


def standardised(values: np.ndarray) -> tuple[float, float]:
    """Mean and spread (1 where there is none) of a part on the val photos."""
    return float(values.mean()), float(values.std()) or 1.0


def part_scales(parts: Parts) -> Scales:
    """Each part's mean and spread on these (validation) photos."""
    head, distance, norm = (standardised(p) for p in parts)
    return head, distance, norm


def z_scores(parts: Parts, scales: Scales) -> ZScores:
    """The parts standardised: the head's and the distance's signed, the length's either way
    (None where it has no spread recorded: runs fitted before it joined the gate)."""
    (head, distance, norm), ((m1, s1), (m2, s2), (m3, s3)) = parts, scales
    return (head - m1) / s1, (distance - m2) / s2, np.abs(norm - m3) / s3 if s3 else None


def atypicality(z: ZScores) -> np.ndarray:
    """What the gate reads: the standardised class distance, or the feature length's standardised
    distance from the val photos' (either way), whichever is larger."""
    _, z_distance, z_norm = z
    return z_distance if z_norm is None else np.maximum(z_distance, z_norm)


def gate_opening(val_z: ZScores) -> float:
    """Where the gate opens: the val photos' atypicality at GATE_QUANTILE."""
    return float(np.quantile(atypicality(val_z), GATE_QUANTILE))


def combined(z: ZScores, head_weight: float, distance_weight: float, gate_at: float, gate_weight: float) -> np.ndarray:
    """The shipped score from its standardised parts: the weighted sum, plus the gate, which adds
    `gate_weight` per standard deviation of atypicality past `gate_at`. Whatever the mix, a photo
    more atypical than 97% of the val photos (a far one: another kind of picture) gains on the
    others, while the mix ranks photos within the val photos' range."""
    gate = gate_weight * np.maximum(atypicality(z) - gate_at, 0.0)
    return (head_weight * z[0] + distance_weight * z[1] + gate).astype(np.float32)


def fit_shipped(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    val_features: np.ndarray,
    val_probabilities: np.ndarray,
    accept: float = DEFAULT_ACCEPT,
    mix: float = 0.5,
    val_logits: np.ndarray | None = None,
    temperature: float = 1.0,
) -> ShippedScore:
    """Feature statistics on the training split; standardisation, gate and threshold on
    validation. `mix`: the class distance's share (0: the head's part alone; 0.5: the plain
    sum); with `val_logits` the head's part is energy at `temperature`, else MSP."""
    distance = fit_feature_stats(train_features, train_labels).distance(relative=True)
    head = energy(val_logits, temperature) if val_logits is not None else msp(val_probabilities)
    parts = score_parts(head, distance, val_features)
    scales = part_scales(parts)
    z = z_scores(parts, scales)
    w1, w2, gate_at = 2 * (1 - mix), 2 * mix, gate_opening(z)
    threshold = threshold_for(combined(z, w1, w2, gate_at, GATE_WEIGHT), accept)
    (m1, s1), (m2, s2), (m3, s3) = scales
    energy_head = val_logits is not None
    return ShippedScore(distance, m1, s1, m2, s2, threshold, accept, w1, w2, gate_at, GATE_WEIGHT, energy_head,
                        temperature, m3, s3)  # fmt: skip
