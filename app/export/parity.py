"""The parity check that decides whether a file beside the SavedModel (LiteRT, OpenVINO) may serve:
the file and the SavedModel on the validation split, top-1 agreement and the largest
difference. Its result is stored in the export's metadata, and a runtime refuses a file whose
check failed or is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.data.pipeline import make_eval_dataset
from app.errors import UserError
from app.export import layout
from app.models.tta import with_tta

# What a precision must reach on the validation split to be served: float32 is the same
# arithmetic in another order, so every top-1 agrees; the smaller types may flip a near tie in 200.
REQUIRED_AGREEMENT = {"float32": 1.0, "float16": 0.995, "bfloat16": 0.995, "int8": 0.995}
FLOAT32_MAX_ABS_DIFF = 1e-4
# How many val images each check reads (None: all). A float32 conversion error shows on every
# image, so a sample decides it as well as the whole split, in less time; the smaller types'
# rare flips are counted on all.
PARITY_IMAGES = {"float32": 64, "float16": None, "bfloat16": None, "int8": None}


def images_needed(required_agreement: float) -> int:
    """The fewest val images on which a bar under 1 means anything: on fewer than 1 / (1 - bar)
    one flip is already under it, and none says little. A bar of 1 (float32: every top-1 agrees)
    is decided by any sample."""
    return 0 if required_agreement >= 1 else round(1 / (1 - required_agreement))


def min_images(precision: str) -> int:
    return images_needed(REQUIRED_AGREEMENT[precision])


def unknown_threshold(metadata: dict) -> float | None:
    """The export's "none of these" threshold (above it, unknown), or None: a multi-label export or
    one made before it existed."""
    return None if metadata.get("thresholds") else (metadata.get("ood") or {}).get("threshold")


# float32 images [N, S, S, 3] 0..255 (and side vectors [N, F] or None) → {"probabilities"[, "ood_score"]}
HostModel = Callable[[np.ndarray, np.ndarray | None], dict[str, np.ndarray]]


def _correct(probabilities: np.ndarray, labels: np.ndarray) -> int:
    """Right answers: the top class, or (multi-hot labels) every label right at 0.5."""
    if labels.ndim == 2:
        return int(((probabilities >= 0.5) == (labels > 0.5)).all(axis=1).sum())
    return int((probabilities.argmax(-1) == labels).sum())


class _Tally:
    """One file's answers against the SavedModel's, batch by batch."""

    def __init__(self, threshold: float | None) -> None:
        self.threshold = threshold
        self.agree = self.agree_unknown = self.correct_file = self.correct_saved = self.total = 0
        self.max_diff = self.max_ood_diff = 0.0

    def add(self, saved: dict[str, np.ndarray], answered: dict[str, np.ndarray], labels: np.ndarray) -> None:
        if "ood_score" in saved and "ood_score" in answered:
            self.max_ood_diff = max(self.max_ood_diff, float(np.abs(saved["ood_score"] - answered["ood_score"]).max()))
            if self.threshold is not None:
                unknown = (saved["ood_score"] > self.threshold) == (answered["ood_score"] > self.threshold)
                self.agree_unknown += int(unknown.sum())
        probabilities, file_probabilities = saved["probabilities"], answered["probabilities"]
        self.max_diff = max(self.max_diff, float(np.abs(probabilities - file_probabilities).max()))
        self.agree += int((probabilities.argmax(-1) == file_probabilities.argmax(-1)).sum())
        self.correct_saved += _correct(probabilities, labels)
        self.correct_file += _correct(file_probabilities, labels)
        self.total += len(labels)

    def report(self, precision: str) -> dict:
        total = max(self.total, 1)
        agreement = self.agree / total
        unknown = self.agree_unknown / total if self.threshold is not None else None
        passed = (
            self.total >= max(1, min_images(precision))
            and agreement >= REQUIRED_AGREEMENT[precision]
            and (unknown is None or unknown >= REQUIRED_AGREEMENT[precision])
            and (precision != "float32" or self.max_diff <= FLOAT32_MAX_ABS_DIFF)
        )
        return {
            "images": self.total,
            "top1_agreement": agreement,
            "max_abs_diff": self.max_diff,
            "max_abs_diff_ood_score": self.max_ood_diff,
            **({"unknown_agreement": unknown} if unknown is not None else {}),
            "passed": passed,
            "required_agreement": REQUIRED_AGREEMENT[precision],
            **({"min_images": min_images(precision)} if min_images(precision) else {}),
            "accuracy": self.correct_file / total,
            "saved_model_accuracy": self.correct_saved / total,
        }


# A val batch: (images [N, S, S, 3] uint8, side vectors or None, labels), and the SavedModel's answers
Batch = tuple[tuple[np.ndarray, np.ndarray | None, np.ndarray], dict[str, np.ndarray]]


class Reference:
    """The SavedModel's answers on the validation split, worked out once for every file an export
    checks against it (LiteRT, OpenVINO in each precision, ONNX): one load, one pass of the
    SavedModel. The float32 sample is kept whole; of the whole split only the answers are kept,
    and its images are decoded again for each file, so memory stays flat in the split's size."""

    def __init__(self, saved_model_dir: Path, data_dir: str | None, image_size: int, tta: str = "none") -> None:
        self.saved_model_dir, self.data_dir, self.image_size, self.tta = saved_model_dir, data_dir, image_size, tta
        self._predict: Callable | None = None
        self._sample: list[Batch] | None = None
        self._answers: list[dict[str, np.ndarray]] | None = None

    def check(self, model: HostModel, precision: str) -> dict:
        """`report`, or a failed check saying why there was nothing to check against."""
        try:
            if not self.data_dir:
                raise UserError("the run has no data folder")
            return self.report(model, precision)
        except UserError as err:
            return {"passed": False, "missing": f"no validation data to check against: {err}"}

    def report(self, model: HostModel, precision: str) -> dict:
        """Top-1 agreement, largest probability difference and both accuracies on the val split, or
        on its first PARITY_IMAGES[precision] (with the export's TTA applied around `model`, as its
        runtime applies it); for an export with "none of these", how often the file's unknown agrees
        with the SavedModel's too: a score can drift where the probabilities do not."""
        tally = _Tally(unknown_threshold(layout.read_metadata(self.saved_model_dir)))
        for (images, side, labels), saved in self._batches(PARITY_IMAGES[precision]):
            tally.add(saved, with_tta(lambda x, side=side: model(x, side), images, self.tta), labels)
        return tally.report(precision)

    def _batches(self, limit: int | None) -> Iterator[Batch]:
        if limit is not None:
            if self._sample is None:
                self._sample = [(batch, self._saved(batch)) for batch in _val_batches(self._split(), limit)]
            yield from self._sample
            return
        answers = self._answers if self._answers is not None else []
        for i, batch in enumerate(_val_batches(self._split(), None)):
            if i == len(answers):
                answers.append(self._saved(batch))
            yield batch, answers[i]
        self._answers = answers

    def _split(self) -> tf.data.Dataset:
        return make_eval_dataset(self.data_dir, split="val", image_size=self.image_size, batch_size=32)

    def _saved(self, batch: tuple[np.ndarray, np.ndarray | None, np.ndarray]) -> dict[str, np.ndarray]:
        if self._predict is None:
            self._predict = tf.saved_model.load(str(self.saved_model_dir)).signatures["predict_images"]
        images, side, _ = batch
        outputs = self._predict(images=tf.cast(images, tf.float32), **({"side": side} if side is not None else {}))
        return {name: value.numpy() for name, value in outputs.items() if name in ("probabilities", "ood_score")}


