"""The usual recipe: TensorFlow's "Transfer learning and fine-tuning" tutorial, as users copy it.

It is the baseline of python -m benchmarks.recipes, so it is written the tutorial's way and
not improved: `image_dataset_from_directory` on the JPEG folders, `RandomFlip` +
`RandomRotation(0.2)` layers, MobileNetV2's `preprocess_input`, the frozen base called with
`training=False`, global average pooling, dropout 0.2 and a Dense layer; 10 epochs with Adam at
1e-4, then the layers from index 100 on unfrozen and 10 more epochs with RMSprop at 1e-5, the
last weights kept. Two deliberate departures, so that the comparison is about the recipe: the
backbone weights come from the same file as ours (no download here), and the logits cover any
number of classes (sparse cross-entropy; the tutorial's single logit is the 2-class case).

The tutorial's backbone is MobileNetV2. With another one (`BACKBONE`, a registry key such as
efficientnet_lite0, which keras.applications does not have), the base is built as `app` builds
it, with its own input scaling in place of MobileNetV2's `preprocess_input`, and phase 2
unfreezes the same share of its layers as the tutorial's 100 of MobileNetV2's 154.

Run as `python -m benchmarks.usual_recipe SPLIT_FOLDER WEIGHTS IMAGE_SIZE SEED [EPOCHS_HEAD
EPOCHS_FINETUNE [BACKBONE]]`: it prints `  val_accuracy X` after every epoch, as fine_tune.py
does, and `final_val_accuracy X` at the end. The epochs are the tutorial's 10 + 10 unless given
(the tests shorten them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import keras

from benchmarks.common import TUTORIAL_BACKBONE

FINE_TUNE_AT = 100  # the tutorial's first trainable layer of the base in phase 2
TUTORIAL_BASE_LAYERS = 154  # MobileNetV2's, as the tutorial prints them
EPOCHS_HEAD, EPOCHS_FINETUNE = 10, 10
BATCH_SIZE = 32


class _PrintValAccuracy(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"  val_accuracy {logs['val_accuracy']:.4f}", flush=True)


def _base(backbone: str, image_size: int, weights: str) -> tuple[keras.Model, Callable]:
    """(base, its input scaling): the tutorial's MobileNetV2, or another backbone as `app` builds it."""
    shape = (image_size, image_size, 3)
    if backbone == TUTORIAL_BACKBONE:
        base = keras.applications.MobileNetV2(input_shape=shape, include_top=False, weights=None)
        base.load_weights(weights)
        return base, keras.applications.mobilenet_v2.preprocess_input
    from app.models.backbones import get_backbone
    from app.models.pretrained import load_backbone

    spec = get_backbone(backbone)
    return load_backbone(spec, image_size, weights)[0], spec.normalization_layer()


def fine_tune_at(base: keras.Model) -> int:
    """The tutorial's first trainable layer as a share of the base's layers: 100 for its MobileNetV2."""
    return round(len(base.layers) * FINE_TUNE_AT / TUTORIAL_BASE_LAYERS)


def build_model(
    num_classes: int, image_size: int, weights: str, backbone: str = TUTORIAL_BACKBONE
) -> tuple[keras.Model, keras.Model]:
    """(model, base) as the tutorial builds them."""
    base, preprocess = _base(backbone, image_size, weights)
    base.trainable = False
    augmentation = keras.Sequential([keras.layers.RandomFlip("horizontal"), keras.layers.RandomRotation(0.2)])
    inputs = keras.Input(shape=(image_size, image_size, 3))
    x = augmentation(inputs)
    x = preprocess(x)
    x = base(x, training=False)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)
    outputs = keras.layers.Dense(num_classes)(x)
    return keras.Model(inputs, outputs), base


def run_usual_recipe(
    split_folder: Path,
    weights: str,
    image_size: int,
    seed: int,
    epochs_head: int = EPOCHS_HEAD,
    epochs_finetune: int = EPOCHS_FINETUNE,
    backbone: str = TUTORIAL_BACKBONE,
) -> float:
    """Both phases; returns the final validation accuracy (the last epoch's weights)."""
    keras.utils.set_random_seed(seed)
    load = dict(batch_size=BATCH_SIZE, image_size=(image_size, image_size), seed=seed)
    train = keras.utils.image_dataset_from_directory(split_folder / "train", shuffle=True, **load)
    val = keras.utils.image_dataset_from_directory(split_folder / "val", shuffle=False, **load)
    model, base = build_model(len(train.class_names), image_size, weights, backbone)
    train, val = train.prefetch(-1), val.prefetch(-1)  # AUTOTUNE, as the tutorial does
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=loss, metrics=["accuracy"])
    history = model.fit(train, epochs=epochs_head, validation_data=val, callbacks=[_PrintValAccuracy()], verbose=2)
    base.trainable = True
    for layer in base.layers[: fine_tune_at(base)]:
        layer.trainable = False
    model.compile(optimizer=keras.optimizers.RMSprop(1e-5), loss=loss, metrics=["accuracy"])
    history = model.fit(
        train,
        epochs=epochs_head + epochs_finetune,
        initial_epoch=len(history.epoch),
        validation_data=val,
        callbacks=[_PrintValAccuracy()],
        verbose=2,
    )
    return float(history.history["val_accuracy"][-1])


if __name__ == "__main__":
    folder, weights_file, *numbers = sys.argv[1:]
    backbone = numbers.pop() if len(numbers) == 5 else TUTORIAL_BACKBONE
    accuracy = run_usual_recipe(Path(folder), weights_file, *map(int, numbers), backbone=backbone)
    print(f"final_val_accuracy {accuracy:.4f}", flush=True)
