"""Every registered backbone builds, normalises 0..255 input, and names its blocks for unfreezing."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from app.errors import UserError
from app.models.backbones import BACKBONES, get_backbone, register_backbone
from app.models.classifier import build_classifier, unfreeze_start, unfreeze_top
from app.models.pretrained import load_backbone


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_registered_backbone_builds_and_unfreezes(name: str):
    spec = get_backbone(name)
    backbone, used = load_backbone(spec, 64, "none")
    clf = build_classifier(spec, backbone, 3, 64, 0.1)
    probs = clf.model(np.full((2, 64, 64, 3), 128.0, np.float32)).numpy()
    assert probs.shape == (2, 3) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert [layer.name for layer in clf.model.layers] == ["image", "normalize", "backbone", "pool", "dropout", "logits", "probabilities"]
    assert not clf.model.get_layer("backbone").trainable_weights
    one, two = unfreeze_start(clf, "blocks:1"), unfreeze_start(clf, "blocks:2")
    assert 0 < two < one < len(clf.backbone.layers)
    trained = unfreeze_top(clf, "blocks:1")
    assert trained and not any(isinstance(clf.backbone.get_layer(n), keras.layers.BatchNormalization) for n in trained)
    assert spec.default_size >= 224


def test_registering_a_name_twice_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register_backbone("mobilenet_v2", default_size=224, normalization=None, block_pattern="x")(lambda s, w: None)


def test_unknown_backbone_lists_the_known_ones():
    with pytest.raises(UserError, match="efficientnet_b0.*mobilenet_v2"):
        get_backbone("vgg16")
