"""The runtimes that run a file beside the SavedModel (LiteRT, OpenVINO IR, ONNX): decoded pixels
in, so the images are decoded on the host by the export's own decoding
(`app.data.preprocess.decode_batch`, the function inside the SavedModel's graph), and top-k,
labels and thresholds taken as the export's graph takes them. Each refuses, saying why, a file
whose parity check against the SavedModel failed or is missing (app/export/parity.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from app.data import side_features
from app.data.image_header import DEFAULT_MAX_MEGAPIXELS
from app.data.preprocess import DEFAULT_CROP_FRACTION, batch_decoder
from app.errors import UserError
from app.export import layout
from app.export.file_runners import ONNXModel, OpenVINOModel, host_precisions
from app.export.onnx_model import onnx_available
from app.export.parity import refusal as parity_refusal
from app.export.parity import unknown_threshold
from app.export.side_inputs import column_specs
from app.export.tflite import LiteRTModel
from app.models.tta import with_tta

Outputs = dict[str, np.ndarray]


def host_decoder(version: Path, metadata: dict | None = None):
    """The export's own decoding (size, crop, pixel limit from its metadata) as a host function:
    string [N] → uint8 [N, S, S, 3]."""
    metadata = layout.read_metadata(version) if metadata is None else metadata
    size, max_mp = int(metadata["input_size"]), float(metadata.get("max_megapixels", DEFAULT_MAX_MEGAPIXELS))
    decode = batch_decoder(size, DEFAULT_CROP_FRACTION, max_mp)
    return lambda image_bytes: decode(tf.constant(image_bytes)).numpy()


class HostRuntime:
    """A file beside the SavedModel that takes decoded pixels (`model`: images [, side vectors] →
    {"probabilities"[, "ood_score"]}), given the SavedModel's signatures: the images are decoded
    on the host by the export's own decoding, and top-k, labels and thresholds are taken here as
    the export's graph takes them."""

    name = "host"

    def __init__(self, version: Path, metadata: dict, model) -> None:
        self.version = Path(version)
        self.classes = layout.read_classes(version)
        self._model = model
        self.top_k = int(metadata.get("top_k", min(5, len(self.classes))))
        self.thresholds = metadata.get("thresholds")  # a multi-label export's: its graph's labels_above_threshold
        self.unknown_threshold = unknown_threshold(metadata)
        self.side_features = metadata.get("side_features", [])
        self._specs = _signature_specs(
            int(metadata["input_size"]),
            len(self.classes),
            self.top_k,
            bool(self.thresholds),
            self.side_features,
            self.unknown_threshold is not None,
        )
        self.tta = metadata.get("tta", "none")  # baked into the export's graph: applied here the same way
        self.decode = host_decoder(version, metadata)
        self._class_names = np.array([c.encode() for c in self.classes], dtype=object)

    def signatures(self) -> dict[str, tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec]]]:
        return self._specs

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> Outputs:
        if signature not in self._specs:
            raise KeyError(signature)
        if signature == "predict_images":
            images, side = np.asarray(inputs["images"], np.float32), inputs.get("side")
        else:
            images, side = self.decode(inputs["image_bytes"]), self._side_vectors(inputs)
        outputs = self._top_k(with_tta(lambda x: self._model(x, side), images, self.tta))
        return {**outputs, "key": inputs["key"]} if signature == "serving_keyed" else outputs

    def _side_vectors(self, inputs: dict[str, np.ndarray]) -> np.ndarray | None:
        """Raw side-feature values → the stored vectors, by the converter's own encoding (the
        SavedModel's graph does the same lookup with its tables)."""
        if not self.side_features:
            return None

        def cell(value) -> str:
            return value.decode() if isinstance(value, bytes) else str(value)  # NaN → "nan": missing

        rows = zip(*(inputs[c["name"]] for c in self.side_features))
        return np.array(
            [side_features.encode(self.side_features, tuple(cell(v) for v in row))[0] for row in rows], np.float32
        )

    def _top_k(self, forward: Outputs) -> Outputs:
        probabilities = forward["probabilities"]
        class_ids = np.argsort(-probabilities, axis=1, kind="stable")[:, : self.top_k].astype(np.int32)
        outputs = {
            "probabilities": probabilities,
            "class_ids": class_ids,
            "classes": self._class_names[class_ids],
            "scores": np.take_along_axis(probabilities, class_ids, axis=1),
        }
        if self.thresholds:
            outputs["labels_above_threshold"] = self._above_threshold(probabilities)
        if "ood_score" in forward and self.unknown_threshold is not None:  # as the export's graph
            outputs["ood_score"] = forward["ood_score"]
            outputs["unknown"] = forward["ood_score"] > self.unknown_threshold
        return outputs

    def _above_threshold(self, probabilities: np.ndarray) -> np.ndarray:
        return above_threshold(probabilities, self.thresholds, self._class_names)


class LiteRTRuntime(HostRuntime):
    name = "litert"

    def __init__(self, version: Path, mode: str = "float32", threads: int | None = None) -> None:
        metadata = layout.read_metadata(version)
        refusal = litert_refusal(version, mode, metadata)
        if refusal:
            raise UserError(f"{version}: cannot serve with LiteRT: {refusal}")
        self.mode = mode
        super().__init__(version, metadata, LiteRTModel(layout.tflite_model_path(version, mode), threads))


