"""The OpenVINO IR of an export (`openvino/model.xml` and `.bin`) and its parity checks.

The IR holds the model's frozen forward pass, as the LiteRT file does: float32 images
[N, S, S, 3] in 0..255 (decoded, resized pixels: the IR has no JPEG decode, so its runtime decodes
with the export's own `app.data.preprocess.decode_batch`) and, for a model with side features,
the side vectors [N, F]; the calibrated probabilities [N, C] (and the "none of these" score [N])
out. Its weights are float32; the precision is chosen as it is compiled: float32 on every CPU,
bfloat16 where the CPU has bfloat16 instructions. Each precision the exporting host can run is
checked against the SavedModel on the validation split (app/export/parity.py), into the export's
metadata under "openvino"; its runtime runs only a precision whose check passed.
"""

from __future__ import annotations

from pathlib import Path

from app.export import layout, parity
from app.export.file_runners import OpenVINOModel, host_precisions
from app.export.frozen import FrozenForward


def convert(forward: FrozenForward) -> object:
    """The frozen GraphDef as an OpenVINO model, its inputs named image (and side) and its outputs
    as the SavedModel names them."""
    import openvino

    model = openvino.convert_model(forward.graph_def)
    for port, name in zip(model.inputs, (n.split(":")[0] for n in forward.inputs)):
        port.get_tensor().set_names({name})
    for port, name in zip(model.outputs, forward.names):
        port.get_tensor().set_names({name})
    return model


def write_openvino(forward: FrozenForward, version: Path, reference: parity.Reference) -> dict:
    """Write the IR into the (staged) version folder and check each precision this host runs →
    metadata["openvino"]. Without the openvino package nothing is written, and it says why."""
    precisions = host_precisions()
    if not precisions:
        return {"openvino": {"missing": "not written: the openvino package is not installed"}}
    import openvino

    model = convert(forward)
    path = layout.openvino_model_path(version)
    path.parent.mkdir(parents=True, exist_ok=True)
    openvino.save_model(model, str(path), compress_to_fp16=False)
    checks = {p: reference.check(OpenVINOModel(model, p), p) for p in precisions}
    return {"openvino": {"file": str(path.relative_to(version)), **checks}}
