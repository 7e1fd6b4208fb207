"""The classifier: 0..255 RGB → normalise → backbone → pool → dropout → logits → softmax.

Layer names are stable ("normalize", "backbone", "pool", "dropout", "logits",
"probabilities") so checkpoints, tests and exports can find them. Logits and softmax stay
float32 under mixed precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import keras

from app.errors import UserError
from app.models.backbones import BackboneSpec, blocks


@dataclass
class Classifier:
    model: keras.Model  # images → probabilities: what is evaluated and exported
    logits_model: keras.Model  # images → logits: what is trained (stable loss from logits)
    head_model: keras.Model  # pooled features → logits: phase 1 on cached features
    features_model: keras.Model  # images → pooled features (frozen backbone)
    backbone: keras.Model
    spec: BackboneSpec


def build_classifier(spec: BackboneSpec, backbone: keras.Model, num_classes: int, image_size: int, dropout: float) -> Classifier:
    backbone = keras.Model(backbone.input, backbone.output, name="backbone")
    backbone.trainable = False
    images = keras.Input((image_size, image_size, 3), name="image")
    x = spec.normalization_layer()(images)
    # training=False: BatchNorm always uses its pretrained statistics, in both phases.
    x = backbone(x, training=False)
    # Feature-vector backbones (TF-Hub) are already pooled.
    pool = keras.layers.GlobalAveragePooling2D(name="pool") if len(x.shape) == 4 else keras.layers.Identity(name="pool")
    features = pool(x)
    dropout_layer = keras.layers.Dropout(dropout, name="dropout")
    logits_layer = keras.layers.Dense(num_classes, name="logits", dtype="float32")
    logits = logits_layer(dropout_layer(features))
    probabilities = keras.layers.Softmax(name="probabilities", dtype="float32")(logits)
    feature_input = keras.Input((features.shape[-1],), name="features")
    return Classifier(
        model=keras.Model(images, probabilities, name=f"{spec.model_name}_classifier"),
        logits_model=keras.Model(images, logits, name=f"{spec.model_name}_logits"),
        head_model=keras.Model(feature_input, logits_layer(dropout_layer(feature_input)), name="head"),
        features_model=keras.Model(images, features, name="features"),
        backbone=backbone,
        spec=spec,
    )


def with_temperature(logits_model: keras.Model, temperature: float) -> keras.Model:
    """images → softmax(logits / T): the calibrated classifier that is exported and served.
    Shares every layer (and weight) with `logits_model`; the temperature is a constant."""
    scaled = keras.layers.Rescaling(1.0 / temperature, name="temperature", dtype="float32")(logits_model.output)
    probabilities = keras.layers.Softmax(name="probabilities", dtype="float32")(scaled)
    return keras.Model(logits_model.input, probabilities, name=logits_model.name.replace("_logits", "_classifier"))


def served_model(clf: Classifier, calibration: dict | None) -> keras.Model:
    """What is exported: the classifier, with the run's fitted temperature when it has one."""
    return with_temperature(clf.logits_model, calibration["temperature"]) if calibration else clf.model


def unfreeze_start(clf: Classifier, rule: str) -> int:
    """Index of the first backbone layer to train in phase 2, from blocks:N, fraction:F, layer:NAME."""
    kind, _, value = rule.partition(":")
    layers = clf.backbone.layers
    found = blocks(clf.backbone, clf.spec)
    try:
        if kind == "layer":
            names = [layer.name for layer in layers]
            if value not in names:
                raise UserError(f"unfreeze: no layer '{value}' in {clf.spec.name} (e.g. {', '.join(names[-5:])})")
            return names.index(value)
        count = int(value) if kind == "blocks" else math.ceil(float(value) * len(found))
    except ValueError:
        raise UserError(f"unfreeze: bad value '{rule}' (expected blocks:N, fraction:F or layer:NAME)") from None
    if clf.spec.hub_handle:
        count = min(count, 1)  # a SavedModel is one opaque block: any non-zero rule trains all of it
    if kind == "fraction" and not 0.0 <= float(value) <= 1.0:
        raise UserError(f"unfreeze: fraction must be in [0, 1], got {value}")
    if count < 0 or count > len(found):
        raise UserError(f"unfreeze: {clf.spec.name} has {len(found)} blocks, asked for {count}")
    return len(layers) if count == 0 else found[-count][1]


def freeze_backbone(clf: Classifier) -> None:
    """Phase 1: only the head trains."""
    clf.backbone.trainable = False


def unfreeze_top(clf: Classifier, rule: str) -> list[str]:
    """Phase 2: train backbone layers from `unfreeze_start` up; BatchNorm stays frozen. Returns their names."""
    start = unfreeze_start(clf, rule)
    clf.backbone.trainable = True
    trained = []
    for index, layer in enumerate(clf.backbone.layers):
        layer.trainable = index >= start and not isinstance(layer, keras.layers.BatchNormalization)
        if layer.trainable and layer.weights:
            trained.append(layer.name)
    return trained
