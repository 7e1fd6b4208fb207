"""TensorBoard logging of a run (`tensorboard --logdir RUN_DIR/tensorboard`).

Per epoch: loss, accuracy, val_loss, val_accuracy, the learning rate and training images/s; once
a run, a few augmented training images, exactly as the model sees them; at the end the
validation confusion matrix of the kept weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

SCALARS = ("loss", "accuracy", "val_loss", "val_accuracy", "lr", "images_per_s")


class TensorBoardLog:
    def __init__(self, folder: Path) -> None:
        self.writer = tf.summary.create_file_writer(str(folder))

    def epoch(self, row: dict) -> None:
        """Scalars of one finished epoch, at the run's global epoch number."""
        with self.writer.as_default(step=int(row["epoch"])):
            for key in SCALARS:
                if key in row:
                    tf.summary.scalar(key, float(row[key]))
        self.writer.flush()

    def images(self, tag: str, images: np.ndarray, step: int, description: str = "") -> None:
        """`images` float [N, H, W, 3] in 0..255 (the pipeline's output)."""
        with self.writer.as_default(step=step):
            tf.summary.image(tag, np.clip(images, 0, 255) / 255.0, max_outputs=len(images), description=description)
        self.writer.flush()

    def figure(self, tag: str, png: bytes, step: int, description: str = "") -> None:
        image = tf.io.decode_png(png, channels=3)[None]
        with self.writer.as_default(step=step):
            tf.summary.image(tag, image, description=description)
        self.writer.flush()
