"""A model card beside every export: `MODEL_CARD.md` for people, `model_card.json` for tools.

Everything in it is read from what the run and the export measured or recorded (the export's
metadata, the run's config, the dataset's dataset.json while it is the one trained on), never
written by hand: the classes and their photos per split, where the photos came from
(dataset.json's SHA-256 as trained on), the backbone and its weights file (with the file's
SHA-256 as exported), the training settings, the test figures (overall and per class), the
calibration, the "none of these" threshold with the share of val photos it accepts, and each
runtime file's parity check. What was not measured is said to be missing, not filled in.
"""

from __future__ import annotations

from pathlib import Path

from app import storage
from app.data.pipeline import dataset_fingerprint, load_dataset_info
from app.errors import UserError
from app.export import layout
from app.export.parity import too_few

# The backbone and the input size it ran at are the card's backbone line (the config's image_size
# may be 0, "the backbone's default"); these are the other settings a reader compares runs by.
SETTINGS = ("epochs_head", "epochs_finetune", "lr_head", "lr_finetune", "unfreeze", "batch_size", "augment",
            "label_smoothing", "seed", "forward_runtime")  # fmt: skip


def card(metadata: dict, config: dict) -> dict:
    """The card's facts, from the export's `metadata` and the run's `config`."""
    trained_on = metadata.get("dataset_fingerprint")
    counts, missing = _counts(config.get("data", ""), trained_on)
    return {
        "classes": _classes(metadata["classes"], counts),
        "data": {"dataset_json_sha256": trained_on, "folder": config.get("data") or None, "counts_missing": missing},
        "backbone": {"name": metadata["backbone"], "input_size": metadata["input_size"],
                     "weights": metadata.get("weights"), "weights_sha256": _weights_digest(metadata.get("weights"))},
        "training": _settings(config, metadata.get("training_metrics") or {}),
        "test": (metadata.get("training_metrics") or {}).get("test"),
        "learning_warning": (metadata.get("training_metrics") or {}).get("learning_warning"),
        "side_features_warning": (metadata.get("training_metrics") or {}).get("side_features_warning"),
        "calibration": metadata.get("calibration"),
        "none_of_these": _none_of_these(metadata.get("ood")),
        "thresholds": dict(zip(metadata["classes"], metadata["thresholds"])) if metadata.get("thresholds") else None,
        "runtimes": {key: metadata.get(key) for key in ("litert", "openvino", "onnx")},
        "created": metadata.get("created"),
        "package_version": metadata.get("package_version"),
    }  # fmt: skip


def _settings(config: dict, metrics: dict) -> dict:
    """The config's training settings, with the batch size the run trained with (a train split
    smaller than the configured batch is one batch)."""
    settings = {key: config[key] for key in SETTINGS if key in config}
    return settings | ({"batch_size": metrics["batch_size"]} if metrics.get("batch_size") else {})  # older runs: None


def _counts(data: str, trained_on: str | None) -> tuple[dict, str | None]:
    """Photos per split and class from the data folder's dataset.json, and why not where they
    cannot be read or the file is no longer the one the run trained on."""
    try:
        if not data:
            return {}, "the run names no data folder"
        counts = load_dataset_info(data).counts
        if trained_on and trained_on != "unknown" and dataset_fingerprint(data) != trained_on:
            return {}, f"{data} holds another dataset.json than the one the run trained on"
        return counts, None
    except (UserError, OSError, KeyError) as err:
        return {}, str(err)


def _classes(classes: list[str], counts: dict) -> list[dict]:
    """Each class with its photos per split."""
    return [{"name": c, **{split: counts[split].get(c) for split in ("train", "val", "test") if split in counts}}
            for c in classes]  # fmt: skip


def _weights_digest(weights: str | None) -> str | None:
    """The SHA-256 of the weights file as it is now, when `weights` names one."""
    path = Path(str(weights or "").split(" (from ")[0])
    return layout.sha256_of(path) if weights and path.is_file() else None


def _none_of_these(ood: dict | None) -> dict | None:
    if not ood:
        return None
    return {key: ood.get(key) for key in ("method", "threshold", "accept", "fitted_on")}


def markdown(facts: dict, name: str) -> str:
    """The card as a page: each section from `facts`, a figure only where it was measured."""
    lines = [f"# Model card: {name}", "", f"Created {facts['created']} by photoclf {facts['package_version']}.", ""]
    lines += _section_data(facts) + _section_backbone(facts) + _section_results(facts) + _section_runtimes(facts)
    warned = [f"- **{facts[key]}**" for key in ("learning_warning", "side_features_warning") if facts.get(key)]
    lines += ["## Known limits", "", *warned,
              "- Measured on this dataset's own val and test photos only; photos unlike them (other cameras,"
              " places, classes) may score lower."]  # fmt: skip
    if facts["none_of_these"]:
        lines.append("- \"None of these\" is fitted without any photo of another class; its acceptance is measured"
                     " on val photos of the known classes only.")  # fmt: skip
    return "\n".join([*lines, ""])


