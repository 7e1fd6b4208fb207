"""The evaluation module end to end on a real export, and the notebook run headless."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from app.data.pipeline import load_dataset_info
from app.errors import UserError
from app.evaluation.evaluate import evaluate
from app.export.run_export import export_run

pytestmark = pytest.mark.start_first  # its tests take over a minute in all

ROOT = Path(__file__).resolve().parents[2]


def test_evaluate_tfrecord_split_writes_metrics_figures_and_html(
    trained_run: Path, demo_records: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    with caplog.at_level("INFO", logger="app.inference.runtime"):
        result = evaluate(trained_run, demo_records, split="val", report_dir=tmp_path)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    # By default the runtime photoclf serve would run here: the one timed fastest, named in the report.
    chosen = re.search(r"runtime auto: (.+?), the fastest that may serve \(ms per photo, (\d+) at a time", caplog.text)
    assert chosen and saved["runtime"] == chosen[1] and int(chosen[2]) == min(32, saved["num_examples"])  # its batch
    assert {"accuracy", "top_k_accuracy", "per_class", "confusion_matrix", "ece", "log_loss"} <= saved.keys()
    assert saved["num_examples"] == load_dataset_info(demo_records).num_examples("val")
    assert sum(map(sum, saved["confusion_matrix"])) == saved["num_examples"]
    assert "Learning curves" in result.figures  # the export lives in its run dir
    assert result.predictions.mistakes  # a model trained for 2 steps: the Grad-CAM of each shown mistake
    assert (tmp_path / "mistakes_gradcam.jpg").exists() and any("Grad-CAM" in name for name in result.figures)
    page = result.html.read_text()
    embedded = re.findall(r'src="data:image/(png|jpeg);base64,([A-Za-z0-9+/=]+)"', page)
    assert len(embedded) == len(result.figures) and all(len(data) > 1000 for _, data in embedded)
    for kind, data in embedded:  # each inlined as what it is: charts PNG, grids of photos JPEG
        assert base64.b64decode(data).startswith(b"\x89PNG" if kind == "png" else b"\xff\xd8\xff")
    assert [kind for kind, _ in embedded].count("jpeg") == 2  # the mistakes, and their Grad-CAM maps
    assert "accuracy" in result.summary


def test_evaluate_image_folder_skips_bad_files_saying_why(trained_run: Path, demo_images: Path, tmp_path: Path):
    photos = Path(shutil.copytree(demo_images, tmp_path / "photos"))
    (photos / "star" / "moved.jpg").symlink_to(tmp_path / "gone.jpg")  # a link whose target is gone
    result = evaluate(trained_run / "export" / "shapes", photos, report_dir=tmp_path / "report", runtime="litert")
    skipped = {s["path"]: s["reason"] for s in result.metrics["skipped"]}
    assert skipped["circle/truncated.jpg"].startswith("undecodable: image file is truncated (")
    assert skipped["square/not_an_image.jpg"] == "not an image (unrecognised format)"
    assert skipped["star/moved.jpg"] == "cannot read: No such file or directory"
    assert result.metrics["num_examples"] == 4 * 12  # the good images: 12 per class
    assert result.metrics["runtime"] == "litert float32"
    assert result.metrics["split"] is None  # a folder of photos, not the default split 'val'
    assert "<title>shapes v1 on photos</title>" in result.html.read_text()


@pytest.mark.slow  # two evaluations: the fast tier stays under 3 minutes
def test_litert_and_the_savedmodel_evaluate_alike(trained_run: Path, demo_records: Path, tmp_path: Path):
    saved = evaluate(trained_run, demo_records, split="test", report_dir=tmp_path / "tf", runtime="tf")
    lite = evaluate(trained_run, demo_records, split="test", report_dir=tmp_path / "litert", runtime="litert")
    assert lite.metrics["confusion_matrix"] == saved.metrics["confusion_matrix"]
    assert abs(lite.metrics["log_loss"] - saved.metrics["log_loss"]) < 1e-4


def test_dataset_classes_map_to_the_model_s_by_name_or_through_the_label_map():
    from app.evaluation.predictions import label_mapping

    model = ["cat", "dog", "fox"]
    assert label_mapping(["dog", "cat"], model, None).tolist() == [1, 0]
    assert label_mapping(["hound", "fox"], model, {"hound": "dog"}).tolist() == [1, 2]
    with pytest.raises(
        UserError, match=r"^dataset classes \['wolf'\] are not .*; pass --label-map FILE .*, given as --ood$"
    ):
        label_mapping(["dog", "wolf"], model, None)
    macos_folder = unicodedata.normalize("NFD", "crème")  # e + a combining accent, as a Mac's zip spells it
    assert macos_folder != "crème" and label_mapping([macos_folder, "cat"], ["cat", "crème"], None).tolist() == [1, 0]


@pytest.mark.slow  # two evaluations: the fast tier stays under 3 minutes
def test_class_mismatch_needs_a_label_map(trained_run: Path, demo_images: Path, tmp_path: Path, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(demo_images, data)
    (data / "circle").rename(data / "round")
    with monkeypatch.context() as patch:  # said before the model loads (auto may time every runtime first)
        patch.setattr("app.evaluation.evaluate.load_runtime", lambda *a, **k: pytest.fail("the model was loaded"))
        with pytest.raises(UserError, match=r"\['round'\] are not among the model's classes"):
            evaluate(trained_run, data, report_dir=tmp_path / "r1")
    (tmp_path / "map.json").write_text('{"round": "circle"}')
    result = evaluate(trained_run, data, report_dir=tmp_path / "r2", label_map=tmp_path / "map.json", runtime="tf")
    assert result.metrics["per_class"]["circle"]["support"] == 12


def test_empty_split_is_a_clear_error(trained_run: Path, demo_records: Path, tmp_path: Path):
    with pytest.raises(UserError, match="no 'holdout' split"):
        evaluate(trained_run, demo_records, split="holdout", report_dir=tmp_path)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    (tmp_path / "empty" / "b").mkdir()
    with pytest.raises(UserError, match="empty"):
        evaluate(trained_run, tmp_path / "empty", report_dir=tmp_path)


def test_a_report_folder_under_a_file_is_refused_before_the_model_runs(
    trained_run: Path, demo_records: Path, tmp_path: Path, monkeypatch
):
    def no_runtime(*args, **kwargs):
        raise AssertionError("the model was loaded before --report was checked")

    monkeypatch.setattr("app.evaluation.evaluate.load_runtime", no_runtime)
    (tmp_path / "report").write_text("a file")
    with pytest.raises(UserError, match=f"--report {tmp_path / 'report' / 'test'}: .* is a file, not a folder"):
        evaluate(trained_run, demo_records, split="test", report_dir=tmp_path / "report" / "test")


def test_a_report_inside_the_folder_of_photos_is_refused_before_the_model_runs(
    trained_run: Path, demo_images: Path, monkeypatch
):
    """Its report.html, metrics.json and figures would be read as photos by the next convert."""
    monkeypatch.setattr("app.evaluation.evaluate.load_runtime", lambda *a, **k: pytest.fail("the model was loaded"))
    inside = demo_images / "star" / "report"
    with pytest.raises(UserError, match=f"^--report {inside} is inside --data {demo_images}: a later convert"):
        evaluate(trained_run, demo_images, report_dir=inside)
    assert not inside.exists()


@pytest.mark.slow  # a subprocess or a second run: the fast tier stays under 3 minutes
def test_cli_prints_the_summary(trained_run: Path, demo_records: Path, tmp_path: Path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/evaluate.py"),
            str(trained_run),
            "--data",
            str(demo_records),
            "--split",
            "test",
            "--report",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-1500:]
    assert "accuracy" in out.stdout and "worst classes" in out.stdout and (tmp_path / "report.html").exists()


def _image_outputs(notebook: dict) -> int:
    return sum(1 for cell in notebook["cells"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {}))


@pytest.mark.slow
def test_notebook_runs_with_papermill_parameters(trained_run: Path, demo_records: Path, tmp_path: Path):
    import papermill

    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(
        str(ROOT / "notebooks/evaluate.ipynb"),
        str(out),
        cwd=str(tmp_path),
        progress_bar=False,
        parameters={
            "model_dir": str(trained_run),
            "data_dir": str(demo_records),
            "split": "val",
            "report_dir": str(tmp_path / "rep"),
            "ood_dir": str(_other_photos(tmp_path / "other")),
        },
    )
    executed = json.loads(out.read_text())
    assert _image_outputs(executed) >= 5  # with the histogram of "none of these"
    assert (tmp_path / "rep" / "report.html").exists()


def test_notebook_is_committed_without_outputs():
    notebook = json.loads((ROOT / "notebooks/evaluate.ipynb").read_text())
    assert all(not cell.get("outputs") for cell in notebook["cells"] if cell["cell_type"] == "code")
    assert "parameters" in notebook["cells"][1]["metadata"].get("tags", [])


@pytest.mark.slow
def test_notebook_runs_as_is_on_the_demo(pretrained_weights: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """nbclient, no parameters: the demo model and data, built first (~2 min) in a demo home
    outside the repository (PHOTOCLF_DEMO_HOME), with the real pretrained backbone."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PHOTOCLF_DEMO_HOME", str(tmp_path))
    notebook = nbformat.read(str(ROOT / "notebooks/evaluate.ipynb"), as_version=4)
    NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    assert _image_outputs(notebook) >= 4
    assert (tmp_path / "runs" / "demo" / "metrics.json").exists()
    reports = list((tmp_path / "runs" / "demo" / "reports").glob("*/report.html"))
    assert [p.parent.name for p in reports] == ["demo-v1-test"]  # the default report folder is in the run dir


