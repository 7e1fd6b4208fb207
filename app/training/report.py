"""What photoclf train prints of its model, and its result table at the end of a run."""

from __future__ import annotations

import keras

from app.evaluation.metrics import accuracy_with_interval
from app.export.parity import parity_lines
from app.table import format_table


def print_model_summary(model: keras.Model) -> None:
    """Keras' table of the layers, as wide as the terminal: where the output is a file or a pipe
    (a log) that is 80 columns, and a wider table would be cut there, its parameter counts lost."""
    model.summary(show_trainable=True)


def majority_warning(val_counts: dict[str, int], val_accuracy: float) -> str | None:
    """Said where the kept weights score no better on val than always answering its most common
    class: the model has learnt nothing usable (a learning rate far too high, labels that do not
    match the photos), however the run otherwise went."""
    total = sum(val_counts.values())
    if not total:
        return None
    common = max(val_counts, key=val_counts.get)
    share = val_counts[common] / total
    if val_accuracy > share + 1e-9:
        return None
    return (
        f"val accuracy {val_accuracy:.4f} is no better than always answering '{common}'"
        f" ({val_counts[common]} of {total} val photos, {share:.4f}): the model has learnt nothing usable;"
        " check that the labels match the photos, and the learning rates (lr_head, lr_finetune; auto finds them)"
    )


def format_result(metrics: dict) -> str:
    multi_label = "thresholds" in metrics  # its "accuracy" is the exact-match ratio: the header says so
    rows = [["", "epochs", "val_exact_match" if multi_label else "val_accuracy", "val_loss", "seconds", "images/s"]]
    for phase in ("phase1", "phase2"):
        r = metrics.get(phase)
        if r:
            rows.append(
                [
                    phase,
                    str(r["epochs"]),
                    f"{r['val_accuracy']:.4f}",
                    f"{r['val_loss']:.4f}",
                    f"{r['seconds']:.0f}",
                    f"{r['images_per_s']:.1f}",
                ]
            )
    test = metrics.get("test")
    if test:  # its log loss is said below: val_loss is the training loss, label smoothing included
        rows.append(["test", "", f"{test['accuracy']:.4f}", "", "", ""])
    lines = ["", format_table(rows), "", f"weights: {metrics['weights']}"]
    if test:
        lines.append(_test_line(test, multi_label))
    if metrics.get("calibration", {}).get("not_fitted"):
        lines.append(f"calibration: temperature 1, {metrics['calibration']['not_fitted']}")
    elif metrics.get("calibration"):
        c = metrics["calibration"]
        lines.append(
            f"calibration: temperature {c['temperature']:.3f};"
            f" val ECE {c['val_ece_before']:.3f} -> {c['val_ece_after']:.3f},"
            f" log loss {c['val_log_loss_before']:.3f} -> {c['val_log_loss_after']:.3f}"
        )
    if metrics.get("ood"):
        o = metrics["ood"]
        lines.append(
            f"none of these: answered unknown above ood_score {o['threshold']:.2f}"
            f" ({100 * o['accept']:.0f}% of val accepted)"
        )
    warnings = [metrics.get("weights_warning"), (metrics.get("init_from") or {}).get("warning"),
                metrics.get("learning_warning"), metrics.get("side_features_warning")]  # fmt: skip
    lines += [f"WARNING: {warning}" for warning in warnings if warning]
    lines.append(f"model: {metrics['export']}" if metrics.get("export") else "model: exported by the chief worker")
    return "\n".join(lines + parity_lines(metrics))


def _test_line(test: dict, multi_label: bool) -> str:
    """The test split's figures as the run measured them; a multi-label run's "accuracy" is its
    exact-match ratio and its loss the labels' mean binary log loss, so the line says so."""
    if multi_label:
        return (
            f"test exact match (every label right): {test['accuracy']:.4f} on {test['count']} photos;"
            f" binary log loss {test['loss']:.3f}; each label's figures and mAP: photoclf evaluate"
        )
    shown = f"{test['accuracy']:.4f}"
    if test.get("accuracy_interval"):
        shown = accuracy_with_interval(test["accuracy"], test["count"])
    return f"test accuracy: {shown}; log loss {test['loss']:.3f}"
