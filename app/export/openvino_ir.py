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

import numpy as np

from app.export import layout, parity
from app.export.frozen import FrozenForward

HINTS = {"float32": "f32", "bfloat16": "bf16"}  # a precision's name here → OpenVINO's inference precision hint


def host_precisions() -> tuple[str, ...]:
    """The precisions this host's CPU runs natively; () without the openvino package."""
    try:
        import openvino
    except ImportError:
        return ()
    capabilities = openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return ("float32", "bfloat16") if "BF16" in capabilities else ("float32",)


def compile_for_cpu(model: object, precision: str) -> object:
    """`model` compiled for this CPU in `precision`, one stream over every core (the latency hint):
    its callers run one batch at a time."""
    import openvino

    config = {"INFERENCE_PRECISION_HINT": HINTS[precision], "PERFORMANCE_HINT": "LATENCY"}
    return openvino.Core().compile_model(model, "CPU", config)


class OpenVINOModel:
    """The IR compiled for this CPU in one precision (`compile_for_cpu`). Not thread-safe: one
    caller at a time."""

    def __init__(self, model: Path | object, precision: str = "float32") -> None:
        import openvino

        model = openvino.Core().read_model(str(model)) if isinstance(model, Path) else model
        compiled = compile_for_cpu(model, precision)
        self._request = compiled.create_infer_request()
        self._side = next((i.get_any_name() for i in compiled.inputs if i.get_any_name() == "side"), None)
        self._outputs = [(o.get_any_name(), o) for o in compiled.outputs]

    def __call__(self, images: np.ndarray, side: np.ndarray | None = None) -> dict[str, np.ndarray]:
        inputs = {"image": np.ascontiguousarray(images, np.float32)}
        if self._side is not None:
            inputs["side"] = np.ascontiguousarray(side, np.float32)
        results = self._request.infer(inputs)
        return {name: np.array(results[output], np.float32) for name, output in self._outputs}


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


def write_openvino(forward: FrozenForward, version: Path, image_size: int, data_dir: str | None, tta: str) -> dict:
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
    checks = {p: parity.checked(OpenVINOModel(model, p), version, data_dir, image_size, p, tta) for p in precisions}
    return {"openvino": {"file": str(path.relative_to(version)), **checks}}
