"""The serving export: signatures, raw-bytes parity with the eval pipeline, versions, TFLite."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import stored_weight_shapes

from app.data import schema
from app.data.pipeline import load_dataset_info, make_eval_dataset
from app.errors import UserError
from app.export.rebuild import rebuild_served_model
from app.export.run_export import export_run
from app.export.saved_model import export_saved_model
from app.run_dir import RunDir
from app.training.report import format_result

pytestmark = pytest.mark.start_first  # its tests take over a minute in all


def _val_bytes(data: Path) -> tuple[list[bytes], list[int]]:
    images, labels = [], []
    for path in load_dataset_info(data).shard_paths("val"):
        for raw in tf.data.TFRecordDataset(path):
            ex = tf.io.parse_single_example(raw, schema.FEATURE_SPEC)
            images.append(ex[schema.ENCODED].numpy())
            labels.append(int(ex[schema.LABEL]))
    return images, labels


def _kernel_values(weights_file: Path) -> int:
    """How many values the model's kernels hold: a float32 LiteRT file carries at least these
    (BatchNorm folds into them, so its own variables need not appear)."""
    return sum(math.prod(shape) for shape in stored_weight_shapes(weights_file) if len(shape) >= 2)


def test_fine_tune_exports_with_all_signatures(trained_run: Path, demo_records: Path):
    version = trained_run / "export" / "shapes" / "1"
    assert (version / "saved_model.pb").exists() and (version / "variables").is_dir()
    # the weights are constants in the graph (one frozen forward pass): the checkpoint holds none
    saved = [name for name, _ in tf.train.list_variables(str(version / "variables" / "variables"))]
    assert saved == ["_CHECKPOINTABLE_OBJECT_GRAPH"]
    assets = sorted(p.name for p in (version / "assets").iterdir())
    assert assets == ["labels.txt", "metadata.json"]
    meta = json.loads((version / "assets" / "metadata.json").read_text())
    assert {
        "backbone",
        "input_size",
        "classes",
        "training_metrics",
        "dataset_fingerprint",
        "created",
        "package_version",
    } <= meta.keys()
    assert meta["max_megapixels"] == 70 and meta["top_k"] == 4
    # the float32 LiteRT file is part of every export, checked against the SavedModel on the
    # val split's first 64 images (all of them when there are fewer)
    assert (version / "litert" / "model_float32.tflite").stat().st_size >= 4 * _kernel_values(
        trained_run / "model.weights.h5"
    )
    parity = meta["litert"]["float32"]
    assert parity["passed"] and parity["top1_agreement"] == 1.0 and parity["max_abs_diff"] < 1e-4
    assert parity["images"] == min(64, load_dataset_info(demo_records).num_examples("val"))
    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["litert"]["float32"] == parity
    assert f"agrees with the SavedModel on {parity['images']}/{parity['images']} val images" in format_result(metrics)
    failed = {**metrics, "litert": {"float32": {**parity, "passed": False, "top1_agreement": 0.5}}}
    said = "float32 file NOT checked OK (top-1 agreement 0.5000 against the 1 required); photoclf serve will not run"
    assert said in format_result(failed)
    int8 = {"images": 150, "top1_agreement": 0.88, "passed": False, "required_agreement": 0.995, "max_abs_diff": 0.7}
    said = "int8 file NOT checked OK (top-1 agreement 0.8800 against the 0.995 required; 150 val images, under the 200"
    assert said in format_result({**metrics, "litert": {"float32": parity, "int8": int8}})  # every file is said
    ir = metrics["openvino"]["float32"]
    n = ir["images"]
    assert f"openvino: IR agrees with the SavedModel on val images in float32 {n}/{n} top-1, {n}/{n} unknown" in (
        format_result(metrics))  # fmt: skip
    below = {**metrics, "openvino": {"float32": {**ir, "passed": False, "top1_agreement": 0.5}}}
    said = f"float32 {round(n / 2)}/{n} top-1, {n}/{n} unknown (not served: below its bar); photoclf serve will not"
    assert said in format_result(below)
    few = {**metrics, "openvino": {"bfloat16": {**ir, "passed": False, "min_images": 200, "required_agreement": 0.995}}}
    said = f"bfloat16 {n}/{n} top-1, {n}/{n} unknown (not served: {n} val images, under the 200 its bar needs)"
    assert said in format_result(few)
    loaded = tf.saved_model.load(str(version))
    assert set(loaded.signatures) == {"serving_default", "serving_keyed", "predict_images"}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "saved_model_cli"), "show", "--dir", str(version), "--all"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0
    for needle in ("serving_default", "predict_images", "image_bytes", "probabilities", "class_ids", "scores"):
        assert needle in out.stdout


def test_serving_bytes_match_the_eval_pipeline(trained_run: Path, demo_records: Path):
    run = RunDir(trained_run).load()
    model = rebuild_served_model(run)
    serve = tf.saved_model.load(str(trained_run / "export" / "shapes" / "1")).signatures["serving_default"]
    images, labels = _val_bytes(demo_records)
    served = serve(image_bytes=tf.constant(images))
    in_memory = np.concatenate(
        [
            model(x, training=False)["probabilities"].numpy()
            for x, _ in make_eval_dataset(demo_records, split="val", image_size=run.image_size, batch_size=16)
        ]
    )
    np.testing.assert_allclose(served["probabilities"].numpy(), in_memory, atol=1e-4)
    classes = run.classes
    top = served["class_ids"].numpy()
    assert served["scores"].shape == top.shape == (len(images), min(5, len(classes)))
    assert [c.decode() for c in served["classes"].numpy()[:, 0]] == [classes[i] for i in top[:, 0]]


def test_keyed_signature_passes_keys_through_and_bad_images_fail_the_call(trained_run: Path, demo_records: Path):
    loaded = tf.saved_model.load(str(trained_run / "export" / "shapes" / "1"))
    images, _ = _val_bytes(demo_records)
    out = loaded.signatures["serving_keyed"](image_bytes=tf.constant(images[:3]), key=tf.constant([b"a", b"b", b"c"]))
    assert out["key"].numpy().tolist() == [b"a", b"b", b"c"]
    with pytest.raises(tf.errors.InvalidArgumentError):
        loaded.signatures["serving_default"](image_bytes=tf.constant([images[0], b"not an image"]))


def _numbers(value) -> set[str]:
    """Every number in a JSON-like value, written each way the model card writes numbers."""
    if isinstance(value, dict):
        return set().union(*(_numbers(v) for v in value.values())) if value else set()
    if isinstance(value, list | tuple):
        return set().union(*(_numbers(v) for v in value)) if value else set()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return set(re.findall(r"\d+(?:\.\d+)?", value)) if isinstance(value, str) else set()
    return {str(value), f"{value:.4f}", f"{value:.3f}", f"{value:.0%}".rstrip("%")}


def test_every_export_has_a_model_card_with_only_what_the_run_measured_or_recorded(trained_run: Path):
    version = trained_run / "export" / "shapes" / "1"
    meta = json.loads((version / "assets" / "metadata.json").read_text())
    card = json.loads((version / "model_card.json").read_text())
    config = json.loads((trained_run / "config.json").read_text())
    counts = load_dataset_info(config["data"]).counts
    assert {"MODEL_CARD.md", "model_card.json"} <= meta["files"].keys()  # a server checks them too
    assert card["classes"] == [{"name": c, **{s: counts[s][c] for s in counts}} for c in meta["classes"]]
    assert card["test"] == meta["training_metrics"]["test"] and card["calibration"] == meta["calibration"]
    assert card["runtimes"] == {"litert": meta["litert"], "openvino": meta["openvino"], "onnx": meta["onnx"]}
    assert card["data"]["dataset_json_sha256"] == meta["dataset_fingerprint"]
    assert card["training"]["seed"] == config["seed"] and card["backbone"]["name"] == meta["backbone"]
    assert card["training"]["batch_size"] == meta["training_metrics"]["batch_size"]  # as it ran
    page = (version / "MODEL_CARD.md").read_text()
    assert f"test accuracy: {meta['training_metrics']['test']['accuracy']:.4f}" in page
    assert "image_size" not in card["training"]  # the config's may be 0, "the backbone's default": said resolved
    assert f"- backbone: {meta['backbone']} at {meta['input_size']} px" in page.splitlines()
    assert "\n\n- calibration: " in page  # the per-class table ends before the list goes on
    test, classes = meta["training_metrics"]["test"], meta["classes"]
    per_class = test["per_class"]  # from the test split's confusion matrix: its photos and its correct answers
    assert list(per_class) == classes and sum(c["support"] for c in per_class.values()) == test["count"]
    correct = sum(c["recall"] * c["support"] for c in per_class.values())
    assert correct == pytest.approx(test["accuracy"] * test["count"])
    for name, c in per_class.items():
        assert f"| {name} | {c['precision']:.3f} | {c['recall']:.3f} | {c['f1']:.3f} | {c['support']} |" in page
    measured = _numbers([meta, config, counts, card]) | {"95"}  # the interval's level
    text = re.sub(r"`[^`]*`|^Created .*$", "", page, flags=re.M)  # digests and the date, checked above
    standalone = r"(?<![\w.-])\d+(?:\.\d+)?(?!\w)"  # not part of a name: SHA-256, bfloat16, top-1
    unmeasured = [n for n in re.findall(standalone, text) if n not in measured]
    assert not unmeasured, unmeasured


def test_a_model_card_reads_photo_counts_only_from_the_dataset_json_the_run_trained_on(trained_run: Path, tmp_path):
    """The data folder is gone, or holds another dataset.json, by the time of an export: the card
    says why it gives no counts (no table of blanks), and the digest is still the one trained on."""
    from app.export.model_card import card, markdown

    version = trained_run / "export" / "shapes" / "1"
    meta = json.loads((version / "assets" / "metadata.json").read_text())
    config = json.loads((trained_run / "config.json").read_text())
    assert meta["dataset_fingerprint"] == json.loads((trained_run / "run_state.json").read_text())["dataset"]
    changed = tmp_path / "changed"
    shutil.copytree(config["data"], changed)
    info = json.loads((changed / schema.METADATA_FILE).read_text())
    (changed / schema.METADATA_FILE).write_text(json.dumps({**info, "note": "converted again"}))
    for data, why in [(str(tmp_path / "gone"), "no dataset.json"), (str(changed), "another dataset.json than")]:
        facts = card(meta, {**config, "data": data})
        assert facts["data"]["dataset_json_sha256"] == meta["dataset_fingerprint"]
        assert why in facts["data"]["counts_missing"] and facts["classes"] == [{"name": c} for c in meta["classes"]]
        lines = markdown(facts, "m").splitlines()
        data_section = lines[lines.index("## Data") : lines.index("## Backbone and training")]
        assert f"Classes: {', '.join(meta['classes'])}." in data_section
        assert not any(line.startswith("|") for line in data_section)


def test_runtime_files_the_export_could_not_check_are_said_unchecked(trained_run: Path):
    metrics = json.loads((trained_run / "metrics.json").read_text())
    missing = {"passed": False, "missing": "no validation data to check against: data/x: no dataset.json"}
    unchecked = {**metrics, "openvino": {"file": "openvino/model.xml", "float32": missing, "bfloat16": missing}}
    said = "openvino: IR NOT checked (no validation data to check against: data/x: no dataset.json); photoclf serve"
    assert said in format_result(unchecked)


def test_a_class_name_with_a_pipe_keeps_its_model_card_rows_whole(trained_run: Path):
    """A folder may be named "cats|dogs": unescaped, its '|' split the class's table rows."""
    from app.export.model_card import markdown

    card = json.loads((trained_run / "export" / "shapes" / "1" / "model_card.json").read_text())
    first = card["classes"][0]["name"]
    card["classes"][0]["name"] = "cats|dogs"
    card["test"]["per_class"] = {("cats|dogs" if k == first else k): v for k, v in card["test"]["per_class"].items()}
    rows = [line for line in markdown(card, "m").splitlines() if line.startswith("| cats")]
    cells = [re.split(r"(?<!\\)\|", row)[1:-1] for row in rows]  # split on the pipes not escaped
    assert [c[0].strip() for c in cells] == ["cats\\|dogs", "cats\\|dogs"]
    assert [len(c) for c in cells] == [4, 5]  # class, train, val, test; class, precision, recall, F1, photos


