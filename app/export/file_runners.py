"""The export's IR and ONNX files run on this host's CPU: OpenVINO and ONNX Runtime, without
TensorFlow, so a host that serves or measures them needs neither TensorFlow nor the exporters
(app/export/openvino_ir.py and app/export/onnx_model.py write and check the files). Both take
float32 images [N, S, S, 3] in 0..255 (and, for a model with side features, the side vectors
[N, F]) and answer {output name: array}.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HINTS = {"float32": "f32", "bfloat16": "bf16"}  # a precision's name here → OpenVINO's inference precision hint


def host_precisions() -> tuple[str, ...]:
    """The precisions this host's CPU runs natively; () without the openvino package."""
    try:
        import openvino
    except ImportError:
        return ()
    capabilities = openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return ("float32", "bfloat16") if "BF16" in capabilities else ("float32",)


def compile_for_cpu(model: object, precision: str, threads: int | None = None) -> object:
    """`model` compiled for this CPU in `precision`, one stream over every core, or over `threads`
    of them (the latency hint): its callers run one batch at a time."""
    import openvino

    config = {"INFERENCE_PRECISION_HINT": HINTS[precision], "PERFORMANCE_HINT": "LATENCY"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    return openvino.Core().compile_model(model, "CPU", config)


class OpenVINOModel:
    """The IR compiled for this CPU in one precision (`compile_for_cpu`). Not thread-safe: one
    caller at a time."""

    def __init__(self, model: Path | object, precision: str = "float32", threads: int | None = None) -> None:
        import openvino

        model = openvino.Core().read_model(str(model)) if isinstance(model, Path) else model
        compiled = compile_for_cpu(model, precision, threads)
        self._request = compiled.create_infer_request()
        self._side = next((i.get_any_name() for i in compiled.inputs if i.get_any_name() == "side"), None)
        self._outputs = [(o.get_any_name(), o) for o in compiled.outputs]

    def __call__(self, images: np.ndarray, side: np.ndarray | None = None) -> dict[str, np.ndarray]:
        inputs = {"image": np.ascontiguousarray(images, np.float32)}
        if self._side is not None:
            inputs["side"] = np.ascontiguousarray(side, np.float32)
        results = self._request.infer(inputs)
        return {name: np.array(results[output], np.float32) for name, output in self._outputs}


class ONNXModel:
    """An ONNX file run by ONNX Runtime on the CPU. ONNX Runtime's sessions may be called from
    several threads."""

    def __init__(self, model: Path | bytes, threads: int | None = None) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        source = str(model) if isinstance(model, Path) else model
        self._session = onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        self._side = any(i.name == "side" for i in self._session.get_inputs())
        self._names = [o.name for o in self._session.get_outputs()]

    def __call__(self, images: np.ndarray, side: np.ndarray | None = None) -> dict[str, np.ndarray]:
        inputs = {"image": np.ascontiguousarray(images, np.float32)}
        if self._side:
            inputs["side"] = np.ascontiguousarray(side, np.float32)
        return dict(zip(self._names, self._session.run(self._names, inputs)))
