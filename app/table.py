"""Plain-text tables for what the scripts print (dataset summary, training result, evaluation)."""

from __future__ import annotations


def format_table(rows: list[list[str]]) -> str:
    """First row is the header (underlined); first column left-aligned, the rest right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def mean_sd(values: list[float]) -> str:
    """'0.912 ± 0.014' over seeds (the value alone for one seed): how benchmarks report spread."""
    import statistics

    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"