def test_the_served_model_card_names_the_weights_file_without_the_training_machine_s_folders(trained_run: Path):
    from app.export.model_card import markdown

    card = json.loads((trained_run / "export" / "shapes" / "1" / "model_card.json").read_text())
    card["backbone"] |= {
        "weights": "/home/alice/private/mnv2.weights.h5 (from $PHOTOCLF_WEIGHTS)",
        "weights_sha256": "ab12",
    }
    page = markdown(card, "m")
    assert "- weights: mnv2.weights.h5 (from $PHOTOCLF_WEIGHTS) (SHA-256 `ab12`)" in page.splitlines()
    assert "alice" not in page
    card["backbone"] |= {
        "weights": "none (random initialisation; auto found no pretrained weights)",
        "weights_sha256": None,
    }
    assert "- weights: none (random initialisation; auto found no pretrained weights)" in markdown(card, "m")
    card["backbone"] |= {"weights": "SavedModel https://tfhub.dev/google/imagenet/mobilenet_v2/5"}  # no file: as it is
    assert "- weights: SavedModel https://tfhub.dev/google/imagenet/mobilenet_v2/5" in markdown(card, "m")


def test_a_run_that_learnt_nothing_says_so_first_among_its_model_cards_known_limits(trained_run: Path):
    from app.export.model_card import markdown

    version = trained_run / "export" / "shapes" / "1"
    card = json.loads((version / "model_card.json").read_text())
    meta = json.loads((version / "assets" / "metadata.json").read_text())
    assert card["learning_warning"] == meta["training_metrics"]["learning_warning"]  # the run's own, or None
    card["learning_warning"] = "val accuracy 0.2500 is no better than always answering 'square'"
    lines = markdown(card, "m").splitlines()
    limits = lines.index("## Known limits")
    assert lines[limits + 2] == "- **val accuracy 0.2500 is no better than always answering 'square'**"


