"""A finished run's model, built again from its settings and final weights: what the export
writes, and what Grad-CAM looks into."""

from __future__ import annotations

from app.models.backbones import get_backbone
from app.models.classifier import build_classifier, served_model
from app.models.pretrained import load_backbone
from app.run_dir import FinishedRun


def rebuild_served_model(finished: FinishedRun, metrics: dict | None = None):
    """The classifier (images → probabilities) with the run's final weights and temperature,
    under the global dtype policy; `metrics` stands in for metrics.json (not yet written while a
    run exports itself)."""
    metrics = finished.metrics if metrics is None else metrics
    spec = get_backbone(finished.state["backbone"])
    backbone, _ = load_backbone(spec, finished.image_size, "auto" if spec.hub_handle else "none")
    clf = build_classifier(
        spec,
        backbone,
        len(finished.classes),
        finished.image_size,
        finished.config.dropout,
        finished.side_features,
        finished.multi_label,
    )
    clf.model.load_weights(str(finished.run.final_weights))
    return served_model(clf, metrics.get("calibration"), finished.ood_score(metrics))
