"""The try-it page in a real browser: headless Chromium loads it, a photo is picked, a label shows.

Needs Chromium and its driver (Debian: `chromium chromium-driver`; .ci/run installs them).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY_BACKBONE
from PIL import Image, ImageDraw
from test_server import Server  # this folder is on sys.path under pytest (rootdir-relative imports)

from tests.page_layout import overlaps

pytestmark = [pytest.mark.slow, pytest.mark.start_first]


def _serve_a_tiny_model(records: Path, tmp_path: Path) -> Server:
    """A model trained for two steps on `records` (random init, 32 px), exported as "shapes" and served."""
    from app.config import TrainConfig
    from app.training.train import train

    train(
        TrainConfig(
            data=str(records),
            out=str(tmp_path / "shapes"),
            backbone=TINY_BACKBONE,
            weights="none",
            image_size=32,
            batch_size=4,
            epochs_head=1,
            epochs_finetune=0,
            max_steps_per_epoch=2,
        )
    )
    return Server(tmp_path / "shapes" / "export" / "shapes")


def _star(path: Path) -> Path:
    """A navy star on white: a photo the shapes model has a clear answer for."""
    image = Image.new("RGB", (96, 96), "white")
    ImageDraw.Draw(image).regular_polygon((48, 48, 36), 5, fill="navy")
    image.save(path)
    return path


def test_the_page_shows_the_models_label_for_an_uploaded_photo(browser, trained_run: Path, tmp_path: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    photo = _star(tmp_path / "star.png")
    server = Server(trained_run / "export" / "shapes")
    try:
        status, expected = server.request("/v1/models/shapes:classify", photo.read_bytes(), "image/png")
        assert status == 200
        browser.get(server.base + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: "circle, square, star, triangle" in b.find_element(By.ID, "model").text)
        browser.find_element(By.ID, "files").send_keys(str(photo))
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".card .row .label")))
        rows = browser.find_elements(By.CSS_SELECTOR, ".card .row")
        shown = [
            (r.find_element(By.CLASS_NAME, "label").text, r.find_element(By.CLASS_NAME, "score").text) for r in rows
        ]
        assert shown == [(p["label"], f"{100 * p['score']:.1f}%") for p in expected["predictions"]]
        assert browser.find_element(By.CSS_SELECTOR, ".card .name").text == "star.png"
        top = expected["predictions"][0]  # the answer first, as a headline: the server's, unknown included
        answer = "None of these" if expected["unknown"] else f"{top['label']} · {100 * top['score']:.1f}%"
        assert browser.find_element(By.CSS_SELECTOR, ".card .answer").text == answer
    finally:
        server.stop()


def test_a_side_features_model_gets_the_fields_typed_on_the_page_and_none_once_it_leaves_them_out(
    browser, tmp_path: Path
):
    """The page shows one field per side feature and sends them with the photo (as :classify
    query parameters): the labels shown are those of the same request sent directly. A model that
    ignores its side features shows no fields, and its answer is that of the photo alone."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from app.data.side_demo import FEATURE_COLUMNS, generate_side_feature_dataset
    from app.data.writer import write_tfrecords

    manifest = generate_side_feature_dataset(tmp_path / "photos", per_class=6, image_size=48)
    write_tfrecords(
        manifest,
        tmp_path / "records",
        feature_columns=FEATURE_COLUMNS,
        val_fraction=0.25,
        test_fraction=0.25,
        num_shards=1,
    )
    photo = sorted((tmp_path / "photos" / "images").glob("*.jpg"))[0]
    server = _serve_a_tiny_model(tmp_path / "records", tmp_path)
    try:
        status, expected = server.request(
            "/v1/models/shapes:classify?reading=40&site=north", photo.read_bytes(), "image/jpeg"
        )
        _, without = server.request("/v1/models/shapes:classify", photo.read_bytes(), "image/jpeg")

        def shown_as(body: dict) -> list[tuple[str, str]]:
            return [(p["label"], f"{100 * p['score']:.1f}%") for p in body["predictions"]]

        assert status == 200 and shown_as(expected) != shown_as(without)  # the fields visibly change the answer
        browser.get(server.base + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: b.find_element(By.ID, "side").is_displayed())
        browser.find_element(By.NAME, "reading").send_keys("40")
        browser.find_element(By.NAME, "site").send_keys("north")
        browser.find_element(By.ID, "files").send_keys(str(photo))
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".card .row .label")))
        rows = browser.find_elements(By.CSS_SELECTOR, ".card .row")
        shown = [
            (r.find_element(By.CLASS_NAME, "label").text, r.find_element(By.CLASS_NAME, "score").text) for r in rows
        ]
        assert shown == shown_as(expected)

        _publish_with_side_features_left_out(tmp_path / "shapes" / "export" / "shapes")
        wait.until(lambda _: server.get("/v1/models/shapes")["model_version_status"][0]["version"] == "2")
        browser.get(server.base + "/")  # the page of a model whose run left its side features out
        wait.until(lambda b: "circle" in b.find_element(By.ID, "model").text)
        assert not browser.find_element(By.ID, "side").is_displayed()
        assert not browser.find_elements(By.NAME, "reading")  # no field for a column the model ignores
        browser.find_element(By.ID, "files").send_keys(str(photo))
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".card .row .label")))
        labels = [
            r.find_element(By.CLASS_NAME, "label").text for r in browser.find_elements(By.CSS_SELECTOR, ".card .row")
        ]
        assert labels == [p["label"] for p in without["predictions"]]  # the photo alone, its columns sent as missing
    finally:
        server.stop()


