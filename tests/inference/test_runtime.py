"""LiteRT serves what the SavedModel serves, and only when the export's parity check says so."""

from __future__ import annotations

import io
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from app.data import schema
from app.data.pipeline import load_dataset_info
from app.errors import UserError
from app.export import layout
from app.export.file_runners import host_precisions
from app.export.rebuild import rebuild_served_model
from app.inference import host_runtimes, runtime_choice
from app.inference import runtime as runtime_module
from app.inference.host_runtimes import LiteRTRuntime, ONNXRuntime, OpenVINORuntime, litert_refusal
from app.inference.runtime import TFRuntime, load_runtime

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def val_bytes(demo_records: Path) -> list[bytes]:
    spec = {schema.ENCODED: schema.FEATURE_SPEC[schema.ENCODED]}
    return [
        tf.io.parse_single_example(raw, spec)[schema.ENCODED].numpy()
        for raw in tf.data.TFRecordDataset(load_dataset_info(demo_records).shard_paths("val"))
    ]


@pytest.fixture
def version(trained_run: Path, tmp_path: Path) -> Path:
    """A private copy of the fine-tune's export, to break."""
    return Path(shutil.copytree(trained_run / "export" / "shapes" / "1", tmp_path / "shapes" / "1"))


def _edit_metadata(version: Path, edit) -> None:
    path = version / "assets" / "metadata.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def test_litert_gives_the_savedmodels_answers_on_the_validation_split(trained_run: Path, val_bytes: list[bytes]):
    version = trained_run / "export" / "shapes" / "1"
    lite, saved = load_runtime(version, "litert"), TFRuntime(version)
    assert isinstance(lite, LiteRTRuntime)
    inputs = {"image_bytes": np.array(val_bytes, dtype=object), "key": np.array([b"k"] * len(val_bytes), dtype=object)}
    ours, theirs = lite.run("serving_keyed", inputs), saved.run("serving_keyed", inputs)
    assert ours.keys() == theirs.keys()
    np.testing.assert_allclose(ours["probabilities"], theirs["probabilities"], atol=1e-4)
    assert (ours["class_ids"] == theirs["class_ids"]).all() and (ours["classes"] == theirs["classes"]).all()
    np.testing.assert_allclose(ours["scores"], theirs["scores"], atol=1e-4)
    assert list(ours["key"]) == [b"k"] * len(val_bytes)
    images = np.random.default_rng(1).uniform(0, 255, (3, 64, 64, 3)).astype(np.float32)
    np.testing.assert_allclose(
        lite.run("predict_images", {"images": images})["probabilities"],
        saved.run("predict_images", {"images": images})["probabilities"],
        atol=1e-4,
    )
    assert lite.signatures()["serving_default"][0]["image_bytes"].dtype == tf.string


def test_a_failed_parity_check_is_refused_and_auto_serves_with_another_runtime(
    version: Path, caplog: pytest.LogCaptureFixture
):
    assert litert_refusal(version, "float32") is None
    _edit_metadata(version, lambda m: m["litert"]["float32"].update(passed=False, top1_agreement=0.9))
    assert "parity check against the SavedModel failed (top-1 agreement 0.9000 < 1.0" in litert_refusal(
        version, "float32"
    )
    with pytest.raises(UserError, match="cannot serve with LiteRT: its float32 parity check"):
        load_runtime(version, "litert")
    with caplog.at_level(logging.INFO):
        assert load_runtime(version, "auto").name in ("tf", "openvino", "onnx")
    assert "cannot serve with LiteRT: its float32 parity check" in caplog.text  # auto says why it was left out


@pytest.fixture
def loaded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each runtime of an export loaded for real once per test (its refusals too, as its metadata
    says then): the tests of auto's choosing load the same runtimes many times over."""
    real, loaded = runtime_module._load, {}

    def load(version: Path, name: str, litert_mode: str):
        key = (name, layout.metadata_path(version).read_bytes())
        if key not in loaded:
            loaded[key] = real(version, name, litert_mode)
        return loaded[key]

    monkeypatch.setattr(runtime_module, "_load", load)


