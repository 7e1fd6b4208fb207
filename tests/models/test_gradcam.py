"""Grad-CAM: the map of a class peaks on the thing that decides it, through a nested backbone,
and each class gets its own map."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import TINY_BACKBONE

from app.errors import UserError
from app.models import gradcam
from app.models.backbones import BACKBONES

pytestmark = pytest.mark.start_first  # its tests take over a minute in all

SIZE = 32


def _colour_detector() -> keras.Model:
    """A classifier built as app.models.classifier builds one (named layers, a nested backbone
    model), whose backbone sees red and green (one channel each) and whose class 0 is "red"
    and class 1 "green": the evidence for each class sits where that colour is."""
    image = keras.Input((SIZE, SIZE, 3), name="image")
    inner = keras.Input((SIZE, SIZE, 3))
    conv = keras.layers.Conv2D(2, 1, use_bias=False, activation="relu")
    backbone = keras.Model(inner, keras.layers.MaxPooling2D(4)(conv(inner)), name="backbone")
    x = keras.layers.Identity(name="normalize")(image)
    x = backbone(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    x = keras.layers.Dropout(0.0, name="dropout")(x)
    logits = keras.layers.Dense(2, use_bias=False, name="logits")
    model = keras.Model(image, keras.layers.Softmax(name="probabilities")(logits(x)))
    conv.set_weights([np.array([[[[1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]]]])])  # red − green, green − red
    logits.set_weights([np.array([[1.0, -1.0], [-1.0, 1.0]])])
    return model


def _two_squares() -> tuple[np.ndarray, tuple, tuple]:
    """A red square top left, a green one bottom right, on grey; their boxes as fractions."""
    image = np.full((1, SIZE, SIZE, 3), 60.0, np.float32)
    image[0, 2:10, 2:10] = (250.0, 0.0, 0.0)
    image[0, 22:30, 22:30] = (0.0, 250.0, 0.0)
    return image, (2 / SIZE, 2 / SIZE, 10 / SIZE, 10 / SIZE), (22 / SIZE, 22 / SIZE, 30 / SIZE, 30 / SIZE)


def test_each_class_s_map_peaks_on_its_own_evidence():
    maps = gradcam.explainer(_colour_detector())
    image, red_box, green_box = _two_squares()
    (red, green), explained = maps(np.repeat(image, 2, axis=0), [0, 1])
    assert explained.tolist() == [0, 1] and maps.finer_layer is None  # no residual block: Grad-CAM's map
    assert red.shape == (SIZE // 4, SIZE // 4) and red.min() >= 0.0 and red.max() == pytest.approx(1.0)
    assert gradcam.peak_inside(red, red_box) and not gradcam.peak_inside(red, green_box)
    assert gradcam.peak_inside(green, green_box) and not gradcam.peak_inside(green, red_box)
    assert np.abs(red - green).max() > 0.5  # top-1 and top-2 maps differ
    top, top_id = maps(image, [-1])  # -1: the model's own top class (red wins: more red than green here)
    assert top_id.tolist() == [0] and np.array_equal(top[0], red)


def _residual_red_detector() -> keras.Model:
    """Like _colour_detector, with one class ("red") and a residual block at twice the last map's
    resolution: the backbone is detector → max-pool 4 → x + conv(x) → max-pool 2, a 4 × 4 map of
    8-pixel cells above an 8 × 8 one of 4-pixel cells."""
    image = keras.Input((SIZE, SIZE, 3), name="image")
    inner = keras.Input((SIZE, SIZE, 3))
    detect = keras.layers.Conv2D(1, 1, use_bias=False, activation="relu")
    x = keras.layers.MaxPooling2D(4)(detect(inner))
    residual = keras.layers.Conv2D(1, 1, use_bias=False, kernel_initializer="zeros")(x)
    x = keras.layers.Add(name="block_add")([x, residual])
    backbone = keras.Model(inner, keras.layers.MaxPooling2D(2)(x), name="backbone")
    x = backbone(keras.layers.Identity(name="normalize")(image))
    x = keras.layers.Dropout(0.0, name="dropout")(keras.layers.GlobalAveragePooling2D(name="pool")(x))
    logits = keras.layers.Dense(2, use_bias=False, name="logits")
    model = keras.Model(image, logits(x))
    detect.set_weights([np.array([[[[1.0], [-1.0], [-1.0]]]])])
    logits.set_weights([np.array([[1.0, -1.0]])])
    return model


def test_the_finer_block_puts_the_peak_on_an_object_that_straddles_the_last_map_s_cells():
    image = np.full((1, SIZE, SIZE, 3), 60.0, np.float32)
    image[0, 13:19, 13:19] = (250.0, 0.0, 0.0)  # across the 8-pixel cells 1 and 2 of each axis
    box = (13 / SIZE, 13 / SIZE, 19 / SIZE, 19 / SIZE)
    maps = gradcam.explainer(_residual_red_detector())
    (cam,), _ = maps(image, [0])
    assert maps.finer_layer == "block_add" and cam.shape == (8, 8)
    assert cam.min() >= 0.0 and cam.max() == pytest.approx(1.0)
    assert gradcam.peak_inside(cam, box)
    coarse = cam.reshape(4, 2, 4, 2).max(axis=(1, 3))  # what the last map's 8-pixel cells would show
    assert not gradcam.peak_inside(coarse, box)  # its peak, a cell's centre, falls outside the object


def test_the_map_is_placed_on_the_photo_s_centre_crop():
    cam = np.zeros((4, 4), np.float32)
    cam[0, 0] = 1.0
    heat = gradcam.on_photo(cam, height=100, width=200, crop_fraction=0.5)  # a 50 x 50 window at (25, 75)
    assert heat.shape == (100, 200) and heat.dtype == np.float32
    assert heat.min() == 0.0 and heat.max() <= 1.0
    y, x = np.unravel_index(np.argmax(heat), heat.shape)
    assert 25 <= y < 40 and 75 <= x < 90  # the window's top-left corner
    assert heat[:25].max() == 0.0 and heat[:, :75].max() == 0.0  # nothing outside the window


def test_a_pooled_backbone_is_refused_with_a_reason():
    image = keras.Input((SIZE, SIZE, 3), name="image")
    inner = keras.Input((SIZE, SIZE, 3))
    backbone = keras.Model(inner, keras.layers.GlobalAveragePooling2D()(inner), name="backbone")
    x = backbone(keras.layers.Identity(name="normalize")(image))
    x = keras.layers.Dropout(0.0, name="dropout")(keras.layers.Identity(name="pool")(x))
    model = keras.Model(image, keras.layers.Dense(2, name="logits")(x))
    with pytest.raises(UserError, match="pooled features, so there is no spatial map"):
        gradcam.explainer(model)


REGISTRY = sorted(name for name in BACKBONES if name != TINY_BACKBONE)  # the tests' own is registered in conftest


@pytest.mark.slow
@pytest.mark.parametrize("name", REGISTRY)
def test_every_registry_backbone_is_explained(name: str):
    """Each registry backbone (random init, its smallest size) gives a map per image in [0, 1]."""
    from app.models.backbones import get_backbone
    from app.models.classifier import build_classifier
    from app.models.pretrained import load_backbone

    spec = get_backbone(name)
    size = max(spec.min_size, 32)
    backbone, _ = load_backbone(spec, size, "none")
    clf = build_classifier(spec, backbone, 3, size, 0.2)
    images = np.random.default_rng(0).uniform(0, 255, (2, size, size, 3)).astype(np.float32)
    cams, ids = gradcam.explainer(clf.model)(images, [-1, 2])
    assert cams.ndim == 3 and len(cams) == 2 and ids[1] == 2
    assert cams.min() >= 0.0 and cams.max() <= 1.0
    assert gradcam.explainer(clf.model).finer_layer is not None  # each has a residual block to refine with