def _publish_with_side_features_left_out(model_dir: Path) -> None:
    """Version 1 again as version 2, its metadata saying what a run whose judge closed the side
    path writes (`side_features_used: false`); copied under a temporary name, then renamed whole."""
    import json
    import shutil

    from app.export import layout

    staging = model_dir.parent / "staging"
    shutil.copytree(model_dir / "1", staging)
    metadata = layout.read_metadata(staging) | {"side_features_used": False}
    layout.metadata_path(staging).write_text(json.dumps(metadata), encoding="utf-8")
    staging.rename(model_dir / "2")


def test_a_multi_label_model_s_labels_above_threshold_are_shown(browser, tmp_path: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from app.data.multilabel_demo import generate_multilabel_dataset
    from app.data.writer import write_tfrecords

    manifest = generate_multilabel_dataset(tmp_path / "photos", photos=24, image_size=48)
    write_tfrecords(
        manifest, tmp_path / "records", multi_label=True, val_fraction=0.25, test_fraction=0.25, num_shards=1
    )
    photo = sorted((tmp_path / "photos" / "images").glob("*.jpg"))[0]
    server = _serve_a_tiny_model(tmp_path / "records", tmp_path)
    try:
        status, expected = server.request("/v1/models/shapes:classify", photo.read_bytes(), "image/jpeg")
        assert status == 200 and "labels_above_threshold" in expected
        browser.get(server.base + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: "circle, square, star, triangle" in b.find_element(By.ID, "model").text)
        browser.find_element(By.ID, "files").send_keys(str(photo))
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".card .above")))
        shown = browser.find_element(By.CSS_SELECTOR, ".card .above").text
        assert shown == f"labels above their thresholds: {', '.join(expected['labels_above_threshold']) or 'none'}"
    finally:
        server.stop()


def test_at_1200_by_900_the_model_table_clears_the_drop_zone_and_unknown_photos_say_so(
    browser, trained_run: Path, tmp_path: Path
):
    """Every label of the model table sits above the drop zone; a photo the server answers
    "unknown" for is shown as not one of the model's classes, with its score; "why?" shows
    where the model looked."""
    import numpy as np
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    server = Server(trained_run / "export" / "shapes")  # inside its run dir: "why?" (Grad-CAM) has the weights
    try:
        rng = np.random.default_rng(0)
        unlike = [np.full((96, 96, 3), 128, np.uint8), np.zeros((96, 96, 3), np.uint8)]  # flat grey, black
        unlike += [rng.integers(0, 256, (96, 96, 3), dtype=np.uint8) for _ in range(10)]  # noise
        unknown = None
        for k, pixels in enumerate(unlike):  # unlike the shapes: the first the server calls unknown
            photo = tmp_path / f"unlike_{k}.png"
            Image.fromarray(pixels).save(photo)
            status, answer = server.request("/v1/models/shapes:classify", photo.read_bytes(), "image/png")
            assert status == 200
            if answer["unknown"]:
                unknown = (photo, answer)
                break
        assert unknown is not None, "none of the photos unlike the shapes was answered unknown"
        browser.set_window_size(1200, 900)
        browser.get(server.base + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: "None of these" in b.find_element(By.ID, "model").text)
        drop_top = browser.find_element(By.ID, "drop").rect["y"]
        for cell in browser.find_elements(By.CSS_SELECTOR, "#model dt, #model dd"):
            assert cell.rect["y"] + cell.rect["height"] <= drop_top, f"{cell.text!r} overlaps the drop zone"
        labels = [dt.text for dt in browser.find_elements(By.CSS_SELECTOR, "#model dt")]
        assert "Largest image" in labels and "None of these" in labels
        photo, answer = unknown
        browser.find_element(By.ID, "files").send_keys(str(photo))
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".card .unknown")))
        shown = browser.find_element(By.CSS_SELECTOR, ".card .unknown").text
        assert shown == f"not one of: circle, square, star, triangle (score {answer['ood_score']:.2f})"
        assert browser.find_element(By.CSS_SELECTOR, ".card .answer").text == "None of these"  # the headline
        # "why?" swaps the photo for its Grad-CAM overlay, as the server's :explain draws it, and back
        photo_src = browser.find_element(By.CSS_SELECTOR, ".card img").get_attribute("src")
        _, why = server.request("/v1/models/shapes:explain", photo.read_bytes(), "image/png")
        browser.find_element(By.CSS_SELECTOR, ".card .why").click()
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, ".card img").get_attribute("src").startswith("data:"))
        assert browser.find_element(By.CSS_SELECTOR, ".card img").get_attribute("src") == why["overlay"]
        assert why["label"] in browser.find_element(By.CSS_SELECTOR, ".card .why").text
        browser.find_element(By.CSS_SELECTOR, ".card .why").click()
        assert browser.find_element(By.CSS_SELECTOR, ".card img").get_attribute("src") == photo_src
    finally:
        server.stop()


