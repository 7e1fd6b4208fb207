"""compare_backbones.py: candidates parsed and checked before work, the probe's scores on features
with a known answer, the ranking, and real backbones ranked on generated photos."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_BACKBONE

from app.errors import UserError
from app.training.backbone_probe import (
    Candidate,
    ProbeResult,
    compare_backbones,
    fit_probe,
    format_ranking,
    parse_candidates,
    probe_backbone,
    rank,
)

REPO = Path(__file__).resolve().parents[2]


def test_candidates_take_their_weights_after_an_at_sign_and_default_to_auto():
    assert parse_candidates("mobilenet_v2, mobilenet_v2@none,efficientnet_b0@/w/b0.h5") == [
        Candidate("mobilenet_v2", "auto"),
        Candidate("mobilenet_v2", "none"),
        Candidate("efficientnet_b0", "/w/b0.h5"),
    ]
    assert Candidate("mobilenet_v2", "none").label == "mobilenet_v2@none"


@pytest.mark.parametrize(
    "text, message",
    [
        ("resnet_9000", "unknown backbone 'resnet_9000'"),
        (" , ", "name at least one backbone"),
        ("mobilenet_v2,mobilenet_v2@auto", "the same candidate twice"),
    ],
)
def test_bad_candidates_are_refused_before_any_backbone_is_built(text: str, message: str):
    with pytest.raises(UserError, match=message):
        parse_candidates(text)


def _blobs(rng: np.random.Generator, n: int, separation: float, dim: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Three classes whose means lie `separation` apart along the first three axes."""
    y = np.repeat(np.arange(3), n)
    x = rng.normal(size=(3 * n, dim))
    x[np.arange(3 * n), y] += separation
    return x, y


def test_the_probe_scores_separable_features_high_and_noise_at_chance():
    rng = np.random.default_rng(0)
    for separation, low, high in ((6.0, 0.97, 1.0), (0.0, 0.15, 0.55)):
        train, val = _blobs(rng, 60, separation), _blobs(rng, 60, separation)
        ((accuracy, loss),) = fit_probe(*train, {"val": val}, num_classes=3).values()
        assert low <= accuracy <= high
        assert (loss < 0.2) if separation else (loss > 0.9)  # ln 3 = 1.10 is a guess's loss


def test_the_probe_counts_a_class_missing_from_train_as_never_predicted():
    x, y = _blobs(np.random.default_rng(1), 30, 6.0)
    train = x[y < 2], y[y < 2]
    ((accuracy, loss),) = fit_probe(*train, {"val": (x, y)}, num_classes=3).values()
    assert accuracy == pytest.approx(2 / 3, abs=0.02) and np.isfinite(loss)


def _result(label: str, accuracy: float, loss: float, test: float | None = None) -> ProbeResult:
    name, _, weights = label.partition("@")
    return ProbeResult(Candidate(name, weights or "auto"), "w", 224, 1280, 2_257_984, accuracy, loss, test, 10.0, 50.0)


def test_ranking_is_by_val_accuracy_then_lower_loss_and_the_table_says_so():
    results = rank([_result("a", 0.90, 0.3), _result("b", 0.95, 0.5), _result("c", 0.95, 0.2, 0.9)])
    assert [r.candidate.backbone for r in results] == ["c", "b", "a"]
    lines = format_ranking(results).splitlines()
    assert lines[2].split()[:3] == ["1", "c", "224"] and "0.9000" in lines[2]  # its test accuracy
    assert lines[4].split()[5] == "-"  # no test split: no test figure
    assert "2.3" in lines[2]  # parameters in millions


def test_the_table_names_a_weights_file_by_its_name_and_the_line_below_it_by_its_path():
    """Two candidates' full paths made the table 180 columns wide."""
    result = _result("efficientnet_lite0@/data/weights/lite0.npz", 0.9, 0.3)
    result = dataclasses.replace(result, weights_used="/data/weights/lite0.npz")
    table, weights = format_ranking([result, _result("mobilenet_v2@imagenet", 0.8, 0.4)]).split("\n\n")
    assert table.splitlines()[2].split()[:2] == ["1", "efficientnet_lite0@lite0.npz"]
    assert table.splitlines()[3].split()[:2] == ["2", "mobilenet_v2@imagenet"]
    assert "/data/weights" not in table
    assert weights.splitlines()[0] == "efficientnet_lite0@lite0.npz: weights /data/weights/lite0.npz"


def test_a_probe_of_the_tiny_backbone_reads_every_split(demo_records: Path, monkeypatch):
    monkeypatch.delenv("PHOTOCLF_WEIGHTS", raising=False)
    result = probe_backbone(Candidate(TINY_BACKBONE, "none"), str(demo_records), image_size=64)
    assert result.feature_dim == 24 and result.image_size == 64  # the tiny CNN's last block has 24 channels
    assert 0.0 <= result.val_accuracy <= 1.0 and result.test_accuracy is not None
    assert result.weights_used.startswith("none")


def test_a_candidate_s_missing_weights_file_is_named_by_the_flag_that_gave_it(demo_records: Path, tmp_path: Path):
    missing = tmp_path / "gone.weights.h5"
    with pytest.raises(UserError, match=f"^--backbones {TINY_BACKBONE}@{missing}: no such file {missing}$"):
        probe_backbone(Candidate(TINY_BACKBONE, str(missing)), str(demo_records), image_size=64)


def test_a_weights_file_that_fails_the_last_candidate_fails_before_the_first_probe(
    demo_records: Path, tmp_path: Path, monkeypatch
):
    import app.training.backbone_probe as probe

    probed = []
    monkeypatch.setattr(probe, "probe_backbone", lambda candidate, *args: probed.append(candidate))
    missing = tmp_path / "gone.weights.h5"
    candidates = [Candidate(TINY_BACKBONE, "none"), Candidate(TINY_BACKBONE, str(missing))]
    with pytest.raises(UserError, match=f"^--backbones {TINY_BACKBONE}@{missing}: no such file"):
        compare_backbones(str(demo_records), candidates, image_size=64)
    assert probed == []


def test_the_script_says_a_missing_folder_before_importing_tensorflow(tmp_path: Path):
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "compare_backbones.py"),
            str(tmp_path / "nope"),
            "--backbones",
            "mobilenet_v2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.strip() == f"error: {tmp_path / 'nope'}: no such file or folder"


@pytest.mark.slow
def test_pretrained_mobilenet_v2_ranks_above_its_random_initialisation(tmp_path: Path, pretrained_weights: Path):
    from app.data.demo import generate_demo_images
    from app.data.writer import write_tfrecords

    records = tmp_path / "records"  # 4 classes, 30 photos each: 15 to fit on, 9 to rank on
    write_tfrecords(
        generate_demo_images(tmp_path / "images", per_class=30, seed=3),
        records,
        val_fraction=0.3,
        test_fraction=0.2,
        num_shards=1,
        workers=1,
    )
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "compare_backbones.py"),
            str(records),
            "--backbones",
            f"mobilenet_v2@none,mobilenet_v2@{pretrained_weights}",
            "--image-size",
            "96",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    table = done.stdout.splitlines()
    first, second = table[2].split(), table[3].split()
    assert first[1] == f"mobilenet_v2@{pretrained_weights.name}" and second[1] == "mobilenet_v2@none"
    assert f"mobilenet_v2@{pretrained_weights.name}: weights {pretrained_weights}" in done.stdout  # the path, below
    assert float(first[3]) > float(second[3])  # the pretrained features separate the classes better