def test_default_report_folder_does_not_depend_on_the_working_directory(trained_run: Path, tmp_path: Path):
    from app.evaluation.evaluate import default_report_dir

    in_run = trained_run / "export" / "shapes" / "1"
    assert default_report_dir(in_run, "val") == trained_run / "reports" / "shapes-v1-val"
    elsewhere = tmp_path / "models" / "shapes" / "3"
    assert default_report_dir(elsewhere, "test") == tmp_path / "models" / "shapes-reports" / "v3-test"


def test_a_folder_of_photos_names_its_report_never_a_split(demo_records: Path, tmp_path: Path):
    """Evaluating ~/new_photos once wrote its report as the val split's, over the real val report."""
    from app.evaluation.evaluate import _evaluated_on

    assert _evaluated_on(str(demo_records), "test") == "test"
    (tmp_path / "val" / "circle").mkdir(parents=True)
    assert _evaluated_on(str(tmp_path / "val"), "val") == "photos-val"
    assert _evaluated_on(str(tmp_path / "val") + "/", "test") == "photos-val"


@pytest.mark.slow  # five evaluations and an export with its LiteRT check
def test_tta_flip_is_applied_recorded_and_refused_twice(trained_run: Path, demo_records: Path, tmp_path: Path):
    plain = evaluate(trained_run, demo_records, split="test", report_dir=tmp_path / "plain", runtime="litert")
    flipped = evaluate(
        trained_run, demo_records, split="test", report_dir=tmp_path / "tta", runtime="litert", tta="flip"
    )
    on_tf = evaluate(trained_run, demo_records, split="test", report_dir=tmp_path / "tta-tf", runtime="tf", tta="flip")
    assert (plain.metrics["tta"], flipped.metrics["tta"]) == ("none", "flip")
    assert re.search(r"test-time augmentation +flip", flipped.summary)
    np.testing.assert_allclose(flipped.predictions.probabilities, on_tf.predictions.probabilities, atol=1e-4)
    baked = export_run(trained_run, export_dir=tmp_path / "exports", name="shapes", tta="flip")["saved_model"]
    assert json.loads((Path(baked) / "assets" / "metadata.json").read_text())["litert"]["float32"]["passed"]
    with pytest.raises(UserError, match="already applies 'flip' test-time augmentation"):
        evaluate(baked, demo_records, split="test", report_dir=tmp_path / "twice", tta="flip")
    served = evaluate(baked, demo_records, split="test", report_dir=tmp_path / "baked", runtime="tf")
    assert served.metrics["tta"] == "flip"
    np.testing.assert_allclose(served.predictions.probabilities, on_tf.predictions.probabilities, atol=1e-4)