@pytest.mark.parametrize("width,height", [(390, 844), (1280, 900)])
def test_on_a_phone_and_a_laptop_the_picker_and_the_answer_show_without_scrolling(
    browser, trained_run: Path, tmp_path: Path, width: int, height: int
):
    """At phone width the model's details fold away so the photo picker is on the first screen;
    at both widths a classified photo's answer is visible without scrolling and no two parts of
    its card overlap."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    photo = _star(tmp_path / "star.png")
    server = Server(trained_run / "export" / "shapes")
    try:
        browser.set_window_size(width, height)
        browser.get(server.base + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(
            lambda b: "circle, square, star, triangle" in b.find_element(By.ID, "model").get_attribute("textContent")
        )
        viewport = browser.execute_script("return window.innerHeight")
        warning = browser.find_element(By.ID, "warning")  # the fixture trained from random weights: said first
        assert warning.is_displayed() and warning.text.startswith("This model was trained from random initialisation")
        assert browser.find_element(By.ID, "about").get_attribute("open") == (None if width < 600 else "true")
        assert (
            browser.find_element(By.ID, "drop").rect["y"] + browser.find_element(By.ID, "drop").rect["height"]
            <= viewport
        )
        browser.find_element(By.ID, "files").send_keys(str(photo))
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".card .answer")))
        answer = browser.find_element(By.CSS_SELECTOR, ".card .answer").rect
        assert answer["y"] + answer["height"] <= viewport and answer["width"] > 0
        assert (
            browser.execute_script("return document.documentElement.scrollWidth") <= width
        )  # nothing wider than the screen
        assert overlaps(browser, ".card img, .card .name, .card .answer, .card .row, .card .why") == []
    finally:
        server.stop()


HOSTILE = '<img src=x onerror="window.pwned=1">'
LABELS = {"circle": HOSTILE, "square": "b&\"q'", "star": "Çiçek", "triangle": "tri,angle"}


def test_labels_that_look_like_markup_are_shown_as_text_everywhere(browser, demo_images: Path, tmp_path: Path):
    """Class names from a manifest holding markup, quotes, '&', a comma and non-ASCII: the page and
    the evaluation report show them as text (no element made of them, no script run), and
    predict's CSV gives them back unchanged."""
    import csv
    import subprocess
    import sys

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from app.data.writer import write_tfrecords
    from app.evaluation.evaluate import evaluate

    manifest = tmp_path / "hostile.csv"
    with manifest.open("w", newline="", encoding="utf-8") as f:
        rows = csv.writer(f)
        rows.writerow(["path", "label"])
        for folder, label in LABELS.items():
            rows.writerows([str(p), label] for p in sorted((demo_images / folder).iterdir()))
    write_tfrecords(manifest, tmp_path / "records", val_fraction=0.25, test_fraction=0.25, num_shards=1)
    server = _serve_a_tiny_model(tmp_path / "records", tmp_path)
    photo = sorted((demo_images / "star").glob("*.png"))[0]

    def nothing_injected() -> None:
        assert browser.find_elements(By.CSS_SELECTOR, 'img[src="x"]') == []
        assert browser.execute_script("return window.pwned") is None

    try:
        browser.get(server.base + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: HOSTILE in b.find_element(By.ID, "model").text)
        browser.find_element(By.ID, "files").send_keys(str(photo))
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".card .row .label")))
        shown = {label.text for label in browser.find_elements(By.CSS_SELECTOR, ".card .row .label")}
        assert shown == set(LABELS.values())
        nothing_injected()
        export = tmp_path / "shapes" / "export" / "shapes"
        report = evaluate(export, tmp_path / "records", split="val", report_dir=tmp_path / "report").html
        browser.get(report.resolve().as_uri())
        assert HOSTILE in browser.find_element(By.TAG_NAME, "body").text
        nothing_injected()
        out = tmp_path / "predicted.csv"
        done = subprocess.run(
            [sys.executable, "scripts/predict.py", str(export), str(photo.parent), "--output", str(out)],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        with out.open(newline="", encoding="utf-8") as f:
            read = [row for row in csv.DictReader(f) if row["label_1"]]  # star/ also holds an empty file
        assert read and {row[f"label_{i}"] for row in read for i in range(1, 5)} == set(LABELS.values())
    finally:
        server.stop()