class OpenVINORuntime(HostRuntime):
    """The export's OpenVINO IR, in the fastest precision this host runs whose check passed
    (bfloat16 before float32)."""

    name = "openvino"

    def __init__(self, version: Path) -> None:
        metadata = layout.read_metadata(version)
        precision, refusal = openvino_precision(version, metadata)
        if refusal:
            raise UserError(f"{version}: cannot serve with OpenVINO: {refusal}")
        self.mode = precision
        super().__init__(version, metadata, OpenVINOModel(layout.openvino_model_path(version), precision))


class ONNXRuntime(HostRuntime):
    """The export's ONNX file through ONNX Runtime's CPU provider, float32."""

    name = "onnx"

    def __init__(self, version: Path) -> None:
        metadata = layout.read_metadata(version)
        refusal = onnx_refusal(version, metadata)
        if refusal:
            raise UserError(f"{version}: cannot serve with ONNX Runtime: {refusal}")
        self.mode = "float32"
        super().__init__(version, metadata, ONNXModel(layout.onnx_model_path(version)))


def onnx_refusal(version: Path, metadata: dict) -> str | None:
    """Why the export's ONNX file must not serve here, or None when it may."""
    checks = metadata.get("onnx") or {}
    if not layout.onnx_model_path(version).is_file():
        return checks.get("missing") or "no onnx/model.onnx (export it again with photoclf export)"
    return onnx_available() or parity_refusal(checks.get("float32"), "ONNX float32")


def openvino_precision(version: Path, metadata: dict) -> tuple[str | None, str | None]:
    """(the precision the export's IR runs in on this host, None) or (None, why it may not)."""
    checks = metadata.get("openvino") or {}
    if not layout.openvino_model_path(version).is_file():
        return None, checks.get("missing") or "no openvino/model.xml (export it again with photoclf export)"
    host = host_precisions()
    if not host:
        return None, "the openvino package is not installed"
    refusals = {p: parity_refusal(checks.get(p), f"OpenVINO {p}") for p in reversed(host)}
    passed = next((p for p, why in refusals.items() if why is None), None)
    return (passed, None) if passed else (None, "; ".join(refusals.values()))


def above_threshold(probabilities: np.ndarray, thresholds: list[float], class_names: np.ndarray) -> np.ndarray:
    """As the export's graph computes labels_above_threshold: per image the labels at or above
    their thresholds, by score, then b"" (for LiteRT, and batch prediction's column)."""
    above = probabilities >= np.asarray(thresholds)[None, :]
    order = np.argsort(-np.where(above, probabilities, probabilities - 2.0), axis=1, kind="stable")
    names = class_names[order]
    names[~np.take_along_axis(above, order, axis=1)] = b""
    return names


def _signature_specs(
    size: int, num_classes: int, k: int, multi_label: bool = False, side: list[dict] | None = None, ood: bool = False
) -> dict:
    outputs = {
        "probabilities": tf.TensorSpec([None, num_classes], tf.float32, "probabilities"),
        "class_ids": tf.TensorSpec([None, k], tf.int32, "class_ids"),
        "classes": tf.TensorSpec([None, k], tf.string, "classes"),
        "scores": tf.TensorSpec([None, k], tf.float32, "scores"),
    }
    if multi_label:
        outputs["labels_above_threshold"] = tf.TensorSpec([None, num_classes], tf.string, "labels_above_threshold")
    if ood:
        outputs["ood_score"] = tf.TensorSpec([None], tf.float32, "ood_score")
        outputs["unknown"] = tf.TensorSpec([None], tf.bool, "unknown")
    image_bytes, key = tf.TensorSpec([None], tf.string, "image_bytes"), tf.TensorSpec([None], tf.string, "key")
    columns = {spec.name: spec for spec in column_specs(side or [])}
    vector = {"side": tf.TensorSpec([None, len(side)], tf.float32, "side")} if side else {}
    return {
        "serving_default": ({"image_bytes": image_bytes, **columns}, outputs),
        "serving_keyed": ({"image_bytes": image_bytes, **columns, "key": key}, {**outputs, "key": key}),
        "predict_images": ({"images": tf.TensorSpec([None, size, size, 3], tf.float32, "images"), **vector}, outputs),
    }


def litert_refusal(version: Path, mode: str, metadata: dict | None = None) -> str | None:
    """Why this export's LiteRT file of `mode` must not serve, or None when it may."""
    metadata = layout.read_metadata(version) if metadata is None else metadata
    parity = (metadata.get("litert") or {}).get(mode)
    if parity and not layout.tflite_model_path(version, mode).is_file() and parity.get("missing"):
        return f"no {mode} LiteRT file ({parity['missing']})"  # e.g. int8 of a model with side features
    if not layout.tflite_model_path(version, mode).is_file():
        return (
            f"no {layout.tflite_model_path(version, mode).relative_to(version)} (export it again with photoclf export)"
        )
    return parity_refusal(parity, mode)
