"""The audit end to end on small generated folders: findings, reports, the review manifest."""

from __future__ import annotations

import csv
import json
import logging
import shutil
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import TINY_BACKBONE
from PIL import Image

from app.audit.audit import audit, run_audit
from app.audit.items import load_audit_input
from app.audit.report import summary
from app.audit.scan import _normalised, scan_images
from app.data.sources import scan_source
from app.data.writer import write_tfrecords
from app.errors import UserError
from app.training.frozen import RowSink

# Random weights: only exact findings are meaningful. The tiny backbone embeds in a fraction of MobileNetV2's time.
FAST = {"backbone": TINY_BACKBONE, "weights": "none", "image_size": 64, "near_threshold": 1.0}


@pytest.fixture
def dirty_folder(demo_images: Path, tmp_path: Path) -> Path:
    """A train/val tree from the demo photos with known problems: one photo copied from train to
    val (a leak), one copied within train under another name, one truncated file, one blank."""
    root = tmp_path / "photos"
    for split, take in (("train", slice(0, 6)), ("val", slice(6, 9))):
        for class_dir in sorted(p for p in demo_images.iterdir() if p.is_dir()):
            (root / split / class_dir.name).mkdir(parents=True)
            for f in sorted(class_dir.iterdir())[take]:
                shutil.copy(f, root / split / class_dir.name / f.name)
    first_class = sorted(p.name for p in (root / "train").iterdir())[0]
    train = root / "train" / first_class
    original = sorted(train.iterdir())[0]
    shutil.copy(original, root / "val" / first_class / "leaked.jpg")
    shutil.copy(original, train / "copy.jpg")
    (train / "broken.jpg").write_bytes(original.read_bytes()[:200])
    Image.new("RGB", (120, 90), (200, 200, 200)).save(train / "blank.png")
    (tmp_path / "ORIGINAL").write_text(f"train/{first_class}/{original.name}")
    return root


def test_audit_finds_the_planted_problems(dirty_folder: Path, tmp_path: Path):
    original = (dirty_folder.parent / "ORIGINAL").read_text()
    first_class = original.split("/")[1]
    result = audit(dirty_folder, tmp_path / "report", **FAST)
    pairs = {frozenset((p["a"]["path"], p["b"]["path"])) for p in result["exact_duplicates"]}
    names = [original, f"train/{first_class}/copy.jpg", f"val/{first_class}/leaked.jpg"]
    assert pairs == {frozenset(names[:2]), frozenset((names[0], names[2]))}
    assert [frozenset((p["a"]["path"], p["b"]["path"])) for p in result["leaks"]] == [frozenset((names[0], names[2]))]
    assert result["leaked_eval_images"] == {"val": 1, "test": 0}
    unreadable = {u["path"]: u["reason"] for u in result["unreadable"]}  # the demo has broken files of its own too
    assert unreadable[f"train/{first_class}/broken.jpg"].startswith("undecodable")
    assert result["readable"] == result["images"] - len(unreadable)  # a zero-byte file, skipped unread, counts too
    assert f"{result['readable']} of {result['images']} files read; {len(unreadable)} unreadable" in summary(result)
    blank = [o for o in result["outliers"] if o["path"].endswith("blank.png")]
    assert blank and any(r.startswith("near-constant") for r in blank[0]["reasons"])
    assert "leaks across splits:   1 pairs (1 val and 0 test images" in summary(result)


def test_without_pretrained_features_the_audit_says_so_first_and_reports_no_junk(dirty_folder: Path, tmp_path: Path):
    """Random weights see every photo as alike (similarity 0.999 between plainly different
    photos): near duplicates, likely wrong labels and far-off photos are not looked for, and
    the summary and the report say so in their first line; exact findings are still made."""
    result, written = run_audit(dirty_folder, tmp_path / "report", **{**FAST, "near_threshold": 0.5})
    assert result["not_looked_for"].startswith("NO PRETRAINED FEATURES")
    assert result["near_duplicates"] == [] and result["likely_mislabels"] == [] and result["label_ranking"] == []
    assert len(result["exact_duplicates"]) == 2 and len(result["leaks"]) == 1
    assert all(not r.startswith("far from every other") for o in result["outliers"] for r in o["reasons"])
    text = summary(result)
    assert text.startswith("WARNING: NO PRETRAINED FEATURES") and "near duplicates:       not looked for" in text
    page = (tmp_path / "report" / "report.html").read_text()
    assert page.index('class="warning">NO PRETRAINED FEATURES') < page.index("<pre>")  # the headline, first
    assert '<meta name="viewport"' in page