def test_a_multi_label_model_card_gives_its_exact_match_and_each_labels_threshold(trained_run: Path):
    """A multi-label run's "accuracy" is its exact-match ratio, its thresholds are its decisions,
    and it has no "none of these" to warn about."""
    from app.export.model_card import markdown

    card = json.loads((trained_run / "export" / "shapes" / "1" / "model_card.json").read_text())
    labels = [c["name"] for c in card["classes"]]
    card |= {"thresholds": dict(zip(labels, [0.5, 0.25, 0.125, 0.75])), "none_of_these": None, "calibration": None}
    card["test"] = {"loss": 0.3, "accuracy": 0.625, "count": 8}
    lines = markdown(card, "m").splitlines()
    assert lines[lines.index("## Data") + 4].startswith("| label (photos with it) | train |")
    results = lines.index("## Results")
    assert lines[results + 2 : results + 4] == [
        "- test exact match (every label right): 0.6250 on 8 photos",
        f"- decision thresholds (each label's best F1 on val): {labels[0]} 0.500, {labels[1]} 0.250,"
        f" {labels[2]} 0.125, {labels[3]} 0.750",
    ]
    assert "| file | precision | checked on | exact-match agreement (at 0.5) | passed |" in lines
    assert not any("top-1" in line or "None of these" in line for line in lines)


