"""A backbone with pretrained weights: ImageNet, a local weights file, none, or `auto`.

`auto` is resolved honestly: ImageNet if it can be had, else the file named by
$PHOTOCLF_WEIGHTS, else random initialisation with a loud warning that also lands in
metrics.json. Any other choice that cannot be met is a UserError, never a silent fallback.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import keras

from app.errors import UserError
from app.models.backbones import BackboneSpec

WEIGHTS_ENV = "PHOTOCLF_WEIGHTS"  # path to a local backbone weights file used by `auto`


@dataclass(frozen=True)
class PretrainedBackbone:
    model: keras.Model
    weights_used: str  # what was loaded, for the log, metrics.json and the export's metadata
    warning: str | None  # set when training will start from random weights


def load_backbone(spec: BackboneSpec, image_size: int, weights: str) -> tuple[keras.Model, str]:
    """Build the backbone with `weights` = imagenet | none | PATH. Returns (model, what was loaded).

    Raises UserError for a size too small, a missing/incompatible file or an unavailable
    download; never falls back silently (`load_pretrained_backbone` resolves `auto`).
    """
    if image_size < spec.min_size:
        raise UserError(f"--image-size {image_size} is too small for {spec.name} (minimum {spec.min_size})")
    shape = (image_size, image_size, 3)
    if spec.hub_handle:
        if weights not in ("auto", "imagenet"):
            raise UserError(f"--weights {weights}: a TF-Hub/SavedModel backbone brings its own weights; use auto")
        return spec.build(shape, None), f"SavedModel {spec.hub_handle}"
    if weights == "none":
        return spec.build(shape, None), "none (random initialisation)"
    if weights == "imagenet":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return spec.build(shape, "imagenet"), "imagenet"
        except Exception as err:  # download or cache failure: keras raises plain Exception
            raise UserError(f"--weights imagenet: could not get ImageNet weights for {spec.name} ({err})") from None
    return _from_file(spec, shape, Path(weights)), weights


def _from_file(spec: BackboneSpec, shape: tuple[int, int, int], path: Path) -> keras.Model:
    if not path.is_file():
        raise UserError(f"--weights: no such file {path}")
    if not path.name.endswith(".h5"):
        raise UserError(f"--weights: {path} is not a .h5 or .weights.h5 file")
    model = spec.build(shape, None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.load_weights(str(path))
    except Exception as err:
        first_line = str(err).strip().splitlines()[0]
        raise UserError(f"--weights: {path} does not fit {spec.name}: {first_line}") from None
    return model


def load_pretrained_backbone(spec: BackboneSpec, image_size: int, weights: str) -> PretrainedBackbone:
    """`weights` as in load_backbone, or `auto`: ImageNet, else $PHOTOCLF_WEIGHTS, else none (warned)."""
    if weights != "auto" or spec.hub_handle:
        model, used = load_backbone(spec, image_size, weights)
        return PretrainedBackbone(
            model, used, "training from random initialisation (--weights none)" if weights == "none" else None
        )
    reasons = []
    local = os.environ.get(WEIGHTS_ENV)
    if not spec.imagenet_sizes or image_size in spec.imagenet_sizes:
        fallback = local if local and Path(local).is_file() else None
        try:
            with _download_failing_over_to(fallback) as fell_back:
                model, used = load_backbone(spec, image_size, "imagenet")
            if not fell_back:
                return PretrainedBackbone(model, used, None)
            return PretrainedBackbone(model, f"{fallback} (from ${WEIGHTS_ENV})", None)
        except UserError as err:  # no download and no file, or a file that does not fit: said below
            reasons.append(str(err))
    else:
        reasons.append(f"{spec.name} has ImageNet weights only for sizes {spec.imagenet_sizes}, not {image_size}")
    if local:
        model, used = load_backbone(spec, image_size, local)  # a configured file that doesn't fit is an error
        return PretrainedBackbone(model, f"{used} (from ${WEIGHTS_ENV})", None)
    reasons.append(f"${WEIGHTS_ENV} is not set")
    warning = (
        "NO PRETRAINED WEIGHTS: training from random initialisation, expect poor accuracy. "
        + "; ".join(reasons)
        + f". Fix: --weights PATH, or export {WEIGHTS_ENV}=PATH to a {spec.name} weights file."
    )
    model, _ = load_backbone(spec, image_size, "none")
    return PretrainedBackbone(model, "none (random initialisation; auto found no pretrained weights)", warning)


@contextlib.contextmanager
def _download_failing_over_to(local: str | None) -> Iterator[list[bool]]:
    """While Keras builds a backbone with weights="imagenet": when its download fails and `local`
    is set, Keras loads `local` into the model it has just built instead of raising, and the
    yielded list becomes non-empty (it fell back). Offline, `auto` with $PHOTOCLF_WEIGHTS otherwise built
    MobileNetV2 twice, once for the failed download (1.1 s on 2 cores). Keras' applications call
    `file_utils.get_file` through the module, so replacing it there reaches them all."""
    from keras.src.utils import file_utils

    download = file_utils.get_file
    fell_back: list[bool] = []

    def get_file(*args, **kwargs) -> str:
        try:
            return download(*args, **kwargs)
        except Exception:  # Keras raises plain Exception for a failed fetch
            if not local:
                raise
            fell_back.append(True)
            return local

    file_utils.get_file = get_file
    try:
        yield fell_back
    finally:
        file_utils.get_file = download
