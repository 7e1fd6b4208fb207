"""The review page in a real browser, by keyboard alone: three photos labelled, the manifest holds them.

Needs Chromium and its driver (Debian: `chromium chromium-driver`; .ci/run installs them).
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from test_review import unlabelled  # noqa: F401  (the fixture: shapes and a burst)

from app.net import free_port
from app.review.answers import NOT_ANY_CLASS
from tests.page_layout import overlaps

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _start(trained_run: Path, folder: Path, manifest: Path) -> tuple[subprocess.Popen, str]:
    port = free_port("127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts/review.py"), str(trained_run), str(folder), "--manifest", str(manifest),
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(base + "/api/state", timeout=5).read()
            return proc, base
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the review server did not start")


def test_three_photos_labelled_by_keyboard_land_in_the_manifest_and_undo_takes_one_back(
    browser,
    trained_run: Path,
    unlabelled,  # noqa: F811
    demo_records: Path,
    tmp_path: Path,
):
    """Enter accepts the guess (and does nothing on a photo the model calls none of its classes),
    2 picks class 2, N says not any class, U takes the last answer back; the manifest starts with
    the run's own photos in their splits, and the answers join its training split."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from app.data.pipeline import load_dataset_info

    folder = tmp_path / "photos"
    shutil.copytree(unlabelled, folder)
    manifest = tmp_path / "review.csv"
    proc, base = _start(trained_run, folder, manifest)
    try:
        browser.get(base + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".card.current")) == 1)
        names = [n.text for n in browser.find_elements(By.CSS_SELECTOR, ".card .name")]
        body = browser.find_element(By.TAG_NAME, "body")
        first_unknown = bool(browser.find_elements(By.CSS_SELECTOR, ".card.current .unknown"))
        if first_unknown:  # Enter is no answer for it: nothing happens, and class 1 is picked instead
            body.send_keys(Keys.ENTER)
            time.sleep(1)
            assert not browser.find_elements(By.CSS_SELECTOR, ".card.done")
            first_key, first_label = "1", "circle"
        else:
            first_key = Keys.ENTER
            first_label = browser.find_element(By.CSS_SELECTOR, ".card.current .accept").text.removeprefix("✓ ")
        for key, done in ((first_key, 1), ("2", 2), ("n", 3)):  # the guess, class 2, not any class
            body.send_keys(key)
            wait.until(lambda b, d=done: len(b.find_elements(By.CSS_SELECTOR, ".card.done")) == d)
        wait.until(lambda b: "3 answered" in b.find_element(By.ID, "status").text)
        assert browser.find_element(By.CSS_SELECTOR, ".card.current .name").text == names[3]
        body.send_keys("u")  # "not any class" taken back: its card is open and current again
        wait.until(lambda b: "2 answered" in b.find_element(By.ID, "status").text)
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, ".card.current .name").text == names[2])
        assert len(browser.find_elements(By.CSS_SELECTOR, ".card.done")) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with manifest.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["path", "label", "split", "keep"]
    assert (
        len(rows)
        == 1
        + load_dataset_info(demo_records).num_examples("train")
        + load_dataset_info(demo_records).num_examples("val")
        + load_dataset_info(demo_records).num_examples("test")
        + 2
    )
    assert rows[-2:] == [
        [f"photos/{names[0]}", first_label, "train", "true"],
        [f"photos/{names[1]}", "square", "train", "true"],  # classes are listed sorted: circle, square, star, triangle
    ]
    assert NOT_ANY_CLASS not in {row[1] for row in rows}  # taken back


@pytest.mark.parametrize("width,height", [(390, 844), (1280, 900)])
def test_the_review_page_fits_a_phone_and_a_laptop(
    browser,
    trained_run: Path,
    unlabelled,  # noqa: F811
    tmp_path: Path,
    width: int,
    height: int,
):
    """The counts and the first photo to answer show without scrolling; nothing is wider than
    the screen; no two parts overlap."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    proc, base = _start(trained_run, unlabelled, tmp_path / "review.csv")
    try:
        browser.set_window_size(width, height)
        browser.get(base + "/")
        WebDriverWait(browser, 60).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".card.current")) == 1)
        viewport = browser.execute_script("return window.innerHeight")
        status = browser.find_element(By.ID, "status")
        assert status.text.startswith("0 answered") and status.rect["y"] + status.rect["height"] <= viewport
        assert browser.find_element(By.CSS_SELECTOR, ".card.current img").rect["y"] < viewport
        assert browser.execute_script("return document.documentElement.scrollWidth") <= width
        assert (
            overlaps(browser, "h1, #status, #keys, .card, .card img, .card .name, .card .guess, .card .buttons") == []
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
