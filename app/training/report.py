"""The result table fine_tune.py prints at the end of a run."""

from __future__ import annotations

from app.table import format_table


def format_result(metrics: dict) -> str:
    rows = [["", "epochs", "val_accuracy", "val_loss", "seconds", "images/s"]]
    for phase in ("phase1", "phase2"):
        r = metrics.get(phase)
        if r:
            rows.append([phase, str(r["epochs"]), f"{r['val_accuracy']:.4f}", f"{r['val_loss']:.4f}",
                         f"{r['seconds']:.0f}", f"{r['images_per_s']:.1f}"])
    if metrics.get("test"):
        t = metrics["test"]
        rows.append(["test", "", f"{t['accuracy']:.4f}", f"{t['loss']:.4f}", "", ""])
    lines = ["", format_table(rows), "", f"weights: {metrics['weights']}"]
    if metrics.get("calibration"):
        c = metrics["calibration"]
        lines.append(f"calibration: temperature {c['temperature']:.3f}; val ECE {c['val_ece_before']:.3f} -> {c['val_ece_after']:.3f},"
                     f" log loss {c['val_log_loss_before']:.3f} -> {c['val_log_loss_after']:.3f}")
    if metrics.get("weights_warning"):
        lines.append(f"WARNING: {metrics['weights_warning']}")
    lines.append(f"model: {metrics['export']}" if metrics.get("export") else "model: exported by the chief worker")
    return "\n".join(lines)
