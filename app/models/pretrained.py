"""A backbone with pretrained weights: ImageNet, a local weights file, none, or `auto`.

`auto` is resolved honestly: the file named by $PHOTOCLF_WEIGHTS when it is set (no download is
tried first), else ImageNet if it can be had, else random initialisation with a loud warning
that also lands in metrics.json. Any choice that cannot be met (a named file that is missing or
does not fit) is a UserError naming where it was named, never a silent fallback.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import keras

from app.errors import UserError
from app.models.backbones import BACKBONES, BackboneSpec

WEIGHTS_ENV = "PHOTOCLF_WEIGHTS"  # path to a local backbone weights file used by `auto`


@dataclass(frozen=True)
class PretrainedBackbone:
    model: keras.Model
    weights_used: str  # what was loaded, for the log, metrics.json and the export's metadata
    warning: str | None  # set when training will start from random weights


def load_backbone(
    spec: BackboneSpec, image_size: int, weights: str, named_by: str = "--weights"
) -> tuple[keras.Model, str]:
    """Build the backbone with `weights` = imagenet | none | PATH. Returns (model, what was loaded).

    Raises UserError, naming `named_by` (the flag or variable that chose `weights`), for a size
    too small, a missing/incompatible file or an unavailable download; never falls back
    silently (`load_pretrained_backbone` resolves `auto`).
    """
    _check_size(spec, image_size)
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
    return _from_file(spec, shape, Path(weights), named_by), weights


def _check_size(spec: BackboneSpec, image_size: int) -> None:
    if image_size < spec.min_size:
        raise UserError(f"--image-size {image_size} is too small for {spec.name} (minimum {spec.min_size})")


def _whose_file(path: Path) -> str:
    """The backbones whose own weights files end as `path` does (an EfficientNet-Lite .npz given
    with the default backbone): the --backbone the user most likely left out."""
    owners = sorted(
        name for name, spec in BACKBONES.items() if spec.weights_file and path.name.endswith(spec.weights_file[0])
    )
    named = " or ".join(owners) if len(owners) <= 2 else f"{owners[0]} ... {owners[-1]}"
    return f"; a {path.suffix} file is for --backbone {named}" if owners else ""


def _from_file(spec: BackboneSpec, shape: tuple[int, int, int], path: Path, named_by: str) -> keras.Model:
    if not path.is_file():
        raise UserError(
            f"{named_by}: {path} is a folder, not a weights file"
            if path.is_dir()
            else f"{named_by}: no such file {path}"
        )
    suffix, loader = spec.weights_file or (".h5", None)
    if not path.name.endswith(".h5") and not path.name.endswith(suffix):
        kinds = ".h5 or .weights.h5" + ("" if suffix == ".h5" else f" or {suffix}")
        raise UserError(f"{named_by}: {path} is not a {kinds} file{_whose_file(path)}")
    model = spec.build(shape, None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if loader is not None and path.name.endswith(suffix):
                loader(model, path)
            else:
                model.load_weights(str(path))
    except Exception as err:
        first_line = str(err).strip().splitlines()[0].split(". Example error message")[0].rstrip(":")  # Keras' count
        raise UserError(f"{named_by}: {path} does not fit {spec.name}: {first_line}") from None
    return model


def load_pretrained_backbone(
    spec: BackboneSpec, image_size: int, weights: str, named_by: str = "--weights", own_file: str = ""
) -> PretrainedBackbone:
    """`weights` as in load_backbone, or `auto`: $PHOTOCLF_WEIGHTS, else ImageNet, else none (warned).
    `named_by`: the flag that gave `weights`, for its errors; `own_file`: how to give this backbone
    a file of its own where $PHOTOCLF_WEIGHTS cannot serve it (default: `named_by` PATH)."""
    if weights != "auto" or spec.hub_handle:
        model, used = load_backbone(spec, image_size, weights, named_by)
        return PretrainedBackbone(
            model, used, "training from random initialisation (--weights none)" if weights == "none" else None
        )
    _check_size(spec, image_size)  # said as it is: no file fixes it
    local = os.environ.get(WEIGHTS_ENV)
    if local:  # named by the user: used as it is, before any download, or the error names the variable
        try:
            model, used = load_backbone(spec, image_size, local, named_by=f"${WEIGHTS_ENV}")
        except UserError as err:  # e.g. one backbone's file, set for every run, and another backbone asked for
            raise UserError(f"{err}; give {spec.name} its own file with {own_file or named_by + ' PATH'}") from None
        return PretrainedBackbone(model, f"{used} (from ${WEIGHTS_ENV})", None)
    reasons = [f"${WEIGHTS_ENV} is not set"]
    if not spec.imagenet_sizes or image_size in spec.imagenet_sizes:
        try:
            model, used = load_backbone(spec, image_size, "imagenet")
            return PretrainedBackbone(model, used, None)
        except UserError as err:  # no download and nothing cached: said below
            reasons.append(str(err))
    else:
        reasons.append(f"{spec.name} has ImageNet weights only for sizes {spec.imagenet_sizes}, not {image_size}")
    warning = (
        "NO PRETRAINED WEIGHTS: training from random initialisation, expect poor accuracy. "
        + "; ".join(reasons)
        + f". Fix: --weights PATH, or export {WEIGHTS_ENV}=PATH to a {spec.name} weights file."
    )
    model, _ = load_backbone(spec, image_size, "none")
    return PretrainedBackbone(model, "none (random initialisation; auto found no pretrained weights)", warning)
