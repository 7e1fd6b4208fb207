"""A run with side features says when they cost val accuracy against its image features alone."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from app.training.frozen import Phase1Features
from app.training.side_check import side_features_warning, val_probe


@pytest.mark.parametrize(
    "with_side,image_only,val_photos,warned",
    [
        (0.560, 0.647, 150, True),  # 13 photos worse: columns of noise on 20 photos a class
        (0.640, 0.647, 150, False),  # one photo: the seeds' spread, not a cost
        (0.500, 0.600, 20, False),  # 10 points, but 2 photos of 20
        (0.450, 0.600, 20, True),  # 3 photos
        (0.990, 0.500, 150, False),  # columns that carry the class
    ],
)
def test_the_warning_needs_a_gap_of_several_points_and_several_photos(with_side, image_only, val_photos, warned):
    said = side_features_warning(with_side, image_only, val_photos)
    assert (said is not None) == warned
    if warned:
        assert said.startswith(f"the side features cost val accuracy: {with_side:.4f} with them, {image_only:.4f} for")
        assert "compare a run converted without --feature-columns" in said


def test_the_image_only_probe_reads_the_image_features_and_leaves_the_side_features_out():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 40)
    centres = rng.normal(size=(3, 16)) * 4
    features = (centres[labels] + rng.normal(size=(120, 16))).astype(np.float32)
    side = np.repeat(np.arange(3), 40)[:, None].astype(np.float32)  # a perfect side column, which it must not see
    train, val = slice(0, 120, 2), slice(1, 120, 2)
    separable = Phase1Features(features[train], labels[train], features[val], labels[val], side[train], side[val])
    assert val_probe(separable, 3)[0] == 1.0
    noise = rng.normal(size=(120, 16)).astype(np.float32)
    blind = Phase1Features(noise[train], labels[train], noise[val], labels[val], side[train], side[val])
    assert val_probe(blind, 3)[0] < 0.6  # chance is 1/3: the side column did not leak in


@pytest.mark.slow  # a whole run and its export
def test_a_run_whose_side_features_cost_val_accuracy_says_so_in_its_metrics_summary_and_model_card(
    tiny_config, tmp_path: Path
):
    from app.data.side_demo import FEATURE_COLUMNS, generate_side_feature_dataset
    from app.data.writer import write_tfrecords
    from app.export.layout import read_metadata
    from app.export.model_card import card, markdown
    from app.training.report import format_result
    from app.training.train import train

    manifest = generate_side_feature_dataset(tmp_path / "photos", per_class=8, image_size=32)
    write_tfrecords(manifest, tmp_path / "records", feature_columns=FEATURE_COLUMNS, val_fraction=0.25,
                    test_fraction=0.0, num_shards=1)  # fmt: skip
    cfg = tiny_config.replace(data=str(tmp_path / "records"), out=str(tmp_path / "run"), image_size=32, batch_size=4,
                              epochs_finetune=0, feature_views="1", side_path="on")  # fmt: skip
    with mock.patch("app.training.train.val_probe", return_value=(1.0, 0.1)) as probe:
        metrics = train(cfg)
    probe.assert_called_once()
    val_accuracy = metrics["phase1"]["val_accuracy"]
    assert metrics["side_features_warning"] == side_features_warning(val_accuracy, 1.0, 8)  # 8 val photos
    assert f"WARNING: {metrics['side_features_warning']}" in format_result(metrics).splitlines()
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["side_features_warning"]
    metadata = read_metadata(Path(metrics["export"]))  # what the model card is written from
    assert metadata["training_metrics"]["side_features_warning"] == metrics["side_features_warning"]
    page = markdown(card(metadata, cfg.to_dict()), "m")
    assert f"- **{metrics['side_features_warning']}**" in page.split("## Known limits")[1].splitlines()


def test_a_large_sets_views_are_sampled_so_the_probe_reads_a_bounded_number_of_rows(monkeypatch):
    import app.training.side_check as side_check

    class Rows(np.ndarray):  # an array that records how many rows each read asked for, as DiskRows is read
        reads: list[int] = []

        def __getitem__(self, index):
            Rows.reads.append(len(np.arange(len(self))[index]))
            return np.asarray(self).__getitem__(index)

    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(2), 100)
    features = (labels[:, None] * 3 + rng.normal(size=(200, 8))).astype(np.float32)
    monkeypatch.setattr(side_check, "MAX_TRAIN_ROWS", 50)
    sampled = Phase1Features(features.view(Rows), labels, features[:20], labels[:20])
    assert val_probe(sampled, 2)[0] == 1.0
    assert Rows.reads == [50]  # one read of 50 of the 200 training rows


def _features_with_side(side_carries_the_class: bool, seed: int = 0) -> Phase1Features:
    """Image features that tell 3 classes apart about two times in three, and one numeric side column."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(3), 60)
    features = (rng.normal(size=(3, 16))[labels] + rng.normal(size=(180, 16)) * 2.5).astype(np.float32)
    side = (labels * 2.0 if side_carries_the_class else rng.normal(size=180))[:, None].astype(np.float32)
    train, val = slice(0, 180, 2), slice(1, 180, 2)
    return Phase1Features(features[train], labels[train], features[val], labels[val], side[train], side[val])


