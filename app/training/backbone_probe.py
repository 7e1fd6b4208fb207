"""Which backbone for these photos? A linear probe on each candidate's frozen features: minutes,
where fine-tuning each would take hours.

Each candidate backbone runs once over the train, val (and test) splits with the evaluation
preprocessing (centre crop, no augmentation); a multinomial logistic regression on the
standardised pooled features is fitted on train and scored on val and test. That is phase 1 of
a run without its augmentation, so it ranks backbones by what phase 1 can get out of them;
phase 2 moves the figures, usually not the order by much. Candidates are ranked by val
accuracy, ties by val log loss.

A candidate is a registry key or TF-Hub handle, optionally with its weights after an `@`:
`mobilenet_v2`, `mobilenet_v2@none`, `efficientnet_b0@imagenet`, `mobilenet_v2@PATH.weights.h5`
(without `@`: `auto`, as fine_tune.py resolves it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.errors import UserError

log = logging.getLogger(__name__)
PROBE_C = 1.0  # inverse L2 strength of the logistic regression, on standardised features


@dataclass(frozen=True)
class Candidate:
    backbone: str
    weights: str = "auto"

    @property
    def label(self) -> str:
        return self.backbone if self.weights == "auto" else f"{self.backbone}@{self.weights}"

    @property
    def short_label(self) -> str:
        """The label with a weights file's name alone: the table's column (its path is said below it)."""
        named = self.weights in ("auto", "imagenet", "none")
        return self.label if named else f"{self.backbone}@{Path(self.weights).name}"


@dataclass(frozen=True)
class ProbeResult:
    candidate: Candidate
    weights_used: str
    image_size: int
    feature_dim: int
    parameters: int
    val_accuracy: float
    val_log_loss: float
    test_accuracy: float | None
    seconds: float  # the backbone's passes over every split, and the fit
    images_per_s: float  # of those passes alone


def parse_candidates(text: str) -> list[Candidate]:
    """'a,b@none,c@imagenet' → candidates; each name is checked against the registry now, before
    any backbone is built (`get_backbone` raises a UserError naming the known ones)."""
    from app.models.backbones import get_backbone

    candidates = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, weights = item.partition("@")
        get_backbone(name)
        candidates.append(Candidate(name, weights or "auto"))
    if not candidates:
        raise UserError("--backbones: name at least one backbone, e.g. mobilenet_v2,efficientnet_b0")
    if len(set(candidates)) != len(candidates):
        raise UserError(f"--backbones: {text} names the same candidate twice")
    return candidates


def fit_probe(
    train_x: np.ndarray, train_y: np.ndarray, evaluate: dict[str, tuple[np.ndarray, np.ndarray]], num_classes: int
) -> dict[str, tuple[float, float]]:
    """Logistic regression on standardised features: {split: (accuracy, log loss)} for each
    split in `evaluate`."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(C=PROBE_C, max_iter=2000))
    probe.fit(train_x, train_y)
    labels = np.arange(num_classes)
    out = {}
    for split, (x, y) in evaluate.items():
        probabilities = np.zeros((len(x), num_classes))
        probabilities[:, probe.classes_] = probe.predict_proba(x)
        probabilities /= probabilities.sum(axis=1, keepdims=True)  # float32 features: sums off by ~1e-7
        out[split] = (float((probabilities.argmax(1) == y).mean()), float(log_loss(y, probabilities, labels=labels)))
    return out