@pytest.mark.slow  # two more checks; the fast tier stays under 3 minutes
def test_the_float32_check_reads_a_sample_of_the_val_split_and_the_same_images_each_time(
    trained_run: Path, demo_records: Path, monkeypatch: pytest.MonkeyPatch
):
    from app.export import parity, tflite

    version = trained_run / "export" / "shapes" / "1"
    model = (version / "litert" / "model_float32.tflite").read_bytes()
    monkeypatch.setitem(parity.PARITY_IMAGES, "float32", 5)
    first = tflite.parity_report(model, version, str(demo_records), 64, "float32")
    assert first["images"] == 5 and first["passed"] and first["top1_agreement"] == 1.0
    assert tflite.parity_report(model, version, str(demo_records), 64, "float32") == first


def test_every_file_is_checked_against_one_load_and_one_pass_of_the_savedmodel(
    trained_run: Path, demo_records: Path, monkeypatch: pytest.MonkeyPatch
):
    """The LiteRT file, the IR in each precision and the ONNX file are checked against the same
    answers: the SavedModel is loaded once and answers each val photo once (the float32 sample
    is the first photos of the whole split, answered in a pass of its own)."""
    from app.export import parity, tflite

    version = trained_run / "export" / "shapes" / "1"
    litert = tflite.LiteRTModel((version / "litert" / "model_float32.tflite").read_bytes())
    loads, answered, load = [], [], tf.saved_model.load

    def counted_load(path: str):
        loads.append(path)
        signature = load(path).signatures["predict_images"]
        return type("Loaded", (), {"signatures": {"predict_images": lambda **x: answered.append(len(x["images"]))
                                                  or signature(**x)}})  # fmt: skip

    monkeypatch.setattr(parity.tf.saved_model, "load", counted_load)
    reference = parity.Reference(version, str(demo_records), 64)
    reports = [reference.check(litert, p) for p in ("float32", "bfloat16", "float32", "bfloat16")]
    assert loads == [str(version)] and sum(answered) == 2 * reports[1]["images"]  # the sample and the split, once
    assert all(r["top1_agreement"] == 1.0 for r in reports)
    assert reports[0]["passed"] and not reports[1]["passed"]  # bfloat16's bar needs 200 val photos, the demo has fewer
    assert reports[0] == reports[2] and reports[1] == reports[3]  # the same photos and answers each time


