"""The parity check that decides whether a file beside the SavedModel (LiteRT, OpenVINO) may serve:
the file and the SavedModel on the validation split, top-1 agreement and the largest
difference. Its result is stored in the export's metadata, and a runtime refuses a file whose
check failed or is missing.
"""

from __future__ import annotations

from collections.abc import Callable
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


def parity_report(
    model: HostModel, saved_model_dir: Path, data_dir: str, image_size: int, precision: str, tta: str = "none"
) -> dict:
    """Top-1 agreement, largest probability difference and both accuracies on the val split, or
    on its first PARITY_IMAGES[precision] (with the export's TTA applied around `model`, as its
    runtime applies it); for an export with "none of these", how often the file's unknown agrees
    with the SavedModel's too: a score can drift where the probabilities do not."""
    predict = tf.saved_model.load(str(saved_model_dir)).signatures["predict_images"]
    threshold = unknown_threshold(layout.read_metadata(saved_model_dir))
    agree = agree_unknown = correct_file = correct_saved = total = 0
    max_diff = max_ood_diff = 0.0
    for inputs, labels in _val_batches(data_dir, image_size, PARITY_IMAGES[precision]):
        images, side = (inputs["image"], inputs["side"]) if isinstance(inputs, dict) else (inputs, None)
        saved_outputs = predict(images=tf.cast(images, tf.float32), **({"side": side} if side is not None else {}))
        saved = saved_outputs["probabilities"].numpy()
        side_values = None if side is None else side.numpy()
        file_outputs = with_tta(lambda x, side_values=side_values: model(x, side_values), images.numpy(), tta)
        answered = file_outputs["probabilities"]
        if "ood_score" in saved_outputs and "ood_score" in file_outputs:
            saved_score = saved_outputs["ood_score"].numpy()
            max_ood_diff = max(max_ood_diff, float(np.abs(saved_score - file_outputs["ood_score"]).max()))
            if threshold is not None:
                agree_unknown += int(((saved_score > threshold) == (file_outputs["ood_score"] > threshold)).sum())
        labels = labels.numpy()
        max_diff = max(max_diff, float(np.abs(saved - answered).max()))
        agree += int((saved.argmax(-1) == answered.argmax(-1)).sum())
        correct_saved += _correct(saved, labels)
        correct_file += _correct(answered, labels)
        total += len(labels)
    agreement = agree / max(total, 1)
    unknown = agree_unknown / max(total, 1) if threshold is not None else None
    passed = (
        total > 0
        and agreement >= REQUIRED_AGREEMENT[precision]
        and (unknown is None or unknown >= REQUIRED_AGREEMENT[precision])
        and (precision != "float32" or max_diff <= FLOAT32_MAX_ABS_DIFF)
    )
    return {
        "images": total,
        "top1_agreement": agreement,
        "max_abs_diff": max_diff,
        "max_abs_diff_ood_score": max_ood_diff,
        **({"unknown_agreement": unknown} if unknown is not None else {}),
        "passed": passed,
        "required_agreement": REQUIRED_AGREEMENT[precision],
        "accuracy": correct_file / max(total, 1),
        "saved_model_accuracy": correct_saved / max(total, 1),
    }


def _val_batches(data_dir: str, image_size: int, limit: int | None):
    """The val split in batches of 32; a sample is decoded up front, so that the file's threads
    do not share the cores with tf.data's decoding (which made the check's time bimodal)."""
    batches = make_eval_dataset(data_dir, split="val", image_size=image_size, batch_size=32)
    return batches if limit is None else list(batches.unbatch().take(limit).batch(32))


def checked(
    model: HostModel, saved_model_dir: Path, data_dir: str | None, image_size: int, precision: str, tta: str = "none"
) -> dict:
    """`parity_report`, or a failed check saying why there was nothing to check against."""
    try:
        if not data_dir:
            raise UserError("the run has no data folder")
        return parity_report(model, saved_model_dir, data_dir, image_size, precision, tta)
    except UserError as err:
        return {"passed": False, "missing": f"no validation data to check against: {err}"}


def refusal(parity: dict | None, what: str) -> str | None:
    """Why a file whose check is `parity` must not serve, or None when it may."""
    if not parity or "passed" not in parity:
        return f"its {what} parity check against the SavedModel is missing from assets/metadata.json"
    if not parity["passed"]:
        why = parity.get("missing") or (
            f"top-1 agreement {parity['top1_agreement']:.4f} < {parity['required_agreement']}"
            f", max abs difference {parity['max_abs_diff']:.2g}"
            + (f", unknown agreement {parity['unknown_agreement']:.4f}" if "unknown_agreement" in parity else "")
        )
        return f"its {what} parity check against the SavedModel failed ({why})"
    return None