def test_auto_serves_with_the_runtime_measured_fastest_as_it_loads(
    trained_run: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, loaded_once: None
):
    version = trained_run / "export" / "shapes" / "1"
    batches = []
    for fastest in ("tf", "litert", "openvino", "onnx"):
        speeds = {"tf": 9.0, "litert": 5.0, "openvino": 5.0, "onnx": 5.0, fastest: 1.0}

        def measured(runtime, inputs, speeds=speeds):
            batches.append(len(inputs["images"]))
            return speeds[runtime.name]

        monkeypatch.setattr(runtime_module, "_ms_per_photo", measured)
        runtime_choice.choices_path().unlink(missing_ok=True)  # measured afresh (the memory is tested below)
        with caplog.at_level(logging.INFO):
            assert load_runtime(version, "auto").name == fastest
        assert "the fastest that may serve (ms per photo, 8 at a time: " in caplog.text
    assert set(batches) == {8}  # a server's few photos a call, unless the caller says its own batch
    assert load_runtime(version, "auto", batch=32).name == "onnx" and set(batches[-4:]) == {32}


def test_auto_measures_once_per_export_and_host_and_again_when_either_changes(
    version: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, loaded_once: None
):
    timed = []

    def measured(runtime, inputs):
        timed.append(runtime.name)
        return 1.0 if runtime.name == "onnx" else 9.0

    def measurements() -> int:
        return len(timed) // runtime_module.TIMING_ROUNDS

    monkeypatch.setattr(runtime_module, "_ms_per_photo", measured)
    assert load_runtime(version, "auto").name == "onnx" and measurements() == 4  # the first command times them all
    assert timed[:4] == ["tf", "litert", "openvino", "onnx"]  # in turn, round after round
    with caplog.at_level(logging.INFO):
        assert load_runtime(version, "auto").name == "onnx" and measurements() == 4  # later: only that one loaded
    assert "measured fastest on this host on " in caplog.text and "onnx float32 1.0" in caplog.text
    assert load_runtime(version, "auto", batch=32).name == "onnx" and measurements() == 8  # another batch: measured
    monkeypatch.setattr(runtime_choice, "_cpu", lambda: "another CPU, 64 cores")
    load_runtime(version, "auto")
    assert measurements() == 12  # another host
    monkeypatch.setattr(runtime_choice, "TIMED", "whole calls on photos")  # a choice another code timed otherwise
    load_runtime(version, "auto")
    assert measurements() == 16
    _edit_metadata(version, lambda m: m["onnx"]["float32"].update(passed=False))  # a new export, or a failed check
    assert load_runtime(version, "auto").name != "onnx" and measurements() == 19
    runtime_choice.choices_path().write_text("not JSON")  # a broken memory is only a measurement more
    load_runtime(version, "auto")
    assert measurements() == 22
    assert runtime_module._ms_per_photo.__name__ == "measured"  # the measurement itself is tested below


def test_the_measurement_times_every_runtime_on_a_batch_of_photos(trained_run: Path):
    version = trained_run / "export" / "shapes" / "1"
    for name in ("tf", "litert", "openvino", "onnx"):
        loaded = load_runtime(version, name)
        assert 0 < runtime_module._ms_per_photo(loaded, runtime_module._timing_inputs(loaded, 4)) < 10_000


def test_auto_prefers_tensorflow_when_a_gpu_is_visible(
    trained_run: Path, monkeypatch: pytest.MonkeyPatch, loaded_once: None
):
    version = trained_run / "export" / "shapes" / "1"
    monkeypatch.setattr(
        runtime_module, "_ms_per_photo", lambda runtime, inputs: 1.0 if runtime.name == "litert" else 9.0
    )
    assert load_runtime(version, "auto").name == "litert"  # no GPU here, parity passed, timed fastest
    monkeypatch.setattr("app.inference.runtime._gpu_visible", lambda: "a GPU is visible, and TensorFlow runs on it")
    assert load_runtime(version, "auto").name == "tf"