def parity_report(
    model: HostModel, saved_model_dir: Path, data_dir: str, image_size: int, precision: str, tta: str = "none"
) -> dict:
    """One file's check against the SavedModel (`Reference.report`)."""
    return Reference(saved_model_dir, data_dir, image_size, tta).report(model, precision)


def _val_batches(
    batches: tf.data.Dataset, limit: int | None
) -> Iterator[tuple[np.ndarray, np.ndarray | None, np.ndarray]]:
    """The val split as numpy (images, side or None, labels); a sample is decoded up front, so
    that the file's threads do not share the cores with tf.data's decoding (which made the
    check's time bimodal)."""
    if limit is not None:
        batches = list(batches.unbatch().take(limit).batch(32))
    for inputs, labels in batches:
        images, side = (inputs["image"], inputs["side"]) if isinstance(inputs, dict) else (inputs, None)
        yield images.numpy(), None if side is None else side.numpy(), labels.numpy()


def too_few(parity: dict) -> str | None:
    """Why a check on too few val images cannot pass (`images_needed`), or None. Read from its bar,
    so an export checked before the rule existed is held to it too."""
    needed = images_needed(parity.get("required_agreement", 1.0))
    if parity.get("images", 0) >= needed:
        return None
    return f"{parity.get('images', 0)} val images, under the {needed} its bar needs"


