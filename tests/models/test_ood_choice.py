"""The shipped score's mix is measured per data set by holding classes out of the run's features."""

from __future__ import annotations

import numpy as np
import pytest

from app.models.ood_choice import FEW_CLASSES_MIX, MIN_CLASSES, MIXES, choose_mix


def _clusters(rng: np.random.Generator, classes: int, per_class: int, dims: int, off_axis: float):
    """Class c near the unit axis e_c; with `off_axis`, each photo also leans into a direction of its
    class's own (dimension `classes + c`), which no other class uses: what the class distance sees."""
    labels = np.repeat(np.arange(classes), per_class)
    features = rng.normal(0, 0.05, (len(labels), dims))
    features[np.arange(len(labels)), labels] += 1.0
    features[np.arange(len(labels)), classes + labels] += off_axis
    return features.astype(np.float32), labels


def _gate(train, val_features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The val photos' standardised relative distance, and the gate: 4 per standard deviation past
    the 97th percentile of the larger of that distance and the log feature length's distance from
    its mean (either way, in standard deviations)."""
    from app.models import ood

    distance = ood.fit_feature_stats(*train).distance(relative=True)(val_features)
    log_norm = np.log(np.linalg.norm(val_features, axis=1))
    z_distance = (distance - distance.mean()) / distance.std()
    atypical = np.maximum(z_distance, np.abs(log_norm - log_norm.mean()) / log_norm.std())
    return z_distance, 4.0 * np.maximum(atypical - np.quantile(atypical, 0.97), 0.0)


def test_the_shipped_score_weighs_its_parts_by_the_mix_and_gates_the_atypical():
    """Mix 0 is the head's part alone (MSP here: no logits given), 1 the distance alone, 0.5 the plain sum;
    each plus the gate past the val photos' 97th percentile of atypicality."""
    from app.models import ood

    rng = np.random.default_rng(2)
    train, val = _clusters(rng, 4, 30, 10, 0.3), _clusters(rng, 4, 10, 10, 0.3)
    val[0][5] *= 3.0  # a photo at a class's angle, its features three times as long
    probabilities = rng.dirichlet(np.ones(4), len(val[1]))
    z_msp = (ood.msp(probabilities) - ood.msp(probabilities).mean()) / ood.msp(probabilities).std()
    z_distance, gate = _gate(train, val[0])
    assert np.count_nonzero(gate) == 2 and np.argmax(gate) == 5  # of 40 val photos, 2 pass; the most: by its length
    for mix, expected in ((0.0, 2 * z_msp), (1.0, 2 * z_distance), (0.5, z_msp + z_distance)):
        score = ood.fit_shipped(train[0], train[1], val[0], probabilities, mix=mix)
        np.testing.assert_allclose(score(probabilities, val[0]), expected + gate, rtol=1e-4, atol=1e-4)
        again = ood.ShippedScore.from_arrays(score.to_arrays())  # the weights are saved with the run
        assert (again.head_weight, again.distance_weight, again.gate_weight) == (2 * (1 - mix), 2 * mix, 4.0)


def test_with_msp_alone_a_confident_photo_of_another_kind_is_still_unknown():
    """The gate: a photo whose features lie far from every class, or at a class's angle but far
    longer or shorter than the val photos', which the head places with full confidence, scores
    past the threshold even where the mix gave the distance no share."""
    from app.models import ood

    rng = np.random.default_rng(4)
    train, val = _clusters(rng, 4, 30, 10, 0.0), _clusters(rng, 4, 10, 10, 0.0)
    probabilities = rng.dirichlet(np.ones(4), len(val[1]))
    score = ood.fit_shipped(train[0], train[1], val[0], probabilities, mix=0.0)
    other_kind = np.zeros((1, 10), np.float32)
    other_kind[0, 9] = 1.0  # a direction no class uses
    sure = np.array([[1.0, 0, 0, 0]])
    assert score(sure, other_kind)[0] > score.threshold
    for length in (4.0, 0.25):  # the distances see the same angle: only the length tells
        assert score(sure, val[0][:1] * length)[0] > score.threshold
    assert score(sure, val[0][:1])[0] < score.threshold  # a confident known photo passes


def test_the_chosen_mix_is_the_best_measured_and_recorded_with_every_mix():
    rng = np.random.default_rng(1)
    train, val = _clusters(rng, 7, 30, 16, 0.0), _clusters(rng, 7, 10, 16, 0.0)
    for features, _ in (train, val):  # classes that overlap, so the mixes score differently
        features += rng.normal(0, 0.4, features.shape).astype(np.float32)
    choice = choose_mix(train, val, seed=3)
    assert len({round(a, 3) for a in choice.auroc.values()}) > 1
    assert set(choice.auroc) == set(MIXES)
    assert round(choice.auroc[choice.mix], 3) == round(max(choice.auroc.values()), 3)
    recorded = choice.to_dict()
    assert recorded["mix"] == choice.mix and set(recorded["auroc_by_mix"]) == {"0", "0.25", "0.5", "0.75", "1"}
    assert f"mix {choice.mix:g}" in choice.reason and "energy alone" in choice.reason


@pytest.mark.parametrize("classes", [2, MIN_CLASSES - 1])
def test_with_too_few_classes_to_hold_a_third_out_energy_alone_is_shipped(classes: int):
    rng = np.random.default_rng(0)
    choice = choose_mix(_clusters(rng, classes, 20, 12, 0.0), _clusters(rng, classes, 5, 12, 0.0))
    assert (choice.mix, choice.auroc) == (FEW_CLASSES_MIX, {}) == (0.0, {})
    assert choice.reason == f"{classes} classes: too few to hold a third out, so energy alone"


def test_with_logits_the_heads_part_is_energy_at_the_runs_temperature():
    from app.models import ood

    rng = np.random.default_rng(5)
    train, val = _clusters(rng, 4, 30, 10, 0.3), _clusters(rng, 4, 10, 10, 0.3)
    logits = rng.normal(0, 3, (len(val[1]), 4))
    probabilities = np.exp(logits / 2) / np.exp(logits / 2).sum(axis=1, keepdims=True)
    score = ood.fit_shipped(train[0], train[1], val[0], probabilities, mix=0.0, val_logits=logits, temperature=2.0)
    energy = -2.0 * np.log(np.exp(logits / 2.0).sum(axis=1))
    z_energy = (energy - energy.mean()) / energy.std()
    _, gate = _gate(train, val[0])
    np.testing.assert_allclose(score(probabilities, val[0], logits), 2 * z_energy + gate, rtol=1e-4, atol=1e-4)
    again = ood.ShippedScore.from_arrays(score.to_arrays())
    assert again.energy_head and again.temperature == 2.0
    with pytest.raises(ValueError, match="needs the logits"):
        score(probabilities, val[0])
