"""metrics.json, figures and a self-contained HTML report (images embedded) for one evaluation."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from app.evaluation.metrics import accuracy_with_interval
from app.storage import write_json_atomic, write_text_atomic
from app.table import format_table


def summary_table(metrics: dict, worst: int = 5) -> str:
    """Overall figures, then the worst classes by F1: what the CLI prints."""
    if metrics.get("task") == "multi_label":
        from app.evaluation.multilabel_report import multilabel_summary

        return multilabel_summary(metrics)
    overall = [
        ["metric", "value"],
        ["examples", str(metrics["num_examples"])],
        ["accuracy", accuracy_with_interval(metrics["accuracy"], metrics["num_examples"])],
        [f"top-{metrics['top_k']} accuracy", f"{metrics['top_k_accuracy']:.4f}"],
        ["macro F1", f"{metrics['macro_avg']['f1']:.4f}"],
        ["weighted F1", f"{metrics['weighted_avg']['f1']:.4f}"],
        ["log loss", f"{metrics['log_loss']:.4f}"],
        ["ECE", f"{metrics['ece']:.4f}"],
        ["runtime", metrics.get("runtime", "tf")],
        ["test-time augmentation", metrics.get("tta", "none")],
    ]
    if "calibration" in metrics:  # before the export's temperature
        c = metrics["calibration"]
        overall += [
            [f"log loss without T={c['temperature']:.2f}", f"{c['log_loss_uncalibrated']:.4f}"],
            [f"ECE without T={c['temperature']:.2f}", f"{c['ece_uncalibrated']:.4f}"],
        ]
    if "ood" in metrics:  # evaluate --ood: photos of other things against these
        from app.evaluation.ood import ood_summary_rows

        overall += ood_summary_rows(metrics["ood"])
    classes = sorted(metrics["per_class"].items(), key=lambda kv: kv[1]["f1"])[:worst]
    rows = [["worst classes", "precision", "recall", "f1", "support"]] + [
        [name, f"{v['precision']:.3f}", f"{v['recall']:.3f}", f"{v['f1']:.3f}", str(v["support"])]
        for name, v in classes
    ]
    confused = [f"  {c['true']} → {c['predicted']}: {c['count']}" for c in metrics["most_confused"][:5]]
    return "\n".join(
        [format_table(overall), "", format_table(rows)] + (["", "most confused:"] + confused if confused else [])
    )


def write_metrics(metrics: dict, path: Path) -> Path:
    write_json_atomic(path, metrics)
    return path


def _table_html(metrics: dict) -> str:
    if metrics.get("task") == "multi_label":
        from app.evaluation.multilabel_report import multilabel_table_html

        return multilabel_table_html(metrics)
    rows = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{v['precision']:.3f}</td><td>{v['recall']:.3f}</td><td>{v['f1']:.3f}</td><td>{v['support']}</td></tr>"
        for n, v in sorted(metrics["per_class"].items(), key=lambda kv: kv[1]["f1"])
    )
    return (
        "<h2>Per class (worst F1 first)</h2><table><tr><th>class</th><th>precision</th><th>recall</th><th>F1</th>"
        f"<th>support</th></tr>{rows}</table>"
    )


def write_html(metrics: dict, figures: dict[str, Path], path: Path, title: str) -> Path:
    """One file, images inlined as data URIs, so it opens anywhere (mail it, attach it)."""

    def img(p: Path) -> str:
        data = base64.b64encode(p.read_bytes()).decode()
        return f'<img alt="{html.escape(p.stem)}" src="data:image/png;base64,{data}">'

    sections = "".join(f"<h2>{html.escape(name)}</h2>{img(p)}" for name, p in figures.items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}} img{{max-width:100%}}
table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child{{text-align:left}}</style>
</head><body><h1>{html.escape(title)}</h1>
<pre>{html.escape(summary_table(metrics, worst=10))}</pre>
{_table_html(metrics)}
{sections}</body></html>"""
    write_text_atomic(path, page)
    return path
