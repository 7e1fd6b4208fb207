"""What runs an export: its SavedModel through TensorFlow, its LiteRT file with XNNPACK, its
OpenVINO IR, or its ONNX file through ONNX Runtime.

All give the SavedModel's signatures (serving_default, serving_keyed, predict_images) with the
same outputs, so the server, evaluation and batch prediction choose a runtime with one flag:

- `tf`: the SavedModel, exactly what TF Serving runs.
- `litert`: `litert/model_<mode>.tflite` with XNNPACK (app.inference.host_runtimes, as the next two).
  Images are decoded on the host by `app.data.preprocess.decode_batch`, the function inside the
  SavedModel's graph, so there is one preprocessing. Refused, saying why, when the export's parity
  check failed or is missing.
- `openvino`: `openvino/model.xml`, decoded the same way, compiled for this CPU in bfloat16 where
  the CPU has it and that precision's check passed, else float32; refused like LiteRT.
- `onnx`: `onnx/model.onnx` through ONNX Runtime on the CPU, decoded the same way; refused like LiteRT.
- `auto`: each runtime that may serve is timed on a batch as it loads (its model's pass on the
  same decoded pixels), and the fastest serves; the log says which, the figures, and why any
  was refused. Remembered per export and host
  (app.inference.runtime_choice). TensorFlow when a GPU is visible. Measured: benchmarks/README.md,
  "Serving" and "Offline commands".
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.cli import RUNTIME_CHOICES
from app.data.convert import ImageRejected as Unconvertible
from app.data.convert import TooLarge, convert_image
from app.data.image_header import UNRECOGNISED, ImageRejected, check_size, max_pixels
from app.errors import UserError
from app.export import layout
from app.export.parity import unknown_threshold
from app.inference import runtime_choice
from app.inference.host_runtimes import HostRuntime, LiteRTRuntime, ONNXRuntime, OpenVINORuntime, host_decoder
from app.models.tta import with_tta

RUNTIMES = RUNTIME_CHOICES
log = logging.getLogger(__name__)


Outputs = dict[str, np.ndarray]


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


def tiny_jpeg() -> bytes:
    return tf.io.encode_jpeg(tf.zeros([8, 8, 3], tf.uint8)).numpy()


def warm_up(runtime: TFRuntime | HostRuntime) -> None:
    """One call before the first request, which would otherwise pay for tracing."""
    runtime.run(
        "serving_default", {"image_bytes": np.array([tiny_jpeg()], dtype=object), **side_arrays(runtime, {}, 1)}
    )


def side_arrays(runtime: TFRuntime | HostRuntime, side: dict[str, list], count: int) -> dict[str, np.ndarray]:
    """Raw side-feature values (numbers, category names) → the arrays serving_default takes, for
    every side column it takes: one not in `side` is given as missing (NaN for a number, "" for a
    category) for each of the `count` images."""
    arrays = {}
    for name, spec in runtime.signatures()["serving_default"][0].items():
        if name == "image_bytes":
            continue
        number = spec.dtype == tf.float32
        values = side.get(name, [np.nan if number else ""] * count)
        arrays[name] = np.array(values, np.float32) if number else np.array([str(v).encode() for v in values], object)
    return arrays


ANSWER_KEYS = ("probabilities", "ood_score", "unknown")  # what offline work keeps of each image's outputs


def _answers(
    runtime: TFRuntime | HostRuntime, images: list[bytes], tta: str, side: dict[str, list] | None = None
) -> Outputs:
    """The batch's probabilities (and, where the export has them, ood_score and unknown); side
    feature columns not in `side` are given as missing."""
    if tta == "none":
        inputs = {"image_bytes": np.array(images, dtype=object), **side_arrays(runtime, side or {}, len(images))}
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
    images: list[bytes | str],
    max_megapixels: float,
    tta: str = "none",
    side: dict[str, list] | None = None,
) -> list[dict[str, np.ndarray] | str]:
    """Per image: its answer ({"probabilities"[, "ood_score", "unknown"]}), or why it has none:
    a str in `images` (why the file could not be read) is kept as it is; an image the eval decode
    refuses is read as `photoclf convert` reads it, and if that fails too gets `_why_unanswered`;
    one over the pixel limit is refused as it is. For offline work (evaluation, batch prediction);
    `tta` adds test-time augmentation around predict_images; `side` holds each side feature's raw
    values, one per image, for a model that takes them.

    The batch goes to the export as it is: its decode refuses a header over the pixel limit
    before decoding anything, so a bomb costs nothing. Only a refused batch is taken apart, one
    image at a time, so one bad image never costs the others their answer and each gets its
    reason; a batch of good photos pays for one header read each, not two.
    """
    side = side or {}
    readable = [i for i, image in enumerate(images) if isinstance(image, bytes)]
    if len(readable) < len(images):
        results: list = list(images)  # read errors stay as their message
        readable_side = {k: [v[i] for i in readable] for k, v in side.items()}
        answers = answers_or_reasons(runtime, [images[i] for i in readable], max_megapixels, tta, readable_side)
        for i, answer in zip(readable, answers):
            results[i] = answer
        return results
    if not images:
        return []
    try:
        outputs = _answers(runtime, images, tta, side)
        return [{k: v[i] for k, v in outputs.items()} for i in range(len(images))]
    except tf.errors.InvalidArgumentError:
        if len(images) > 1:
            return [
                answers_or_reasons(runtime, [image], max_megapixels, tta, {k: [v[i]] for k, v in side.items()})[0]
                for i, image in enumerate(images)
            ]
    return [_refused_answer_or_reason(runtime, images[0], max_megapixels, tta, side)]


def _refused_answer_or_reason(
    runtime: TFRuntime | HostRuntime, image: bytes, max_megapixels: float, tta: str, side: dict[str, list]
) -> dict[str, np.ndarray] | str:
    """One image the export's decode refused: the answer for it as convert reads it, or why it
    has none (a header over the pixel limit is refused as it is)."""
    try:
        check_size(image, max_megapixels)
        header_reason = None
    except ImageRejected as err:
        if err.status == 413:
            return str(err)
        header_reason = str(err)
    converted = _answered_as_converted(runtime, image, max_megapixels, tta, side)
    if isinstance(converted, dict):
        return converted
    return _why_unanswered(header_reason, converted)


def _why_unanswered(header_reason: str | None, converted: Unconvertible) -> str:
    """The header check's words where it named the format (a truncated PNG header, a TIFF), else
    convert's: a zero-byte file, not an image, a truncated JPEG."""
    if isinstance(converted, TooLarge) or header_reason in (None, f"cannot read the image header: {UNRECOGNISED}"):
        return str(converted)
    return header_reason


