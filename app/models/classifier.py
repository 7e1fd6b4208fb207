"""The classifier: 0..255 RGB → normalise → backbone → pool → dropout → logits → softmax (or,
multi-label, one sigmoid per label).

With side features (app/data/side_features.py) the model takes {"image", "side"}: the side
vector is encoded (standardised numbers, one-hot categories: "side_encoding") and reaches the
head twice, concatenated ("fuse") with the pooled image features before the dropout: through
a small MLP ("side_dense"), and directly ("side_wide", wide and deep), scaled by the number of
image features D. Adam moves every weight by about the learning rate per step, so D image
features move the logits about D times as fast as one unscaled column: behind the MLP alone, a
threshold on one column lagged while the head fitted the training photos' labels from image
features instead (benchmarks/README.md, "Side features", has the measurements).

Layer names are stable ("normalize", "backbone", "pool", "dropout", "logits",
"probabilities") so checkpoints, tests and exports can find them. Logits and softmax stay
float32 under mixed precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import keras
from keras import ops

from app.data.side_features import input_width
from app.errors import UserError
from app.models.backbones import BackboneSpec, blocks
from app.models.layers import OutOfDistributionScore, SideFeatureEncoding
from app.models.ood import ShippedScore

SIDE_UNITS = 32  # the side branch's width: a handful of columns needs no more


@dataclass
class Classifier:
    model: keras.Model  # inputs → probabilities: what is evaluated and exported
    logits_model: keras.Model  # inputs → logits: what is trained (stable loss from logits)
    head_model: keras.Model  # pooled features (+ side) → logits: phase 1 on cached features
    features_model: keras.Model  # images → pooled features (frozen backbone)
    backbone: keras.Model
    spec: BackboneSpec
    side_features: list[dict] | None = None  # the dataset's side-feature columns, when it has them


def _side_branch(side_features: list[dict]) -> tuple[keras.layers.Layer, ...]:
    return (
        SideFeatureEncoding(side_features, name="side_encoding"),
        keras.layers.Dense(SIDE_UNITS, activation="relu", name="side_dense"),
        keras.layers.Concatenate(name="fuse"),
    )


def build_classifier(
    spec: BackboneSpec,
    backbone: keras.Model,
    num_classes: int,
    image_size: int,
    dropout: float,
    side_features: list[dict] | None = None,
    multi_label: bool = False,
) -> Classifier:
    """The models of one classifier, sharing every layer; `side_features` adds the side branch;
    `multi_label` gives one sigmoid per label instead of a softmax over classes."""
    backbone = keras.Model(backbone.input, backbone.output, name="backbone")
    backbone.trainable = False
    images = keras.Input((image_size, image_size, 3), name="image")
    x = spec.normalization_layer()(images)
    # training=False: BatchNorm always uses its pretrained statistics, in both phases.
    x = backbone(x, training=False)
    # Feature-vector backbones (TF-Hub) are already pooled.
    pool = keras.layers.GlobalAveragePooling2D(name="pool") if len(x.shape) == 4 else keras.layers.Identity(name="pool")
    features = pooled = pool(x)
    dropout_layer = keras.layers.Dropout(dropout, name="dropout")
    logits_layer = keras.layers.Dense(num_classes, name="logits", dtype="float32")
    feature_input = keras.Input((pooled.shape[-1],), name="features")
    inputs, head_inputs, head_features = images, feature_input, feature_input
    if side_features:
        encode, dense, fuse = _side_branch(side_features)
        side, head_side = (keras.Input((len(side_features),), name="side") for _ in range(2))
        inputs, head_inputs = {"image": images, "side": side}, {"features": feature_input, "side": head_side}
        wide = keras.layers.Rescaling(float(pooled.shape[-1]), name="side_wide")
        encoded, head_encoded = encode(side), encode(head_side)
        features = fuse([features, dense(encoded), wide(encoded)])
        head_features = fuse([feature_input, dense(head_encoded), wide(head_encoded)])
    logits = logits_layer(dropout_layer(features))
    if side_features:
        _start_wide_columns_at_zero(logits_layer, input_width(side_features))
    probabilities = (
        keras.layers.Activation("sigmoid", name="probabilities", dtype="float32")
        if multi_label
        else keras.layers.Softmax(name="probabilities", dtype="float32")
    )(logits)
    return Classifier(
        model=keras.Model(inputs, probabilities, name=f"{spec.model_name}_classifier"),
        logits_model=keras.Model(inputs, logits, name=f"{spec.model_name}_logits"),
        head_model=keras.Model(head_inputs, logits_layer(dropout_layer(head_features)), name="head"),
        features_model=keras.Model(images, pooled, name="features"),
        backbone=backbone,
        spec=spec,
        side_features=side_features or None,
    )


def _start_wide_columns_at_zero(logits_layer: keras.layers.Dense, width: int) -> None:
    """The logits' weights on the side features' wide columns (the kernel's last `width` rows)
    start at zero, not random: those columns are scaled by D, so a random start put logits D
    times a random weight on every photo, and a small run's head never recovered from them (its
    confidences wrong, its accuracy near chance). From zero they move D times as fast, as meant."""
    kernel = logits_layer.kernel
    kernel.assign(ops.concatenate([kernel[:-width], ops.zeros((width, kernel.shape[1]), kernel.dtype)], axis=0))


def with_temperature(logits_model: keras.Model, temperature: float) -> keras.Model:
    """images → softmax(logits / T): the calibrated classifier that is exported and served.
    Shares every layer (and weight) with `logits_model`; the temperature is a constant."""
    scaled = keras.layers.Rescaling(1.0 / temperature, name="temperature", dtype="float32")(logits_model.output)
    probabilities = keras.layers.Softmax(name="probabilities", dtype="float32")(scaled)
    return keras.Model(logits_model.input, probabilities, name=logits_model.name.replace("_logits", "_classifier"))


def served_model(clf: Classifier, calibration: dict | None, ood_score: ShippedScore | None = None) -> keras.Model:
    """What is exported: the classifier, with the run's fitted temperature when it has one; with
    the run's out-of-distribution statistics it returns {"probabilities", "ood_score"}."""
    model = with_temperature(clf.logits_model, calibration["temperature"]) if calibration else clf.model
    if ood_score is None:
        return model
    inputs = [model.output, clf.features_model.output, clf.logits_model.output]
    score = OutOfDistributionScore(ood_score, name="ood_score")(inputs)
    return keras.Model(model.input, {"probabilities": model.output, "ood_score": score}, name=model.name)


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


