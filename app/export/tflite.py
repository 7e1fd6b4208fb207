"""LiteRT (TFLite) files of an export, and the parity check that decides whether they may serve.

Every export writes `litert/model_float32.tflite` (the fast CPU runtime: XNNPACK on every core,
`LiteRTModel`); float16 and int8 (calibrated on training images) are written on request, for phones.
Each file takes float32 [N, S, S, 3] images in 0..255 (what `decode_for_eval` gives) and returns
the same calibrated probabilities as the SavedModel. The parity check runs the file and the
SavedModel on the validation split (its first 64 images for float32); its result is stored in
the export's metadata under "litert", and a runtime refuses a file whose check failed or is missing.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tensorflow as tf

from app import storage
from app.data.pipeline import make_eval_dataset
from app.export import layout, parity
from app.export.frozen import FrozenForward
from app.export.saved_model import tensorflow_log_level

log = logging.getLogger(__name__)

CALIBRATION_IMAGES = 100
MODES = ("float32", "float16", "int8")
MAX_LANES = 8  # interpreters side by side at most: each holds its own copy of the packed weights
LANES_MARGIN = 0.95  # side by side must be at least 5% faster to be kept (the timing is short)


def cpu_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _Interpreter:
    """One interpreter with XNNPACK, called one image at a time (batch 1 was the fastest per
    image here, and never re-plans the graph). A model with side features has a second, 2-D
    input (the stored side vector), found by its rank; a model with an out-of-distribution
    score a second, 1-D output, found by its rank too."""

    def __init__(self, source: dict, threads: int) -> None:
        from ai_edge_litert.interpreter import Interpreter

        self.threads = threads
        self._interpreter = Interpreter(**source, num_threads=threads)
        inputs = self._interpreter.get_input_details()
        image_input = next(d for d in inputs if len(d["shape"]) == 4)
        self._input, self.image_shape = image_input["index"], tuple(int(n) for n in image_input["shape"][1:])
        self._side = next((d["index"] for d in inputs if len(d["shape"]) == 2), None)
        outputs = self._interpreter.get_output_details()
        self._output = next(d["index"] for d in outputs if len(d["shape"]) == 2)
        self._ood_score = next((d["index"] for d in outputs if len(d["shape"]) == 1), None)
        self.side_width = next((int(d["shape"][1]) for d in inputs if len(d["shape"]) == 2), 0)
        for d in inputs:
            self._interpreter.resize_tensor_input(d["index"], [1, *d["shape"][1:]])
        self._interpreter.allocate_tensors()

    def __call__(self, images: np.ndarray, side: np.ndarray | None = None) -> dict[str, np.ndarray]:
        probabilities, ood_scores = [], []
        for i, image in enumerate(images):
            self._interpreter.set_tensor(self._input, np.ascontiguousarray(image[None], dtype=np.float32))
            if self._side is not None:
                self._interpreter.set_tensor(self._side, np.ascontiguousarray(side[i : i + 1], dtype=np.float32))
            self._interpreter.invoke()
            probabilities.append(self._interpreter.get_tensor(self._output)[0].copy())
            if self._ood_score is not None:
                ood_scores.append(self._interpreter.get_tensor(self._ood_score)[0])
        outputs = {"probabilities": np.stack(probabilities) if probabilities else np.zeros((0, 0), np.float32)}
        if self._ood_score is not None:
            outputs["ood_score"] = np.array(ood_scores, np.float32)
        return outputs


class LiteRTModel:
    """The file's forward pass on the host's cores. A lone image runs on one interpreter with
    every thread; several images are split over interpreters of one thread each, run side by
    side, where that measured faster at load on this host (XNNPACK spreads one small image over
    threads less well than it runs one image a thread). The answers are the same either way, to
    the bit. Not thread-safe: one caller at a time."""

    def __init__(self, model: bytes | Path, threads: int | None = None) -> None:
        source = {"model_content": model} if isinstance(model, bytes) else {"model_path": str(model)}
        threads = threads or cpu_threads()
        self._whole = _Interpreter(source, threads)
        self._lanes: list[_Interpreter] = []
        self._pool: ThreadPoolExecutor | None = None
        lanes = min(threads, MAX_LANES)
        if lanes > 1:
            self._lanes = [_Interpreter(source, threads // lanes) for _ in range(lanes)]
            self._pool = ThreadPoolExecutor(lanes, thread_name_prefix="litert")
            if not self._lanes_faster():  # their memory goes: one interpreter serves every call
                self._pool.shutdown()
                self._lanes, self._pool = [], None
        self.side_by_side = len(self._lanes)  # interpreters that share a call of several images; 0: one does

    def _lanes_faster(self) -> bool:
        """Times both ways on the same noise pixels (two images a lane), alternating, best of 3."""
        shape = (2 * len(self._lanes), *self._whole.image_shape)
        images = np.random.default_rng(0).uniform(0, 255, shape).astype(np.float32)
        side = np.zeros((len(images), self._whole.side_width), np.float32) if self._whole.side_width else None
        best = {"whole": float("inf"), "lanes": float("inf")}
        for _ in range(3):
            for name, run in (("whole", self._whole), ("lanes", self._side_by_side)):
                start = time.perf_counter()
                run(images, side)
                best[name] = min(best[name], time.perf_counter() - start)
        return best["lanes"] < LANES_MARGIN * best["whole"]

    def _side_by_side(self, images: np.ndarray, side: np.ndarray | None = None) -> dict[str, np.ndarray]:
        parts = np.array_split(np.arange(len(images)), min(len(self._lanes), len(images)))
        results = list(self._pool.map(lambda lane, rows: lane(images[rows], None if side is None else side[rows]),
                                      self._lanes, parts))  # fmt: skip
        return {key: np.concatenate([r[key] for r in results]) for key in results[0]}

    def __call__(self, images: np.ndarray, side: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """float32 or uint8 [N, S, S, 3] (and the side vectors [N, F]) → {"probabilities" [N, C]
        (, "ood_score" [N])}."""
        if len(images) > 1 and self._lanes:
            return self._side_by_side(images, side)
        return self._whole(images, side)


def convert(forward: FrozenForward, image_size: int, mode: str, data_dir: str | None) -> bytes:
    """The model's frozen forward pass (`app.export.frozen`), converted from its GraphDef. The
    converter's concrete-function route freezes the function again and copies its graph op by op
    in Python (the same file, with the same dynamic batch dimension, more slowly); its SavedModel
    route saves and loads it back twice."""
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(forward.graph_def, name="")
    converter = tf.compat.v1.lite.TFLiteConverter(
        forward.graph_def,
        [graph.get_tensor_by_name(name) for name in forward.inputs],
        [graph.get_tensor_by_name(name) for name in forward.outputs],
    )
    _set_mode(converter, mode, data_dir, image_size)
    with warnings.catch_warnings(), tensorflow_log_level(logging.WARNING):  # "Using new converter: ..."
        # The graph route warns for int8 that the inputs' quantization statistics are missing;
        # the inputs stay float32 (quantized inside the file), so there are none to give.
        warnings.filterwarnings("ignore", "Statistics for quantized inputs were expected")
        tflite_model = converter.convert()
    return _with_serving_signature(tflite_model, forward.names)


def _with_serving_signature(tflite_model: bytes, names: list[str]) -> bytes:
    """The graph route writes no SignatureDef; add `serving_default` (inputs by their names,
    outputs by `names`: `probabilities`, then `ood_score`), which phones' signature runners call."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    flat = flatbuffer_utils.convert_bytearray_to_object(tflite_model)
    if flat.signatureDefs:
        return tflite_model
    graph = flat.subgraphs[0]

    def tensor_map(name: str, index: int) -> schema.TensorMapT:
        entry = schema.TensorMapT()
        entry.name, entry.tensorIndex = name, index
        return entry

    signature = schema.SignatureDefT()
    signature.signatureKey, signature.subgraphIndex = "serving_default", 0
    signature.inputs = [tensor_map(graph.tensors[i].name.decode(), i) for i in graph.inputs]
    signature.outputs = [tensor_map(name, index) for name, index in zip(names, graph.outputs)]
    flat.signatureDefs = [signature]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(flat))


