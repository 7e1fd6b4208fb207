"""Phase 2 on images with the frozen layers below its cut run as a forward pass on the host's
runtime, batch by batch, and only the layers above trained by TensorFlow.

Phase 2 on images shows the model freshly augmented photos every epoch. The layers below the cut
train nothing and BatchNorm runs on its pretrained statistics, so their share of each training
step is a forward pass like phase 1's: `HostForward` runs it (OpenVINO where it agrees with
TensorFlow on the first batch and is faster, else TensorFlow), and the train step trains the
tail (`FrozenCut.tail`) on the activations, as it does on phase 1's views. The colour jitter, the
train step's own on images, is applied here before the pass, seeded by the batch's index. The
pass runs in tf.data's thread, one batch ahead of the step. Measured: benchmarks/README.md,
"Runtimes" (phase 2's layers below its cut).
"""

from __future__ import annotations

from collections.abc import Iterator

import tensorflow as tf

from app.data.preprocess import color_jitter
from app.inference.host_forward import HostForward, keeps_tensorflow, openvino_precisions
from app.models.classifier import FrozenCut
from app.training.context import Context

JITTER_STREAM = 2  # the colour jitter's seeds here: [seed, JITTER_STREAM] folded with the batch's index


def runs_below_on_host(ctx: Context, cut: FrozenCut | None, on_views: bool, epochs: int) -> bool:
    """Phase 2 on images goes through the host's runtime where it may gain: one replica on one
    worker decoding here (several replicas would call one runtime from several threads), and a
    pass that `HostForward` would not keep on TensorFlow anyway (a GPU, no OpenVINO, too few rows)."""
    if cut is None or on_views or not epochs or ctx.strategy.num_replicas_in_sync > 1 or ctx.cfg.data_service:
        return False
    return not keeps_tensorflow(ctx.cfg.forward_runtime, _rows(ctx, epochs), openvino_precisions())


def below_forward(ctx: Context, cut: FrozenCut, epochs: int) -> HostForward:
    """The layers below the cut as a host call on float32 images 0..255."""
    shape = (ctx.image_size, ctx.image_size, 3)
    return HostForward(lambda x: cut.lower(x, training=False), shape, ctx.cfg.forward_runtime, _rows(ctx, epochs))


def _rows(ctx: Context, epochs: int) -> int:
    return epochs * ctx.steps_per_epoch * ctx.batch_size


def fresh_activations(ctx: Context, cut: FrozenCut, forward: HostForward, images: tf.data.Dataset) -> tf.data.Dataset:
    """Endless (activations, labels) batches (({"activations", "side"}, labels) with side
    features) of `images`' augmented batches. The first batch runs here, in the caller's thread,
    so that the runtime is chosen (and converted) before tf.data's thread takes over."""
    inputs_spec, labels_spec = images.element_spec
    activations_spec = tf.TensorSpec([None, *cut.lower.output.shape[1:]], tf.float32)
    has_side = isinstance(inputs_spec, dict)
    output_spec = {"activations": activations_spec, "side": inputs_spec["side"]} if has_side else activations_spec
    batches = iter(images)
    jitter = ctx.augmentation.color_jitter
    seed = tf.constant([ctx.cfg.seed, JITTER_STREAM])

    def below(index: int, inputs, labels) -> tuple:
        pixels = inputs["image"] if has_side else inputs
        if jitter > 0:
            pixels = color_jitter(pixels, tf.random.experimental.stateless_fold_in(seed, index), jitter)
        activations = forward(tf.cast(pixels, tf.float32).numpy())
        return ({"activations": activations, "side": inputs["side"]} if has_side else activations), labels

    first = below(0, *next(batches))

    def generate() -> Iterator[tuple]:
        yield first
        for index, (inputs, labels) in enumerate(batches, start=1):
            yield below(index, inputs, labels)

    return tf.data.Dataset.from_generator(generate, output_signature=(output_spec, labels_spec)).prefetch(1)
