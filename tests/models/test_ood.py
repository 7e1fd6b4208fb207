"""Out-of-distribution scores: a far cluster scores higher than the training classes' photos under
every method, the threshold accepts the asked share, and AUROC / FPR are the textbook figures."""

from __future__ import annotations

import numpy as np
import pytest

from app.models import ood


def _clusters(rng: np.random.Generator, centres: np.ndarray, per: int, spread: float = 0.3) -> np.ndarray:
    return np.concatenate([c + spread * rng.standard_normal((per, centres.shape[1])) for c in centres])


@pytest.fixture
def synthetic():
    """3 classes in 64 dimensions; a 'head' that is the nearest class mean; a far cluster."""
    rng = np.random.default_rng(0)
    centres = 3.0 * np.eye(3, 64)
    train, test = _clusters(rng, centres, 100), _clusters(rng, centres, 30)
    labels = np.repeat(np.arange(3), 100)
    far = _clusters(rng, 3.0 * np.eye(64)[10:11], 90)  # a direction no class uses

    def logits(x: np.ndarray) -> np.ndarray:
        return 2.0 * x @ centres.T

    return train, labels, test, far, logits


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("method", ood.METHODS)
def test_a_far_cluster_scores_higher_than_the_classes_photos(synthetic, method: str):
    train, labels, test, far, logits = synthetic
    stats = ood.fit_feature_stats(train, labels)

    def score(x: np.ndarray) -> np.ndarray:
        z = logits(x)
        return ood.scores(method, probabilities=_softmax(z), logits=z, features=x, stats=stats)

    assert ood.auroc(score(test), score(far)) > 0.95
    assert np.median(score(far)) > np.median(score(test))


def test_the_threshold_accepts_the_share_asked_for():
    scores = np.random.default_rng(1).standard_normal(1000)
    for accept in (0.5, 0.9, 0.95):
        assert (scores <= ood.threshold_for(scores, accept)).mean() == pytest.approx(accept, abs=0.002)
    assert (scores <= ood.threshold_for(scores, 1.0)).all()
    with pytest.raises(ValueError, match="accept"):
        ood.threshold_for(scores, 0.0)


def test_the_threshold_lies_between_two_scores_so_the_share_accepted_is_exact():
    """On a score, the last bits of another CPU or runtime would decide that photo's side."""
    scores = np.array([0.3, 0.1, 0.7, 0.5, 0.9, 0.2, 0.8, 0.4, 0.6, 1.0])
    assert ood.threshold_for(scores, 0.5) == pytest.approx(0.55)  # halfway between the 5th and 6th
    assert ood.threshold_for(scores, 0.95) == pytest.approx(1.0 + 0.9 / 10)  # past the highest: its mean gap
    tied = np.array([0.1, 0.2, 0.2, 0.2, 0.3])
    assert ood.threshold_for(tied, 0.4) == pytest.approx(0.25)  # a tie across the cut is accepted whole
    assert ood.threshold_for(np.full(4, 2.0), 0.5) == pytest.approx(2.002)  # all equal: a thousandth past them