def _other_photos(folder: Path, count: int = 6) -> Path:
    """Photos of something else: noise, in no class folder, plus a file that is not an image and
    a link whose target is gone."""
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for k in range(count):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / f"noise_{k}.jpg")
    (folder / "notes.txt").write_text("not a photo")
    (folder / "gone.jpg").symlink_to(folder / "moved_away.jpg")
    return folder


@pytest.mark.slow  # an evaluation with OOD photos: the fast tier stays under 3 minutes
def test_ood_photos_are_measured_against_the_evaluation_photos(trained_run: Path, demo_records: Path, tmp_path: Path):
    from app.export.layout import read_metadata, resolve_model_dir
    from app.models import ood

    result = evaluate(
        trained_run,
        demo_records,
        split="val",
        report_dir=tmp_path / "rep",
        runtime="tf",
        ood=_other_photos(tmp_path / "o"),
    )
    found = result.metrics["ood"]
    known, other = np.array(found["scores"]["known"]), np.array(found["scores"]["other"])
    threshold = read_metadata(resolve_model_dir(trained_run))["ood"]["threshold"]
    assert found["threshold"] == threshold and found["method"] == ood.SHIPPED
    assert len(known) == load_dataset_info(demo_records).num_examples("val") and len(other) == 6
    assert found["other"]["skipped"] == [
        {"path": "gone.jpg", "reason": "cannot read: No such file or directory"},
        {"path": "notes.txt", "reason": "not an image (unrecognised format)"},
    ]
    assert found["auroc"] == pytest.approx(ood.auroc(known, other), abs=1e-6)
    # The threshold was fitted on this split to accept 95% of it: exactly that many, on any CPU.
    accepted = int(np.ceil(0.95 * len(known)))
    assert found["known"] == {"count": len(known), "accepted": accepted, "unknown": len(known) - accepted}
    # The stored scores are rounded to 5 decimals: a recount from them may differ only by the
    # scores that rounding could have moved across the threshold.
    for part, scores in (("known", known), ("other", other)):
        near = int((np.abs(scores - threshold) <= 5e-6).sum())
        assert abs(found[part]["unknown"] - int((scores > threshold).sum())) <= near
    assert result.figures["None of these: scores of the evaluation photos and the other photos"].exists()
    assert "other photos: AUROC" in result.summary and "ood_scores" in result.html.read_text()
    assert "other photos skipped" in result.summary


def test_ood_needs_photos_and_says_so_before_any_work(trained_run: Path, demo_records: Path, tmp_path: Path):
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(UserError, match="--ood .*neither a TFRecord folder"):
            evaluate(trained_run, demo_records, split="val", report_dir=tmp_path / "rep", ood=path)
    assert not (tmp_path / "rep").exists()


def test_a_label_map_that_cannot_be_read_is_one_line_naming_the_flag_and_the_file(tmp_path: Path):
    from app.evaluation.predictions import load_label_map

    with pytest.raises(UserError, match=f"^--label-map {tmp_path}: Is a directory$"):
        load_label_map(tmp_path)
    with pytest.raises(UserError, match=f"^--label-map {tmp_path / 'none.json'}: No such file or directory$"):
        load_label_map(tmp_path / "none.json")