def test_reports_and_the_review_manifest_round_trip_through_the_converter(dirty_folder: Path, tmp_path: Path):
    manifest = tmp_path / "reviewed.csv"
    result, written = run_audit(dirty_folder, tmp_path / "report", manifest, **FAST)
    assert [p.name for p in written] == ["audit.json", "report.html", "reviewed.csv"]
    saved = json.loads((tmp_path / "report" / "audit.json").read_text())
    assert saved["leaks"] == result["leaks"] and "thumbnails" not in saved
    page = (tmp_path / "report" / "report.html").read_text()
    assert "Leaks across splits: 1" in page and "data:image/jpeg;base64," in page and "http" not in page
    rows = list(csv.DictReader(manifest.open()))
    assert list(rows[0]) == ["path", "label", "split", "finding", "suggested_label", "keep"]
    dropped = {r["path"] for r in rows if r["keep"] == "false"}
    assert {Path(p).name for p in dropped} == {"leaked.jpg", "copy.jpg"}  # the val copy of the leak; the second copy
    assert any(r["finding"].startswith("leak of") for r in rows if r["path"].endswith("leaked.jpg"))
    broken = [r for r in rows if r["path"].endswith("broken.jpg")]
    assert len(broken) == 1 and broken[0]["finding"].startswith("unreadable: undecodable")
    source = scan_source(manifest)  # what make_tfrecords.py reads
    assert {Path(s["path"]).name for s in source.skipped if "keep = false" in s["reason"]} == {"leaked.jpg", "copy.jpg"}
    assert len(source.images) == len(rows) - 2
    write_tfrecords(manifest, tmp_path / "records", num_shards=1, workers=1)  # converts, skipping the broken file


def test_a_tfrecord_folder_is_audited_from_its_records(demo_records: Path, tmp_path: Path):
    result = audit(demo_records, tmp_path / "report", **FAST)
    info = json.loads((demo_records / "dataset.json").read_text())
    assert result["images"] == result["readable"] == sum(sum(c.values()) for c in info["counts"].values())
    assert result["counts"] == info["counts"]
    with pytest.raises(UserError, match="needs the original photos"):
        run_audit(demo_records, tmp_path / "r2", tmp_path / "m.csv", **FAST)


def test_a_report_folder_that_is_a_file_is_refused_before_the_scan(dirty_folder: Path, tmp_path: Path, monkeypatch):
    module = sys.modules[run_audit.__module__]
    monkeypatch.setattr(module, "audit", lambda *a, **k: pytest.fail("scanned before --report was checked"))
    (tmp_path / "report").write_text("a file")
    with pytest.raises(UserError, match=f"--report {tmp_path / 'report'}: .* is a file, not a folder"):
        run_audit(dirty_folder, tmp_path / "report", **FAST)
    with pytest.raises(UserError, match="--write-manifest .*: is a folder"):
        run_audit(dirty_folder, tmp_path / "r2", tmp_path, **FAST)


def test_a_report_inside_the_photo_folder_is_refused_before_the_scan(dirty_folder: Path, monkeypatch):
    """Its audit.json, report.html and embeddings.npz would be read as photos by the next convert."""
    module = sys.modules[run_audit.__module__]
    monkeypatch.setattr(module, "audit", lambda *a, **k: pytest.fail("scanned before --report was checked"))
    inside = dirty_folder / sorted(p.name for p in dirty_folder.iterdir() if p.is_dir())[0] / "audit"
    with pytest.raises(UserError, match=f"^--report {inside} is inside DATA {dirty_folder}: a later convert"):
        run_audit(dirty_folder, inside, **FAST)
    assert not inside.exists()


def test_embeddings_are_reused_when_nothing_changed(dirty_folder: Path, tmp_path: Path, caplog):

    caplog.set_level(logging.INFO)
    keras.utils.set_random_seed(0)  # the same random backbone twice (its weights are part of the key)
    audit(dirty_folder, tmp_path / "report", **FAST)
    stamp = (tmp_path / "report" / "embeddings.npz").stat().st_mtime_ns
    keras.utils.set_random_seed(0)
    audit(dirty_folder, tmp_path / "report", **FAST)
    assert (
        tmp_path / "report" / "embeddings.npz"
    ).stat().st_mtime_ns == stamp and "audit embeddings: reusing" in caplog.text
    Image.new("RGB", (80, 80), (10, 200, 30)).save(
        dirty_folder / "train" / sorted(p.name for p in (dirty_folder / "train").iterdir())[0] / "new.png"
    )
    caplog.clear()
    keras.utils.set_random_seed(0)
    audit(dirty_folder, tmp_path / "report", **FAST)
    assert "recomputing" in caplog.text


def test_bad_input_fails_with_one_line_errors(tmp_path: Path):
    with pytest.raises(UserError, match="no such file or folder"):
        audit(tmp_path / "missing", tmp_path / "report", **FAST)
    with pytest.raises(UserError, match="near-threshold"):
        audit(tmp_path, tmp_path / "report", weights="none", near_threshold=1.5)


