"""TF-Hub / Kaggle image feature-vector SavedModels as Keras 3 backbones.

`hub.KerasLayer` cannot sit in a Keras 3 model ("A KerasTensor cannot be used as input to a
TensorFlow function"), and `keras.layers.TFSMLayer(trainable=True)` trains *copies* of the
SavedModel's variables (its forward pass keeps reading the originals; `fit` with Adam also
fails on their names). This layer instead exposes the SavedModel's own variables as Keras
variables, so the optimizer updates exactly what the forward pass reads: frozen in phase 1,
trainable in phase 2.
"""

from __future__ import annotations

import re
from pathlib import Path

import keras
import tensorflow as tf

from app.errors import UserError


def is_hub_handle(name: str) -> bool:
    return "://" in name or Path(name).is_dir()


def _load(handle: str):
    path = handle
    if "://" in handle:
        import tensorflow_hub as hub

        try:
            path = hub.resolve(handle)  # downloads once into TFHUB_CACHE_DIR
        except Exception as err:  # network errors surface as many types
            raise UserError(f"--backbone {handle}: could not download ({err})") from None
    try:
        return tf.saved_model.load(path)
    except (OSError, ValueError) as err:
        raise UserError(f"--backbone {handle}: not a SavedModel ({str(err).splitlines()[0]})") from None


def _shared_keras_variable(variable: tf.Variable, trainable: bool) -> keras.Variable:
    """A Keras variable backed by the SavedModel's own tf.Variable (no copy)."""
    shared = keras.Variable(
        initializer=tf.zeros_like(variable),
        dtype=variable.dtype.name,
        trainable=trainable,
        name=re.sub(r"[^A-Za-z0-9_.-]", "_", variable.name.split(":")[0]),  # optimizer slot names need this
    )
    shared._value = variable  # the forward pass reads `variable`; so does the optimizer now
    return shared


def _module_variables(module) -> tuple[list[tf.Variable], set[int]]:
    """TF-Hub SavedModels list `variables`/`trainable_variables`; for other SavedModels, collect
    what their traced functions capture."""
    if hasattr(module, "variables"):
        return list(module.variables), {id(v) for v in getattr(module, "trainable_variables", [])}
    found: dict[int, tf.Variable] = {}
    trainable: set[int] = set()
    for fn in [module.__call__, *getattr(module, "signatures", {}).values()]:
        for concrete in getattr(fn, "concrete_functions", [fn]):
            found.update({id(v): v for v in concrete.variables})
            trainable |= {id(v) for v in concrete.trainable_variables}
    return list(found.values()), trainable


@keras.saving.register_keras_serializable(package="app")
class HubFeatureExtractor(keras.layers.Layer):
    """images in [0, 1] (the TF-Hub image convention) → feature vectors [B, C]."""

    def __init__(self, handle: str, **kwargs):
        super().__init__(**kwargs)
        self.handle = handle
        self._module = _load(handle)
        variables, trainable_ids = _module_variables(self._module)
        for variable in variables:
            self._track_variable(_shared_keras_variable(variable, id(variable) in trainable_ids))
        self._takes_training = True

    def call(self, images, training=False):
        if self._takes_training:
            try:
                return self._module(images, training=bool(training))
            except (TypeError, ValueError):
                self._takes_training = False  # signature-only SavedModel: no training argument
        return self._module(images)

    def compute_output_shape(self, input_shape):
        probe = self._module(tf.zeros([1, *input_shape[1:]]), **({"training": False} if self._takes_training else {}))
        return (input_shape[0], probe.shape[-1])

    def get_config(self) -> dict:
        return {**super().get_config(), "handle": self.handle}


def build_hub_backbone(handle: str, input_shape: tuple[int, int, int]) -> keras.Model:
    images = keras.Input(input_shape, name="hub_input")
    features = HubFeatureExtractor(handle, name="hub_module")(images)
    return keras.Model(images, features, name="hub_backbone")