@pytest.mark.slow  # a subprocess or a second run: the fast tier stays under 3 minutes
def test_loading_needs_only_tensorflow(trained_run: Path, demo_records: Path):
    images, _ = _val_bytes(demo_records)
    script = (
        "import sys; sys.modules['app'] = None\n"  # any import of this package would now fail
        "import tensorflow as tf\n"
        f"m = tf.saved_model.load({str(trained_run / 'export' / 'shapes' / '1')!r})\n"
        f"out = m.signatures['serving_default'](image_bytes=tf.constant([{images[0]!r}]))\n"
        "print(out['classes'].numpy()[0][0].decode())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.strip().splitlines()[-1] in ("circle", "square", "star", "triangle")


@pytest.mark.slow  # two complete exports, each with its LiteRT conversion and parity check
def test_versions_are_never_overwritten(trained_run: Path, tmp_path: Path, monkeypatch):
    first = export_run(trained_run, export_dir=tmp_path, name="m")["saved_model"]
    second = export_run(trained_run, export_dir=tmp_path, name="m")["saved_model"]
    assert (Path(first).name, Path(second).name) == ("1", "2")
    with monkeypatch.context() as patched:  # refused before a model is built
        patched.setattr("app.export.run_export.rebuild_served_model", lambda *a, **k: pytest.fail("a model was built"))
        with pytest.raises(UserError, match="never overwritten"):
            export_run(trained_run, export_dir=tmp_path, name="m", version=1)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["1", "2"]  # no half-written leftovers


@pytest.mark.slow  # two complete exports, each with its LiteRT conversion and parity check
def test_an_export_racing_another_publishes_the_next_version_and_a_pinned_one_is_refused(
    trained_run: Path, tmp_path: Path, monkeypatch
):
    """Two exports of one model at once chose the same version, and the second to finish ended in
    an OSError traceback ("Directory not empty")."""
    from app.export import run_export

    finish, taken = run_export._files_beside, []

    def another_export_publishes_meanwhile(*args, **kwargs):
        result = finish(*args, **kwargs)
        shutil.copytree(trained_run / "export" / "shapes" / "1", tmp_path / "m" / taken[-1])
        return result

    monkeypatch.setattr(run_export, "_files_beside", another_export_publishes_meanwhile)
    taken.append("1")
    assert Path(export_run(trained_run, export_dir=tmp_path, name="m")["saved_model"]).name == "2"
    taken.append("7")
    with pytest.raises(UserError, match="m/7 was published by another export meanwhile; versions are never"):
        export_run(trained_run, export_dir=tmp_path, name="m", version=7)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["1", "2", "7"]  # no staging folder left


def test_an_export_dir_that_is_or_lies_under_a_file_is_refused_before_a_model_is_built(
    trained_run: Path, tmp_path: Path, monkeypatch
):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before --export-dir was checked")

    monkeypatch.setattr("app.export.run_export.rebuild_served_model", no_model)
    (tmp_path / "models").write_text("not a folder")
    for export_dir in (tmp_path / "models", tmp_path / "models" / "inner"):
        with pytest.raises(
            UserError, match=f"--export-dir {export_dir}: {tmp_path / 'models'} is a file, not a folder"
        ):
            export_run(trained_run, export_dir=export_dir, name="m")


@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b"])
def test_a_name_that_is_no_folder_of_its_own_is_refused_before_a_model_is_built(
    trained_run: Path, tmp_path: Path, monkeypatch, name: str
):
    """--name .. wrote version 1 into EXPORT_DIR's parent and failed with a KeyError; a name
    starting with "." is hidden, as the export's own half-written temp folders are."""
    monkeypatch.setattr("app.export.run_export.rebuild_served_model", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(UserError, match=re.escape(f"--name '{name}': use letters, digits")):
        export_run(trained_run, export_dir=tmp_path / "models" / "inner", name=name)
    assert not (tmp_path / "models").exists()


def test_an_int8_file_whose_calibration_photos_are_gone_is_refused_before_a_model_is_built(
    trained_run: Path, tmp_path: Path, monkeypatch
):
    moved = Path(shutil.copytree(trained_run, tmp_path / "run", ignore=shutil.ignore_patterns("export")))
    config = json.loads((moved / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps({**config, "data": str(tmp_path / "moved-away")}))
    monkeypatch.setattr("app.export.run_export.rebuild_served_model", lambda *a, **k: pytest.fail("a model was built"))
    message = f"--tflite int8 is calibrated on the run's training photos: {tmp_path / 'moved-away'}: no dataset.json"
    with pytest.raises(UserError, match=re.escape(message)):
        export_run(moved, export_dir=tmp_path / "models", name="m", tflite="int8")
    assert not (tmp_path / "models").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["float16", "int8"])
def test_phone_litert_files_with_parity_in_the_metadata(
    trained_run: Path, tmp_path: Path, demo_records: Path, mode: str
):
    paths = export_run(trained_run, export_dir=tmp_path, name="m", tflite=mode)
    report = paths["litert"][mode]
    assert report["images"] == load_dataset_info(demo_records).num_examples("val")
    assert report["required_agreement"] == 0.995 and report["min_images"] == 200
    assert report["images"] < 200 and not report["passed"]  # the demo's val split is too small to tell 99.5%
    assert json.loads((Path(paths["saved_model"]) / "assets" / "metadata.json").read_text())["litert"][mode] == report
    from app.export.tflite import LiteRTModel

    model = rebuild_served_model(RunDir(trained_run).load())
    x = np.random.default_rng(0).uniform(0, 255, (2, 64, 64, 3)).astype(np.float32)
    lite = LiteRTModel(Path(paths["saved_model"]) / report["file"])(x)["probabilities"]
    np.testing.assert_allclose(lite, model(x)["probabilities"].numpy(), atol=0.05 if mode == "int8" else 0.01)


def _small_model(side_width: int) -> keras.Model:
    image = keras.Input((16, 16, 3), name="image")
    side = keras.Input((side_width,), name="side")
    pooled = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(image))
    features = keras.layers.Concatenate()([pooled, side]) if side_width else pooled
    return keras.Model(
        {"image": image, "side": side} if side_width else image, keras.layers.Dense(3, activation="softmax")(features)
    )


def _small_inputs(side_width: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.uniform(0, 255, (2, 16, 16, 3)).astype(np.float32), rng.normal(size=(2, side_width)).astype(np.float32)


@pytest.mark.parametrize("side_width", [0, 2])
def test_the_frozen_forward_pass_is_the_model_with_its_weights_as_constants(side_width: int):
    """What the SavedModel's signatures call and the LiteRT converter converts: one graph."""
    from app.export.frozen import frozen_forward

    model = _small_model(side_width)
    x, s = _small_inputs(side_width)
    expected = model({"image": x, "side": s} if side_width else x).numpy()
    forward = frozen_forward(model, 16, side_width)
    assert forward.inputs == ["image:0", "side:0"][: 1 + bool(side_width)]
    assert not {node.op for node in forward.graph_def.node} & {"VarHandleOp", "ReadVariableOp"}
    np.testing.assert_allclose(forward(x, *([s] if side_width else []))["probabilities"].numpy(), expected, atol=1e-6)
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])  # the graph holds its own copy
    np.testing.assert_allclose(forward(x, *([s] if side_width else []))["probabilities"].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("side_width", [0, 2])
def test_the_litert_file_has_the_signature_a_phone_calls(side_width: int):
    """serving_default: `image` (and `side`) in, `probabilities` out, the model's own answers,
    for any batch size (the file's batch dimension is dynamic)."""
    from ai_edge_litert.interpreter import Interpreter

    from app.export.frozen import frozen_forward
    from app.export.parity import FLOAT32_MAX_ABS_DIFF
    from app.export.tflite import convert

    model = _small_model(side_width)
    x, s = _small_inputs(side_width)
    interpreter = Interpreter(model_content=convert(frozen_forward(model, 16, side_width), 16, "float32", None))
    assert interpreter.get_input_details()[0]["shape_signature"].tolist() == [-1, 16, 16, 3]
    runner = interpreter.get_signature_runner("serving_default")
    inputs = {"image": x, **({"side": s} if side_width else {})}
    expected = model(inputs if side_width else x).numpy()
    # as close as the export's parity check requires (1e-6 failed on 1.6e-6 for some random weights)
    np.testing.assert_allclose(runner(**inputs)["probabilities"], expected, atol=FLOAT32_MAX_ABS_DIFF)


def test_the_serving_signature_refuses_images_over_its_pixel_limit(tmp_path: Path):
    """The guard is inside the SavedModel, so TF Serving gets it too: 0.002 MP = 2,000 pixels."""
    inputs = keras.Input((16, 16, 3))
    model = keras.Model(
        inputs, keras.layers.Dense(2, activation="softmax")(keras.layers.GlobalAveragePooling2D()(inputs))
    )
    path = export_saved_model(model, ["a", "b"], 16, tmp_path, "m", max_megapixels=0.002)
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    small, large = (tf.io.encode_png(tf.zeros([s, s, 3], tf.uint8)) for s in (40, 50))  # 1,600 and 2,500 pixels
    assert serve(image_bytes=tf.stack([small]))["probabilities"].shape == (1, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="over the 0.002 megapixel limit"):
        serve(image_bytes=tf.stack([small, large]))
    assert json.loads((path / "assets" / "metadata.json").read_text())["max_megapixels"] == 0.002


def test_a_full_disk_during_export_publishes_nothing_and_the_next_export_completes(tmp_path: Path, monkeypatch):
    """The SavedModel is half on disk when the space runs out: no version appears (a server
    polling the folder sees only the staging name it skips), the NAME folder this first export
    made is gone again, and the same export then works; a later failure keeps the versions there."""
    inputs = keras.Input((16, 16, 3))
    model = keras.Model(
        inputs, keras.layers.Dense(2, activation="softmax")(keras.layers.GlobalAveragePooling2D()(inputs))
    )
    real_save = tf.saved_model.save

    def filling(obj, path, **kwargs):
        Path(path).mkdir(parents=True)
        (Path(path) / "saved_model.pb").write_bytes(b"half")
        raise tf.errors.UnknownError(None, None, f"{path}/variables: No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(tf.saved_model, "save", filling)
        with pytest.raises(UserError, match=r"m/1: no space left on the device; nothing half-written was kept"):
            export_saved_model(model, ["a", "b"], 16, tmp_path, "m", version=1)
    assert list(tmp_path.iterdir()) == []
    assert real_save is tf.saved_model.save
    path = export_saved_model(model, ["a", "b"], 16, tmp_path, "m", version=1)
    assert path == tmp_path / "m" / "1" and (path / "saved_model.pb").stat().st_size > 1000
    with monkeypatch.context() as patched:
        patched.setattr(tf.saved_model, "save", filling)
        with pytest.raises(UserError, match="no space left"):
            export_saved_model(model, ["a", "b"], 16, tmp_path, "m")
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["1"]


@pytest.mark.parametrize(
    "script,args,message",
    [
        ("export.py", [], "not a finished run"),
        ("serve.py", [], "no such model folder"),
        ("export.py", ["--tflite", "int4"], "invalid choice"),
    ],
)
def test_cli_bad_input(tmp_path: Path, script: str, args: list[str], message: str):
    root = Path(__file__).resolve().parents[2]
    target = tmp_path / "missing" if script == "serve.py" else tmp_path
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / script), str(target), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and message in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.export_files
@pytest.mark.slow  # a run and its LiteRT conversion: the fast tier stays under 3 minutes
def test_a_mixed_precision_run_gets_its_litert_file_like_any_other(tiny_config, tmp_path: Path):
    """Trained under mixed_float16 (the default on GPUs), exported from a float32 copy rebuilt
    from its final weights: the LiteRT file is written and passes its check against the SavedModel."""
    from app.training.train import train

    try:
        metrics = train(tiny_config.replace(mixed_precision="on", epochs_finetune=0))
        assert keras.config.dtype_policy().name == "mixed_float16"  # the export left the run's policy alone
    finally:
        keras.config.set_dtype_policy("float32")  # process-wide: later tests build float32 models
    lite = metrics["litert"]["float32"]
    assert lite["passed"] and lite["top1_agreement"] == 1.0, lite
    assert (Path(metrics["export"]) / lite["file"]).stat().st_size > 10_000
    images = np.random.default_rng(0).uniform(0, 255, (2, 64, 64, 3)).astype(np.float32)
    served = tf.saved_model.load(metrics["export"]).signatures["predict_images"](images=tf.constant(images))
    rebuilt = rebuild_served_model(RunDir(Path(tiny_config.out)).load())(images)  # float32, its temperature and score
    np.testing.assert_allclose(served["probabilities"], rebuilt["probabilities"], atol=1e-5)
    np.testing.assert_allclose(served["ood_score"], rebuilt["ood_score"], atol=1e-4)


def test_a_model_with_an_ood_score_gives_it_to_phones_too():
    """The LiteRT file's signature returns `ood_score` beside `probabilities`, as the model does."""
    from ai_edge_litert.interpreter import Interpreter

    from app.export.frozen import frozen_forward
    from app.export.tflite import convert
    from app.models.layers import OutOfDistributionScore
    from app.models.ood import fit_shipped

    image = keras.Input((16, 16, 3), name="image")
    pooled = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(8, 3, activation="relu")(image))
    logits = keras.layers.Dense(2)(pooled)
    probabilities = keras.layers.Softmax()(logits)
    rng = np.random.default_rng(0)
    val_logits = rng.normal(0, 1, (10, 2))
    score = fit_shipped(rng.random((40, 8)), np.arange(40) % 2, rng.random((10, 8)), rng.dirichlet([1, 1], 10),
                        val_logits=val_logits)  # fmt: skip
    ood_score = OutOfDistributionScore(score)([probabilities, pooled, logits])
    model = keras.Model(image, {"probabilities": probabilities, "ood_score": ood_score})
    x, _ = _small_inputs(0)
    runner = Interpreter(model_content=convert(frozen_forward(model, 16), 16, "float32", None)).get_signature_runner(
        "serving_default"
    )
    answer, expected = runner(image=x), model(x)
    assert set(answer) == {"probabilities", "ood_score"}
    np.testing.assert_allclose(answer["probabilities"], expected["probabilities"].numpy(), atol=1e-4)
    np.testing.assert_allclose(answer["ood_score"], expected["ood_score"].numpy(), rtol=1e-3, atol=1e-3)
