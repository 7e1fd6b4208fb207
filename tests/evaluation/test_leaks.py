"""Accuracy without the test photos the data's audit found copied in another split: the figure a
photo never seen would give, beside the split's own."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.data.audit_files import Leaked, default_report_dir, leaked_in
from app.data.pipeline import load_dataset_info, photo_index
from app.evaluation import leaks
from app.evaluation.metrics import wilson_interval
from app.evaluation.predictions import Predictions


def _write_audit(audited: Path, counts: dict, pairs: list[tuple[str, str, str, str]]) -> Path:
    """An audit.json as `photoclf audit` writes it: counts, and leaks as pairs (split, path) x 2."""
    folder = default_report_dir(audited)
    folder.mkdir(parents=True, exist_ok=True)
    found = [{"a": {"path": a, "split": sa}, "b": {"path": b, "split": sb}, "kind": "near"} for sa, a, sb, b in pairs]
    (folder / "audit.json").write_text(json.dumps({"counts": counts, "leaks": found}))
    return folder / "audit.json"


@pytest.fixture
def records(demo_records: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(demo_records, tmp_path / "records"))


def test_the_audits_copies_are_read_for_the_split_asked(records: Path, tmp_path: Path):
    info = load_dataset_info(records)
    names = {split: [name for s, name, _ in photo_index(info) if s == split] for split in ("train", "val", "test")}
    pairs = [("train", names["train"][0], "test", names["test"][0]), ("test", names["test"][1], "val", names["val"][0])]
    audit = _write_audit(records, info.counts, pairs)
    assert leaked_in(str(records), "test") == Leaked(frozenset(names["test"][:2]), audit)
    assert leaked_in(str(records), "val").names == {names["val"][0]}
    # an audit that counts other photos (other data, or this data before it was converted again) is not read
    _write_audit(records, {**info.counts, "test": {}}, pairs)
    assert leaked_in(str(records), "test") is None
    # the audit of the photos the folder was converted from is read as well (their paths are the stored names)
    dataset = json.loads((records / "dataset.json").read_text())
    (records / "dataset.json").write_text(json.dumps({**dataset, "source": str(tmp_path / "photos")}))
    audit = _write_audit(tmp_path / "photos", info.counts, pairs[:1])
    assert leaked_in(str(records), "test") == Leaked(frozenset(names["test"][:1]), audit)


def _predictions(names: list[str], labels: list[int], guesses: list[int]) -> Predictions:
    probabilities = np.eye(2)[guesses] * 0.8 + 0.1
    return Predictions(np.array(labels), probabilities, names, ["cat", "dog"])


def test_accuracy_without_the_copied_photos(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    predictions = _predictions(["a", "b", "c", "d", "e"], [0, 0, 1, 1, 1], [0, 1, 1, 0, 1])  # b and d wrong
    copied = Leaked(frozenset({"a", "c"}), Path("photos-audit/audit.json"))  # two right answers copied
    monkeypatch.setattr(leaks, "leaked_in", lambda data, split: copied)
    found = leaks.without_leaks(predictions, "data", "test")
    assert found == {
        "audit": "photos-audit/audit.json",
        "leaked": 2,
        "count": 3,
        "accuracy": pytest.approx(1 / 3),
        "accuracy_interval": pytest.approx(list(wilson_interval(1, 3))),
    }
    assert leaks.summary_rows(found)[0][0] == "accuracy without the 2 copied in another split (audit)"
    assert leaks.in_words(found).endswith("without them, 33.3% right on 3.")
    # an audit naming photos this split does not hold is of other photos: not read, and said
    monkeypatch.setattr(leaks, "leaked_in", lambda data, split: Leaked(frozenset({"a", "z"}), Path("x")))
    with caplog.at_level(logging.WARNING):
        assert leaks.without_leaks(predictions, "data", "test") is None
    assert "not this data's audit" in caplog.text


def test_evaluate_reports_both_accuracies(trained_run: Path, records: Path, tmp_path: Path):
    from app.evaluation.evaluate import evaluate

    info = load_dataset_info(records)
    test_names = [name for s, name, _ in photo_index(info) if s == "test"]
    train_name = next(name for s, name, _ in photo_index(info) if s == "train")
    _write_audit(records, info.counts, [("train", train_name, "test", name) for name in test_names[:3]])
    result = evaluate(trained_run, records, split="test", report_dir=tmp_path / "report", runtime="litert")
    p = result.predictions
    kept = [i for i, name in enumerate(p.filenames) if name not in test_names[:3]]
    expected = float(np.mean(p.probabilities[kept].argmax(axis=1) == p.labels[kept]))
    assert result.metrics["without_leaks"]["leaked"] == 3 and result.metrics["without_leaks"]["count"] == len(kept)
    assert result.metrics["without_leaks"]["accuracy"] == pytest.approx(expected)
    assert "accuracy without the 3 copied in another split (audit)" in result.summary
    assert "3 of these photos have a copy in another split" in result.html.read_text()
