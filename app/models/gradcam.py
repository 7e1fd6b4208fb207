"""Grad-CAM (Selvaraju et al. 2017): where in the photo the model looked for a class.

The map is the ReLU of the backbone's last feature map weighted by the mean gradient of the
class's logit with respect to it. That map has the last feature map's resolution (7 × 7 for
MobileNetV2 at 224: cells of 32 pixels), too coarse to put its peak on a small object, so, as
Guided Grad-CAM sharpens it with a finer gradient map, it is multiplied here by LayerCAM (Jiang
et al. 2021: the positive gradient times the activation, per position) at the last block
output at twice that resolution (block_12_add for MobileNetV2), and shown at that
resolution (14 × 14), scaled to [0, 1]. On generated photos whose class is a small object
(`python -m benchmarks.gradcam`) the map's peak lands on the object more often than Grad-CAM's
7 × 7 map alone puts it there.

The usual recipe builds one Keras model from the input to an inner layer of the nested backbone,
which fails with "Graph disconnected" (tensorflow#44462, tf-keras-vis#71). Here the classifier's
named layers are called in turn (normalize → backbone → pool → dropout → logits), the backbone
split in two at the finer block (two Keras models over its own layers and weights), so the
feature maps are tensors of the call. A backbone without such a block (a SavedModel) gets
Grad-CAM's map alone; one that returns pooled features (a TF-Hub feature vector) has no spatial
map, and models with side features are not explained yet: both are refused with one line.

Only the head and the backbone above the finer block are differentiated, so a map costs about
one to two forward passes (`python -m benchmarks.gradcam` measures it).
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
    in 0..255, class ids [N]; -1: the model's top class) → (maps [N, h, w] in [0, 1], the class
    ids explained [N]); its `image_size` is S and its `finer_layer` the block LayerCAM reads
    (None: Grad-CAM's map alone)."""
    names = {layer.name for layer in model.layers}
    if "side_encoding" in names:
        raise UserError("Grad-CAM: models with side features are not explained yet")
    normalize, backbone = model.get_layer("normalize"), model.get_layer("backbone")
    head = [model.get_layer(name) for name in HEAD]
    if len(backbone.output.shape) != 4:
        raise UserError("Grad-CAM: this backbone returns pooled features, so there is no spatial map to show")
    finer, below, above = _split_at_finer_block(backbone)

    size = model.inputs[0].shape[1]
    images_spec = tf.TensorSpec([None, size, size, 3], tf.float32)

    # autograph=False: no tensor-dependent Python control flow here, and autograph's generated
    # source would be left in $TMPDIR by a process that is killed (it removes it at exit)
    @tf.function(input_signature=[images_spec, tf.TensorSpec([None], tf.int32)], autograph=False)
    def maps(images: tf.Tensor, class_ids: tf.Tensor) -> tf.Tensor:
        lower = tf.cast(below(normalize(images), training=False), tf.float32)
        with tf.GradientTape() as tape:
            tape.watch(lower)
            features = tf.cast(above(lower, training=False), tf.float32)
            x = features
            for layer in head:
                x = layer(x, training=False)
            class_ids = tf.where(class_ids < 0, tf.argmax(x, axis=-1, output_type=tf.int32), class_ids)
            chosen = tf.gather(x, class_ids, batch_dims=1)
        grads = tape.gradient(chosen, [features, lower] if finer is not None else [features])
        weights = tf.reduce_mean(grads[0], axis=[1, 2], keepdims=True)
        cam = tf.nn.relu(tf.reduce_sum(weights * features, axis=-1))
        if finer is not None:
            layer_cam = tf.nn.relu(tf.reduce_sum(tf.nn.relu(grads[1]) * lower, axis=-1))
            cam = tf.image.resize(cam[..., None], tf.shape(layer_cam)[1:3], method="bilinear")[..., 0] * layer_cam
        return _scaled(cam), class_ids

    def call(images, class_ids) -> tuple[np.ndarray, np.ndarray]:
        cams, ids = maps(tf.convert_to_tensor(images, tf.float32), tf.convert_to_tensor(class_ids, tf.int32))
        return cams.numpy(), ids.numpy()

    call.image_size = size
    call.finer_layer = finer
    return call


def _scaled(cam: tf.Tensor) -> tf.Tensor:
    return tf.math.divide_no_nan(cam, tf.reduce_max(cam, axis=[1, 2], keepdims=True))


def _split_at_finer_block(backbone: keras.Model):
    """(name, images → its output, its output → the last feature map) for the last layer whose map
    has twice the last feature map's height and that is the only tensor the layers above it take
    (Keras can rebuild them from it), a residual block's Add where one is: two models sharing the
    backbone's layers. Without such a layer: (None, identity, the backbone)."""
    height = backbone.output.shape[1]
    finer = [layer for layer in backbone.layers if layer.output.shape[1:2] == (2 * height,)]
    ordered = [layer for layer in finer if isinstance(layer, keras.layers.Add)][::-1] + finer[::-1]
    for layer in ordered:
        try:  # Keras rebuilds the graph from the cut
            above = keras.Model(layer.output, backbone.output, name="backbone_above")
        except ValueError:  # "Graph disconnected": a layer above also takes a tensor from below this one
            continue
        return layer.name, keras.Model(backbone.input, layer.output, name="backbone_below"), above
    return None, (lambda x, training=False: x), backbone


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