@pytest.mark.parametrize("carries, kept", [(True, True), (False, False)])
def test_the_side_path_stays_open_only_where_the_side_features_lower_the_probes_val_log_loss(carries, kept):
    from app.models.layers import SideFeatureEncoding
    from app.training.side_check import SidePath

    encoding = SideFeatureEncoding([{"name": "reading", "kind": "numeric", "mean": 2.0, "std": 1.6}])
    path = SidePath(encoding, 3)
    path.judge(_features_with_side(carries))
    (acc_without, without), (acc_with, with_side) = path.probes["image_only"], path.probes["with_side"]
    assert path.open == kept and float(encoding.gate) == float(kept)
    if kept:
        assert acc_with > acc_without + 0.2 and with_side < without / 2
    else:  # the noise column did not lower the log loss by the 2% the side path must earn
        assert with_side > without * 0.98
        said = path.left_out()
        assert said.startswith("the side features were left out of the model (it still takes them and ignores them;")
        assert f"val log loss {without:.4f} (accuracy {acc_without:.4f}) without them and {with_side:.4f}" in said
    assert path.record() == {
        "open": kept,
        "image_only": {"val_accuracy": acc_without, "val_log_loss": without},
        "with_side": {"val_accuracy": acc_with, "val_log_loss": with_side},
    }


def test_a_resume_judges_with_the_gate_it_restored_set_aside():
    """A resume restores a closed gate before judging again: the probes still see the side features."""
    from app.models.layers import SideFeatureEncoding
    from app.training.side_check import SidePath

    encoding = SideFeatureEncoding([{"name": "reading", "kind": "numeric", "mean": 2.0, "std": 1.6}])
    encoding.gate.assign(0.0)
    path = SidePath(encoding, 3)
    path.judge(_features_with_side(True))
    assert path.open


def test_a_run_resumed_past_phase_1_reads_the_decision_from_the_gate_its_weights_restored():
    from app.models.layers import SideFeatureEncoding
    from app.training.side_check import SidePath

    encoding = SideFeatureEncoding([{"name": "reading", "kind": "numeric", "mean": 2.0, "std": 1.6}])
    encoding.gate.assign(0.0)  # as phase 1's kept weights left it
    path = SidePath(encoding, 3)  # nothing judged in this process
    assert not path.open and path.record() == {"open": False}
    assert path.left_out() == (
        "the side features were left out of the model (it still takes them and ignores them; predict and evaluate"
        " take photos alone): judged before phase 1 of this run, which resumed past it; side_path = on keeps them"
        " (docs/side-features.md)"
    )
