"""Resolve `--weights auto` honestly: ImageNet if it can be had, else a configured local file,
else random initialisation with a loud warning that also lands in metrics.json."""

from __future__ import annotations

import os

import keras

from app.errors import UserError
from app.models.backbones import BackboneSpec, load_backbone

WEIGHTS_ENV = "PHOTOCLF_WEIGHTS"  # path to a local backbone weights file used by `auto`


def resolve_backbone(spec: BackboneSpec, image_size: int, weights: str) -> tuple[keras.Model, str, str | None]:
    """Returns (backbone, description of the weights used, warning or None)."""
    if weights != "auto" or spec.hub_handle:
        model, used = load_backbone(spec, image_size, weights)
        return model, used, ("training from random initialisation (--weights none)" if weights == "none" else None)
    reasons = []
    if not spec.imagenet_sizes or image_size in spec.imagenet_sizes:
        try:
            model, used = load_backbone(spec, image_size, "imagenet")
            return model, used, None
        except UserError as err:
            reasons.append(str(err))
    else:
        reasons.append(f"{spec.name} has ImageNet weights only for sizes {spec.imagenet_sizes}, not {image_size}")
    local = os.environ.get(WEIGHTS_ENV)
    if local:
        model, used = load_backbone(spec, image_size, local)  # a configured file that doesn't fit is an error
        return model, f"{used} (from ${WEIGHTS_ENV})", None
    reasons.append(f"${WEIGHTS_ENV} is not set")
    warning = (
        "NO PRETRAINED WEIGHTS: training from random initialisation, expect poor accuracy. "
        + "; ".join(reasons)
        + f". Fix: --weights PATH, or export {WEIGHTS_ENV}=PATH to a {spec.name} weights file."
    )
    model, _ = load_backbone(spec, image_size, "none")
    return model, "none (random initialisation; auto found no pretrained weights)", warning
