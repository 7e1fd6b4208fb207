"""The accelerator's side of training, alone: images/s of the classifier's phase-1 and phase-2
train steps, and of the frozen backbone's forward pass (what the feature cache pays per view),
per precision and with XLA on or off, on random uint8 batches in memory (no input pipeline).

Dividing a rate by the input pipeline's images/s per CPU core (scripts/benchmark_input.py)
gives the cores that keep the device fed. Written against Keras 3 alone, with no TensorFlow
import: the same measurement runs on the TensorFlow, JAX or PyTorch backend (KERAS_BACKEND),
so the model's speed on a GPU can be read where only JAX or PyTorch is installed beside it.
The steps are Keras' own `fit` / `predict` loops, not fine_tune.py's distributed loop: the
same model, loss, optimizer and unfrozen layers, without the on-device colour jitter.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import keras
import numpy as np

from app.config import TrainConfig
from app.models.backbones import get_backbone
from app.models.classifier import Classifier, build_classifier, freeze_backbone, unfreeze_top
from app.models.pretrained import load_backbone

WORKLOADS = ("features", "phase1", "phase2")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
Step = Callable[[], object]
DEFAULTS = TrainConfig()  # fine_tune.py's defaults: dropout, rates, loss, unfreeze rule


@dataclass(frozen=True)
class DeviceSetup:
    backbone: str = "mobilenet_v2"
    weights: str = "none"  # speed does not depend on the weights' values
    image_size: int = 0  # 0 = the backbone's default
    batch_size: int = 64
    num_classes: int = 10


@dataclass(frozen=True)
class Variant:
    workload: str  # features | phase1 | phase2
    precision: str  # a Keras dtype policy: float32 | mixed_float16 | mixed_bfloat16
    jit: bool  # Keras' jit_compile: XLA on TensorFlow and JAX, torch.compile on PyTorch

    @property
    def label(self) -> str:
        return f"{self.workload} {self.precision} xla={'on' if self.jit else 'off'}"


def _image_size(setup: DeviceSetup) -> int:
    return setup.image_size or get_backbone(setup.backbone).default_size


def _classifier(setup: DeviceSetup, precision: str) -> Classifier:
    """A fresh classifier built under `precision` (Keras reads the dtype policy at build time)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        spec, size = get_backbone(setup.backbone), _image_size(setup)
        backbone, _ = load_backbone(spec, size, setup.weights)
        return build_classifier(spec, backbone, setup.num_classes, size, DEFAULTS.dropout)
    finally:
        keras.config.set_dtype_policy(previous)


def _compiled_step(clf: Classifier, variant: Variant, images: np.ndarray, labels: np.ndarray, batch_size: int) -> Step:
    """One pass of `variant` over the batches: Keras' own fit/predict loop, which keeps the
    weights on the device between steps, as fine_tune.py's loop does. It returns host values,
    so it ends when the device does."""
    if variant.workload == "features":
        clf.features_model.compile(jit_compile=variant.jit)
        return lambda: clf.features_model.predict(images, batch_size=batch_size, verbose=0)
    if variant.workload == "phase1":
        freeze_backbone(clf)
        rate = DEFAULTS.lr_head
    else:
        unfreeze_top(clf, DEFAULTS.unfreeze)
        rate = DEFAULTS.lr_finetune
    clf.logits_model.compile(  # mixed_float16 wraps the optimizer in loss scaling, as fine_tune.py does
        optimizer=keras.optimizers.AdamW(rate, weight_decay=DEFAULTS.weight_decay),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=DEFAULTS.label_smoothing),
        jit_compile=variant.jit,
    )
    return lambda: clf.logits_model.fit(images, labels, batch_size=batch_size, shuffle=False, verbose=0)


def _batches(setup: DeviceSetup, size: int, steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`steps` batches of random uint8 images (what the input pipeline hands over) and one-hot
    labels, in host memory: each batch crosses to the device, as the pipeline's batches do."""
    rng = np.random.default_rng(seed)
    count = steps * setup.batch_size
    images = rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    labels = np.eye(setup.num_classes, dtype=np.float32)[rng.integers(0, setup.num_classes, count)]
    return images, labels


def _images_per_s(step: Step, images: int) -> float:
    start = time.perf_counter()
    step()
    return images / (time.perf_counter() - start)


def run_device_benchmark(setup: DeviceSetup, variants: list[Variant], *, steps: int = 20, rounds: int = 5,
                         warmup: int = 2, log: Callable[[str], None] = print) -> dict:
    """Build and warm up every variant (compilation and autotuning stay out of the figures),
    then time them in alternating rounds; report each one's median images/s and range."""
    size = _image_size(setup)
    images, labels = _batches(setup, size, steps)
    prepared: dict[Variant, Step] = {}
    for variant in variants:
        start = time.perf_counter()
        prepared[variant] = _compiled_step(_classifier(setup, variant.precision), variant, images, labels,
                                           setup.batch_size)
        for _ in range(warmup):
            prepared[variant]()
        log(f"{variant.label}: built, compiled and warmed up in {time.perf_counter() - start:.1f} s")
    samples: dict[Variant, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant, step in prepared.items():
            samples[variant].append(_images_per_s(step, len(images)))
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{v.label} {s[-1]:.0f}" for v, s in samples.items()))
    return {
        "backend": keras.backend.backend(), "device": device_name(), "backbone": setup.backbone,
        "image_size": size, "batch_size": setup.batch_size, "steps": steps, "rounds": rounds,
        "results": [{"workload": v.workload, "precision": v.precision, "xla": v.jit,
                     "images_per_s": round(statistics.median(s), 1),
                     "range": [round(min(s), 1), round(max(s), 1)]} for v, s in samples.items()],
    }


def device_name() -> str:
    """The accelerator the backend places tensors on, for the report ("cpu" when there is none)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return f"{device.platform}: {device.device_kind}"
    if backend == "torch":
        import torch

        return f"cuda: {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return f"gpu: {tf.config.experimental.get_device_details(gpus[0]).get('device_name', 'GPU')}" if gpus else "cpu"


def format_table(report: dict) -> str:
    """The report as a Markdown table, for the README and for reading at a glance."""
    rows = ["| workload | precision | XLA | images/s (median) | range |", "| --- | --- | --- | ---: | ---: |"]
    for r in report["results"]:
        rows.append(f"| {r['workload']} | {r['precision']} | {'on' if r['xla'] else 'off'} | "
                    f"{r['images_per_s']:,.0f} | {r['range'][0]:,.0f}–{r['range'][1]:,.0f} |")
    return "\n".join(rows)
