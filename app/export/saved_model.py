"""SavedModel export in TF Serving's layout, with image-bytes and float-image signatures.

The graph's preprocessing is `app.data.preprocess.decode_for_eval`, the same function the eval
pipeline maps over TFRecords, so what is served is what was evaluated. Loading and calling the
export needs only TensorFlow.

Signatures (all return probabilities [N, C], class_ids/classes/scores [N, k]):
- serving_default(image_bytes: string [N])            JPEG/PNG/GIF/BMP/WebP bytes, refused above
  `max_megapixels` from the header before decoding (the image-bomb guard, app.data.image_header)
- serving_keyed(image_bytes: string [N], key: string [N]) also returns `key` unchanged
- predict_images(images: float32 [N, H, W, 3] in 0..255)
A model with side features (app/data/side_features.py) takes them too: the byte signatures one
input per column, named as in the manifest (app/export/side_inputs.py), before `key`;
predict_images a `side` float32 [N, F] vector as stored in the TFRecords.
A multi-label model (per-label sigmoids) also returns `labels_above_threshold` string [N, C]:
the labels at or above their decision thresholds (chosen on validation), by score, "" after them.
A single-label model whose run fitted its out-of-distribution score (app.models.ood) also
returns `ood_score` float32 [N] (higher: less like the training photos) and `unknown` bool [N]
(the score over the threshold fitted on validation: "none of these").
With `tta="flip"` every signature averages the probabilities of each image and its mirror.
An undecodable image fails the whole call with InvalidArgumentError (TF cannot flag one item
without decoding it); the local server then retries items one by one to name the bad one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import keras
import tensorflow as tf

from app import storage
from app.data.image_header import DEFAULT_MAX_MEGAPIXELS
from app.data.preprocess import DEFAULT_CROP_FRACTION, batch_decoder
from app.errors import UserError
from app.export import layout
from app.export.frozen import FrozenForward, frozen_forward, trace
from app.export.side_inputs import SideInputs
from app.labels import LABELS_FILE, write_labels
from app.models.tta import with_tta

DEFAULT_TOP_K = 5


class ServingModule(tf.Module):
    def __init__(
        self,
        model: keras.Model,
        classes: list[str],
        image_size: int,
        crop_fraction: float,
        top_k: int,
        labels_file: Path,
        metadata_file: Path,
        max_megapixels: float = DEFAULT_MAX_MEGAPIXELS,
        tta: str = "none",
        side_features: list[dict] | None = None,
        thresholds: list[float] | None = None,
        unknown_threshold: float | None = None,
    ) -> None:
        super().__init__()
        self.thresholds = tf.constant(thresholds, tf.float32) if thresholds else None
        self.unknown_threshold = unknown_threshold
        # The model's weights are constants in this graph: nothing of the Keras model is tracked
        # (saving the Keras object graph of every layer took more than half of the export's time).
        self.forward = frozen_forward(model, image_size, len(side_features or []))
        self.side = SideInputs(side_features) if side_features else None
        self.class_names = tf.constant(classes)
        self.image_size, self.crop_fraction, self.top_k = image_size, crop_fraction, min(top_k, len(classes))
        self.max_megapixels, self.tta = max_megapixels, tta
        self.labels_txt = tf.saved_model.Asset(str(labels_file))
        self.metadata_json = tf.saved_model.Asset(str(metadata_file))
        images = tf.TensorSpec([None, image_size, image_size, 3], tf.float32, name="images")
        image_bytes, key = (
            tf.TensorSpec([None], tf.string, name="image_bytes"),
            tf.TensorSpec([None], tf.string, name="key"),
        )
        side_vector = [tf.TensorSpec([None, len(side_features)], tf.float32, name="side")] if side_features else []
        columns = self.side.specs() if self.side else []
        # Traced here, once each, as concrete functions: a tf.function would be traced again inside
        # tf.saved_model.save, whose tracing context differs. No AutoGraph: the graph code uses
        # TF's own control flow (tf.case, tf.while_loop), and rewriting its Python source is a
        # cost for nothing.
        self.predict_images = trace(self._from_images, [images, *side_vector])
        self.serving_default = trace(self._from_bytes, [image_bytes, *columns])
        self.serving_keyed = trace(self._from_bytes_keyed, [image_bytes, *columns, key])

    def _decode(self, image_bytes: tf.Tensor) -> tf.Tensor:
        decode = batch_decoder(self.image_size, self.crop_fraction, self.max_megapixels)
        return tf.cast(decode(image_bytes), tf.float32)

    def _from_images(self, images: tf.Tensor, *side: tf.Tensor) -> dict[str, tf.Tensor]:
        forward = with_tta(lambda x: self.forward(x, *side), images, self.tta)
        probabilities = tf.cast(forward["probabilities"], tf.float32)
        scores, class_ids = tf.math.top_k(probabilities, k=self.top_k)
        outputs = {
            "probabilities": probabilities,
            "class_ids": class_ids,
            "classes": tf.gather(self.class_names, class_ids),
            "scores": scores,
        }
        if self.thresholds is not None:
            outputs["labels_above_threshold"] = self._above_threshold(probabilities)
        if "ood_score" in forward and self.unknown_threshold is not None:
            outputs["ood_score"] = tf.cast(forward["ood_score"], tf.float32)
            outputs["unknown"] = outputs["ood_score"] > self.unknown_threshold
        return outputs

    def _above_threshold(self, probabilities: tf.Tensor) -> tf.Tensor:
        """Every label by score, kept where it reaches its threshold ("" elsewhere, so at the end)."""
        above = probabilities >= self.thresholds
        ranked = tf.where(above, probabilities, probabilities - 2.0)  # labels above their threshold rank first
        _, ids = tf.math.top_k(ranked, k=int(self.class_names.shape[0]))
        return tf.where(tf.gather(above, ids, batch_dims=1), tf.gather(self.class_names, ids), "")

    # The byte signatures call the traced functions above them rather than their Python bodies,
    # so the model's graph is traced once for the three signatures, not three times.
    def _from_bytes(self, image_bytes: tf.Tensor, *columns: tf.Tensor) -> dict[str, tf.Tensor]:
        side = [self.side.encode(columns)] if self.side else []
        return self.predict_images(self._decode(image_bytes), *side)

    def _from_bytes_keyed(self, image_bytes: tf.Tensor, *columns_then_key: tf.Tensor) -> dict[str, tf.Tensor]:
        *columns, key = columns_then_key
        return {**self.serving_default(image_bytes, *columns), "key": tf.identity(key)}


@contextlib.contextmanager
def tensorflow_log_level(level: int) -> Iterator[None]:
    """TensorFlow logs through both its own logger and absl's (which reaches the root logger)."""
    loggers = [logging.getLogger(name) for name in ("tensorflow", "absl")]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, old in zip(loggers, before):
            logger.setLevel(old)


