"""AdamW for fine-tuning: a learning rate per backbone block, and a warmed-up weight average.

Layer-wise learning-rate decay (BEiT, ULMFiT's discriminative rates, timm) trains the top of a
pretrained network at the full rate and each block below it at the rate of the block above x
`layer_decay`: lower blocks hold more general features, which a small dataset should move less.
Keras' AdamW has one rate per optimizer, and scaling gradients cannot stand in for a rate (Adam
divides the scale back out), so the scale multiplies the step itself, weight decay included.

The weight average (EMA) is Keras' own (`use_ema`), with the warm-up of
`tf.train.ExponentialMovingAverage(num_updates=...)`: decay min(ema_decay, (1 + t) / (10 + t)),
so that a phase of a few dozen steps averages its recent steps instead of staying at its start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras
import tensorflow as tf

from app.models.backbones import blocks
from app.models.classifier import Classifier, unfreeze_start


class FineTuneAdamW(keras.optimizers.AdamW):
    def __init__(self, *, rate_scales: dict[str, float] | None = None, ema_decay: float = 0.0, **kwargs) -> None:
        """rate_scales: variable path → multiplier of the learning rate (missing: 1.0).
        ema_decay: 0 = no average; else the average's decay after its warm-up."""
        super().__init__(use_ema=ema_decay > 0, ema_momentum=ema_decay or 0.99, **kwargs)
        self.rate_scales = dict(rate_scales or {})
        self._scales: list[float] = []

    def build(self, var_list) -> None:
        super().build(var_list)
        self._scales = [self.rate_scales.get(v.path, 1.0) for v in var_list]

    def _apply_weight_decay(self, variables) -> None:
        """Applied per variable in update_step instead, at that variable's own rate."""

    def update_step(self, gradient, variable, learning_rate) -> None:
        scale = self._scales[self._get_variable_index(variable)]
        rate = tf.cast(learning_rate, variable.dtype) * scale
        if self.weight_decay and self._use_weight_decay(variable):
            variable.assign_sub(variable * tf.cast(self.weight_decay, variable.dtype) * rate)
        super().update_step(gradient, variable, rate)

    def _update_model_variables_moving_average(self, trainable_variables) -> None:
        step = tf.cast(self.iterations, tf.float32)  # 0 at the first update, which copies the weights
        decay = tf.minimum(self.ema_momentum, (1.0 + step) / (10.0 + step)) * tf.cast(step > 0, tf.float32)
        for var, average in zip(trainable_variables, self._model_variables_moving_average):
            if average is not None:
                d = tf.cast(decay, var.dtype)
                average.assign(d * average + (1.0 - d) * var)


def inner(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer under a LossScaleOptimizer (mixed precision), else itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def keeps_average(optimizer: keras.optimizers.Optimizer | None) -> bool:
    """Whether the optimizer keeps a weight average (ema_decay): then the average, not the
    training weights, is what is validated and kept."""
    return optimizer is not None and bool(inner(optimizer).use_ema)


@contextlib.contextmanager
def averaged_weights(optimizer: keras.optimizers.Optimizer | None) -> Iterator[None]:
    """Inside: the model holds the weight average (what is validated and saved); after: the
    training weights again. A no-op without an average."""
    opt = inner(optimizer) if keeps_average(optimizer) else None
    if opt is None or not opt.built:
        yield
        return
    _swap(opt)
    try:
        yield
    finally:
        _swap(opt)


def _swap(opt: keras.optimizers.Optimizer) -> None:
    """Exchange weights and averages in place on every replica (as keras.callbacks.SwapEMAWeights)."""
    strategy = opt._distribution_strategy or tf.distribute.get_strategy()
    for var, average in zip(opt._trainable_variables, opt._model_variables_moving_average):
        var, average = getattr(var, "value", var), getattr(average, "value", average)
        strategy.extended.update(var, lambda a, b: a.assign_add(b), args=(average,))
        strategy.extended.update(var, lambda a, b: b.assign(a - b), args=(average,))
        strategy.extended.update(var, lambda a, b: a.assign(a - b), args=(average,))


def layer_rate_scales(clf: Classifier, unfreeze: str, decay: float) -> dict[str, float]:
    """Variable path → rate multiplier for phase 2: 1.0 for the head and the top block (with the
    layers above it), decay for the block below, decay**2 below that, and so on."""
    if decay == 1.0:
        return {}
    starts = [index for _, index in blocks(clf.backbone, clf.spec)]
    first = unfreeze_start(clf, unfreeze)
    scales = {}
    for index, layer in enumerate(clf.backbone.layers):
        if index < first:
            continue
        below_top = sum(1 for start in starts if start > index)  # blocks starting above this layer
        for variable in layer.trainable_weights:
            scales[variable.path] = decay**below_top
    return scales