def _set_mode(converter: tf.compat.v1.lite.TFLiteConverter, mode: str, data_dir: str | None, image_size: int) -> None:
    """float32 as is; float16 weights; int8 weights and activations with float in/out,
    calibrated on training images."""
    if mode == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif mode == "int8":

        def representative():
            ds = make_eval_dataset(data_dir, split="train", image_size=image_size, batch_size=1)
            for images, _ in ds.take(CALIBRATION_IMAGES):
                yield [tf.cast(images, tf.float32)]

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative


def parity_report(
    tflite_model: bytes, saved_model_dir: Path, data_dir: str, image_size: int, mode: str, tta: str = "none"
) -> dict:
    """The LiteRT file's parity check (app/export/parity.py)."""
    return parity.parity_report(LiteRTModel(tflite_model), saved_model_dir, data_dir, image_size, mode, tta)


def write_litert(
    forward: FrozenForward, version: Path, reference: parity.Reference, modes: list[str], side_width: int = 0
) -> dict:
    """Write each mode's file into the (staged) version folder → metadata["litert"]. Without
    validation data the check is recorded as missing, and the files will not be served."""
    result = {}
    for mode in modes:
        if side_width and mode == "int8":  # its calibration feeds images only
            result[mode] = {
                "passed": False,
                "missing": "not written: int8 LiteRT files of models with side features"
                " are not supported yet (float32 and float16 are)",
            }
            continue
        tflite_model = convert(forward, reference.image_size, mode, reference.data_dir)  # export_run's float32 graph
        layout.tflite_model_path(version, mode).parent.mkdir(parents=True, exist_ok=True)
        storage.write_bytes_atomic(layout.tflite_model_path(version, mode), tflite_model)
        result[mode] = {
            "file": str(layout.tflite_model_path(version, mode).relative_to(version)),
            **reference.check(LiteRTModel(tflite_model), mode),
        }
    return {"litert": result}