def _new_version(export_root: Path, name: str, version: int | None) -> tuple[Path, int, Path]:
    """`check_new_version`, and the model folder made."""
    model_dir, version, final = check_new_version(export_root, name, version)
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--export-dir {export_root}: cannot create {model_dir} ({err.strerror})") from None
    return model_dir, version, final


def check_new_version(export_root: Path, name: str, version: int | None) -> tuple[Path, int, Path]:
    """(model folder, version, its final path), checked before anything is written (and, by
    `export_run`, before a model is built): a valid name, a version >= 1 (the next free one when
    None), and one that does not exist yet."""
    if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", name):  # "." and ".." name no folder of their own
        raise UserError(f"--name '{name}': use letters, digits, '_', '-', '.' (not first)")
    model_dir = Path(export_root) / name
    version = layout.next_version(model_dir) if version is None else version
    if version < 1:
        raise UserError(f"--version must be >= 1, got {version}")
    final = layout.version_dir(export_root, name, version)
    if final.exists():
        raise UserError(f"{final} already exists; versions are never overwritten (omit --version for the next one)")
    return model_dir, version, final


def _publish(saved: Path, final: Path, pinned: bool) -> Path:
    """Rename the staged SavedModel to its version folder, in one step; → that folder. Where
    another export published that version meanwhile (two exports of one model at once), the next
    free version, unless --version named it: a version is never overwritten."""
    while True:
        try:
            os.rename(saved, final)  # a folder onto a version folder that has files: refused, not merged
            return final
        except OSError as err:
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not final.exists():
                raise
            if pinned:
                raise UserError(
                    f"{final} was published by another export meanwhile; versions are never overwritten"
                ) from None
            final = final.parent / str(layout.next_version(final.parent))


def _save(module: ServingModule, path: Path) -> None:
    """The SavedModel with its three signatures."""
    with tensorflow_log_level(logging.ERROR):  # a screenful of "input name(s) 32592, ..." renames
        signatures = {
            "serving_default": module.serving_default,
            "serving_keyed": module.serving_keyed,
            "predict_images": module.predict_images,
        }
        tf.saved_model.save(module, str(path), signatures=signatures)


def export_saved_model(
    model: keras.Model,
    classes: list[str],
    image_size: int,
    export_root: Path,
    name: str,
    *,
    version: int | None = None,
    metadata: dict | None = None,
    top_k: int = DEFAULT_TOP_K,
    crop_fraction: float = DEFAULT_CROP_FRACTION,
    max_megapixels: float = DEFAULT_MAX_MEGAPIXELS,
    tta: str = "none",
    finish: Callable[[Path, FrozenForward], dict] | None = None,
    side_features: list[dict] | None = None,
    thresholds: list[float] | None = None,
    unknown_threshold: float | None = None,
) -> Path:
    """Write EXPORT_ROOT/NAME/VERSION atomically (temp dir + rename); never overwrite a version.

    `finish(staged_version, forward)` runs on the complete SavedModel before it is published (it
    writes the LiteRT files of `forward`, the model's traced forward pass, and their parity
    check); what it returns is added to the metadata.
    """
    created, pinned = storage.missing_folders(Path(export_root) / name), version is not None
    model_dir, version, final = _new_version(export_root, name, version)
    layout.remove_abandoned_staging(model_dir)  # what an export killed midway left
    staging = Path(tempfile.mkdtemp(prefix=layout.staging_prefix(version), dir=model_dir))  # servers skip it
    try:
        with storage.space_named(final):  # ENOSPC: one line; the staging folder goes
            # Written outside the SavedModel; tf.saved_model.save copies assets into its assets/.
            extra = staging / "extra"
            labels, metadata_file = extra / LABELS_FILE, extra / layout.METADATA_FILE
            extra.mkdir()
            write_labels(labels, classes)
            metadata = {**(metadata or {}), "max_megapixels": max_megapixels, "top_k": min(top_k, len(classes))}
            metadata["tta"] = tta
            storage.write_json_atomic(metadata_file, metadata)
            module = ServingModule(model, classes, image_size, crop_fraction, top_k, labels, metadata_file,
                                   max_megapixels, tta, side_features, thresholds, unknown_threshold)  # fmt: skip
            saved = staging / "model"
            _save(module, saved)
            finished = finish(saved, module.forward) if finish is not None else {}
            files = {layout.FILES_KEY: layout.file_digests(saved)}  # a server checks them before swapping in
            storage.write_json_atomic(layout.metadata_path(saved), {**metadata, **finished, **files})
            final = _publish(saved, final, pinned)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        storage.remove_if_empty(created)  # a failed first export leaves no empty NAME folder for a server to find
    return final
