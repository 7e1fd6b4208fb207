"""Every registered backbone builds, normalises 0..255 input, and names its blocks for unfreezing."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import TINY_BACKBONE

from app.errors import UserError
from app.models.backbones import BACKBONES, get_backbone, register_backbone
from app.models.classifier import build_classifier, cut_at_trained, unfreeze_start, unfreeze_top
from app.models.pretrained import load_backbone

pytestmark = pytest.mark.start_first  # its tests take over a minute in all


FAST_TIER_BACKBONES = {  # one of each family; the rest in the slow tier: the fast tier stays under 3 minutes
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "efficientnet_lite0",
    "efficientnetv2_b0",
    "resnet50",
    "convnext_tiny",
}


@pytest.mark.parametrize(
    "name",
    [
        name if name in FAST_TIER_BACKBONES else pytest.param(name, marks=pytest.mark.slow)
        for name in sorted(set(BACKBONES) - {TINY_BACKBONE})  # the product's, not the tests'
    ],
)
def test_registered_backbone_builds_and_unfreezes(name: str):
    spec = get_backbone(name)
    backbone, used = load_backbone(spec, 64, "none")
    clf = build_classifier(spec, backbone, 3, 64, 0.1)
    probs = clf.model(np.full((2, 64, 64, 3), 128.0, np.float32)).numpy()
    assert probs.shape == (2, 3) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert [layer.name for layer in clf.model.layers] == [
        "image",
        "normalize",
        "backbone",
        "pool",
        "dropout",
        "logits",
        "probabilities",
    ]
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


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("mobilenet_v2", "blocks:1"),
        pytest.param("mobilenet_v2", "blocks:2", marks=pytest.mark.slow),
        ("mobilenet_v2", "fraction:0.5"),
        ("efficientnetv2_b0", "blocks:2"),
        pytest.param("resnet50", "blocks:1", marks=pytest.mark.slow),
    ],
)
def test_the_tail_on_the_lower_part_gives_the_classifier_logits(name: str, rule: str):
    spec = get_backbone(name)
    backbone, _ = load_backbone(spec, 64, "none")
    clf = build_classifier(spec, backbone, 3, 64, 0.5)
    start = unfreeze_start(clf, rule)
    split = cut_at_trained(clf, start)
    assert split is not None and clf.backbone.layers.index(clf.backbone.get_layer(split.layer)) < start
    images = np.random.default_rng(0).uniform(0, 255, (2, 64, 64, 3)).astype(np.float32)
    np.testing.assert_allclose(split.tail(split.lower(images)).numpy(), clf.logits_model(images).numpy(), atol=1e-5)
    assert {id(v) for v in split.tail.weights} <= {id(v) for v in clf.logits_model.weights}  # shared, not copied


def test_no_split_where_a_frozen_layer_also_feeds_a_layer_above_the_cut():
    images = keras.Input((8, 8, 3))
    a = keras.layers.Conv2D(4, 1, name="a")(images)
    b = keras.layers.Conv2D(4, 1, name="b")(a)
    c = keras.layers.Conv2D(4, 1, name="c")(b)
    backbone = keras.Model(images, keras.layers.Add(name="skip")([a, c]))
    clf = build_classifier(get_backbone("mobilenet_v2"), backbone, 2, 8, 0.0)
    names = [layer.name for layer in clf.backbone.layers]
    assert cut_at_trained(clf, names.index("c")) is None  # b and a both cross
    assert cut_at_trained(clf, names.index("b")).layer == "a"  # only a crosses (to b and to skip)
    assert cut_at_trained(clf, names.index("a")) is None  # the cut would be the input itself