@pytest.mark.slow  # an audit with a backbone: the fast tier stays under 3 minutes
def test_a_threshold_under_what_the_backbone_gives_unlike_photos_is_said(
    pretrained_weights, dirty_folder: Path, tmp_path: Path, caplog
):
    caplog.set_level(logging.WARNING)
    result = audit(
        dirty_folder, tmp_path / "report", weights=str(pretrained_weights), image_size=96, near_threshold=0.05
    )
    assert len(result["near_duplicates"]) > result["readable"]  # each photo's nearest, not every pair
    assert len(result["near_duplicates"]) < result["readable"] * (result["readable"] - 1) // 2
    assert "near-duplicate pairs among" in caplog.text and "--near-threshold higher" in caplog.text


@pytest.mark.slow  # MobileNetV2's embeddings: the fast tier stays under 3 minutes
def test_pretrained_embeddings_place_a_smaller_recompressed_copy_nearest_its_original(
    pretrained_weights, demo_images: Path, tmp_path: Path
):
    folder = tmp_path / "photos"
    shutil.copytree(demo_images, folder)
    class_dir = sorted(p for p in folder.iterdir() if p.is_dir())[0]
    original = sorted(class_dir.iterdir())[0]
    with Image.open(original) as image:
        image.convert("RGB").resize((image.width * 3 // 4, image.height * 3 // 4)).save(
            class_dir / "smaller.jpg", quality=50
        )
    audit_input = load_audit_input(folder)
    scan = scan_images(audit_input, tmp_path / "embeddings.npz", weights=str(pretrained_weights))
    names = [Path(audit_input.items[i].name).name for i in scan.indices]
    similarity = scan.embeddings @ scan.embeddings.T
    row = names.index(original.name)
    similarity[row, row] = -1.0
    assert names[int(similarity[row].argmax())] == "smaller.jpg"
    assert np.allclose(np.linalg.norm(scan.embeddings, axis=1), 1.0, atol=1e-5)


ROOT = Path(__file__).resolve().parents[2]


def test_notebook_is_committed_without_outputs():
    notebook = json.loads((ROOT / "notebooks/audit.ipynb").read_text())
    assert all(not cell.get("outputs") for cell in notebook["cells"] if cell["cell_type"] == "code")
    assert "parameters" in notebook["cells"][1]["metadata"].get("tags", [])


@pytest.mark.slow
def test_notebook_runs_with_papermill_parameters(dirty_folder: Path, tmp_path: Path):
    import papermill

    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(
        str(ROOT / "notebooks/audit.ipynb"),
        str(out),
        cwd=str(tmp_path),
        progress_bar=False,
        parameters={
            "data": str(dirty_folder),
            "report_dir": str(tmp_path / "rep"),
            "manifest": str(tmp_path / "reviewed.csv"),
            "options": {**FAST, "backbone": "mobilenet_v2"},
        },
    )  # the kernel has the product's backbones
    executed = json.loads(out.read_text())
    text = "".join("".join(o.get("text", "")) for cell in executed["cells"] for o in cell.get("outputs", []))
    assert "leaks across splits:   1 pairs" in text and "leaked.jpg" in text
    assert any("text/html" in o.get("data", {}) for cell in executed["cells"] for o in cell.get("outputs", []))
    assert (tmp_path / "reviewed.csv").exists() and (tmp_path / "rep" / "report.html").exists()


@pytest.mark.slow  # a subprocess or a second run: the fast tier stays under 3 minutes
def test_cli_refuses_bad_input_in_one_line(demo_records: Path, tmp_path: Path):
    import subprocess
    import sys

    for args, message in (
        ([str(tmp_path / "missing")], "no such file or folder"),
        ([str(demo_records), "--write-manifest", str(tmp_path / "m.csv")], "needs the original photos"),
    ):
        out = subprocess.run(
            [sys.executable, str(ROOT / "scripts/audit.py"), *args, "--report", str(tmp_path / "r")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2 and message in out.stderr
        assert [line for line in out.stderr.splitlines() if line.startswith("error:")] == [
            out.stderr.strip().splitlines()[-1]
        ]
    assert not (tmp_path / "r").exists()  # nothing written before the error


def test_the_embeddings_are_the_batches_rows_in_order_scaled_to_length_one():
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(2, 4)), np.zeros((1, 4), np.float32)]
    rows = RowSink(10)  # two images did not decode: fewer rows than images
    for batch in batches:
        rows.add(batch)
    whole = np.concatenate(batches)
    embeddings = _normalised(rows.done())
    assert embeddings.dtype == np.float32 and embeddings.shape == (8, 4)
    np.testing.assert_allclose(embeddings[:7], whole[:7] / np.linalg.norm(whole[:7], axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(embeddings[7], 0.0)  # an all-zero row stays zero, not NaN


def test_a_multi_label_manifest_is_refused_saying_the_audit_reads_single_label_data(tmp_path: Path):
    """convert's advice (pass --multi-label) names a flag the audit does not have."""
    Image.new("RGB", (8, 8)).save(tmp_path / "a.jpg")
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label\na.jpg,car|person\n")
    said = f"^{manifest}:2: label 'car\\|person' lists several labels; a multi-label dataset, and the audit reads"
    with pytest.raises(UserError, match=said + " single-label data only$"):
        load_audit_input(manifest)