def _section_data(facts: dict) -> list[str]:
    splits = [s for s in ("train", "val", "test") if any(s in c for c in facts["classes"])]
    rows = [f"| {_cell(c['name'])} | " + " | ".join(str(c.get(s, "")) for s in splits) + " |" for c in facts["classes"]]
    data = facts["data"]
    lines = ["## Data", "", f"dataset.json SHA-256: `{data['dataset_json_sha256']}`", ""]
    if data.get("counts_missing"):
        classes = ", ".join(_cell(c["name"]) for c in facts["classes"])
        return [*lines, f"Classes: {classes}.", "", f"Photos per class: not read ({data['counts_missing']}).", ""]
    return [*lines,
            f"| {'label (photos with it)' if facts.get('thresholds') else 'class'} | " + " | ".join(splits) + " |",
            "| --- |" + " ---: |" * len(splits), *rows, ""]  # fmt: skip


def _cell(name: str) -> str:
    """A class name in a table cell: a folder may be named "cats|dogs", and its '|' split the row."""
    return name.replace("|", "\\|")


def _section_backbone(facts: dict) -> list[str]:
    b, settings = facts["backbone"], facts["training"]
    digest = f" (SHA-256 `{b['weights_sha256']}`)" if b["weights_sha256"] else ""
    return ["## Backbone and training", "", f"- backbone: {b['name']} at {b['input_size']} px",
            f"- weights: {layout.weights_for_readers(b['weights'])}{digest}",
            *(f"- {key}: {value}" for key, value in settings.items()), ""]  # fmt: skip


def _section_results(facts: dict) -> list[str]:
    lines = ["## Results", ""]
    test = facts["test"]
    if facts.get("thresholds"):  # a multi-label run: its accuracy is the exact-match ratio
        return [*lines, *_multi_label_results(test, facts["thresholds"]), ""]
    if test and "accuracy" in test:
        low, high = test.get("accuracy_interval") or (None, None)
        interval = f" (95% interval {low:.3f}-{high:.3f})" if low is not None else ""
        lines.append(f"- test accuracy: {test['accuracy']:.4f} on {test['count']} photos{interval}")
    else:
        lines.append("- test accuracy: not measured (no test split)")
    lines += _per_class_rows((test or {}).get("per_class"))
    c = facts["calibration"]
    if c and "temperature" in c:
        lines.append(f"- calibration: temperature {c['temperature']}, fitted on {c['fitted_on']}; val ECE "
                     f"{c['val_ece_before']:.4f} before, {c['val_ece_after']:.4f} after")  # fmt: skip
    o = facts["none_of_these"]
    if o:
        lines.append(f"- \"none of these\": {o['method']}, threshold {o['threshold']:.4f}, set to accept "
                     f"{o['accept']:.0%} of val photos; fitted on {o['fitted_on']}")  # fmt: skip
    return [*lines, ""]


def _multi_label_results(test: dict | None, thresholds: dict[str, float]) -> list[str]:
    lines = ["- test exact match (every label right): not measured (no test split)"]
    if test and "accuracy" in test:
        lines = [f"- test exact match (every label right): {test['accuracy']:.4f} on {test['count']} photos"]
    said = ", ".join(f"{_cell(name)} {value:.3f}" for name, value in thresholds.items())
    return [*lines, f"- decision thresholds (each label's best F1 on val): {said}"]


def _per_class_rows(scores: dict | None) -> list[str]:
    """The test split's figures per class, where the run recorded them."""
    if not scores:
        return []
    rows = [f"| {_cell(name)} | {c['precision']:.3f} | {c['recall']:.3f} | {c['f1']:.3f} | {c['support']} |"
            for name, c in scores.items()]  # fmt: skip
    return ["", "| class (test) | precision | recall | F1 | photos |", "| --- | ---: | ---: | ---: | ---: |", *rows, ""]


def _section_runtimes(facts: dict) -> list[str]:
    agreement = "exact-match agreement (at 0.5)" if facts.get("thresholds") else "top-1 agreement"
    lines = ["## Runtimes beside the SavedModel", "", f"| file | precision | checked on | {agreement} | passed |",
             "| --- | --- | ---: | ---: | --- |"]  # fmt: skip
    for runtime, checks in facts["runtimes"].items():
        for precision, check in (checks or {}).items():
            if isinstance(check, dict) and "passed" in check:
                agreement = f"{check['top1_agreement']:.4f}" if "top1_agreement" in check else "-"
                passed = (
                    "yes" if check["passed"] else "no: " + (check.get("missing") or too_few(check) or "below the bar")
                )
                lines.append(
                    f"| {runtime} | {precision} | {check.get('images', '-')} val photos | {agreement} | {passed} |"
                )
    return [*lines, ""]


def write_model_card(version: Path, metadata: dict, config: dict, name: str) -> None:
    """Both files into the (staged) version folder."""
    facts = card(metadata, config)
    storage.write_json_atomic(layout.model_card_path(version, "json"), facts)
    storage.write_text_atomic(layout.model_card_path(version, "md"), markdown(facts, name))
