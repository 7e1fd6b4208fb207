"""Backbone registry: each entry knows its builder, input size, pixel normalisation and blocks.

Register with `@register_backbone(...)` on a builder `(input_shape, weights) -> keras.Model`.
Everything else (the head, freezing, unfreezing) is generic and lives in classifier.py, so
adding an architecture is one short function.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import keras

from app.errors import UserError
from app.models.efficientnet_lite import VARIANTS as LITE_VARIANTS
from app.models.efficientnet_lite import build_efficientnet_lite, load_torch_npz
from app.models.layers import PixelNormalization

Builder = Callable[[tuple[int, int, int], "str | None"], keras.Model]

# Normalisations, as PixelNormalization arguments. None: the Keras model normalises itself.
SCALE_MINUS1_1 = {"mean": (127.5,) * 3, "std": (127.5,) * 3}
LITE_PIXELS = {"mean": (127.0,) * 3, "std": (128.0,) * 3}
CAFFE_BGR = {"mean": (103.939, 116.779, 123.68), "std": (1.0,) * 3, "bgr": True}


@dataclass(frozen=True)
class BackboneSpec:
    name: str
    build: Builder
    default_size: int
    normalization: dict | None  # PixelNormalization kwargs, or None if built in
    block_pattern: str  # regex whose group 1 names the block a layer belongs to
    min_size: int = 32
    imagenet_sizes: tuple[int, ...] = ()  # sizes with ImageNet weights, when the family is picky
    hub_handle: str | None = None  # TF-Hub/Kaggle handle or local SavedModel: weights come with it
    weights_file: tuple[str, Callable[[keras.Model, Path], None]] | None = None  # (suffix, loader) beside .h5

    @property
    def model_name(self) -> str:
        """A Keras-safe name (handles and paths contain '/')."""
        return "hub" if self.hub_handle else self.name

    def normalization_layer(self) -> keras.layers.Layer:
        if self.normalization is None:
            return keras.layers.Identity(name="normalize")
        return PixelNormalization(**self.normalization, name="normalize")


BACKBONES: dict[str, BackboneSpec] = {}


def register_backbone(name: str, **spec_kwargs) -> Callable[[Builder], Builder]:
    def wrap(build: Builder) -> Builder:
        if name in BACKBONES:
            raise ValueError(f"backbone '{name}' is already registered")
        BACKBONES[name] = BackboneSpec(name=name, build=build, **spec_kwargs)
        return build

    return wrap


def get_backbone(name: str) -> BackboneSpec:
    """A registry entry, or an ad-hoc spec for a TF-Hub handle URL / local SavedModel folder."""
    if name in BACKBONES:
        return BACKBONES[name]
    from app.models.hub import build_hub_backbone, is_hub_handle  # TensorFlow: registry backbones need only Keras

    if not is_hub_handle(name):
        raise UserError(f"unknown backbone '{name}'; known: {', '.join(sorted(BACKBONES))}")
    return BackboneSpec(
        name=name,
        build=lambda shape, weights: build_hub_backbone(name, shape),
        default_size=224,
        normalization={"mean": (0.0,) * 3, "std": (255.0,) * 3},  # TF-Hub image models take [0, 1]
        block_pattern=r"^(hub_module)$",
        hub_handle=name,
    )


def _apps(fn_name: str, **kwargs) -> Builder:
    def build(input_shape: tuple[int, int, int], weights: str | None) -> keras.Model:
        fn = getattr(keras.applications, fn_name)
        return fn(input_shape=input_shape, include_top=False, weights=weights, **kwargs)

    return build


register_backbone(
    "mobilenet_v2",
    default_size=224,
    normalization=SCALE_MINUS1_1,
    block_pattern=r"^(block_\d+)_",
    imagenet_sizes=(96, 128, 160, 192, 224),
)(_apps("MobileNetV2"))
for _name, _keras_name in (("mobilenet_v3_small", "MobileNetV3Small"), ("mobilenet_v3_large", "MobileNetV3Large")):
    register_backbone(
        _name, default_size=224, normalization=None, block_pattern=r"^(expanded_conv(?:_\d+)?)_", imagenet_sizes=(224,)
    )(_apps(_keras_name, include_preprocessing=True))
for _i, _size in enumerate((224, 240, 260, 300)):
    register_backbone(
        f"efficientnet_b{_i}", default_size=_size, normalization=None, block_pattern=r"^(block\d+[a-z])_"
    )(_apps(f"EfficientNetB{_i}"))
for _i, _size in enumerate((224, 240, 260, 300)):
    register_backbone(
        f"efficientnetv2_b{_i}", default_size=_size, normalization=None, block_pattern=r"^(block\d+[a-z])_"
    )(_apps(f"EfficientNetV2B{_i}", include_preprocessing=True))
register_backbone("resnet50", default_size=224, normalization=CAFFE_BGR, block_pattern=r"^(conv\d_block\d+)_")(
    _apps("ResNet50")
)
register_backbone(
    "convnext_tiny", default_size=224, normalization=None, block_pattern=r"^convnext_tiny_(stage_\d+_block_\d+)_"
)(_apps("ConvNeXtTiny", include_preprocessing=True))


def _lite(name: str) -> Builder:
    def build(input_shape: tuple[int, int, int], weights: str | None) -> keras.Model:
        if weights == "imagenet":  # Keras has no download for it: the weights come as a file
            raise ValueError(f"no download of {name}'s ImageNet weights; give the .npz file as --weights PATH")
        return build_efficientnet_lite(name, input_shape)

    return build


for _name, _variant in LITE_VARIANTS.items():
    register_backbone(
        _name,
        default_size=_variant.size,
        normalization=LITE_PIXELS,
        block_pattern=r"^(block_\d+)_",
        weights_file=(".npz", load_torch_npz),
    )(_lite(_name))


def blocks(backbone: keras.Model, spec: BackboneSpec) -> list[tuple[str, int]]:
    """(block name, index of its first layer) in layer order."""
    found: list[tuple[str, int]] = []
    for index, layer in enumerate(backbone.layers):
        match = re.match(spec.block_pattern, layer.name)
        if match and (not found or found[-1][0] != match.group(1)):
            found.append((match.group(1), index))
    return found
