"""The ONNX file of an export (`onnx/model.onnx`) and its parity check.

The file holds the model's frozen forward pass, as the LiteRT file and the OpenVINO IR do,
converted by tf2onnx (what Keras 3's own ONNX exporter calls for the TensorFlow backend) from the
same frozen GraphDef. Its input contract: `image`, float32 [N, S, S, 3], decoded and resized
pixels in 0..255 (ONNX has no JPEG decode: decode with the export's own
`app.data.preprocess.decode_batch`, or any decoder that centre-crops the same way) and, for a
model with side features, `side` [N, F]; out `probabilities` [N, C] (calibrated) and, where the
export has "none of these", `ood_score` [N]. It is checked against the SavedModel on the
validation split (app/export/parity.py) into the export's metadata under "onnx"; its runtime (ONNX
Runtime, CPU) runs it only where the check passed.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from app import storage
from app.export import layout, parity
from app.export.file_runners import ONNXModel
from app.export.frozen import FrozenForward

OPSET = 17  # supported by every ONNX Runtime of the last three years


def onnx_available() -> str | None:
    """None where ONNX files can be written and run here, else why not."""
    try:
        import onnxruntime  # noqa: F401
        import tf2onnx  # noqa: F401
    except ImportError as err:
        return f"the {err.name} package is not installed"
    return None


def convert(forward: FrozenForward) -> bytes:
    """The frozen GraphDef as a serialized ONNX model, its inputs named image (and side) and its
    outputs as the SavedModel names them."""
    logging.getLogger("tf2onnx").setLevel(logging.WARNING)  # its INFO lines (opset, optimizer counts)
    try:
        proto = _from_graph_def(forward, catch_errors=False)
    except Exception:  # an optimizer failed: tf2onnx's own default skips it and goes on
        proto = _from_graph_def(forward, catch_errors=True)
    gc.collect()  # tf2onnx leaves its working graphs in reference cycles: about its own peak, freed now
    renames = {**{n: n.split(":")[0] for n in forward.inputs}, **dict(zip(forward.outputs, forward.names))}
    for value in [*proto.graph.input, *proto.graph.output]:
        old = value.name
        value.name = renames.get(old, old)
        for node in proto.graph.node:
            node.input[:] = [value.name if i == old else i for i in node.input]
            node.output[:] = [value.name if o == old else o for o in node.output]
    return proto.SerializeToString()


def _from_graph_def(forward: FrozenForward, catch_errors: bool):
    """tf2onnx's conversion. Catching errors, its default, deep-copies the whole graph, weights
    and all, before every optimizer pass: most of the conversion's time. Without it an optimizer
    that fails raises instead of being skipped, so `convert` tries that first and falls back.
    tf2onnx reads the switch from the environment only, and catches wherever it is unset (set to
    anything, even "TRUE", it does not catch)."""
    import tf2onnx
    from tensorflow.python.util import deprecation

    switch = None if catch_errors else "FALSE"
    # deprecation.silence: the TF1 APIs tf2onnx calls would each warn of their deprecation
    with _environment(tf2onnx.constants.ENV_TF2ONNX_CATCH_ERRORS, switch), deprecation.silence():
        proto, _ = tf2onnx.convert.from_graph_def(
            forward.graph_def, input_names=forward.inputs, output_names=forward.outputs, opset=OPSET
        )
    return proto


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """$name set to value (unset for None) within the block, as it was after."""
    before = os.environ.get(name)
    os.environ.pop(name, None)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)
        if before is not None:
            os.environ[name] = before


def write_onnx(forward: FrozenForward, version: Path, reference: parity.Reference) -> dict:
    """Write the ONNX file into the (staged) version folder and check it → metadata["onnx"].
    Without tf2onnx and onnxruntime nothing is written, and it says why."""
    missing = onnx_available()
    if missing:
        return {"onnx": {"missing": f"not written: {missing}"}}
    model = convert(forward)
    path = layout.onnx_model_path(version)
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_bytes_atomic(path, model)
    report = reference.check(ONNXModel(model), "float32")
    return {"onnx": {"file": str(path.relative_to(version)), "input": "image: float32 [N, S, S, 3], 0..255",
                     "float32": report}}  # fmt: skip
