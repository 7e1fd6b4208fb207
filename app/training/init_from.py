"""Start a run from an earlier run's kept weights (`--init-from RUN_DIR`, config `init_from`).

Users grow a dataset rather than start over: with the same classes a run starts where the earlier
one ended; with more classes the old classes' weights in the classification layer (their kernel
columns and biases) are kept and the new ones start fresh; a class the earlier run knew that the
data no longer has is refused before anything is built (its output would be trained towards
nothing, silently).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np

from app.errors import UserError
from app.models.backbones import BackboneSpec
from app.models.classifier import Classifier, build_classifier
from app.run_dir import FinishedRun, RunDir

log = logging.getLogger(__name__)
LOGITS_LAYER = "logits"


@dataclass(frozen=True)
class Start:
    """Where a run started: recorded in its metrics."""

    run: str
    kept_classes: list[str]
    new_classes: list[str]
    seen: dict[str, int] | None = None  # this data's val/test photos the earlier run trained on (None: not known)

    def to_dict(self) -> dict:
        return {"run": self.run, "kept_classes": self.kept_classes, "new_classes": self.new_classes,
                "seen": self.seen, "warning": self.warning}  # fmt: skip

    @property
    def warning(self) -> str | None:
        """Said where the run will be scored on photos the model it starts from trained on."""
        if not self.seen or not any(self.seen.values()):
            return None
        counts = " and ".join(f"{n} {split}" for split, n in self.seen.items() if n)
        return (
            f"{counts} photo(s) of this data were training photos of {self.run}: this run starts from a model"
            " that has seen them, so its figures on them read high. A grown folder converted again with the"
            " same --seed keeps its photos' splits (docs/data.md)"
        )


def seen_in_training(earlier_data: str, data: str) -> dict[str, int] | None:
    """How many of `data`'s val and test photos are, by content, training photos of `earlier_data`
    (None where that data can no longer be read: nothing to compare)."""
    from app.data.keyed import record_table
    from app.data.pipeline import load_dataset_info

    try:
        trained = record_table(earlier_data, "train")["key"]
    except (UserError, OSError) as err:
        log.info("--init-from: the earlier run's data cannot be read (%s); not checked for photos it trained on", err)
        return None
    info = load_dataset_info(data)
    splits = [split for split in ("val", "test") if info.num_examples(split)]
    return {split: int(np.isin(record_table(data, split)["key"], trained).sum()) for split in splits}


def check_start(init_from: str, facts: dict, side_features: list[dict]) -> FinishedRun:
    """The earlier run, or a one-line UserError when this run cannot start from it."""
    flag = f"--init-from {init_from}"
    try:
        earlier = RunDir(Path(init_from)).load(need_weights=True)
    except UserError as err:
        raise UserError(f"--init-from: {err}") from None
    for key in ("backbone", "image_size"):
        if earlier.state.get(key) != facts[key]:
            raise UserError(f"{flag}: that run's {key} is {earlier.state.get(key)!r}, this one's {facts[key]!r}")
    if earlier.multi_label != (facts.get("task") == "multi_label"):
        raise UserError(f"{flag}: one run is multi-label and the other is not")
    if earlier.side_features != (side_features or []):
        raise UserError(f"{flag}: that run's side features differ from this data's")
    gone = [c for c in earlier.classes if c not in facts["classes"]]
    if gone:
        raise UserError(
            f"{flag}: its class(es) {', '.join(repr(c) for c in gone)} are not in this data;"
            " start without --init-from, or put their photos back"
        )
    return earlier


def start_from(clf: Classifier, spec: BackboneSpec, earlier: FinishedRun, classes: list[str], dropout: float) -> Start:
    """Load the earlier run's kept weights into `clf` layer by layer (by name); its classification
    layer's columns go to the same class names, new classes keep their fresh initialisation."""
    old = _earlier_classifier(spec, earlier, dropout)
    old_layers = {layer.name: layer for layer in old.model.layers}
    for layer in clf.model.layers:
        source = old_layers.get(layer.name)
        if source is None or not layer.weights:
            continue
        if layer.name == LOGITS_LAYER:
            _copy_class_columns(layer, source, earlier.classes, classes)
        else:
            layer.set_weights(source.get_weights())
    start = Start(str(earlier.run.root), [c for c in classes if c in earlier.classes],
                  [c for c in classes if c not in earlier.classes])  # fmt: skip
    log.info(
        "starting from %s: %d classes kept, %d new%s",
        start.run,
        len(start.kept_classes),
        len(start.new_classes),
        f" ({', '.join(start.new_classes)})" if start.new_classes else "",
    )
    return start


def _earlier_classifier(spec: BackboneSpec, earlier: FinishedRun, dropout: float) -> Classifier:
    from app.models.pretrained import load_backbone

    backbone, _ = load_backbone(spec, earlier.image_size, "auto" if spec.hub_handle else "none")
    old = build_classifier(spec, backbone, len(earlier.classes), earlier.image_size, dropout,
                           earlier.side_features, earlier.multi_label)  # fmt: skip
    old.model.load_weights(str(earlier.run.final_weights))
    return old


def _copy_class_columns(layer: keras.layers.Layer, source: keras.layers.Layer, old: list[str], new: list[str]) -> None:
    kernel, bias = (w.copy() for w in layer.get_weights())
    old_kernel, old_bias = source.get_weights()
    for j, name in enumerate(new):
        if name in old:
            kernel[:, j], bias[j] = old_kernel[:, old.index(name)], old_bias[old.index(name)]
    if len(new) > len(old):  # a new class's fresh bias of 0 would start it far below the trained ones
        bias[[j for j, name in enumerate(new) if name not in old]] = float(np.mean(old_bias))
    layer.set_weights([kernel, bias])
