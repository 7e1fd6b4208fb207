"""What a multi-label evaluation prints and draws: overall figures, the per-label table (its
2x2 counts are the per-label confusion view), per-label bars and a 2x2 per label."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from app.evaluation.figures import plt, save_figure
from app.table import format_table


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def multilabel_summary(metrics: dict) -> str:
    overall = [
        ["metric", "value"],
        ["photos", str(metrics["count"])],
        ["exact match", _f(metrics["exact_match"])],
        ["macro mAP", _f(metrics["macro_map"])],
        ["micro mAP", _f(metrics["micro_map"])],
        ["macro F1", _f(metrics["macro_f1"])],
        ["runtime", metrics.get("runtime", "tf")],
    ]
    rows = [["label", "threshold", "support", "precision", "recall", "F1", "AP", "tp", "fp", "fn", "tn"]]
    for r in metrics["labels"]:
        rows.append(
            [
                r["label"],
                f"{r['threshold']:.3f}",
                str(r["support"]),
                _f(r["precision"]),
                _f(r["recall"]),
                _f(r["f1"]),
                _f(r["average_precision"]),
                str(r["tp"]),
                str(r["fp"]),
                str(r["fn"]),
                str(r["tn"]),
            ]
        )
    return "\n".join([format_table(overall), "", format_table(rows)])


def multilabel_table_html(metrics: dict) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in ("label", "threshold", "support", "precision", "recall", "F1", "AP", "tp", "fp", "fn", "tn")
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (
                r["label"],
                f"{r['threshold']:.3f}",
                r["support"],
                _f(r["precision"]),
                _f(r["recall"]),
                _f(r["f1"]),
                _f(r["average_precision"]),
                r["tp"],
                r["fp"],
                r["fn"],
                r["tn"],
            )
        )
        + "</tr>"
        for r in metrics["labels"]
    )
    return f"<h2>Per label (at each label's threshold)</h2><table><tr>{head}</tr>{body}</table>"


def plot_per_label(metrics: dict, path: Path) -> Path:
    """Precision, recall, F1 (at the thresholds) and AP per label; an undefined value is left out."""
    rows = metrics["labels"]
    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.4 * len(rows) + 1)))
    y = np.arange(len(rows))
    for offset, key in zip((-0.3, -0.1, 0.1, 0.3), ("precision", "recall", "f1", "average_precision")):
        ax.barh(y + offset, [r[key] or 0.0 for r in rows], height=0.2, label=key.replace("_", " "))
    ax.set_yticks(y, [r["label"] for r in rows])
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    ax.set_title("Per label")
    return save_figure(fig, path)


def plot_label_confusion(metrics: dict, path: Path, columns: int = 4) -> Path:
    """One 2x2 per label (rows: true no/yes, columns: predicted no/yes), in counts."""
    rows = metrics["labels"]
    lines = -(-len(rows) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(2.6 * columns, 2.4 * lines), squeeze=False)
    for ax, r in zip(axes.flat, rows):
        counts = np.array([[r["tn"], r["fp"]], [r["fn"], r["tp"]]])
        ax.imshow(counts / max(counts.sum(), 1), cmap="Blues", vmin=0, vmax=1)
        for (t, p), n in np.ndenumerate(counts):
            ax.text(p, t, str(n), ha="center", va="center")
        ax.set_xticks([0, 1], ["no", "yes"])
        ax.set_yticks([0, 1], ["no", "yes"])
        ax.set_title(r["label"], fontsize=9)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    fig.supxlabel("predicted")
    fig.supylabel("true")
    return save_figure(fig, path)
