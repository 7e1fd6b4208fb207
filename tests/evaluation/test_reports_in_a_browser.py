"""The evaluation and audit reports in a real browser at phone and laptop width: the headline
first and visible without scrolling, nothing wider than the screen, no two blocks overlapping.

Needs Chromium and its driver (Debian: `chromium chromium-driver`; .ci/run installs them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.page_layout import overlaps

pytestmark = pytest.mark.slow
WIDTHS = [(390, 844), (1280, 900)]


def _check_page(browser, page: Path, width: int, height: int, headline: str, blocks: str) -> str:
    from selenium.webdriver.common.by import By

    browser.set_window_size(width, height)
    browser.get(page.as_uri())
    first = browser.find_element(By.CSS_SELECTOR, headline)
    viewport = browser.execute_script("return window.innerHeight")
    assert first.is_displayed() and first.rect["y"] + first.rect["height"] <= viewport, first.rect
    assert browser.execute_script("return document.documentElement.scrollWidth") <= width  # no sideways scrolling
    assert overlaps(browser, blocks) == []
    return first.text


@pytest.mark.parametrize("width,height", WIDTHS)
def test_the_evaluation_report_opens_with_its_answer_in_plain_words(
    browser, trained_run: Path, demo_records: Path, tmp_path: Path, width: int, height: int
):
    from app.evaluation.evaluate import evaluate

    result = evaluate(trained_run, demo_records, split="val", report_dir=tmp_path / "report")
    shown = _check_page(browser, result.html, width, height, ".card .headline", "h1, .card, details, .table, h2, img")
    n = result.metrics["num_examples"]
    assert shown.startswith(f"{100 * result.metrics['accuracy']:.1f}% right on {n} photos (95% interval")


@pytest.mark.parametrize("width,height", WIDTHS)
def test_the_audit_report_without_pretrained_features_says_so_first(
    browser, demo_images: Path, tmp_path: Path, width: int, height: int
):
    from conftest import TINY_BACKBONE

    from app.audit.audit import run_audit

    run_audit(demo_images, tmp_path / "audit", backbone=TINY_BACKBONE, weights="none", image_size=64)
    shown = _check_page(
        browser, tmp_path / "audit" / "report.html", width, height, ".warning", "h1, .warning, p, pre, h2"
    )
    assert shown.startswith("NO PRETRAINED FEATURES")
