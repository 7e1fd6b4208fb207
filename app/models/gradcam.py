"""Grad-CAM (Selvaraju et al. 2017): where in the photo the model looked for a class.

The map is the ReLU of the backbone's last feature map weighted by the mean gradient of the
class's logit with respect to it, scaled to [0, 1]. The usual recipe builds one Keras model from
the input to an inner layer of the nested backbone, which fails with "Graph disconnected"
(tensorflow#44462, tf-keras-vis#71). Here the classifier's named layers are called in turn
(normalize → backbone → pool → dropout → logits), so the backbone's output *is* the feature map,
whatever the backbone: every registry backbone ends in its last convolutional block. A backbone
that returns pooled features (a TF-Hub feature vector) has no spatial map, and models with side
features are not explained yet: both are refused with one line saying so.

Only the head is differentiated (the backbone runs forward once), so a map costs about one
forward pass of the Keras model (`python -m benchmarks.gradcam` measures it).
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from app.errors import UserError

HEAD = ("pool", "dropout", "logits")


def explainer(model: keras.Model):
    """`model` (a classifier from app.models.classifier) → a function (float32 images [N, S, S, 3]
    in 0..255, class ids [N]; -1: the model's top class) → (maps [N, h, w] in [0, 1] at the
    feature map's resolution, the class ids explained [N]); its `image_size` is S."""
    names = {layer.name for layer in model.layers}
    if "side_encoding" in names:
        raise UserError("Grad-CAM: models with side features are not explained yet")
    normalize, backbone = model.get_layer("normalize"), model.get_layer("backbone")
    head = [model.get_layer(name) for name in HEAD]
    if len(backbone.output.shape) != 4:
        raise UserError("Grad-CAM: this backbone returns pooled features, so there is no spatial map to show")

    size = model.inputs[0].shape[1]
    images_spec = tf.TensorSpec([None, size, size, 3], tf.float32)

    @tf.function(input_signature=[images_spec, tf.TensorSpec([None], tf.int32)])
    def maps(images: tf.Tensor, class_ids: tf.Tensor) -> tf.Tensor:
        features = tf.cast(backbone(normalize(images), training=False), tf.float32)
        with tf.GradientTape() as tape:
            tape.watch(features)
            x = features
            for layer in head:
                x = layer(x, training=False)
            class_ids = tf.where(class_ids < 0, tf.argmax(x, axis=-1, output_type=tf.int32), class_ids)
            chosen = tf.gather(x, class_ids, batch_dims=1)
        weights = tf.reduce_mean(tape.gradient(chosen, features), axis=[1, 2], keepdims=True)
        cam = tf.nn.relu(tf.reduce_sum(weights * features, axis=-1))
        peak = tf.reduce_max(cam, axis=[1, 2], keepdims=True)
        return tf.math.divide_no_nan(cam, peak), class_ids

    def call(images, class_ids) -> tuple[np.ndarray, np.ndarray]:
        cams, ids = maps(tf.convert_to_tensor(images, tf.float32), tf.convert_to_tensor(class_ids, tf.int32))
        return cams.numpy(), ids.numpy()

    call.image_size = size
    return call


def on_photo(cam: np.ndarray, height: int, width: int, crop_fraction: float) -> np.ndarray:
    """A map of the model's input (its centre crop of the photo) → float32 [height, width] in
    [0, 1] over the whole photo: bilinear inside the crop window, 0 outside it."""
    from app.data.preprocess import centre_window

    top, left, side, _ = (int(v) for v in centre_window(tf.constant(height), tf.constant(width), crop_fraction))
    window = tf.image.resize(cam[None, :, :, None].astype(np.float32), [side, side], method="bilinear")[0, :, :, 0]
    full = np.zeros((height, width), np.float32)
    full[top : top + side, left : left + side] = np.clip(window.numpy(), 0.0, 1.0)
    return full


def overlay(photo: np.ndarray, heat: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """uint8 RGB photo [H, W, 3] with the map [H, W] blended over it (matplotlib's "jet")."""
    from matplotlib import colormaps

    colours = colormaps["jet"](heat)[..., :3] * 255.0
    return np.clip((1 - alpha) * photo.astype(np.float32) + alpha * colours, 0, 255).astype(np.uint8)


def peak_inside(cam: np.ndarray, box: Sequence[float], tolerance: float = 0.0) -> bool:
    """The pointing game (Zhang et al. 2016): whether the map's maximum falls in `box` = (top,
    left, bottom, right) as fractions of the map, grown by `tolerance` on every side (theirs:
    15 pixels of 224)."""
    y, x = np.unravel_index(int(np.argmax(cam)), cam.shape)
    top, left, bottom, right = box
    cy, cx = (y + 0.5) / cam.shape[0], (x + 0.5) / cam.shape[1]
    return top - tolerance <= cy <= bottom + tolerance and left - tolerance <= cx <= right + tolerance
