"""Whole runs: config round trip, resume after SIGKILL, and bad input failing before any work."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_BACKBONE, with_tiny_backbone

from app.config import TrainConfig, load_config, parse_set, read_saved_config, save_config
from app.errors import UserError
from app.run_dir import RunDir, read_history
from app.training.context import setup
from app.training.train import train

pytestmark = pytest.mark.start_first  # its tests take over a minute in all

ROOT = Path(__file__).resolve().parents[2]


def test_config_round_trip(tmp_path: Path):
    toml = tmp_path / "c.toml"
    toml.write_text('[train]\nbackbone = "efficientnet_b0"\nepochs_head = 7\nclass_weights = true\nlr_head = 3e-4\n')
    cfg = load_config(toml, parse_set(["batch-size=12", "label_smoothing=0"]))
    assert (cfg.backbone, cfg.epochs_head, cfg.class_weights, cfg.lr_head, cfg.batch_size, cfg.label_smoothing) == (
        "efficientnet_b0",
        7,
        True,
        3e-4,
        12,
        0.0,
    )
    save_config(cfg, tmp_path / "config.json")
    assert read_saved_config(tmp_path / "config.json") == cfg


@pytest.mark.parametrize("key,value", [("lr_finetune", "inf"), ("weight_decay", "nan"), ("color_jitter", "-inf")])
def test_a_number_that_is_not_finite_is_refused_naming_its_key(tmp_path: Path, key: str, value: str):
    """lr_finetune = inf passed `> 0` and trained a run; keys without a range check took nan."""
    with pytest.raises(UserError, match=f"^--set: '{key}' must be a finite number, got {value}$"):
        load_config(None, parse_set([f"{key}={value}"]))
    toml = tmp_path / "c.toml"
    toml.write_text(f"[train]\n{key} = {value}\n")  # TOML writes them too
    with pytest.raises(UserError, match=f"^{toml}: '{key}' must be a finite number"):
        load_config(toml)


def test_keys_above_a_train_table_are_read_with_it_and_one_in_both_is_refused(tmp_path: Path):
    toml = tmp_path / "c.toml"
    toml.write_text("seed = 3\n[train]\nepochs_head = 4\n")
    assert (load_config(toml).seed, load_config(toml).epochs_head) == (3, 4)  # the seed was dropped silently
    toml.write_text("epochs_head = 3\n[train]\nepochs_head = 4\n")
    with pytest.raises(UserError, match=r"c.toml: 'epochs_head' given twice, above \[train\] and in it; keep one$"):
        load_config(toml)


def test_a_config_saved_by_an_older_version_loads_without_its_retired_keys(tmp_path: Path):
    saved = {**TrainConfig(epochs_head=7).to_dict(), "phase2_on_views": True}  # replaced by phase2_mode
    del saved["phase2_mode"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert read_saved_config(tmp_path / "config.json") == TrainConfig(epochs_head=7)


@pytest.mark.parametrize(
    "cache_features,views,joined",
    [("auto", 2, "auto"), ("auto", 4, "4"), ("true", 2, "2"), ("true", 3, "3"), ("false", 2, "0"), ("false", 5, "0")],
)
def test_an_older_run_s_cache_features_joins_feature_views(tmp_path: Path, cache_features: str, views: int, joined):
    """Before one key said both, cache_features said whether phase 1 caches and feature_views how
    many views; an older run dir loads with the one key that says what it did."""
    saved = {**TrainConfig().to_dict(), "cache_features": cache_features, "feature_views": views}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert read_saved_config(tmp_path / "config.json") == TrainConfig(feature_views=joined)


@pytest.mark.parametrize("given,kept", [("auto", "auto"), ("AUTO", "auto"), ("0", "0"), ("03", "3"), (4, "4")])
def test_feature_views_is_auto_or_a_count(given: object, kept: str):
    cfg = load_config(None, {"feature_views": given})
    assert cfg.feature_views == kept and cfg.cached_views == (2 if kept == "auto" else int(kept))
    assert TrainConfig().replace(feature_views=4).feature_views == "4"  # from code as from a file


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"feature_views": "-1"}, "--set: 'feature_views' must be auto or a number of views >= 0, got '-1'"),
        ({"feature_views": True}, "'feature_views' must be auto or a number of views"),
        ({"cache_features": "false"}, "'cache_features' is retired; feature_views says it now: 0 = phase 1 on images"),
        ({"no_such_key": "1"}, r"^--set: unknown config key 'no_such_key' \(known: augment, backbone, "),
        ({"epochs_heads": "3"}, r"^--set: unknown config key 'epochs_heads': did you mean 'epochs_head'\? \(known"),
        ({"strategy": "magic"}, "must be one of"),
        ({"augment": "maybe"}, "must be bool"),
        ({"unfreeze": "half"}, "^--set: 'unfreeze' must be blocks:N, fraction:F or layer:NAME, got 'half'$"),
        ({"batch_size": "0"}, r"^--set: 'batch_size' must be >= 1, got 0$"),
        ({"dropout": "1"}, r"^--set: 'dropout' must be in \[0, 1\), got 1.0$"),
        ({"epochs_head": "0", "epochs_finetune": "0"}, "^config: nothing to train: epochs_head and epochs_finetune"),
        ({"out": "gs://bucket/run"}, "the run dir must be a local path"),
    ],
)
def test_bad_config_values(overrides: dict, message: str):
    with pytest.raises(UserError, match=message):
        load_config(None, overrides)


@pytest.mark.parametrize(
    "key,meant",
    [
        ("img_size", "'image_size'"),  # a misspelling
        ("epochs-head", "'epochs_head'"),  # the flag's spelling
        ("epochs", "'epochs_head' or 'epochs_finetune'"),  # a word of both phases' keys
        ("patience", "'early_stopping_patience'"),
        ("cache_dir", "'feature_store'"),  # no key's name: its help says "cached backbone features"
        ("learning_rate", "'lr_head' or 'lr_finetune'"),
    ],
)
def test_an_unknown_key_names_the_keys_the_user_most_likely_meant(key: str, meant: str):
    with pytest.raises(UserError, match=f"^--set: unknown config key '{key}': did you mean {meant}\\? \\(known"):
        load_config(None, {key: "1"})


def test_an_unknown_key_that_names_nothing_known_gets_no_guess():
    with pytest.raises(UserError, match=r"^--set: unknown config key 'mixup' \(known"):
        load_config(None, {"mixup": "0.2"})


def test_a_value_from_a_flag_is_named_by_the_flag_and_one_from_set_by_set_and_from_a_file_by_the_file(tmp_path: Path):
    with pytest.raises(UserError, match="^--batch-size: 'batch_size' must be int, got 'many'$"):
        load_config(None, flags={"batch_size": "many"})
    with pytest.raises(UserError, match="^--set: 'epochs_head' must be int, got 'three'$"):
        load_config(None, parse_set(["epochs_head=three"]))  # a key that is also a flag, given by --set
    toml = tmp_path / "c.toml"
    toml.write_text("batch_size = -4\n")
    with pytest.raises(UserError, match=f"^{toml}: 'batch_size' must be >= 1, got -4$"):
        load_config(toml)
    toml.write_text("batch_size = 4\n")
    assert load_config(toml, {"batch_size": "8"}, {"batch_size": "16"}).batch_size == 16  # file, --set, flag


def _assert_nothing_written(cfg: TrainConfig):
    assert not Path(cfg.out).exists(), f"{cfg.out} was created by a run that failed validation"


@pytest.mark.parametrize(
    "change,message",
    [
        ({"data": "/nonexistent/data"}, "dataset.json"),
        ({"backbone": "vgg99"}, "known: .*mobilenet_v2"),
        ({"image_size": 16}, "too small"),
        ({"strategy": "tpu"}, "strategy=tpu: no TPU found"),  # selectable; here there is none
    ],
)
def test_bad_input_fails_before_anything_is_written(tiny_config: TrainConfig, change: dict, message: str):
    cfg = tiny_config.replace(**change)
    with pytest.raises(UserError, match=message):
        setup(cfg)
    _assert_nothing_written(cfg)


def test_a_batch_larger_than_the_train_split_becomes_the_split(tiny_config: TrainConfig, caplog):
    """A few photos a class: epochs of one step over all of them, not an error (nor epochs of none)."""
    from app.data.pipeline import load_dataset_info

    photos = load_dataset_info(tiny_config.data).num_examples("train")
    with caplog.at_level("WARNING", logger="app.training.context"):
        ctx = setup(tiny_config.replace(batch_size=4096, max_steps_per_epoch=0))
    assert (ctx.batch_size, ctx.global_batch, ctx.steps_per_epoch) == (photos, photos, 1)
    assert f"batch size {photos}: the train split holds {photos} photos, fewer than a batch of 4096" in caplog.text
    assert ctx.cfg.batch_size == 4096  # the config as asked: the same command again finds its run


def test_weights_file_that_does_not_fit(tiny_config: TrainConfig, tmp_path: Path):
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    bogus = tmp_path / "other.weights.h5"
    other.save_weights(str(bogus))
    cfg = tiny_config.replace(weights=str(bogus))
    with pytest.raises(UserError, match=f"does not fit {cfg.backbone}"):
        setup(cfg)
    _assert_nothing_written(cfg)
    with pytest.raises(UserError, match="no such file"):
        setup(tiny_config.replace(weights=str(tmp_path / "missing.weights.h5")))


def test_a_run_dir_another_process_trains_in_is_refused_before_the_work(tiny_config: TrainConfig):
    """Two `photoclf train` on one --out wrote one history, checkpoints and exports over each other."""
    import subprocess
    import sys

    from app import run_dir

    setup(tiny_config)  # this process's own run dir: claiming it again is no conflict
    setup(tiny_config)
    run_dir.release_run_dirs()  # as train() does at its end: another process may claim it now
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY);"
         " fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", tiny_config.out],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        other = tiny_config.replace(out=str(Path(tiny_config.out)))
        with pytest.raises(UserError, match=f"^--out {other.out}: another process is training in this run dir"):
            setup(other)
        with pytest.raises(UserError, match="another process is training"):
            setup(other, overwrite=True)  # never cleared under the other run
        assert Path(other.out, "config.json").exists()
    finally:
        holder.kill()
        holder.wait()
    setup(tiny_config)  # the other process gone: the run dir is free again


def test_changed_config_in_existing_run_dir_is_refused(tiny_config: TrainConfig, monkeypatch):
    setup(tiny_config)

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were loaded (or downloaded) before the run dir was checked")

    with monkeypatch.context() as patched:
        patched.setattr("app.training.context.load_pretrained_backbone", no_weights)
        with pytest.raises(UserError, match="different config.*epochs_head"):
            setup(tiny_config.replace(epochs_head=9))
    setup(tiny_config.replace(epochs_head=9), overwrite=True)


def test_class_count_that_does_not_match_the_checkpoint(tiny_config: TrainConfig, demo_records: Path, tmp_path: Path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(demo_records, data)
    cfg = tiny_config.replace(data=str(data))
    setup(cfg)
    meta = json.loads((data / "dataset.json").read_text())
    meta["classes"] = meta["classes"][:3] + ["extra", "more"]
    (data / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="checkpoint was trained with classes"):
        setup(cfg)


def _tensorboard_events(folder: Path) -> dict[str, list[tuple[int, object]]]:
    """tag → [(step, value)] from the event files; images as their encoded PNGs."""
    events: dict[str, list[tuple[int, object]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                tensor = tf.make_ndarray(value.tensor)
                events.setdefault(value.tag, []).append(
                    (event.step, tensor if tensor.dtype == object else float(tensor))
                )
    return events


def test_full_run_writes_the_run_dir(trained_run: Path):
    run = RunDir(trained_run)
    for path in (
        run.config,
        run.state,
        run.history,
        run.learning_curves,
        run.metrics,
        run.final_weights,
        run.tensorboard,
    ):
        assert path.exists(), path
    saved = run.read_metrics()
    assert saved["weights"].startswith("none") and saved["weights_warning"]
    assert {"val_accuracy", "val_loss", "epochs", "seconds"} <= saved["phase1"].keys()
    assert {"val_accuracy", "val_loss", "epochs", "seconds"} <= saved["phase2"].keys()
    for phase in ("phase1", "phase2"):  # the kept weights' validation, whose matrix the report and TensorBoard show
        matrix = np.array(saved[phase]["val_confusion_matrix"])
        assert matrix.shape == (4, 4) and np.trace(matrix) / matrix.sum() == pytest.approx(
            saved[phase]["val_accuracy"], abs=1e-6
        )
    assert "accuracy" in saved["test"]
    assert (
        Path(saved["export"]) == run.export_root / "shapes" / "1"
        and (Path(saved["export"]) / "saved_model.pb").exists()
    )
    assert [(r["phase"], r["phase_epoch"]) for r in read_history(run.history)] == [("1", "1"), ("2", "1")]
    assert not list(run.checkpoints.glob(".*")) and not list(run.root.glob(".*"))  # no temp files left


def test_tensorboard_gets_scalars_augmented_images_and_the_confusion_matrix(trained_run: Path):
    run = RunDir(trained_run)
    events, history = _tensorboard_events(run.tensorboard), read_history(run.history)
    for tag in ("loss", "accuracy", "val_loss", "val_accuracy", "lr", "images_per_s"):
        assert [step for step, _ in events[tag]] == [int(r["epoch"]) for r in history], tag
    assert [v for _, v in events["val_loss"]] == pytest.approx([float(r["val_loss"]) for r in history], abs=1e-5)
    assert [v for _, v in events["lr"]] == pytest.approx([float(r["lr"]) for r in history], rel=1e-2)
    assert all(v > 0 for _, v in events["images_per_s"])
    for tag in ("train/augmented_inputs", "val/confusion_matrix"):
        ((step, tensor),) = events[tag]
        width, height, *pngs = tensor  # TensorBoard's image summary: width, height, then PNGs
        assert pngs and all(png.startswith(b"\x89PNG") for png in pngs), tag
    assert len(events["train/augmented_inputs"][0][1]) - 2 == 8  # eight training images
    assert events["val/confusion_matrix"][0][0] == len(history)  # logged after the last epoch


def _history(run: Path) -> list[tuple[str, str]]:
    with (run / "history.csv").open() as f:
        return [(r["phase"], r["phase_epoch"]) for r in csv.DictReader(f)]


@pytest.mark.slow
def test_resume_after_sigkill(demo_records: Path, tmp_path: Path):
    """Kill the train command (as scripts/fine_tune.py runs it) mid-phase with SIGKILL; the same
    command continues and finishes."""
    run = tmp_path / "run"
    cmd = with_tiny_backbone(
        "fine_tune.py", "--backbone", TINY_BACKBONE, "--weights", "none",
        "--data", str(demo_records), "--out", str(run), "--image-size", "64",
        "--batch-size", "8", "--epochs-head", "12", "--epochs-finetune", "2",
        "--set", "max_steps_per_epoch=2", "--set", "early_stopping_patience=20",
        "--set", "feature_views=0", "--set", "phase2_mode=images",  # epochs on images: long enough to kill
    )  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PHOTOCLF_WEIGHTS", None)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(_history(run) if (run / "history.csv").exists() else []) < 2:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(_history(run))
    assert 2 <= done_before < 12, "the run was not killed mid-training"
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    log = out.stderr + out.stdout
    assert "resuming phase 1 after epoch" in log
    assert "\x1b[" not in log and "\b" not in log  # a log redirected to a file: no colour or backspace codes
    assert "Sharding callback" not in log  # TensorFlow's INFO line for every checkpoint written
    assert _history(run) == [("1", str(e)) for e in range(1, 13)] + [("2", "1"), ("2", "2")]
    assert (run / "metrics.json").exists()


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path):
    (tmp_path / "photos").mkdir()  # a folder, but not one make_tfrecords.py wrote
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/fine_tune.py"),
            "--data",
            str(tmp_path / "photos"),
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "dataset.json" in errors[0] and "Traceback" not in out.stderr
    assert not (tmp_path / "r").exists()


def test_finished_run_is_reported_not_rebuilt_whatever_the_path_spelling(trained_run: Path, monkeypatch):
    cfg = RunDir(trained_run).read_config()
    monkeypatch.setenv("PHOTOCLF_WEIGHTS", "/nonexistent.weights.h5")  # would fail if the model were rebuilt
    for out in (str(trained_run), os.path.relpath(trained_run)):
        assert train(cfg.replace(out=out)) == RunDir(trained_run).read_metrics()
    assert sorted(p.name for p in (trained_run / "export" / "shapes").iterdir()) == ["1"]  # nothing new exported


def test_a_finished_run_on_data_that_changed_since_says_so_instead_of_its_old_metrics(
    trained_run: Path, demo_records: Path, tmp_path: Path
):
    import shutil

    run, data = tmp_path / "run", tmp_path / "data"
    shutil.copytree(trained_run, run)
    shutil.copytree(demo_records, data)
    cfg = RunDir(run).read_config().replace(out=str(run), data=str(data))
    save_config(cfg, RunDir(run).config)  # the copied run, trained on the copied data
    assert train(cfg) == RunDir(run).read_metrics()  # the same dataset.json: finished, nothing rebuilt
    meta = json.loads((data / "dataset.json").read_text())
    meta["bytes"] += 1000
    (data / "dataset.json").write_text(json.dumps(meta))  # converted again, from a folder that grew
    with pytest.raises(UserError, match=r"trained on another version of its data .*--overwrite"):
        train(cfg)
