"""`audit(data, report_dir)`: scan, run every finder, and return one JSON-ready result.

Findings name images by their path relative to DATA and carry split and label, so the
report, the JSON and the manifest all speak about the same rows. Leaks (a duplicate pair
that crosses train/val/test) are listed first: they inflate every accuracy measured on the
affected validation or test images.
"""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import numpy as np

from app import storage
from app.audit import findings, report
from app.audit.items import AuditInput, AuditItem, load_audit_input
from app.audit.neighbours import Nearest, nearest
from app.audit.scan import Scan, scan_images
from app.data.audit_files import default_report_dir
from app.data.sources import check_out_beside_src
from app.errors import UserError

log = logging.getLogger(__name__)
EMBEDDINGS_FILE = "embeddings.npz"


def _image(item: AuditItem) -> dict:
    return {"path": item.name, "split": item.split, "label": item.label}


def _without_pretrained_features(scan: Scan) -> str | None:
    """Why near duplicates, likely wrong labels and far-off photos were not looked for: a
    backbone without pretrained weights sees every photo as alike (plainly different photos
    nearly identical), so its findings would be junk that looks like results."""
    if not scan.weights_used.startswith("none"):
        return None
    return (
        "NO PRETRAINED FEATURES: near duplicates, likely wrong labels and photos far from the rest were not"
        " looked for (they need a pretrained backbone: --weights PATH, or export PHOTOCLF_WEIGHTS=PATH);"
        " exact duplicates, leaks of them across splits and the pixel checks were"
    )


def _pairs(
    scan: Scan, items: list[AuditItem], threshold: float, found: Nearest | None
) -> tuple[list[dict], list[dict]]:
    """(exact duplicate pairs, near duplicate pairs among the nearest `found`: none without
    pretrained features), each {a, b, similarity, kind}."""
    images = [_image(items[index]) for index in scan.indices]  # one dict an image, shared by its pairs
    exact = []
    for group in findings.exact_duplicate_groups(scan.pixel_hashes):
        exact += [{"a": images[group[0]], "b": images[row], "similarity": 1.0, "kind": "exact"} for row in group[1:]]
    near = [
        {"a": images[i], "b": images[j], "similarity": round(s, 4), "kind": "near"}
        for chunk in (findings.near_duplicate_chunks(scan.embeddings, threshold, found) if found else [])
        for i, j, s in chunk
        if scan.pixel_hashes[i] != scan.pixel_hashes[j]
    ]  # identical pixels are listed as exact
    if len(near) > len(scan.indices):
        log.warning("WARNING: %d near-duplicate pairs among %d images: to this backbone most of these images look "
                    "alike at cosine %g; --near-threshold higher lists the ones that are copies", len(near),
                    len(scan.indices), threshold)  # fmt: skip
    return exact, near


def _label_issues(scan: Scan, audit_input: AuditInput) -> tuple[list[dict], list[dict]]:
    """(flagged likely mislabels, every image ranked by self-confidence) from out-of-sample
    probabilities; needs at least two classes with two images each."""
    classes = audit_input.classes
    labels = np.array([classes.index(audit_input.items[i].label) for i in scan.indices])
    if len(classes) < 2 or np.bincount(labels, minlength=len(classes)).min() < 2:
        return [], []
    probabilities = findings.out_of_sample_probabilities(scan.embeddings, labels)
    flagged = [
        {
            **_image(audit_input.items[scan.indices[row]]),
            "suggested": classes[suggested],
            "confidence_in_label": round(conf, 4),
            "confidence_in_suggested": round(float(probabilities[row, suggested]), 4),
        }
        for row, suggested, conf in findings.label_issues(probabilities, labels)
    ]
    self_confidence = probabilities[np.arange(len(labels)), labels]
    ranking = [_image(audit_input.items[scan.indices[row]]) for row in np.argsort(self_confidence, kind="stable")]
    return flagged, ranking


