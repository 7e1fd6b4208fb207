"""The recipe benchmark: its arithmetic on known traces, and one real run of both recipes."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import UserError
from benchmarks import recipes as recipe_benchmark
from benchmarks.recipes import Trace, _summary, format_result, run_recipe_benchmark, subset_folder

pytestmark = pytest.mark.start_first  # its tests take over a minute in all


def test_time_to_reach_is_the_first_epoch_at_or_above_the_target():
    trace = Trace(seconds=50.0, epochs=[(10.0, 0.70), (20.0, 0.85), (30.0, 0.80), (40.0, 0.90)])
    assert trace.time_to_reach(0.85) == 20.0 and trace.time_to_reach(0.88) == 40.0
    assert trace.time_to_reach(0.95) is None


def test_summary_adds_the_conversion_to_our_times_and_takes_medians():
    usual = [Trace(100.0, [(90.0, 0.8)], 0.8), Trace(120.0, [(110.0, 0.8)], 0.8)]
    ours = [Trace(30.0, [(10.0, 0.7), (20.0, 0.85)], 0.9), Trace(50.0, [(12.0, 0.82)], 0.9)]
    result = _summary(list(zip(usual, ours)), convert_seconds=5.0)
    assert result["usual_seconds"] == 110.0 and result["ours_seconds"] == 45.0  # medians, + 5 s conversion
    assert result["time_ratio"] == pytest.approx(45 / 110, abs=1e-3)
    assert result["ours_seconds_to_reach_usual_accuracy"] == 21.0  # median of 20 and 12, + 5 s
    assert (result["usual_val_accuracy"], result["ours_val_accuracy"]) == (0.8, 0.9)
    assert "0.41x" in format_result(result) and "+0.1000" in format_result(result)


def test_the_usual_recipe_runs_with_tensorflows_own_allocator_and_ours_with_the_apps(tmp_path: Path, monkeypatch):
    environments: dict[str, dict | None] = {}
    commands: dict[str, list[str]] = {}

    def fake_trace(cmd: list[str], environment: dict | None = None) -> Trace:
        name = "usual" if "benchmarks.usual_recipe" in cmd else "ours"
        environments[name], commands[name] = environment, cmd
        return Trace(1.0, [(1.0, 0.9)], 0.9)

    monkeypatch.setattr(recipe_benchmark, "_trace", fake_trace)
    monkeypatch.setattr(recipe_benchmark.RunDir, "read_metrics", lambda self: {"phase2": {"val_accuracy": 0.9}})
    recipe_benchmark._rounds(
        tmp_path,
        tmp_path,
        tmp_path,
        weights="w.npz",
        backbone="efficientnet_lite0",
        image_size=32,
        rounds=1,
        seed=7,
        recipe_epochs=(1, 1),
        log=lambda line: None,
    )
    assert environments["usual"] == {"TF_CPU_ALLOCATOR_USE_BFC": "false"}  # what a copy of the tutorial gets
    assert environments["ours"] is None  # fine_tune.py as a user runs it: app/__init__.py's BFC default
    assert commands["usual"][-4] == "7"  # both recipes get --seed: the usual one as its seed argument,
    assert commands["ours"][commands["ours"].index("--set") + 1] == "seed=7"  # ours as its config key
    assert commands["usual"][-1] == "efficientnet_lite0" and "w.npz" in commands["usual"]  # and the same backbone
    assert commands["ours"][commands["ours"].index("--backbone") + 1] == "efficientnet_lite0"


def test_subset_keeps_n_training_photos_per_class_and_all_of_val(tmp_path: Path):
    for split, n in (("train", 5), ("val", 3)):
        for cls in ("a", "b"):
            (tmp_path / "src" / split / cls).mkdir(parents=True)
            for i in range(n):
                (tmp_path / "src" / split / cls / f"{i}.jpg").write_bytes(b"x")
    out = subset_folder(tmp_path / "src", tmp_path / "out", per_class=2, seed=0)
    assert sorted(len(list((out / "train" / c).iterdir())) for c in "ab") == [2, 2]
    assert sorted(len(list((out / "val" / c).iterdir())) for c in "ab") == [3, 3]
    assert not (out / "test").exists()
    held = subset_folder(tmp_path / "src", tmp_path / "held", per_class=2, seed=0, test_per_class=10)
    for c in "ab":  # the 3 training photos the subset left out, none of them in its train/
        test = {p.name for p in (held / "test" / c).iterdir()}
        assert len(test) == 3 and not test & {p.name for p in (held / "train" / c).iterdir()}


def test_without_a_per_class_cut_every_train_and_val_photo_is_kept_and_no_test_split(tmp_path: Path):
    """What both recipes read: the usual recipe reads no test/, so ours converts none either."""
    for split, n in (("train", 4), ("val", 2), ("test", 3)):
        (tmp_path / "src" / split / "a").mkdir(parents=True)
        for i in range(n):
            (tmp_path / "src" / split / "a" / f"{i}.jpg").write_bytes(b"x")
    out = subset_folder(tmp_path / "src", tmp_path / "out", per_class=None, seed=0)
    assert sorted(p.name for p in out.iterdir()) == ["train", "val"]
    assert [len(list((out / split / "a").iterdir())) for split in ("train", "val")] == [4, 2]


def test_a_folder_without_train_and_val_is_refused(tmp_path: Path):
    with pytest.raises(UserError, match="needs train/ and val/"):
        run_recipe_benchmark(tmp_path, weights="w.h5")


@pytest.mark.slow
def test_both_recipes_run_on_the_same_photos(pretrained_weights: Path, tmp_path: Path):
    from app.data.demo import generate_demo_images

    for split, seed in (("train", 0), ("val", 1)):
        generate_demo_images(tmp_path / "photos" / split, per_class=8, seed=seed)
    for bad in ("circle/truncated.jpg", "square/not_an_image.jpg", "star/empty.jpg"):
        for split in ("train", "val"):  # the usual recipe stops at the first file it cannot decode
            (tmp_path / "photos" / split / bad).unlink()
    lines: list[str] = []
    result = run_recipe_benchmark(
        tmp_path / "photos",
        weights=str(pretrained_weights),
        image_size=64,
        rounds=1,
        recipe_epochs=(1, 1),
        log=lines.append,
    )
    assert len(lines) == 1 and result["rounds"] == 1
    assert result["usual_seconds"] > 0 and result["ours_seconds"] > result["convert_seconds"] > 0
    assert 0 <= result["usual_val_accuracy"] <= 1 and 0 <= result["ours_val_accuracy"] <= 1


def test_with_another_backbone_the_recipe_unfreezes_the_tutorials_share_of_its_layers(lite0_weights: Path):
    """The tutorial unfreezes MobileNetV2 from layer 100 of 154; EfficientNet-Lite0 (141 layers,
    not in keras.applications) from the same share, 92, with its own input scaling."""
    from benchmarks.usual_recipe import build_model, fine_tune_at

    model, base = build_model(3, 64, str(lite0_weights), "efficientnet_lite0")
    assert len(base.layers) == 141 and fine_tune_at(base) == 92
    assert not base.trainable and model.output.shape == (None, 3)
    assert "normalize" in [layer.name for layer in model.layers]  # Lite0's (x - 127) / 128, not MobileNetV2's
