"""The model's forward pass with its weights frozen into the graph as constants, frozen once for
both of its uses: the SavedModel's signatures call it as a function, and the LiteRT converter
reads it as a GraphDef.

A SavedModel of constants has no checkpoint to trace, write or restore, and the export is
quicker for it (benchmarks/README.md). TensorFlow's public `convert_variables_to_constants_v2`
freezes quickly and then rebuilds a ConcreteFunction by copying the frozen graph op by op in
Python; the LiteRT converter, given that function, froze and copied it all again. Here the graph
is frozen once and imported (in C++) into one new trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import keras
import tensorflow as tf
from tensorflow.python.framework import convert_to_constants


@dataclass(frozen=True)
class FrozenForward:
    """`(image[, side]) → {"probabilities"[, "ood_score"]}`: float32 images [N, S, S, 3] in 0..255
    (and side vectors [N, F]) in; probabilities [N, C] out, and the out-of-distribution score [N]
    of a model that has one (app.models.classifier.served_model)."""

    graph_def: tf.compat.v1.GraphDef  # the frozen graph, what the LiteRT converter converts
    inputs: list[str]  # its input tensors' names: "image:0" (then "side:0")
    outputs: list[str]  # its output tensors' names, in the order of `names`
    names: list[str]  # "probabilities" (then "ood_score")
    function: tf.types.experimental.ConcreteFunction  # the same graph, called by the SavedModel

    def __call__(self, *inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        return dict(zip(self.names, self.function(*inputs)))


def output_names(model: keras.Model) -> list[str]:
    """The served model's outputs, probabilities first."""
    names = list(model.output) if isinstance(model.output, dict) else ["probabilities"]
    return sorted(names, key=lambda name: name != "probabilities")


def frozen_forward(model: keras.Model, image_size: int, side_width: int = 0) -> FrozenForward:
    """Trace the model's inference call once and freeze its weights."""
    specs = [tf.TensorSpec([None, image_size, image_size, 3], tf.float32, name="image")]
    names = output_names(model)

    def listed(outputs) -> list[tf.Tensor]:
        return [outputs[n] for n in names] if isinstance(outputs, dict) else [outputs]

    if side_width:
        specs.append(tf.TensorSpec([None, side_width], tf.float32, name="side"))
        traced = trace(lambda image, side: listed(model({"image": image, "side": side}, training=False)), specs)
    else:
        traced = trace(lambda image: listed(model(image, training=False)), specs)
    graph_def = _constants_for_variables(traced)
    inputs, outputs = [t.name for t in traced.inputs[: len(specs)]], [t.name for t in traced.outputs]

    def imported(*tensors: tf.Tensor) -> list[tf.Tensor]:
        return tf.graph_util.import_graph_def(
            graph_def, input_map=dict(zip(inputs, tensors)), return_elements=outputs, name="frozen"
        )

    return FrozenForward(graph_def, inputs, outputs, names, trace(imported, specs))


def trace(body: Callable, input_signature: list[tf.TensorSpec]) -> tf.types.experimental.ConcreteFunction:
    """Once, for these inputs, without AutoGraph (the graph code uses TF's own control flow)."""
    return tf.function(body, input_signature=input_signature, autograph=False).get_concrete_function()


def _constants_for_variables(traced: tf.types.experimental.ConcreteFunction) -> tf.compat.v1.GraphDef:
    """The GraphDef that `convert_variables_to_constants_v2` builds before it copies it into a new
    function; control flow kept as it is (as the LiteRT converter freezes)."""
    data = convert_to_constants._FunctionConverterDataInEager(
        func=traced, lower_control_flow=False, aggressive_inlining=False
    )
    graph_def, _ = convert_to_constants._replace_variables_by_constants(converter_data=data)
    return graph_def