def _answered_as_converted(
    runtime: TFRuntime | HostRuntime, image: bytes, max_megapixels: float, tta: str, side: dict[str, list]
) -> dict[str, np.ndarray] | Unconvertible:
    """The answer for a photo the eval decode cannot read but `photoclf convert` can (a TIFF, an
    iPhone's HEIC, a BMP or JPEG TensorFlow misreads and Pillow reads): the JPEG convert would
    store for training goes through the one eval decode, so it is answered as such photos were
    trained on. Otherwise why not, as convert words it: TooLarge over the pixel limit (read from
    its header, before decoding), or a damaged file's reason ("undecodable: image file is truncated")."""
    try:
        jpeg = convert_image(image, max_pixels=max_pixels(max_megapixels)).jpeg
        outputs = _answers(runtime, [jpeg], tta, side)
    except Unconvertible as err:
        return err
    except tf.errors.InvalidArgumentError:
        return Unconvertible("undecodable")
    return {k: v[0] for k, v in outputs.items()}


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
        candidate.run(TIMED_SIGNATURE, inputs)  # its first call, untimed
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


# What auto times: the model's pass on decoded pixels. Every runtime decodes with the export's own
# decode (the SavedModel in its graph, the others on the host), so its cost is the same in each
# and timing it too only added its noise: two runtimes tied on photos while one was clearly the
# faster model (benchmarks/README.md, "Offline commands").
TIMED_SIGNATURE = "predict_images"


def _timing_inputs(runtime: TFRuntime | HostRuntime, batch: int) -> dict[str, np.ndarray]:
    """predict_images' inputs for `batch` photos: a noise JPEG's pixels, decoded once by the
    export's decode, and zero side vectors for a model that takes them."""
    noise = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    jpeg = tf.io.encode_jpeg(noise).numpy()
    pixels = runtime.decode(np.array([jpeg] * batch, dtype=object)).astype(np.float32)
    specs = runtime.signatures()[TIMED_SIGNATURE][0]
    side = {name: np.zeros([batch, *spec.shape[1:]], np.float32) for name, spec in specs.items() if name != "images"}
    return {"images": pixels, **side}


def _ms_per_photo(runtime: TFRuntime | HostRuntime, inputs: dict[str, np.ndarray]) -> float:
    """One timed call of the model's pass on `inputs`."""
    start = time.perf_counter()
    runtime.run(TIMED_SIGNATURE, inputs)
    return (time.perf_counter() - start) * 1000 / len(inputs["images"])
