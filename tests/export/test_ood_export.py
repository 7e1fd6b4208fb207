""" "None of these" in every export: the run fits its threshold on validation, and the SavedModel's
signatures, the LiteRT runtime and batch prediction all answer `ood_score` and `unknown` with it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from app.data.pipeline import make_eval_dataset
from app.export import layout
from app.export.rebuild import rebuild_served_model
from app.inference.host_runtimes import LiteRTRuntime
from app.inference.runtime import TFRuntime
from app.models import ood
from app.training.report import format_result


def _val_scores(version: Path, demo_records: Path) -> np.ndarray:
    predict = tf.saved_model.load(str(version)).signatures["predict_images"]
    size = int(layout.read_metadata(version)["input_size"])
    batches = make_eval_dataset(demo_records, split="val", image_size=size, batch_size=16)
    return np.concatenate([predict(images=tf.cast(x, tf.float32))["ood_score"].numpy() for x, _ in batches])


def test_the_threshold_accepts_95_percent_of_validation_and_is_in_metrics_and_export(
    trained_run: Path, demo_records: Path
):
    found = json.loads((trained_run / "metrics.json").read_text())["ood"]
    version = trained_run / "export" / "shapes" / "1"
    assert layout.read_metadata(version)["ood"] == found
    assert found["method"] == ood.SHIPPED == "energy+relative_mahalanobis" and found["accept"] == ood.DEFAULT_ACCEPT
    # phase 2 trained on phase 1's views: their activations at the cut gave the training features
    assert "train views" in found["fitted_on"] and found["fitted_on"].endswith("val photos")
    assert f"answered unknown above ood_score {found['threshold']:.2f} (95% of val accepted)" in format_result(
        json.loads((trained_run / "metrics.json").read_text())
    )
    scores = _val_scores(version, demo_records)
    # Fitted in float64 NumPy, computed by the graph in float32: the threshold lies between two
    # photos' scores, never on one, so the graph accepts exactly the share asked for.
    assert int((scores <= found["threshold"]).sum()) == int(np.ceil(0.95 * len(scores)))
    assert np.abs(scores - found["threshold"]).min() > 1e-3


def test_signatures_and_litert_answer_the_same_ood_score_and_unknown(trained_run: Path, demo_images: Path):
    version = trained_run / "export" / "shapes" / "1"
    threshold = layout.read_metadata(version)["ood"]["threshold"]
    images = np.array([p.read_bytes() for p in sorted((demo_images / "circle").glob("circle_*"))[:6]], dtype=object)
    saved = TFRuntime(version).run("serving_default", {"image_bytes": images})
    lite = LiteRTRuntime(version).run("serving_default", {"image_bytes": images})
    assert saved["ood_score"].shape == (6,) and saved["unknown"].dtype == bool
    np.testing.assert_array_equal(saved["unknown"], saved["ood_score"] > threshold)
    assert np.abs(lite["ood_score"] - saved["ood_score"]).max() < 1e-4
    np.testing.assert_array_equal(lite["unknown"], lite["ood_score"] > threshold)
    for runtime in (TFRuntime(version), LiteRTRuntime(version)):
        outputs = runtime.signatures()["serving_default"][1]
        assert {"ood_score", "unknown"} <= set(outputs)


def test_the_graph_computes_the_score_numpy_fitted(trained_run: Path, demo_images: Path):
    """The export's score is app.models.ood.ShippedScore's arithmetic on the pooled features and logits."""
    import keras

    from app.data.preprocess import DEFAULT_CROP_FRACTION, decode_batch
    from app.run_dir import RunDir

    finished = RunDir(trained_run).load()
    model = rebuild_served_model(finished)
    features = keras.Model(model.inputs, model.get_layer("pool").output)
    images = [p.read_bytes() for p in sorted((demo_images / "star").glob("star_*"))[:6]]
    pixels = tf.cast(decode_batch(tf.constant(images), finished.image_size, DEFAULT_CROP_FRACTION, 40.0), tf.float32)
    outputs = model(pixels)
    logits = keras.Model(model.inputs, model.get_layer("logits").output)(pixels).numpy()
    expected = finished.ood_score()(outputs["probabilities"].numpy(), features(pixels).numpy(), logits)
    version = trained_run / "export" / "shapes" / "1"
    saved = TFRuntime(version).run("serving_default", {"image_bytes": np.array(images, dtype=object)})
    np.testing.assert_allclose(saved["ood_score"], expected, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(outputs["ood_score"].numpy(), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("accept", [0.0, 0.5])
def test_unknown_accept_sets_the_share_of_validation_accepted_or_turns_it_off(tiny_config, accept: float):
    from app.training.train import train

    metrics = train(tiny_config.replace(unknown_accept=accept))
    version = Path(metrics["export"])
    outputs = TFRuntime(version).signatures()["serving_default"][1]
    if accept == 0.0:
        assert "ood" not in metrics and "ood_score" not in outputs and "ood" not in layout.read_metadata(version)
        assert not (Path(tiny_config.out) / "ood_score.npz").exists()
        return
    assert metrics["ood"]["accept"] == 0.5 and {"ood_score", "unknown"} <= set(outputs)
    scores = _val_scores(version, Path(tiny_config.data))  # exactly half, rounded up, on any CPU
    assert int((scores <= metrics["ood"]["threshold"]).sum()) == int(np.ceil(0.5 * len(scores)))
    assert np.abs(scores - metrics["ood"]["threshold"]).min() > 1e-3
