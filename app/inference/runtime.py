"""What runs an export: its SavedModel through TensorFlow, its LiteRT file with XNNPACK, its
OpenVINO IR, or its ONNX file through ONNX Runtime.

All give the SavedModel's signatures (serving_default, serving_keyed, predict_images) with the
same outputs, so the server, evaluation and batch prediction choose a runtime with one flag:

- `tf`: the SavedModel, exactly what TF Serving runs.
- `litert`: `litert/model_<mode>.tflite` with XNNPACK. Images are decoded on the host by
  `app.data.preprocess.decode_batch`, the function inside the SavedModel's graph, so there is one
  preprocessing. Refused, saying why, when the export's parity check failed or is missing.
- `openvino`: `openvino/model.xml`, decoded the same way, compiled for this CPU in bfloat16 where
  the CPU has it and that precision's check passed, else float32; refused like LiteRT.
- `onnx`: `onnx/model.onnx` through ONNX Runtime on the CPU, decoded the same way; refused like LiteRT.
- `auto`: each runtime that may serve is timed on a batch as it loads, and the fastest serves; the
  log says which, the figures, and why any was refused. TensorFlow when a GPU is visible.
  Measured: benchmarks/README.md, "Serving".
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.cli import RUNTIME_CHOICES
from app.data import side_features
from app.data.image_header import DEFAULT_MAX_MEGAPIXELS, ImageRejected, check_size
from app.data.preprocess import DEFAULT_CROP_FRACTION, decode_batch
from app.errors import UserError
from app.export import layout
from app.export.onnx_model import ONNXModel, onnx_available
from app.export.openvino_ir import OpenVINOModel, host_precisions
from app.export.parity import refusal as parity_refusal
from app.export.parity import unknown_threshold
from app.export.side_inputs import column_specs
from app.export.tflite import LiteRTModel
from app.inference import runtime_choice
from app.models.tta import with_tta

RUNTIMES = RUNTIME_CHOICES
log = logging.getLogger(__name__)


Outputs = dict[str, np.ndarray]


def host_decoder(version: Path, metadata: dict | None = None):
    """The export's own decoding (size, crop, pixel limit from its metadata) as a host function:
    string [N] → uint8 [N, S, S, 3]."""
    metadata = layout.read_metadata(version) if metadata is None else metadata
    size, max_mp = int(metadata["input_size"]), float(metadata.get("max_megapixels", DEFAULT_MAX_MEGAPIXELS))
    decode = tf.function(
        lambda b: decode_batch(b, size, DEFAULT_CROP_FRACTION, max_mp),
        input_signature=[tf.TensorSpec([None], tf.string)],
        autograph=False,
    )
    return lambda image_bytes: decode(tf.constant(image_bytes)).numpy()


class TFRuntime:
    name = "tf"

    def __init__(self, version: Path) -> None:
        self.version = Path(version)
        self._module = tf.saved_model.load(str(version))
        self._decode = None
        self.unknown_threshold = unknown_threshold(layout.read_metadata(version))

    def decode(self, image_bytes: np.ndarray) -> np.ndarray:
        """Host-side decoding, only for TTA around predict_images (the graph decodes by itself)."""
        self._decode = self._decode or host_decoder(self.version)
        return self._decode(image_bytes)

    def signatures(self) -> dict[str, tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec]]]:
        return {
            name: (fn.structured_input_signature[1], fn.structured_outputs)
            for name, fn in self._module.signatures.items()
        }

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> Outputs:
        fn = self._module.signatures[signature]
        return {k: v.numpy() for k, v in fn(**{k: tf.constant(v) for k, v in inputs.items()}).items()}


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


def tiny_jpeg() -> bytes:
    return tf.io.encode_jpeg(tf.zeros([8, 8, 3], tf.uint8)).numpy()


def missing_side_inputs(runtime: TFRuntime | HostRuntime, count: int) -> dict[str, np.ndarray]:
    """Every serving_default input besides the image (a side-features model's columns), given
    as missing: NaN for a number, "" for a category."""
    specs = runtime.signatures()["serving_default"][0]
    return side_arrays(
        runtime,
        {
            name: [np.nan if spec.dtype == tf.float32 else ""] * count
            for name, spec in specs.items()
            if name != "image_bytes"
        },
    )


def warm_up(runtime: TFRuntime | HostRuntime) -> None:
    """One call before the first request, which would otherwise pay for tracing."""
    runtime.run(
        "serving_default", {"image_bytes": np.array([tiny_jpeg()], dtype=object), **missing_side_inputs(runtime, 1)}
    )


def side_arrays(runtime: TFRuntime | HostRuntime, side: dict[str, list]) -> dict[str, np.ndarray]:
    """Raw side-feature values (numbers, category names) → the arrays serving_default takes."""
    specs = runtime.signatures()["serving_default"][0]
    return {
        name: np.array(values, np.float32)
        if specs[name].dtype == tf.float32
        else np.array([str(v).encode() for v in values], dtype=object)
        for name, values in side.items()
    }


ANSWER_KEYS = ("probabilities", "ood_score", "unknown")  # what offline work keeps of each image's outputs


def _answers(
    runtime: TFRuntime | HostRuntime, images: list[bytes], tta: str, side: dict[str, list] | None = None
) -> Outputs:
    """The batch's probabilities (and, where the export has them, ood_score and unknown)."""
    if tta == "none":
        inputs = {"image_bytes": np.array(images, dtype=object), **side_arrays(runtime, side or {})}
        outputs = runtime.run("serving_default", inputs)
        return {k: outputs[k] for k in ANSWER_KEYS if k in outputs}
    pixels = runtime.decode(np.array(images, dtype=object)).astype(np.float32)
    keys = ("probabilities", "ood_score")
    outputs = with_tta(
        lambda x: {k: v for k, v in runtime.run("predict_images", {"images": x}).items() if k in keys}, pixels, tta
    )
    if "ood_score" in outputs and runtime.unknown_threshold is not None:  # the averaged score, the export's threshold
        outputs["unknown"] = outputs["ood_score"] > runtime.unknown_threshold
    return outputs


def answers_or_reasons(
    runtime: TFRuntime | HostRuntime,
    images: list[bytes],
    max_megapixels: float,
    tta: str = "none",
    side: dict[str, list] | None = None,
) -> list[dict[str, np.ndarray] | str]:
    """Per image: its answer ({"probabilities"[, "ood_score", "unknown"]}), or why it was refused
    (the header check's words, else "undecodable"). For offline work (evaluation, batch
    prediction); `tta` adds test-time augmentation around the export's predict_images; `side`
    holds each side feature's raw values, one per image, for a model that takes them.

    The batch goes to the export as it is: its decode refuses a header over the pixel limit
    before decoding anything, so a bomb costs nothing. Only a refused batch is taken apart, one
    image at a time, so one bad image never costs the others their answer and each gets its
    reason; a batch of good photos pays for one header read each, not two.
    """
    if not images:
        return []
    side = side or {}
    try:
        outputs = _answers(runtime, images, tta, side)
        return [{k: v[i] for k, v in outputs.items()} for i in range(len(images))]
    except tf.errors.InvalidArgumentError:
        if len(images) > 1:
            return [
                answers_or_reasons(runtime, [image], max_megapixels, tta, {k: [v[i]] for k, v in side.items()})[0]
                for i, image in enumerate(images)
            ]
    try:
        check_size(images[0], max_megapixels)
    except ImageRejected as err:
        return [str(err)]
    return ["undecodable"]


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


def _gpu_visible() -> str | None:
    return "a GPU is visible, and TensorFlow runs on it" if tf.config.list_physical_devices("GPU") else None


def load_runtime(
    version: Path, runtime: str = "auto", litert_mode: str = "float32", batch: int | None = None
) -> TFRuntime | HostRuntime:
    """`auto`: of the runtimes that may serve this export on this host, the one measured fastest
    on `batch` photos a call (the caller's own batch: a server's few, an offline command's many;
    default TIMING_BATCH), measured once per export and host (app.inference.runtime_choice);
    TensorFlow when a GPU is visible (the others run on the CPU)."""
    if runtime not in RUNTIMES:
        raise UserError(f"--runtime must be one of {RUNTIMES}, got '{runtime}'")
    if runtime == "auto" and (gpu := _gpu_visible()):
        log.info("%s: runtime auto: TensorFlow (%s)", version, gpu)
        runtime = "tf"
    if runtime != "auto":
        loaded = _load(version, runtime, litert_mode)
        warm_up(loaded)
        return loaded
    batch = batch or TIMING_BATCH
    key = runtime_choice.choice_key(version, batch, litert_mode)
    return _remembered(version, key, litert_mode) or _measured(version, key, litert_mode, batch)


def _remembered(version: Path, key: str, litert_mode: str) -> TFRuntime | HostRuntime | None:
    """The runtime an earlier command measured fastest for this export on this host, loaded; None
    where there is none, or it may no longer serve."""
    found = runtime_choice.recall(key)
    if found is None:
        return None
    try:
        loaded = _load(version, found["runtime"], litert_mode)
    except UserError:
        return None
    warm_up(loaded)
    log.info("%s: runtime auto: %s, measured fastest on this host on %s (ms per photo, %s); kept in %s",
             version, runtime_label(loaded), found.get("measured"), found.get("figures"),
             runtime_choice.choices_path())  # fmt: skip
    return loaded


def _measured(version: Path, key: str, litert_mode: str, batch: int) -> TFRuntime | HostRuntime:
    """Each runtime that may serve, loaded, then timed in turn over TIMING_ROUNDS rounds (A B C A B
    C ..., so that the machine's drift falls on all of them); the fastest by its best round (a burst of
    other work on the machine slows some rounds, never speeds one up)."""
    candidates, refusals = [], []
    for name in ("tf", "litert", "openvino", "onnx"):
        try:
            candidates.append(_load(version, name, litert_mode))
        except UserError as err:
            refusals.append(str(err))
    inputs = _timing_inputs(candidates[0], batch)
    for candidate in candidates:
        candidate.run("serving_default", inputs)  # its first call, untimed
    times = [[_ms_per_photo(c, inputs) for c in candidates] for _ in range(TIMING_ROUNDS)]
    timed = sorted((min(column), runtime_label(c)) for c, column in zip(candidates, zip(*times)))
    chosen = next(c for c in candidates if runtime_label(c) == timed[0][1])
    said = f"{batch} at a time: " + ", ".join(f"{label} {ms:.1f}" for ms, label in timed)
    runtime_choice.remember(key, chosen.name, runtime_label(chosen), said)
    refused = f"; {'; '.join(refusals)}" if refusals else ""
    log.info("%s: runtime auto: %s, the fastest that may serve (ms per photo, %s)%s",
             version, runtime_label(chosen), said, refused)  # fmt: skip
    return chosen


TIMING_BATCH = 8  # photos per call when auto times the runtimes for a server: its batch under a few clients
TIMING_ROUNDS = 5  # calls timed of each runtime, in turn: measured once per export and host, so it can be thorough


def _load(version: Path, runtime: str, litert_mode: str) -> TFRuntime | HostRuntime:
    if runtime == "tf":
        return TFRuntime(version)
    if runtime == "litert":
        return LiteRTRuntime(version, litert_mode)
    return OpenVINORuntime(version) if runtime == "openvino" else ONNXRuntime(version)


def runtime_label(runtime: TFRuntime | HostRuntime) -> str:
    """The runtime and, for a file beside the SavedModel, its precision: what a log or report names."""
    return runtime.name if runtime.name == "tf" else f"{runtime.name} {runtime.mode}"


def _timing_inputs(runtime: TFRuntime | HostRuntime, batch: int) -> dict[str, np.ndarray]:
    """serving_default's inputs for `batch` photo-sized JPEGs (noise: every pixel decoded)."""
    noise = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    jpeg = tf.io.encode_jpeg(noise).numpy()
    return {"image_bytes": np.array([jpeg] * batch, dtype=object), **missing_side_inputs(runtime, batch)}


def _ms_per_photo(runtime: TFRuntime | HostRuntime, inputs: dict[str, np.ndarray]) -> float:
    """One timed call of serving_default on `inputs`."""
    start = time.perf_counter()
    runtime.run("serving_default", inputs)
    return (time.perf_counter() - start) * 1000 / len(inputs["image_bytes"])