def probe_backbone(candidate: Candidate, data: str, image_size: int = 0) -> ProbeResult:
    """Build `candidate`, compute its features on every split, fit and score the probe."""
    import keras

    from app.data.pipeline import load_dataset_info
    from app.models.backbones import get_backbone
    from app.models.classifier import build_classifier
    from app.models.pretrained import load_pretrained_backbone
    from app.training.frozen import splits_features

    info = load_dataset_info(data)
    spec = get_backbone(candidate.backbone)
    size = image_size or spec.default_size
    pretrained = load_pretrained_backbone(
        spec, size, candidate.weights, f"--backbones {candidate.label}", f"--backbones {spec.name}@PATH"
    )
    if pretrained.warning:
        log.warning("%s: %s", candidate.label, pretrained.warning)
    clf = build_classifier(spec, pretrained.model, len(info.classes), size, 0.0)
    splits = [s for s in ("train", "val", "test") if info.num_examples(s)]
    start = time.perf_counter()
    features = splits_features(clf.features_model, data, splits, size)
    passes = time.perf_counter() - start
    scores = fit_probe(*features["train"], {s: features[s] for s in splits if s != "train"}, len(info.classes))
    keras.backend.clear_session()  # the next candidate's graph starts clean
    return ProbeResult(
        candidate=candidate,
        weights_used=pretrained.weights_used,
        image_size=size,
        feature_dim=int(features["train"][0].shape[1]),
        parameters=int(pretrained.model.count_params()),
        val_accuracy=scores["val"][0],
        val_log_loss=scores["val"][1],
        test_accuracy=scores["test"][0] if "test" in scores else None,
        seconds=time.perf_counter() - start,
        images_per_s=sum(len(f[1]) for f in features.values()) / passes,
    )


def check_probe_data(data: str) -> None:
    """The probe needs labelled train and val splits of a single-label dataset."""
    from app.data.pipeline import load_dataset_info

    info = load_dataset_info(data)
    if info.multi_label:
        raise UserError(f"{data}: multi-label datasets are not supported by the probe")
    for split in ("train", "val"):
        if not info.num_examples(split):
            raise UserError(f"{data}: the '{split}' split is empty; the probe fits on train and ranks on val")


def compare_backbones(data: str, candidates: list[Candidate], image_size: int = 0) -> list[ProbeResult]:
    """Every candidate probed on `data`, best first."""
    check_probe_data(data)
    check_weight_files(candidates, image_size)
    results = []
    for candidate in candidates:
        log.info("probing %s", candidate.label)
        results.append(probe_backbone(candidate, data, image_size))
    return rank(results)


def check_weight_files(candidates: list[Candidate], image_size: int = 0) -> None:
    """Each candidate whose weights come from a file loads them now, before the first probe, so
    that a file that does not fit the third backbone fails the command in seconds, not after
    the first two probes."""
    import os

    import keras

    from app.models.backbones import get_backbone
    from app.models.pretrained import WEIGHTS_ENV, load_pretrained_backbone

    for candidate in candidates:
        spec = get_backbone(candidate.backbone)
        from_file = candidate.weights != "auto" or bool(os.environ.get(WEIGHTS_ENV))
        if spec.hub_handle or not from_file or candidate.weights in ("none", "imagenet"):
            continue  # nothing to read, or a download: the probe itself says what it found
        load_pretrained_backbone(
            spec,
            image_size or spec.default_size,
            candidate.weights,
            f"--backbones {candidate.label}",
            f"--backbones {spec.name}@PATH",
        )
        keras.backend.clear_session()


def rank(results: list[ProbeResult]) -> list[ProbeResult]:
    return sorted(results, key=lambda r: (-r.val_accuracy, r.val_log_loss))


def format_ranking(results: list[ProbeResult]) -> str:
    from app.table import format_table

    rows = [
        [
            "rank",
            "backbone",
            "size",
            "val accuracy",
            "val log loss",
            "test accuracy",
            "features",
            "params (M)",
            "seconds",
            "images/s",
        ]
    ]
    for place, r in enumerate(results, start=1):
        test = "-" if r.test_accuracy is None else f"{r.test_accuracy:.4f}"
        rows.append(
            [
                str(place),
                r.candidate.short_label,
                str(r.image_size),
                f"{r.val_accuracy:.4f}",
                f"{r.val_log_loss:.4f}",
                test,
                str(r.feature_dim),
                f"{r.parameters / 1e6:.1f}",
                f"{r.seconds:.0f}",
                f"{r.images_per_s:.0f}",
            ]
        )
    weights = "\n".join(f"{r.candidate.short_label}: weights {r.weights_used}" for r in results)
    return format_table(rows) + "\n\n" + weights
