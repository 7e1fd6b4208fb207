"""The run directory: one owner for every path of a run, and loading a finished run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from app.config import TrainConfig
from app.errors import UserError
from app.export.rebuild import rebuild_served_model
from app.run_dir import RunDir, config_changes, prepare_run_dir, release_run_dirs


def test_every_path_of_a_run_is_distinct_and_inside_the_run_dir(tmp_path: Path):
    run = RunDir(tmp_path / "run")
    paths = [
        run.config,
        run.state,
        run.history,
        run.tensorboard,
        run.learning_curves,
        run.checkpoints,
        run.final_weights,
        run.metrics,
        run.export_root,
        run.reports,
        run.phase_checkpoints(1),
        run.phase_checkpoints(2),
        run.best_weights(1, 3),
        run.best_weights(2, 3),
    ]
    assert len(set(paths)) == len(paths)
    assert all(p.is_relative_to(run.root) for p in paths)
    assert run.best_weights(1, 3).name.endswith(".weights.h5")  # what Keras' save_weights requires


@pytest.mark.parametrize(
    "folder,name",
    [("pets", "pets"), ("my photos", "my_photos"), ("v1.2-run", "v1.2-run"), (".x", "x"), ("日本", "model")],
)
def test_the_default_model_name_is_the_run_dir_s_as_a_model_name_may_be_spelt(tmp_path: Path, folder: str, name: str):
    """`--out "runs/my photos"` trained a whole run, then failed its export on --name, a flag train has not."""
    from app.export.saved_model import check_new_version

    run = RunDir(tmp_path / folder)
    assert run.export_name == name
    check_new_version(run.export_root, run.export_name, None)  # a name the export takes


def test_stale_best_weights_are_the_other_epochs_of_the_same_phase(tmp_path: Path):
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    for phase, epoch in ((1, 1), (1, 2), (1, 3), (2, 1)):
        run.best_weights(phase, epoch).write_bytes(b"")
    assert sorted(run.stale_best_weights(1, keep_epoch=2)) == [run.best_weights(1, 1), run.best_weights(1, 3)]


def test_an_export_knows_its_run_dir(trained_run: Path, tmp_path: Path):
    run = RunDir(trained_run)
    assert RunDir.of_export(run.export_root / "shapes" / "1") == run
    assert RunDir.of_export(tmp_path / "models" / "shapes" / "1") is None  # an export outside any run


def test_loading_a_finished_run_rebuilds_the_trained_model(trained_run: Path):
    finished = RunDir(trained_run).load()
    assert finished.classes == ["circle", "square", "star", "triangle"] and finished.image_size == 64
    assert finished.config.out == str(trained_run) and finished.metrics["phase1"]["epochs"] == 1
    x = np.random.default_rng(0).uniform(0, 255, (2, 64, 64, 3)).astype(np.float32)
    # The export was written from the in-memory model at the end of training.
    exported = tf.saved_model.load(str(trained_run / "export" / "shapes" / "1")).signatures["predict_images"]
    np.testing.assert_allclose(
        rebuild_served_model(finished)(x)["probabilities"].numpy(),
        exported(images=x)["probabilities"].numpy(),
        atol=1e-5,
    )


def test_a_run_dir_that_is_not_finished_says_what_is_missing(tmp_path: Path):
    run = RunDir(tmp_path)
    with pytest.raises(
        UserError, match="not a finished run .*run_state.json, config.json, model.weights.h5.*train first$"
    ):
        run.load()
    (tmp_path / "run_state.json").write_text("{}")
    (tmp_path / "config.json").write_text("{}")  # a run stopped before its end: resumed, not started
    with pytest.raises(UserError, match="needs model.weights.h5\\); .* the same photoclf train command resumes it$"):
        run.load()


def test_an_export_given_where_its_run_dir_is_asked_for_names_the_run_dir(trained_run: Path):
    version = trained_run / "export" / "shapes" / "1"
    with pytest.raises(
        UserError, match=f"^{version}: not a finished run .*; it is inside the run dir {trained_run}: give that$"
    ):
        RunDir(version).load()


@pytest.mark.slow
@pytest.mark.parametrize("feature_views", ["2", "0"])
def test_a_run_without_phase_2_also_leaves_weights_that_rebuild_its_export(tiny_config, feature_views: str):
    """model.weights.h5 is the kept epoch's file copied when that holds the whole model (phase 1
    on images), and written from the model when it holds only the head (phase 1 on cached features)."""
    from app.training.train import train

    train(tiny_config.replace(epochs_finetune=0, feature_views=feature_views))
    run = Path(tiny_config.out)
    x = np.random.default_rng(1).uniform(0, 255, (2, 64, 64, 3)).astype(np.float32)
    exported = tf.saved_model.load(str(run / "export" / "run" / "1")).signatures["predict_images"]
    rebuilt = rebuild_served_model(RunDir(run).load())(x)["probabilities"].numpy()
    np.testing.assert_allclose(rebuilt, exported(images=x)["probabilities"].numpy(), atol=1e-5)


def test_a_run_records_its_data_folder_absolute_so_it_is_found_from_any_folder(tmp_path: Path, monkeypatch):
    """export, evaluate and review read the run's data folder later, maybe from elsewhere; the same
    train command, with the folder named relatively again, is still the same run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    cfg = TrainConfig(data="data", out="run")
    try:
        run = prepare_run_dir(cfg, overwrite=False)
    finally:
        release_run_dirs()
    saved = run.read_config()
    assert saved.data == str(tmp_path / "data")
    assert config_changes(saved, cfg) == []
    assert config_changes(saved, cfg.replace(data="other")) == ["data"]
    assert config_changes(saved, cfg.replace(data="gs://bucket/data")) == ["data"]
