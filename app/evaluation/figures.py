"""Figures (matplotlib, PNG) for evaluation reports, TensorBoard and the run dir, sized to stay
readable with many classes. Written atomically, like every file the project writes."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from app import storage  # noqa: E402
from app.data.display import MISTAKE_SIDE, open_photo  # noqa: E402
from app.evaluation.fonts import drawing, use_fallback_fonts  # noqa: E402
from app.evaluation.metrics import row_normalized  # noqa: E402
from app.run_dir import read_history  # noqa: E402

use_fallback_fonts()


def save_figure(fig, path: Path) -> Path:
    """PNG for charts; a grid of photos as `.jpg` (JPEG), which holds photos in far fewer bytes
    than PNG and is written faster, in its file and in the report that inlines it."""
    photo = {"pil_kwargs": {"quality": 90}} if Path(path).suffix.lower() in (".jpg", ".jpeg") else {}
    with drawing(fig), storage.atomic_path(path) as tmp:
        if fig.get_layout_engine() is None:  # a figure made with layout="constrained" lays itself out
            fig.tight_layout()
        fig.savefig(tmp, dpi=100, **photo)
    plt.close(fig)
    return path


def figure_png(fig) -> bytes:
    out = io.BytesIO()
    with drawing(fig):
        fig.tight_layout()
        fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out.getvalue()


def plot_confusion_matrix(counts: np.ndarray, classes: list[str], path: Path) -> Path:
    return save_figure(confusion_matrix_figure(counts, classes), path)


def confusion_matrix_figure(counts: np.ndarray, classes: list[str]):
    """Row-normalised colours; counts written in the cells while there are few enough classes."""
    counts = np.asarray(counts)
    normalized = row_normalized(counts)
    n = len(classes)
    side = min(max(5.0, 0.45 * n + 2), 40.0)
    fig, ax = plt.subplots(figsize=(side, side))
    image = ax.imshow(normalized, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.046, label="fraction of the true class")
    ax.set_xticks(range(n), classes, rotation=90, fontsize=max(4, 10 - n // 15))
    ax.set_yticks(range(n), classes, fontsize=max(4, 10 - n // 15))
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if n <= 25:
        for t in range(n):
            for p in range(n):
                if counts[t, p]:
                    ax.text(
                        p,
                        t,
                        str(counts[t, p]),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if normalized[t, p] > 0.5 else "black",
                    )
    ax.set_title("Confusion matrix")
    return fig


def plot_per_class(metrics: dict, path: Path) -> Path:
    """Precision, recall and F1 per class, worst F1 first (a class absent from photos and answers has none)."""
    absent = set(metrics.get("classes_absent", []))
    per_class = sorted(((n, v) for n, v in metrics["per_class"].items() if n not in absent), key=lambda kv: kv[1]["f1"])
    names = [k for k, _ in per_class]
    height = max(3.0, 0.3 * len(names) + 1)
    fig, ax = plt.subplots(figsize=(8, height))
    y = np.arange(len(names))
    for offset, key in zip((-0.27, 0.0, 0.27), ("precision", "recall", "f1")):
        ax.barh(y + offset, [v[key] for _, v in per_class], height=0.27, label=key)
    ax.set_yticks(y, names)
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)  # above the bars, never on them
    ax.set_title("Per-class metrics (worst F1 at the top)", pad=24)
    return save_figure(fig, path)


def plot_reliability(metrics: dict, path: Path) -> Path:
    bins = [b for b in metrics["reliability"] if b["count"]]
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    ax.bar(
        [b["low"] for b in bins],
        [b["accuracy"] for b in bins],
        width=[b["high"] - b["low"] for b in bins],
        align="edge",
        alpha=0.7,
        edgecolor="black",
        label="accuracy in bin",
    )
    ax.plot(
        [b["confidence"] for b in bins],
        [b["accuracy"] for b in bins],
        "o-",
        color="C3",
        label="calibrated" if "calibration" in metrics else "mean confidence",
    )
    title = f"Reliability (ECE {metrics['ece']:.3f})"
    if "calibration" in metrics:  # the same predictions without the export's temperature
        c = metrics["calibration"]
        raw = [b for b in c["reliability_uncalibrated"] if b["count"]]
        ax.plot(
            [b["confidence"] for b in raw],
            [b["accuracy"] for b in raw],
            "s--",
            color="C7",
            label=f"without temperature {c['temperature']:.2f}",
        )
        title = f"Reliability (ECE {metrics['ece']:.3f}; {c['ece_uncalibrated']:.3f} without T)"
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(loc="upper left")
    return save_figure(fig, path)


def plot_mistakes(
    mistakes: list[dict], path: Path, columns: int = 4, shown: list[np.ndarray] | None = None, title: str = ""
) -> Path | None:
    """The most confident mistakes: image (or `shown[i]` instead, e.g. with its Grad-CAM map),
    true label, predicted label, confidence."""
    if not mistakes:
        return None
    rows = (len(mistakes) + columns - 1) // columns
    no_ticks = {"xticks": [], "yticks": []}  # hidden either way; without any, the layout places no tick labels
    fig, axes = plt.subplots(
        rows, columns, figsize=(3 * columns, 3.8 * rows), squeeze=False, layout="constrained", subplot_kw=no_ticks
    )
    for ax in axes.flat:
        ax.axis("off")
    for i, (ax, m) in enumerate(zip(axes.flat, mistakes)):
        ax.imshow(shown[i] if shown else open_photo(m["image"], MISTAKE_SIDE))
        ax.set_title(
            f"{_short(Path(m.get('filename', '')).name)}\ntrue: {_short(m['true'])}\n"
            f"said: {_short(m['predicted'])} ({m['confidence']:.2f})",
            fontsize=9,
        )
    fig.suptitle(title or "Most confident mistakes")
    return save_figure(fig, path)


def _short(text: str, most: int = 30) -> str:
    """A name cut to fit a thumbnail's width, so titles never run into their neighbours."""
    return text if len(text) <= most else text[: most - 1] + "…"


def plot_learning_curves(history_csv: Path, out_png: Path) -> Path | None:
    """Loss and accuracy over both phases on one time axis, with the phase boundary marked."""
    rows = read_history(history_csv)
    if not rows:
        return None
    epochs = [int(r["epoch"]) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("loss", "accuracy")):
        ax.plot(epochs, [float(r[key]) for r in rows], "o-", label=f"train {key}")
        ax.plot(epochs, [float(r[f"val_{key}"]) for r in rows], "s-", label=f"val {key}")
        phase2 = [int(r["epoch"]) for r in rows if r["phase"] == "2"]
        if phase2 and len(phase2) < len(rows):
            ax.axvline(min(phase2) - 0.5, color="gray", linestyle="--", label="phase 2 starts")
        ax.set_xlabel("epoch")
        ax.set_title(key)
        ax.grid(alpha=0.3)
        ax.legend()
    return save_figure(fig, out_png)