def refusal(parity: dict | None, what: str) -> str | None:
    """Why a file whose check is `parity` must not serve, or None when it may."""
    if not parity or "passed" not in parity:
        return f"its {what} parity check against the SavedModel is missing from assets/metadata.json"
    few = too_few(parity)
    if not parity["passed"] or few:
        why = (
            parity.get("missing")
            or few
            or (
                f"top-1 agreement {parity['top1_agreement']:.4f} < {parity['required_agreement']}"
                f", max abs difference {parity['max_abs_diff']:.2g}"
                + (f", unknown agreement {parity['unknown_agreement']:.4f}" if "unknown_agreement" in parity else "")
            )
        )
        return f"its {what} parity check against the SavedModel failed ({why})"
    return None


def parity_lines(record: dict) -> list[str]:
    """A line for each file beside the SavedModel in `record` (metadata.json's or metrics.json's
    "litert", "openvino" and "onnx"): how each precision agreed with it on val photos, and whether
    `photoclf serve` may run it. What train and export print."""
    lines = [_litert_line(mode, parity) for mode, parity in (record.get("litert") or {}).items()]
    for runtime, what in (("openvino", "IR"), ("onnx", "file")):
        if record.get(runtime):
            lines.append(_runtime_line(runtime, what, record[runtime]))
    return lines


def _litert_line(mode: str, parity: dict) -> str:
    if parity.get("passed") and not too_few(parity):
        return (
            f"litert: {mode} file agrees with the SavedModel on {round(parity['top1_agreement'] * parity['images'])}"
            f"/{parity['images']} val images (max difference {parity['max_abs_diff']:.1e}); photoclf serve may run it"
        )
    if parity.get("missing"):
        why = parity["missing"]
    else:
        required = parity.get("required_agreement", 1.0)
        agreement = f"top-1 agreement {parity['top1_agreement']:.4f} against the {required:g} required"
        why = "; ".join(r for r in (None if parity.get("passed") else agreement, too_few(parity)) if r)
    return f"litert: {mode} file NOT checked OK ({why}); photoclf serve will not run it"


def _runtime_line(runtime: str, what: str, checks: dict) -> str:
    """Each precision's top-1 agreement with the SavedModel, and whether it may serve."""
    if "missing" in checks:
        return f"{runtime}: {checks['missing']}"
    said, served = [], False
    unchecked = {parity["missing"] for parity in checks.values() if isinstance(parity, dict) and "missing" in parity}
    if unchecked and not any(isinstance(parity, dict) and "top1_agreement" in parity for parity in checks.values()):
        return f"{runtime}: {what} NOT checked ({'; '.join(sorted(unchecked))}); photoclf serve will not run it"
    for precision, parity in checks.items():
        if isinstance(parity, dict) and "top1_agreement" in parity:
            agreed = f"{round(parity['top1_agreement'] * parity['images'])}/{parity['images']}"
            if "unknown_agreement" in parity:  # "none of these" decided alike too
                agreed += f" top-1, {round(parity['unknown_agreement'] * parity['images'])}/{parity['images']} unknown"
            passed = parity["passed"] and not too_few(parity)
            served |= passed
            why = "" if passed else f" (not served: {too_few(parity) or 'below its bar'})"
            said.append(f"{precision} {agreed}{why}")
    may = "photoclf serve may run it" if served else "photoclf serve will not run it"
    return f"{runtime}: {what} agrees with the SavedModel on val images in {', '.join(said)}; {may}"
