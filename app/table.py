"""Plain-text tables for what the scripts print (dataset summary, training result, evaluation)."""

from __future__ import annotations

import unicodedata


def format_table(rows: list[list[str]]) -> str:
    """First row is the header (underlined); first column left-aligned, the rest right-aligned."""
    widths = [max(display_width(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        cells = [_pad(row[0], widths[0], left=True)] + [_pad(c, w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def display_width(text: str) -> int:
    """Columns a terminal gives `text`: a CJK character takes two, an accent combined with the letter
    before it none (class names are folder names, in any script)."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text
    )


def _pad(text: str, width: int, left: bool = False) -> str:
    fill = " " * (width - display_width(text))
    return text + fill if left else fill + text


def mean_sd(values: list[float]) -> str:
    """'0.912 ± 0.014' over seeds (the value alone for one seed): how benchmarks report spread."""
    import statistics

    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"