@dataclass(frozen=True)
class FrozenCut:
    """The classifier cut where phase 2's trained layers begin. Nothing below the cut trains and
    BatchNorm runs on its pretrained statistics, so `lower` maps an image to the same activation
    in every epoch of phase 2; `tail` is the rest of the classifier, from that activation on."""

    lower: keras.Model  # images 0..255 → the activation entering the first trained layer
    upper: keras.Model  # that activation → pooled features (what `features_model` gives)
    tail: keras.Model  # that activation (with side features: {"activations", "side"}) → logits
    layer: str  # the backbone layer whose output is the activation, for the log


def cut_at_trained(clf: Classifier, start: int) -> FrozenCut | None:
    """`lower` and `tail` sharing every layer and weight with `clf`, or None where no single
    tensor separates the frozen layers from the trained ones (a frozen layer also feeds one
    above the first trained layer), or where the cut would be the backbone's input."""
    found = _cut(clf.backbone, start)
    if found is None:
        return None
    name, cut = found
    normalize, pool = clf.logits_model.get_layer("normalize"), clf.logits_model.get_layer("pool")
    images = keras.Input(normalize.input.shape[1:], name="image")
    below = keras.Model(clf.backbone.input, cut, name="backbone_below")
    lower = keras.Model(images, below(normalize(images), training=False), name="lower")
    above = keras.Model(cut, clf.backbone.output, name="backbone_above")  # Keras rebuilds the graph from the cut
    activations = keras.Input(cut.shape[1:], name="activations")
    upper = keras.Model(activations, pool(above(activations, training=False)), name="upper")
    pooled = upper(activations)
    if clf.side_features:
        side = keras.Input((len(clf.side_features),), name="side")
        inputs, logits = {"activations": activations, "side": side}, clf.head_model({"features": pooled, "side": side})
    else:
        inputs, logits = activations, clf.head_model(pooled)
    return FrozenCut(lower=lower, upper=upper, tail=keras.Model(inputs, logits, name="tail"), layer=name)


def _cut(backbone: keras.Model, start: int) -> tuple[str, object] | None:
    """(layer name, output) of the one tensor that the layers from `start` up take from the
    layers below, if there is one. A layer's `input` and `output` are those of its first call:
    the backbone's own graph (splitting calls the layers above the cut again)."""
    below, above = backbone.layers[:start], backbone.layers[start:]
    if not 1 < start < len(backbone.layers):
        return None  # nothing frozen, or nothing trained
    produced = {id(t) for layer in above for t in keras.tree.flatten(layer.output)}
    crossing = {id(t) for layer in above for t in keras.tree.flatten(layer.input)} - produced
    if len(crossing) != 1:
        return None
    return next((layer.name, t) for layer in below for t in keras.tree.flatten(layer.output) if id(t) in crossing)


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