def test_auroc_and_fpr_are_the_textbook_figures():
    assert ood.auroc(np.array([0.0, 1.0]), np.array([2.0, 3.0])) == 1.0
    assert ood.auroc(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 0.0
    assert ood.auroc(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.5  # ties count half
    assert ood.auroc(np.array([0.0, 2.0]), np.array([1.0, 3.0])) == 0.75
    in_scores = np.arange(100, dtype=float)  # 95% accepted at 94
    assert ood.fpr_at_tpr(in_scores, np.array([10.0, 50.0, 94.0, 95.0, 200.0])) == 0.6


def test_the_scores_follow_their_definitions():
    logits = np.array([[2.0, 0.0], [0.0, 0.0]])
    assert ood.energy(logits) == pytest.approx(-np.log(np.exp(logits).sum(axis=1)), rel=1e-6)
    assert ood.energy(logits, 2.0) == pytest.approx(-2.0 * np.log(np.exp(logits / 2.0).sum(axis=1)), rel=1e-6)
    assert ood.msp(np.array([[0.7, 0.3], [0.5, 0.5]])) == pytest.approx([0.3, 0.5])
    bank = ood.l2_normalise(np.array([[1.0, 0.0], [0.0, 1.0]]))
    assert ood.knn(np.array([[2.0, 0.0]]), bank, k=1) == pytest.approx([0.0])  # its own direction
    assert ood.knn(np.array([[2.0, 0.0]]), bank, k=2) == pytest.approx([1.0])  # the 2nd: orthogonal
    stats = ood.fit_feature_stats(np.random.default_rng(0).standard_normal((5000, 4)), np.zeros(5000))
    assert len(stats.bank) == ood.BANK_SIZE  # a bounded sample of the training set


def test_the_class_distances_follow_their_definitions():
    rng = np.random.default_rng(2)
    features, labels = rng.standard_normal((200, 6)), np.arange(200) % 4
    stats = ood.fit_feature_stats(features, labels)
    z = ood.l2_normalise(rng.standard_normal((5, 6))).astype(np.float64)

    def squared(x: np.ndarray, mean: np.ndarray, precision: np.ndarray) -> np.ndarray:
        d = x - mean
        return np.einsum("nd,de,ne->n", d, precision, d)

    to_classes = np.stack([squared(z, m, stats.precision) for m in stats.means], axis=1)
    to_all = squared(z, stats.background_mean, stats.background_precision)
    plain = ood.scores("mahalanobis", probabilities=None, logits=None, features=z, stats=stats)
    relative = ood.scores("relative_mahalanobis", probabilities=None, logits=None, features=z, stats=stats)
    np.testing.assert_allclose(plain, to_classes.min(axis=1), rtol=1e-4)
    np.testing.assert_allclose(relative, (to_classes - to_all[:, None]).min(axis=1), rtol=1e-4, atol=1e-3)


def test_the_shipped_score_survives_its_file_and_reads_a_plain_mahalanobis_one():
    rng = np.random.default_rng(3)
    train, labels = rng.standard_normal((120, 8)), np.arange(120) % 3
    val, probabilities = rng.standard_normal((30, 8)), rng.dirichlet([1, 1, 1], 30)
    score = ood.fit_shipped(train, labels, val, probabilities)
    again = ood.ShippedScore.from_arrays(score.to_arrays())
    np.testing.assert_allclose(again(probabilities, val), score(probabilities, val), rtol=1e-4, atol=1e-4)
    assert (score(probabilities, val) <= score.threshold).mean() == pytest.approx(0.95, abs=0.02)

    stats = ood.fit_feature_stats(train, labels)  # a run fitted before the relative distance
    older = {"means": stats.means, "precision": stats.precision, "msp_mean": 0.5, "msp_std": 0.25}
    older |= {"mahalanobis_mean": 10.0, "mahalanobis_std": 2.0, "threshold": 1.0, "accept": 0.95}
    expected = (ood.msp(probabilities) - 0.5) / 0.25 + (stats.distance(relative=False)(val) - 10.0) / 2.0
    np.testing.assert_allclose(ood.ShippedScore.from_arrays(older)(probabilities, val), expected, rtol=1e-5)


def test_the_feature_statistics_are_those_of_the_whole_set_whatever_the_chunk(monkeypatch: pytest.MonkeyPatch):
    """A run's views are worked through a chunk of rows at a time; the statistics are the ones
    the normalised, centred rows give all at once (to float64 rounding)."""
    rng = np.random.default_rng(3)
    features, labels = rng.standard_normal((300, 5)) + 2.0, rng.integers(0, 3, 300)
    z = ood.l2_normalise(features).astype(np.float64)
    means = np.stack([z[labels == c].mean(axis=0) for c in range(3)])
    monkeypatch.setattr(ood, "STATS_CHUNK", 7)  # chunks that split classes and end mid-set
    stats = ood.fit_feature_stats(features, labels)
    np.testing.assert_allclose(stats.means, means, rtol=1e-12)
    np.testing.assert_allclose(stats.background_mean, z.mean(axis=0), rtol=1e-12)
    centred = z - means[labels]
    covariance = centred.T @ centred / 299
    expected = np.linalg.inv(covariance + 0.1 * np.trace(covariance) / 5 * np.eye(5))
    np.testing.assert_allclose(stats.precision, expected, rtol=1e-9)
    assert stats.bank.dtype == np.float32 and np.allclose(np.linalg.norm(stats.bank, axis=1), 1.0)
