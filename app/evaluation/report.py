"""metrics.json, figures and a self-contained HTML report (images embedded) for one evaluation."""

from __future__ import annotations

import base64
import html
import mimetypes
from pathlib import Path

from app.evaluation.metrics import accuracy_with_interval
from app.storage import write_json_atomic, write_text_atomic
from app.table import format_table


def summary_table(metrics: dict, worst: int = 5) -> str:
    """Overall figures, then the worst classes by F1: what the CLI prints."""
    if metrics.get("task") == "multi_label":
        from app.evaluation.multilabel_report import multilabel_summary

        return multilabel_summary(metrics)
    confused = [f"  {c['true']} → {c['predicted']}: {c['count']}" for c in metrics["most_confused"][:5]]
    return "\n".join(
        [format_table(_overall_rows(metrics)), "", format_table(_worst_class_rows(metrics, worst))]
        + (["", "most confused:"] + confused if confused else [])
    )


def _overall_rows(metrics: dict) -> list[list[str]]:
    rows = [
        ["metric", "value"],
        ["examples", str(metrics["num_examples"])],
        ["accuracy", accuracy_with_interval(metrics["accuracy"], metrics["num_examples"])],
        *(
            [[f"top-{metrics['top_k']} accuracy", f"{metrics['top_k_accuracy']:.4f}"]]
            if _top_k_says_more(metrics)
            else []
        ),
        ["macro F1", f"{metrics['macro_avg']['f1']:.4f}"],
        ["weighted F1", f"{metrics['weighted_avg']['f1']:.4f}"],
        ["log loss", f"{metrics['log_loss']:.4f}"],
        ["ECE", f"{metrics['ece']:.4f}"],
        ["runtime", metrics.get("runtime", "tf")],
        ["test-time augmentation", metrics.get("tta", "none")],
    ]
    if "without_leaks" in metrics:  # the data's audit found test photos copied in another split
        from app.evaluation.leaks import summary_rows

        rows[3:3] = summary_rows(metrics["without_leaks"])
    if "calibration" in metrics:  # before the export's temperature
        c = metrics["calibration"]
        rows += [
            [f"log loss without T={c['temperature']:.2f}", f"{c['log_loss_uncalibrated']:.4f}"],
            [f"ECE without T={c['temperature']:.2f}", f"{c['ece_uncalibrated']:.4f}"],
        ]
    if "ood" in metrics:  # evaluate --ood: photos of other things against these
        from app.evaluation.ood import ood_summary_rows

        rows += ood_summary_rows(metrics["ood"])
    return rows


def _worst_class_rows(metrics: dict, worst: int) -> list[list[str]]:
    classes = _bad_classes(metrics)[:worst]
    header = ["worst classes" if classes else "worst classes: none (every class perfect)"]
    return [header + ["precision", "recall", "f1", "support"]] + [
        [name, f"{v['precision']:.3f}", f"{v['recall']:.3f}", f"{v['f1']:.3f}", str(v["support"])]
        for name, v in classes
    ]


def _top_k_says_more(metrics: dict) -> bool:
    """Top-k accuracy is 1 by definition where k covers every class."""
    return metrics["top_k"] < len(metrics["per_class"])


def _bad_classes(metrics: dict) -> list[tuple[str, dict]]:
    """Classes with a mistake, worst F1 first: a class at 1.000 is no worst class, nor one the
    photos do not hold and the model never answered."""
    absent = set(metrics.get("classes_absent", []))
    bad = ((n, v) for n, v in metrics["per_class"].items() if v["f1"] < 1.0 and n not in absent)
    return sorted(bad, key=lambda kv: kv[1]["f1"])


def summary_card(metrics: dict) -> str:
    """What a person reads first, in plain words: accuracy with its photos and interval, the share
    answered unknown, and the classes that are actually bad (jargon goes under "details")."""
    if metrics.get("task") == "multi_label":
        return ""
    low, high = metrics.get("accuracy_interval") or (None, None)
    interval = f" (95% interval {100 * low:.1f}–{100 * high:.1f}%)" if low is not None else ""
    lines = [
        f"<p class=headline>{100 * metrics['accuracy']:.1f}% right on {metrics['num_examples']} photos{interval}</p>"
    ]
    if metrics.get("without_leaks"):
        from app.evaluation.leaks import in_words

        lines.append(f"<p>{html.escape(in_words(metrics['without_leaks']))}</p>")
    if metrics.get("ood"):
        known = metrics["ood"]["known"]
        share = known["unknown"] / max(known["count"], 1)
        lines.append(f"<p>{100 * share:.1f}% of these photos were answered “none of these”.</p>")
    bad = _bad_classes(metrics)[:3]
    if bad:
        lines.append(f"<p>Most mistakes: {'; '.join(_mistakes_in_words(n, v) for n, v in bad)}.</p>")
    else:
        lines.append("<p>No class has a mistake.</p>")
    return '<section class="card">' + "".join(lines) + "</section>"


def _mistakes_in_words(name: str, figures: dict) -> str:
    """'triangle: 9 of its 10 photos found, 1 other photo called triangle'."""
    found = round(figures["recall"] * figures["support"])
    called = round(found / figures["precision"]) - found if figures["precision"] > 0 else 0
    words = f"{html.escape(name)}: {found} of its {figures['support']} photos found"
    return words + (f", {called} other photo{'s' * (called != 1)} called {html.escape(name)}" if called else "")


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
        return f'<img alt="{html.escape(p.stem)}" src="data:{mimetypes.guess_type(p.name)[0]};base64,{data}">'

    sections = "".join(f"<h2>{html.escape(name)}</h2>{img(p)}" for name, p in figures.items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em}} img{{max-width:100%;height:auto}}
h1{{font-size:1.4rem;overflow-wrap:anywhere}} .card{{background:#f4f6fb;border-radius:.5em;padding:.2em 1em;margin:0 0 1em}} .headline{{font-size:1.5rem;font-weight:700}}
pre,.table{{overflow-x:auto}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child{{text-align:left;overflow-wrap:break-word}}</style>
</head><body><h1>{html.escape(title)}</h1>
{summary_card(metrics)}
<details><summary>Details: every figure</summary><pre>{html.escape(summary_table(metrics, worst=10))}</pre></details>
<div class="table">{_table_html(metrics)}</div>
{sections}</body></html>"""
    write_text_atomic(path, page)
    return path
