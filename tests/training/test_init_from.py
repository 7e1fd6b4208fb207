"""--init-from: a run starts from an earlier run's kept weights; more classes keep the old
classes' rows of the classification layer; a class that disappeared is refused before anything
is built."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import savedmodel_only

from app.config import TrainConfig
from app.errors import UserError
from app.run_dir import RunDir
from app.training.context import setup
from app.training.init_from import _earlier_classifier


@pytest.fixture(scope="module")
def three_class_records(demo_images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo photos without the star class."""
    from app.data.writer import write_tfrecords

    images = tmp_path_factory.mktemp("three") / "images"
    shutil.copytree(demo_images, images, ignore=shutil.ignore_patterns("star"))
    out = tmp_path_factory.mktemp("three_records")
    write_tfrecords(images, out, val_fraction=0.25, test_fraction=0.25, num_shards=1, workers=1)
    return out


@pytest.fixture(scope="module")
def three_class_run(three_class_records: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from app.training.train import train

    run = tmp_path_factory.mktemp("earlier") / "three"
    with savedmodel_only():  # an earlier run to start from: its files beside the SavedModel are not read
        train(TrainConfig(data=str(three_class_records), out=str(run), backbone="tiny_cnn", weights="none",
                          image_size=64, batch_size=8, epochs_head=1, epochs_finetune=1, max_steps_per_epoch=2,
                          phase2_mode="views"))  # fmt: skip
    return run


def earlier_weights(run: Path, dropout: float) -> dict[str, list[np.ndarray]]:
    finished = RunDir(run).load()
    from app.models.backbones import get_backbone

    old = _earlier_classifier(get_backbone(finished.state["backbone"]), finished, dropout)
    return {layer.name: layer.get_weights() for layer in old.model.layers if layer.weights}


def test_more_classes_keep_the_old_rows_and_start_the_new_one_fresh(tiny_config: TrainConfig, three_class_run: Path):
    ctx = setup(tiny_config.replace(init_from=str(three_class_run)))
    old = earlier_weights(three_class_run, tiny_config.dropout)
    classes, old_classes = ctx.info.classes, RunDir(three_class_run).load().classes
    assert ctx.start.kept_classes == old_classes and ctx.start.new_classes == ["star"]
    for name, weights in old.items():
        if name != "logits":
            for now, before in zip(ctx.clf.model.get_layer(name).get_weights(), weights):
                np.testing.assert_array_equal(now, before)
    kernel, bias = ctx.clf.model.get_layer("logits").get_weights()
    old_kernel, old_bias = old["logits"]
    for j, name in enumerate(classes):
        if name in old_classes:
            np.testing.assert_array_equal(kernel[:, j], old_kernel[:, old_classes.index(name)])
            assert bias[j] == old_bias[old_classes.index(name)]
    star = classes.index("star")
    assert not any(np.allclose(kernel[:, star], old_kernel[:, i]) for i in range(len(old_classes)))
    assert bias[star] == pytest.approx(float(np.mean(old_bias)))


def test_a_class_the_earlier_run_had_that_the_data_lost_is_refused_before_anything_is_built(
    tiny_config: TrainConfig, trained_run: Path, three_class_records: Path
):
    cfg = tiny_config.replace(data=str(three_class_records), init_from=str(trained_run))
    with pytest.raises(UserError, match=r"--init-from .*: its class\(es\) 'star' are not in this data"):
        setup(cfg)
    assert not Path(cfg.out).exists()


def test_a_run_of_another_backbone_size_or_an_unfinished_one_is_refused(
    tiny_config: TrainConfig, trained_run: Path, tmp_path: Path
):
    with pytest.raises(UserError, match="that run's image_size is 64, this one's 96"):
        setup(tiny_config.replace(init_from=str(trained_run), image_size=96))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="^--init-from: .*empty: not a finished run"):
        setup(tiny_config.replace(init_from=str(tmp_path / "empty")))


@pytest.mark.slow  # a whole training run
def test_the_finished_run_records_where_it_started(tiny_config: TrainConfig, three_class_run: Path):
    from app.training.train import train

    metrics = train(tiny_config.replace(init_from=str(three_class_run)))
    assert metrics["init_from"] == {
        "run": str(three_class_run),
        "kept_classes": ["circle", "square", "triangle"],
        "new_classes": ["star"],
        "seen": {"val": 0, "test": 0},  # the same photos split alike, star's new
        "warning": None,
    }
    assert RunDir(Path(tiny_config.out)).read_config().init_from == str(three_class_run)


def _names(records: Path, split: str) -> set[bytes]:
    from app.data.pipeline import make_eval_dataset

    ds = make_eval_dataset(records, split=split, image_size=16, with_filenames=True)
    return {name for _, _, names in ds for name in names.numpy()}


def test_photos_the_earlier_run_trained_on_are_counted_in_this_datas_val_and_test(
    demo_images: Path, demo_records: Path, tmp_path: Path
):
    """The same photos converted with another --seed: many of this data's val and test photos
    were the earlier data's training photos (counted here by file name, there by content)."""
    from app.data.writer import write_tfrecords
    from app.training.init_from import Start, seen_in_training

    other_seed = tmp_path / "seed1"
    write_tfrecords(demo_images, other_seed, val_fraction=0.25, test_fraction=0.25, num_shards=1, workers=1, seed=1)
    seen = seen_in_training(str(other_seed), str(demo_records))
    trained = _names(other_seed, "train")
    assert seen == {split: len(_names(demo_records, split) & trained) for split in ("val", "test")}
    assert seen["val"] > 0 and seen["test"] > 0
    assert seen_in_training(str(demo_records), str(demo_records)) == {"val": 0, "test": 0}
    assert seen_in_training(str(tmp_path / "gone"), str(demo_records)) is None  # nothing to compare

    warning = Start("runs/old", ["a"], [], seen).warning
    assert warning.startswith(f"{seen['val']} val and {seen['test']} test photo(s) of this data were training photos")
    assert Start("runs/old", ["a"], [], {"val": 0, "test": 0}).warning is None