def test_the_openvino_ir_gives_the_savedmodel_s_answers_in_every_precision_the_host_runs(
    trained_run: Path, val_bytes: list[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    version = trained_run / "export" / "shapes" / "1"
    checks = layout.read_metadata(version)["openvino"]
    assert checks["file"] == "openvino/model.xml" and (version / "openvino" / "model.bin").is_file()
    assert checks["float32"]["passed"] and checks["float32"]["top1_agreement"] == 1.0
    assert checks["float32"]["max_abs_diff"] <= 1e-4
    saved = TFRuntime(version)
    inputs = {"image_bytes": np.array(val_bytes, dtype=object), "key": np.array([b"k"] * len(val_bytes), dtype=object)}
    theirs = saved.run("serving_keyed", inputs)
    monkeypatch.setattr(host_runtimes, "host_precisions", lambda: ("float32",))
    ours = load_runtime(version, "openvino")
    assert isinstance(ours, OpenVINORuntime) and ours.mode == "float32"
    answered = ours.run("serving_keyed", inputs)
    assert answered.keys() == theirs.keys()
    np.testing.assert_allclose(answered["probabilities"], theirs["probabilities"], atol=1e-4)
    assert (answered["classes"] == theirs["classes"]).all() and list(answered["key"]) == [b"k"] * len(val_bytes)
    if "bfloat16" in host_precisions():  # this CPU runs bfloat16: its own check, and where it passes it is preferred
        bf16 = checks["bfloat16"]
        assert bf16["top1_agreement"] >= 0.995 and bf16["images"] < 200 and not bf16["passed"]  # too few to tell
        monkeypatch.setattr(host_runtimes, "host_precisions", host_precisions)
        assert load_runtime(version, "openvino").mode == "float32"
        passed = Path(shutil.copytree(version, tmp_path / "shapes" / "1"))
        _edit_metadata(passed, lambda m: m["openvino"]["bfloat16"].update(images=200, passed=True))
        fast = load_runtime(passed, "openvino")
        assert fast.mode == "bfloat16"
        agree = fast.run("serving_default", inputs)["class_ids"][:, 0] == theirs["class_ids"][:, 0]
        assert agree.mean() >= 0.99


def test_a_file_whose_none_of_these_score_drifts_fails_its_check_though_every_top1_agrees(
    trained_run: Path, demo_records: Path, monkeypatch: pytest.MonkeyPatch
):
    """bfloat16 can leave every top-1 as it was and still move the "none of these" score far
    (a difference of large sums): the check counts the unknown decisions too."""
    from app.export import parity

    version = trained_run / "export" / "shapes" / "1"
    monkeypatch.setattr(parity, "images_needed", lambda bar: 1)  # the demo's val split is under the bar's 200
    predict = tf.saved_model.load(str(version)).signatures["predict_images"]

    def answering(drift: float):
        def model(images, side):
            out = predict(images=tf.constant(images, tf.float32))
            return {"probabilities": out["probabilities"].numpy(), "ood_score": out["ood_score"].numpy() + drift}

        return model

    same = parity.parity_report(answering(0.0), version, str(demo_records), 64, "bfloat16")
    assert same["passed"] and same["unknown_agreement"] == 1.0
    drifted = parity.parity_report(answering(100.0), version, str(demo_records), 64, "bfloat16")
    assert drifted["top1_agreement"] == 1.0 and drifted["unknown_agreement"] < 0.5 and not drifted["passed"]
    assert "unknown agreement" in parity.refusal(drifted, "OpenVINO bfloat16")


def test_a_smaller_type_s_check_passes_only_on_enough_images_to_tell_its_bar_from_a_flip():
    """99.5% top-1 agreement needs 200 val images before it means anything: on fewer one flip is
    already under it, and none says little."""
    from app.export import parity

    def checked(n: int, precision: str) -> dict:
        tally = parity._Tally(threshold=None)
        answers = {"probabilities": np.eye(4, dtype=np.float32)[np.arange(n) % 4]}
        tally.add(answers, answers, np.arange(n) % 4)
        return tally.report(precision)

    assert [parity.min_images(p) for p in ("float32", "float16", "bfloat16", "int8")] == [0, 200, 200, 200]
    few, enough = checked(6, "bfloat16"), checked(200, "bfloat16")
    assert few["top1_agreement"] == 1.0 and not few["passed"] and enough["passed"]
    assert checked(6, "float32")["passed"]  # float32's every top-1 must agree: a sample decides it
    assert parity.refusal(few, "OpenVINO bfloat16") == (
        "its OpenVINO bfloat16 parity check against the SavedModel failed (6 val images, under the 200 its bar needs)"
    )
    before_the_rule = {**few, "passed": True}  # an export checked before the rule: held to it when loaded
    del before_the_rule["min_images"]
    assert parity.refusal(before_the_rule, "OpenVINO bfloat16").endswith("(6 val images, under the 200 its bar needs)")
    assert parity.refusal({**enough, "passed": True}, "OpenVINO bfloat16") is None


def test_an_openvino_ir_without_a_passed_check_is_refused(version: Path):
    _edit_metadata(version, lambda m: [m["openvino"][p].update(passed=False, top1_agreement=0.5) for p in
                                       host_precisions()])  # fmt: skip
    with pytest.raises(UserError, match="cannot serve with OpenVINO: its OpenVINO .* parity check .* failed"):
        load_runtime(version, "openvino")
    (version / "openvino" / "model.xml").unlink()
    with pytest.raises(UserError, match="no openvino/model.xml"):
        load_runtime(version, "openvino")


def test_the_onnx_file_gives_the_savedmodel_s_answers_and_states_its_input(trained_run: Path, val_bytes: list[bytes]):
    version = trained_run / "export" / "shapes" / "1"
    checks = layout.read_metadata(version)["onnx"]
    assert checks["file"] == "onnx/model.onnx" and checks["input"].startswith("image: float32 [N, S, S, 3]")
    assert checks["float32"]["passed"] and checks["float32"]["top1_agreement"] == 1.0
    assert checks["float32"]["max_abs_diff"] <= 1e-4
    inputs = {"image_bytes": np.array(val_bytes, dtype=object)}
    theirs = TFRuntime(version).run("serving_default", inputs)
    ours = load_runtime(version, "onnx")
    assert isinstance(ours, ONNXRuntime) and ours.mode == "float32"
    answered = ours.run("serving_default", inputs)
    assert answered.keys() == theirs.keys()
    np.testing.assert_allclose(answered["probabilities"], theirs["probabilities"], atol=1e-4)
    assert (answered["classes"] == theirs["classes"]).all()


def test_an_onnx_file_without_a_passed_check_or_its_package_is_refused(version: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(host_runtimes, "onnx_available", lambda: "the onnxruntime package is not installed")
    with pytest.raises(UserError, match="cannot serve with ONNX Runtime: the onnxruntime package is not installed"):
        load_runtime(version, "onnx")
    monkeypatch.undo()
    _edit_metadata(version, lambda m: m["onnx"]["float32"].update(passed=False, top1_agreement=0.5))
    with pytest.raises(UserError, match="cannot serve with ONNX Runtime: its ONNX float32 parity check .* failed"):
        load_runtime(version, "onnx")
    (version / "onnx" / "model.onnx").unlink()
    with pytest.raises(UserError, match="no onnx/model.onnx"):
        load_runtime(version, "onnx")


def test_a_missing_check_or_file_is_refused(version: Path):
    _edit_metadata(version, lambda m: m.pop("litert"))
    assert "parity check against the SavedModel is missing" in litert_refusal(version, "float32")
    (version / "litert" / "model_float32.tflite").unlink()
    assert litert_refusal(version, "float32").startswith("no litert/model_float32.tflite")
    assert "no litert/model_int8.tflite" in litert_refusal(version, "int8")


@pytest.mark.slow  # a subprocess; the refusal itself is tested in process above
def test_serve_refuses_litert_without_a_passed_check_in_one_line(version: Path):
    _edit_metadata(version, lambda m: m.pop("litert"))
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/serve.py"), str(version.parent), "--runtime", "litert"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "cannot serve with LiteRT" in out.stderr and "missing" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_phone_sized_jpeg_gets_the_same_answer_from_every_path(trained_run: Path):
    """A 12-megapixel JPEG is decoded at a reduced DCT scale by the one eval decode; the SavedModel's
    signature, the LiteRT runtime's host decode and the in-memory model on `decode_for_eval` (what
    the eval pipeline and the feature cache feed it) agree on it."""
    from app.data.demo import draw_image
    from app.data.preprocess import decode_for_eval, eval_scale
    from app.run_dir import RunDir

    run = RunDir(trained_run).load()
    photo = draw_image("star", np.random.default_rng(3), (400, 300)).resize((4000, 3000))
    buffer = io.BytesIO()
    photo.save(buffer, format="JPEG", quality=90)
    data = buffer.getvalue()
    assert eval_scale(3000, 4000, run.image_size) == 8  # the path under test
    version = trained_run / "export" / "shapes" / "1"
    inputs = {"image_bytes": np.array([data], dtype=object)}
    served = TFRuntime(version).run("serving_default", inputs)["probabilities"]
    lite = load_runtime(version, "litert").run("serving_default", inputs)["probabilities"]
    pixels = decode_for_eval(tf.constant(data), run.image_size)[None]
    in_memory = rebuild_served_model(run)(pixels, training=False)["probabilities"].numpy()
    np.testing.assert_allclose(lite, served, atol=1e-4)
    np.testing.assert_allclose(in_memory, served, atol=1e-4)
    assert lite.argmax() == served.argmax() == in_memory.argmax()
