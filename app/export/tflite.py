"""TFLite conversion (float16, or int8 calibrated on training images) with a parity report.

The .tflite file takes float32 [1, S, S, 3] images in 0..255 and returns probabilities; image
decoding/cropping on the phone must follow `decode_for_eval` (centre crop 0.875, bilinear).
The parity report compares it with the SavedModel on the validation split.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from app import storage
from app.data.pipeline import make_eval_dataset
from app.export import layout
from app.labels import LABELS_FILE, write_labels

CALIBRATION_IMAGES = 100


def convert(model: keras.Model, image_size: int, mode: str, data_dir: str) -> bytes:
    """Through Keras' own LiteRT export (ExportArchive → SavedModel → converter): converting a
    concrete function or a plain tf.saved_model of a Keras 3 model gave NaN/garbage here."""
    options: dict = {"optimizations": [tf.lite.Optimize.DEFAULT]}
    if mode == "float16":
        options["target_spec"] = {"supported_types": [tf.float16]}
    else:  # int8 weights and activations, float in/out; calibrated on training images

        def representative():
            ds = make_eval_dataset(data_dir, split="train", image_size=image_size, batch_size=1)
            for images, _ in ds.take(CALIBRATION_IMAGES):
                yield [tf.cast(images, tf.float32)]

        options["representative_dataset"] = representative
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.tflite")
        model.export(path, format="litert", verbose=False,
                     input_signature=[tf.TensorSpec([1, image_size, image_size, 3], tf.float32)], **options)
        return Path(path).read_bytes()


def tflite_probabilities(tflite_model: bytes, images: np.ndarray) -> np.ndarray:
    interpreter = tf.lite.Interpreter(model_content=tflite_model)
    interpreter.allocate_tensors()
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    results = []
    for image in images:
        interpreter.set_tensor(inp["index"], image[None].astype(np.float32))
        interpreter.invoke()
        results.append(interpreter.get_tensor(out["index"])[0])
    return np.stack(results)


def parity_report(tflite_model: bytes, saved_model_dir: Path, data_dir: str, image_size: int) -> dict:
    """Top-1 agreement and accuracy of the .tflite file vs the SavedModel, on the val split."""
    predict = tf.saved_model.load(str(saved_model_dir)).signatures["predict_images"]
    agree = correct_tflite = correct_saved = total = 0
    for images, labels in make_eval_dataset(data_dir, split="val", image_size=image_size, batch_size=32):
        saved = predict(images=tf.cast(images, tf.float32))["probabilities"].numpy().argmax(-1)
        lite = tflite_probabilities(tflite_model, images.numpy()).argmax(-1)
        labels = labels.numpy()
        agree += int((saved == lite).sum())
        correct_saved += int((saved == labels).sum())
        correct_tflite += int((lite == labels).sum())
        total += len(labels)
    return {"images": total, "top1_agreement": agree / max(total, 1),
            "tflite_accuracy": correct_tflite / max(total, 1), "saved_model_accuracy": correct_saved / max(total, 1)}


def export_tflite(model: keras.Model, saved_model_dir: Path, classes: list[str], image_size: int, data_dir: str,
                  mode: str, out_dir: Path) -> dict[str, str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    tflite_model = convert(model, image_size, mode, data_dir)
    path = layout.tflite_model_path(out_dir, mode)
    storage.write_bytes_atomic(path, tflite_model)
    write_labels(out_dir / LABELS_FILE, classes)
    report = parity_report(tflite_model, saved_model_dir, data_dir, image_size)
    report_path = layout.tflite_parity_path(out_dir, mode)
    storage.write_json_atomic(report_path, {"mode": mode, **report})
    return {"tflite": str(path), "tflite_parity": str(report_path)}
