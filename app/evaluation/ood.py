"""`evaluate --ood PATH`: how well the export's "none of these" separates the evaluation photos
from photos of other things.

The scores are the export's own `ood_score` outputs (app.models.ood, computed in its graph), for
the evaluation data (in distribution) and for PATH: a folder of photos (any layout, labels
ignored) or a TFRecord folder (its `split`). Reported: AUROC, the share of other photos accepted
when 95% of the evaluation photos are, the counts accepted and answered "unknown" at the export's
own threshold, accuracy on the accepted photos, and a histogram of both sets of scores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np

from app import storage
from app.data import schema
from app.data.image_header import DEFAULT_MAX_MEGAPIXELS
from app.data.photo_lists import read_or_reason
from app.data.sources import files_and_broken_links, list_files
from app.errors import UserError
from app.export.layout import read_metadata
from app.inference.runtime import HostRuntime, TFRuntime, answers_or_reasons
from app.models import ood
from app.progress import progress_bar

T = TypeVar("T")


def check_ood_source(path: str) -> None:
    """Before any work: PATH is a TFRecord folder or a local folder of files."""
    storage.check_url(path, "--ood")
    if storage.exists(storage.join(path, schema.METADATA_FILE)):
        return
    if storage.is_url(path) or not Path(path).is_dir() or not list_files(Path(path)):
        raise UserError(f"--ood {path}: neither a TFRecord folder (dataset.json) nor a folder of photos")


def _encoded(path: str, split: str) -> tuple[int, Iterator[tuple[str, bytes | str]]]:
    """(name, the bytes or why they cannot be read) of every file under `path`, links whose
    target is gone included, or of every record of its `split`."""
    if storage.exists(storage.join(path, schema.METADATA_FILE)):
        from app.evaluation.predictions import tfrecord_examples

        _, total, examples = tfrecord_examples(path, split)
        return total, ((example[2], example[0]) for example in examples)
    folder = Path(path)
    files = sorted(sum(files_and_broken_links(folder), []))
    return len(files), ((str(f.relative_to(folder)), read_or_reason(f)) for f in files)


def ood_scores(
    runtime: TFRuntime | HostRuntime, path: str, split: str, tta: str, batch_size: int = 32
) -> tuple[np.ndarray, list[dict]]:
    """The export's ood_score of every photo under `path` it can read and decode, and the others
    as skipped ({"path", "reason"}), as evaluation lists its own."""
    limit = float(read_metadata(runtime.version).get("max_megapixels", DEFAULT_MAX_MEGAPIXELS))
    total, images = _encoded(path, split)
    scores: list[float] = []
    skipped: list[dict] = []
    with progress_bar(total, "img", "Other photos") as bar:
        for batch in _batched(images, batch_size):  # streamed: one batch of bytes in memory at a time
            answers = answers_or_reasons(runtime, [data for _, data in batch], limit, tta)
            for (name, _), answer in zip(batch, answers):
                if isinstance(answer, str):
                    skipped.append({"path": name, "reason": answer})
                else:
                    scores.append(float(answer["ood_score"]))
            bar.update(len(batch))
    if not scores:
        raise UserError(f"--ood {path}: no photo there could be decoded")
    return np.array(scores, np.float32), skipped


def _batched(items: Iterator[T], size: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def ood_metrics(
    known: np.ndarray, other: np.ndarray, threshold: float, correct: np.ndarray, other_skipped: list[dict] | None = None
) -> dict:
    """`known`: the evaluation photos' scores, `correct` whether each was classified right;
    `other`: the other photos' scores, `other_skipped` those that had none; `threshold`: the export's."""
    accepted = known <= threshold
    return {
        "method": ood.SHIPPED,
        "threshold": threshold,
        "auroc": round(ood.auroc(known, other), 6),
        "fpr_at_95_tpr": round(ood.fpr_at_tpr(known, other, 0.95), 6),
        "known": {"count": len(known), "accepted": int(accepted.sum()), "unknown": int((~accepted).sum())},
        "other": {
            "count": len(other),
            "accepted": int((other <= threshold).sum()),
            "unknown": int((other > threshold).sum()),
            "skipped": other_skipped or [],
        },
        "accuracy_accepted": round(float(correct[accepted].mean()), 6) if accepted.any() else None,
        "scores": {"known": known.round(5).tolist(), "other": other.round(5).tolist()},
    }


def plot_ood_histogram(metrics: dict, path: Path) -> Path:
    from app.evaluation.figures import plt, save_figure

    known, other = (np.array(metrics["scores"][k]) for k in ("known", "other"))
    bins = np.linspace(min(known.min(), other.min()), max(known.max(), other.max()), 40)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(known, bins=bins, alpha=0.6, label=f"evaluation photos ({len(known)})")
    ax.hist(other, bins=bins, alpha=0.6, label=f"other photos ({len(other)})")
    ax.axvline(metrics["threshold"], color="black", linestyle="--", label='threshold: above it, "unknown"')
    ax.set_xlabel("ood_score (higher: less like the training photos)")
    ax.set_ylabel("photos")
    ax.set_title(f"None of these: AUROC {metrics['auroc']:.3f}, FPR at 95% TPR {metrics['fpr_at_95_tpr']:.3f}")
    ax.legend()
    return save_figure(fig, path)


def ood_summary_rows(metrics: dict) -> list[list[str]]:
    known, other = metrics["known"], metrics["other"]
    rows = [
        ["other photos: AUROC", f"{metrics['auroc']:.4f}"],
        ["other photos accepted at 95% TPR", f"{metrics['fpr_at_95_tpr']:.4f}"],
        ["evaluation photos accepted", f"{known['accepted']} of {known['count']}"],
        ["other photos answered unknown", f"{other['unknown']} of {other['count']}"],
    ]
    if other.get("skipped"):
        rows.append(["other photos skipped", f"{len(other['skipped'])} (in metrics.json, ood.other.skipped)"])
    if metrics["accuracy_accepted"] is not None:
        rows.append(["accuracy on accepted photos", f"{metrics['accuracy_accepted']:.4f}"])
    return rows
