"""What the audit writes: audit.json (every finding), report.html (one self-contained page with
thumbnails inlined), a one-screen terminal summary, and the review manifest (CSV)."""

from __future__ import annotations

import csv
import html
from pathlib import Path

from app import storage
from app.audit.items import AuditItem
from app.data.audit_files import HTML_FILE, JSON_FILE
from app.table import format_table

SHOWN = 60  # items per section in the HTML page and its grids


def write_reports(result: dict, report_dir: Path) -> tuple[Path, Path]:
    findings = {k: v for k, v in result.items() if k != "thumbnails"}
    storage.write_json_atomic(report_dir / JSON_FILE, findings)
    with storage.atomic_path(report_dir / HTML_FILE) as tmp:
        Path(tmp).write_text(_html(result), encoding="utf-8", errors="backslashreplace")  # a name not UTF-8: \udcff
    return report_dir / JSON_FILE, report_dir / HTML_FILE


NOT_LOOKED_FOR = "not looked for (no pretrained features)"


def summary(result: dict) -> str:
    """One screen: counts per class and split, then how many of each finding."""
    splits = sorted(result["counts"])
    rows = [[c, *[str(result["counts"][s].get(c, 0)) for s in splits]] for c in result["classes"]]
    leaked = result["leaked_eval_images"]
    skipped = result.get("not_looked_for")
    near = f"{len(result['near_duplicates'])} pairs (cosine >= {result['near_duplicate_threshold']})"
    lines = [f"WARNING: {skipped}", ""] if skipped else []
    lines += [
        format_table([["class", *splits], *rows]),
        "",
        f"{result['readable']} of {result['images']} files read; {len(result['unreadable'])} unreadable",
        f"leaks across splits:   {len(result['leaks'])} pairs"
        f" ({leaked['val']} val and {leaked['test']} test images have a copy elsewhere)",
        f"exact duplicates:      {len(result['exact_duplicates'])} pairs",
        f"near duplicates:       {NOT_LOOKED_FOR if skipped else near}",
        f"likely wrong labels:   {NOT_LOOKED_FOR if skipped else len(result['likely_mislabels'])}",
        f"outliers:              {len(result['outliers'])}" + (" (pixel checks only)" if skipped else ""),
    ]
    if result["weights_warning"] and not skipped:
        lines.append(f"WARNING: {result['weights_warning']}")
    return "\n".join(lines)


def _thumb(result: dict, image: dict, caption: str) -> str:
    src = result["thumbnails"].get(image["path"], "")
    return (
        f'<figure><img src="{src}" alt=""><figcaption>{html.escape(image["path"])}<br>'
        f"{html.escape(image['split'])} · {html.escape(image['label'])}{caption}</figcaption></figure>"
    )


def _pair_rows(result: dict, pairs: list[dict]) -> str:
    return "".join(
        f'<div class="pair">{_thumb(result, p["a"], "")}{_thumb(result, p["b"], "")}'
        f"<p>{p['kind']}, similarity {p['similarity']:.3f}</p></div>"
        for p in pairs[:SHOWN]
    )


def _section(title: str, count: int, body: str) -> str:
    note = f" (first {SHOWN} shown; all in {JSON_FILE})" if count > SHOWN else ""
    return f"<h2>{html.escape(title)}: {count}{note}</h2>{body or '<p>none</p>'}"


