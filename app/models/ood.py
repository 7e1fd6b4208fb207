"""Out-of-distribution scores: how unlike the training photos an image is (higher: less like them).

A classifier must answer one of its classes; these scores let it say "none of these" instead.
Each is computed from what the model already has:

- `msp`: 1 - the largest (calibrated) probability (Hendrycks & Gimpel 2017).
- `energy`: -T·logsumexp(logits / T) (Liu et al. 2020), T the run's calibration temperature.
- `knn`: 1 - the cosine similarity to the k-th nearest training feature vector (Sun et al. 2022),
  the pooled backbone features, L2-normalised; the bank is a bounded sample of the training set.
- `mahalanobis`: the smallest squared Mahalanobis distance to a class mean of the L2-normalised
  features, with one shared covariance (Lee et al. 2018, on normalised features).

What every export ships (`SHIPPED`, chosen by benchmarks.ood: on flowers17 with 5 species held
out it was the only score at least MSP's on both near and far photos) is the sum of two of them,
each standardised by its mean and spread on the validation split: `msp` sees a photo the head
cannot place, `mahalanobis` one whose features lie away from every class.

The threshold is the validation split's shipped score at the acceptance rate asked for (95% by
default): an image scoring above it is "unknown". NumPy here, for measuring and fitting; the
export computes the shipped score in its graph (app.models.layers.OutOfDistributionScore).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METHODS = ("msp", "energy", "knn", "mahalanobis")
SHIPPED = "msp+mahalanobis"  # what every export computes: benchmarks/README.md, "None of these"
DEFAULT_ACCEPT = 0.95
KNN_K = 10
BANK_SIZE = 2048  # training feature vectors kept for knn (measured by benchmarks.ood, not exported)


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


def mahalanobis(features: np.ndarray, means: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """min over classes of (z - μc)ᵀ P (z - μc), expanded as zᵀPz - 2 zᵀPμc + μcᵀPμc (as the
    export's layer computes it: one [N, D] × [D, D] product, no [N, C, D] differences)."""
    z = l2_normalise(features).astype(np.float64)
    precision, means = np.asarray(precision, np.float64), np.asarray(means, np.float64)
    projected = z @ precision
    distances = (projected * z).sum(axis=1, keepdims=True) - 2 * projected @ means.T
    return (distances + ((means @ precision) * means).sum(axis=1)[None, :]).min(axis=1).astype(np.float32)


@dataclass(frozen=True)
class FeatureStats:
    """What the feature-based scores need from the training set."""

    bank: np.ndarray  # [M, D] L2-normalised training features, M <= BANK_SIZE
    means: np.ndarray  # [C, D] class means of the normalised features
    precision: np.ndarray  # [D, D] inverse of the shared (shrunk) covariance


def fit_feature_stats(features: np.ndarray, labels: np.ndarray, seed: int = 0) -> FeatureStats:
    z = l2_normalise(features)
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    bank = z[np.sort(rng.choice(len(z), BANK_SIZE, replace=False))] if len(z) > BANK_SIZE else z
    classes = np.unique(labels)
    means = np.stack([z[labels == c].mean(axis=0) for c in classes])
    centred = z - means[np.searchsorted(classes, labels)]
    covariance = centred.T @ centred / max(len(z) - 1, 1)
    shrink = 0.1 * np.trace(covariance) / covariance.shape[0]  # fewer photos than dimensions: regularise
    precision = np.linalg.inv(covariance + shrink * np.eye(covariance.shape[0]))
    return FeatureStats(bank.astype(np.float32), means.astype(np.float32), precision.astype(np.float32))


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
    if method == "mahalanobis":
        return mahalanobis(features, stats.means, stats.precision)
    raise ValueError(f"unknown OOD method '{method}', expected one of {METHODS}")


def threshold_for(in_distribution: np.ndarray, accept: float = DEFAULT_ACCEPT) -> float:
    """The smallest score at or under which at least `accept` of these (validation) photos fall."""
    if not 0.0 < accept <= 1.0:
        raise ValueError(f"accept must be in (0, 1], got {accept}")
    ordered = np.sort(np.asarray(in_distribution, np.float64))
    return float(ordered[max(int(np.ceil(accept * len(ordered) - 1e-9)), 1) - 1])


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
    """Everything the export's score needs: the feature statistics and, per part, its
    validation mean and standard deviation; plus the threshold."""

    means: np.ndarray  # [C, D]
    precision: np.ndarray  # [D, D]
    msp_mean: float
    msp_std: float
    mahalanobis_mean: float
    mahalanobis_std: float
    threshold: float
    accept: float

    def __call__(self, probabilities: np.ndarray, features: np.ndarray) -> np.ndarray:
        return (msp(probabilities) - self.msp_mean) / self.msp_std + (
            mahalanobis(features, self.means, self.precision) - self.mahalanobis_mean
        ) / self.mahalanobis_std

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            k: np.asarray(v, np.float32 if k in ("means", "precision") else np.float64) for k, v in vars(self).items()
        }

    @staticmethod
    def from_arrays(arrays) -> ShippedScore:
        return ShippedScore(**{k: arrays[k] if k in ("means", "precision") else float(arrays[k]) for k in arrays})


def fit_shipped(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    val_features: np.ndarray,
    val_probabilities: np.ndarray,
    accept: float = DEFAULT_ACCEPT,
) -> ShippedScore:
    """Feature statistics on the training split; standardisation and threshold on validation."""
    stats = fit_feature_stats(train_features, train_labels)
    parts = msp(val_probabilities), mahalanobis(val_features, stats.means, stats.precision)
    (m1, s1), (m2, s2) = ((float(x.mean()), float(x.std()) or 1.0) for x in parts)
    val_scores = (parts[0] - m1) / s1 + (parts[1] - m2) / s2
    return ShippedScore(stats.means, stats.precision, m1, s1, m2, s2, threshold_for(val_scores, accept), accept)
