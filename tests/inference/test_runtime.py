"""LiteRT serves what the SavedModel serves, and only when the export's parity check says so."""

from __future__ import annotations

import io
import json
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
from app.export.rebuild import rebuild_served_model
from app.inference.runtime import LiteRTRuntime, TFRuntime, litert_refusal, load_runtime

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


def test_a_failed_parity_check_is_refused_and_auto_falls_back_to_tensorflow(version: Path):
    assert litert_refusal(version, "float32") is None
    _edit_metadata(version, lambda m: m["litert"]["float32"].update(passed=False, top1_agreement=0.9))
    assert "parity check against the SavedModel failed (top-1 agreement 0.9000 < 1.0" in litert_refusal(
        version, "float32"
    )
    with pytest.raises(UserError, match="cannot serve with LiteRT: its float32 parity check"):
        load_runtime(version, "litert")
    assert load_runtime(version, "auto").name == "tf"


def test_auto_prefers_tensorflow_when_a_gpu_is_visible(trained_run: Path, monkeypatch: pytest.MonkeyPatch):
    version = trained_run / "export" / "shapes" / "1"
    assert load_runtime(version, "auto").name == "litert"  # no GPU here, parity passed
    monkeypatch.setattr("app.inference.runtime._gpu_visible", lambda: "a GPU is visible, and TensorFlow runs on it")
    assert load_runtime(version, "auto").name == "tf"


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