def _html(result: dict) -> str:
    mislabels = "".join(
        _thumb(
            result,
            m,
            f"<br>suggested <b>{html.escape(m['suggested'])}</b> "
            f"({m['confidence_in_suggested']:.2f}; label {m['confidence_in_label']:.2f})",
        )
        for m in result["likely_mislabels"][:SHOWN]
    )
    outliers = "".join(
        _thumb(result, o, "<br>" + html.escape("; ".join(o["reasons"]))) for o in result["outliers"][:SHOWN]
    )
    unreadable = "".join(f"<li>{html.escape(u['path'])}: {html.escape(u['reason'])}</li>" for u in result["unreadable"])
    counts = html.escape(summary({**result, "weights_warning": None, "not_looked_for": None}))
    headline = f'<p class="warning">{html.escape(result["not_looked_for"])}</p>' if result.get("not_looked_for") else ""
    return f"""<!doctype html><html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Dataset audit: {html.escape(result["data"])}</title>
<style>body{{font-family:sans-serif;margin:1em auto;max-width:72rem;padding:0 1em}} pre{{overflow-x:auto}} .warning{{background:#fff3e0;border-left:4px solid #e65100;padding:.6em .8em;font-weight:600}} figure{{display:inline-block;margin:4px;width:150px;vertical-align:top;font-size:11px;word-break:break-all}}
img{{max-width:140px;max-height:140px}} .pair{{border-bottom:1px solid #ddd;padding:4px}} .pair p{{display:inline-block;vertical-align:top}}</style></head>
<body><h1>Dataset audit</h1>{headline}<p>{html.escape(result["data"])}; embeddings: {html.escape(result["weights"])}</p><pre>{counts}</pre>
{_section("Leaks across splits", len(result["leaks"]), _pair_rows(result, result["leaks"]))}
{_section("Exact duplicates", len(result["exact_duplicates"]), _pair_rows(result, result["exact_duplicates"]))}
{_section("Near duplicates", len(result["near_duplicates"]), _pair_rows(result, result["near_duplicates"]))}
{_section("Likely wrong labels", len(result["likely_mislabels"]), mislabels)}
{_section("Outliers", len(result["outliers"]), outliers)}
{_section("Unreadable files", len(result["unreadable"]), f"<ul>{unreadable}</ul>" if unreadable else "")}
</body></html>"""


def write_manifest(result: dict, items: list[AuditItem], path: Path) -> Path:
    """A CSV that `photoclf convert` accepts: path,label,split, then `finding` and
    `suggested_label` for review (an unreadable file's row says why), and `keep`: true, except
    the val/test copy of every leak and the second image of every other exact duplicate pair.
    Edit labels or `keep`, then convert."""
    notes: dict[str, list[str]] = {}
    for kind, pairs in (
        ("leak", result["leaks"]),
        ("exact duplicate", result["exact_duplicates"]),
        ("near duplicate", result["near_duplicates"]),
    ):
        for p in pairs:
            notes.setdefault(p["b"]["path"], []).append(f"{kind} of {p['a']['path']}")
    for m in result["likely_mislabels"]:
        notes.setdefault(m["path"], []).append(f"likely {m['suggested']} ({m['confidence_in_suggested']:.2f})")
    for o in result["outliers"]:
        notes.setdefault(o["path"], []).append("outlier: " + "; ".join(o["reasons"]))
    for u in result["unreadable"]:  # convert will skip it too: the row says why before it does
        notes.setdefault(u["path"], []).append(f"unreadable: {u['reason']}")
    suggested = {m["path"]: m["suggested"] for m in result["likely_mislabels"]}
    leaks = {_eval_side(p) for p in result["leaks"]}
    drop = leaks | {p["b"]["path"] for p in result["exact_duplicates"] if p["a"]["split"] == p["b"]["split"]}
    with storage.atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "split", "finding", "suggested_label", "keep"])
        for item in items:
            writer.writerow(
                [
                    _relative(Path(item.source), path.parent),
                    item.label,
                    item.split,
                    " | ".join(notes.get(item.name, [])),
                    suggested.get(item.name, ""),
                    "false" if item.name in drop else "true",
                ]
            )
    return path


def _eval_side(pair: dict) -> str:
    """The copy to drop from a leak: the one in val/test, so evaluation is clean."""
    return pair["b"]["path"] if pair["b"]["split"] != "train" else pair["a"]["path"]


def _relative(path: Path, folder: Path) -> str:
    try:
        return str(path.resolve().relative_to(folder.resolve()))
    except ValueError:
        return str(path.resolve())