def run_audit(
    data: str | Path, report_dir: str | Path | None = None, manifest: str | Path | None = None, **options
) -> tuple[dict, list[Path]]:
    """`audit`, then audit.json, report.html and (if asked) the review manifest. Checks that a
    manifest can be written before any image is read."""
    audit_input = load_audit_input(data)
    if manifest is not None:
        if not all(item.source for item in audit_input.items):
            raise UserError(
                f"--write-manifest needs the original photos; {data} is a TFRecord folder"
                " (audit the folder or CSV you converted)"
            )
        storage.check_output_file(manifest, "--write-manifest")
    report_dir = Path(report_dir) if report_dir else default_report_dir(data)
    if all(item.source for item in audit_input.items):  # photos, not a TFRecord folder
        check_out_beside_src(Path(data), report_dir, "--report", "DATA")
    storage.check_output_folder(report_dir, "--report")
    result = audit(audit_input, report_dir, **options)
    written = list(report.write_reports(result, report_dir))
    if manifest is not None:
        written.append(report.write_manifest(result, audit_input.items, Path(manifest)))
    return result, written


def audit(
    data: str | Path | AuditInput,
    report_dir: str | Path,
    *,
    backbone: str = "mobilenet_v2",
    weights: str = "auto",
    near_threshold: float = findings.NEAR_DUPLICATE_SIMILARITY,
    image_size: int = 0,
) -> dict:
    """Every finding about DATA, as a dict (what audit.json holds, plus thumbnails)."""
    if not 0.0 < near_threshold <= 1.0:
        raise UserError(f"--near-threshold must be in (0, 1], got {near_threshold}")
    audit_input = data if isinstance(data, AuditInput) else load_audit_input(data)
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    scan = scan_images(audit_input, report_dir / EMBEDDINGS_FILE, backbone, weights, image_size)
    gc.collect()  # the backbone's models, in reference cycles: freed before the finders' own peaks
    not_looked_for = _without_pretrained_features(scan)
    if not_looked_for:
        log.warning("WARNING: %s", not_looked_for)
    # the finders one after another, each one's working memory let go before the next's
    mislabels, ranking = ([], []) if not_looked_for else _label_issues(scan, audit_input)
    found = None if not_looked_for else nearest(scan.embeddings, findings.NEAR_CANDIDATES)  # once, for both finders
    exact, near = _pairs(scan, audit_input.items, near_threshold, found)
    leaks = [p for p in exact + near if p["a"]["split"] != p["b"]["split"]]
    return {
        "data": str(audit_input.root),
        "images": len(scan.indices) + len(audit_input.unreadable),  # every file: read, or unreadable
        "readable": len(scan.indices),
        "classes": audit_input.classes,
        "counts": _counts(audit_input.items),
        "weights": scan.weights_used,
        "weights_warning": scan.weights_warning,
        "not_looked_for": not_looked_for,  # why the findings that need pretrained features are absent, or None
        "near_duplicate_threshold": near_threshold,
        "leaks": leaks,
        "leaked_eval_images": _eval_images_in(leaks),
        "exact_duplicates": exact,
        "near_duplicates": near,
        "likely_mislabels": mislabels,
        "outliers": _outliers(scan, audit_input, found),
        "unreadable": audit_input.unreadable,
        "label_ranking": ranking,
        "thumbnails": {audit_input.items[i].name: thumb for i, thumb in zip(scan.indices, scan.thumbnails)},
    }


def _outliers(scan: Scan, audit_input: AuditInput, found: Nearest | None) -> list[dict]:
    """The photos far from every other, or odd in their pixels, each with why."""
    # features of random weights put every photo near every other: no photo is far from the rest
    similarity = findings.neighbour_similarity(scan.embeddings, found=found) if found else np.ones(len(scan.indices))
    stats = findings.PixelStats(scan.heights, scan.widths, scan.pixel_std, scan.detail, scan.flat_share)
    odd = findings.outliers(similarity, stats)
    return [
        {**_image(audit_input.items[scan.indices[row]]), "reasons": reasons} for row, reasons in sorted(odd.items())
    ]


def _eval_images_in(leaks: list[dict]) -> dict[str, int]:
    """How many validation and test images have a copy in another split."""
    affected = {
        (side["split"], side["path"]) for pair in leaks for side in (pair["a"], pair["b"]) if side["split"] != "train"
    }
    return {split: sum(1 for s, _ in affected if s == split) for split in ("val", "test")}


def _counts(items: list[AuditItem]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for item in items:
        counts.setdefault(item.split, {}).setdefault(item.label, 0)
        counts[item.split][item.label] += 1
    return counts
