"""Measure the accelerator alone (images/s): phase-1 and phase-2 train steps and the backbone's
forward pass, per precision and XLA on/off, on random batches in memory and, with --data, on
the training input pipeline's batches.

    python -m benchmarks.device                                  # float32 and mixed_float16, XLA off and on
    KERAS_BACKEND=jax python -m benchmarks.device --xla on       # where JAX, not TensorFlow, is beside the GPU
    python -m benchmarks.device --data records/                  # also fed by the input pipeline

Divide a rate by python -m benchmarks.input_pipeline's images/s per CPU core to get the cores that keep
the device fed, or pass --data: each variant is then also timed on the training input pipeline's
batches over those TFRecords, and the table says what share of the in-memory rate the host's
cores sustain (tf.data needs TensorFlow installed, whichever backend trains). Prints progress
per round, a Markdown table, then one JSON line.

The accelerator's side of training, alone: images/s of the classifier's phase-1 and phase-2
train steps, and of the frozen backbone's forward pass (what the feature cache pays per view),
per precision and with XLA on or off, on random uint8 batches in memory (no input pipeline).

Dividing a rate by the input pipeline's images/s per CPU core (python -m benchmarks.input_pipeline)
gives the cores that keep the device fed; with `data`, each variant is also timed fed by the
training input pipeline itself (decode, random-resized crop, flip on the host's cores), which
says directly what share of the device's rate the host sustains. Written against Keras 3, with
TensorFlow imported only for that pipeline: the model runs on the TensorFlow, JAX or PyTorch
backend (KERAS_BACKEND), so its speed on a GPU can be read where only JAX or PyTorch can use it.
The steps are Keras' own `fit` / `predict` loops, not fine_tune.py's distributed loop: the
same model, loss, optimizer and unfrozen layers, without the on-device colour jitter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import keras
import numpy as np

from app.cli import run_cli
from app.config import TrainConfig
from app.errors import UserError
from app.models.backbones import get_backbone
from app.models.classifier import Classifier, build_classifier, freeze_backbone, unfreeze_top
from app.models.pretrained import load_backbone

WORKLOADS = ("features", "phase1", "phase2")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
FEEDS = ("memory", "pipeline")
Step = Callable[[], object]
DEFAULTS = TrainConfig()  # fine_tune.py's defaults: dropout, rates, loss, unfreeze rule


@dataclass(frozen=True)
class DeviceSetup:
    backbone: str = "mobilenet_v2"
    weights: str = "none"  # speed does not depend on the weights' values
    image_size: int = 0  # 0 = the backbone's default
    batch_size: int = 64
    num_classes: int = 10  # with `data`, the dataset's class count instead
    data: str | None = None  # TFRecords (make_tfrecords.py) to also feed each variant from the input pipeline


@dataclass(frozen=True)
class Variant:
    workload: str  # features | phase1 | phase2
    precision: str  # a Keras dtype policy: float32 | mixed_float16 | mixed_bfloat16
    jit: bool  # Keras' jit_compile: XLA on TensorFlow and JAX, torch.compile on PyTorch
    feed: str = "memory"  # memory: batches already in host memory | pipeline: the training input pipeline

    @property
    def label(self) -> str:
        return f"{self.workload} {self.precision} xla={'on' if self.jit else 'off'} {self.feed}"


@dataclass(frozen=True)
class Feed:
    """What one timed pass trains on: `steps` batches in host memory, or as many drawn from one
    endless stream of the input pipeline's batches (its start-up paid once, in the warm-up)."""

    steps: int
    batch_size: int
    images: np.ndarray | None = None
    labels: np.ndarray | None = None
    stream: Iterator | None = None

    @property
    def images_per_pass(self) -> int:
        return self.steps * self.batch_size

    def fit_args(self) -> dict:
        if self.stream is not None:
            return {"x": self.stream, "steps_per_epoch": self.steps, "shuffle": False}
        return {"x": self.images, "y": self.labels, "batch_size": self.batch_size, "shuffle": False}

    def predict_args(self) -> dict:
        if self.stream is not None:
            return {"x": self.stream, "steps": self.steps}
        return {"x": self.images, "batch_size": self.batch_size}


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


def _compiled_step(clf: Classifier, variant: Variant, feed: Feed) -> Step:
    """One pass of `variant` over `feed`'s batches: Keras' own fit/predict loop, which keeps the
    weights on the device between steps, as fine_tune.py's loop does. It returns host values,
    so it ends when the device does."""
    if variant.workload == "features":
        clf.features_model.compile(jit_compile=variant.jit)
        return lambda: clf.features_model.predict(**feed.predict_args(), verbose=0)
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
    return lambda: clf.logits_model.fit(**feed.fit_args(), verbose=0)


def _batches(setup: DeviceSetup, size: int, steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`steps` batches of random uint8 images (what the input pipeline hands over) and one-hot
    labels, in host memory: each batch crosses to the device, as the pipeline's batches do."""
    rng = np.random.default_rng(seed)
    count = steps * setup.batch_size
    images = rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    labels = np.eye(setup.num_classes, dtype=np.float32)[rng.integers(0, setup.num_classes, count)]
    return images, labels


def _pipeline_stream(data: str, size: int, batch_size: int) -> tuple[Iterator, int]:
    """An endless generator of fine_tune.py's training batches over `data` (uint8 images after
    the host's crop and flip, one-hot labels), and the dataset's class count."""
    import tensorflow as tf  # only here: the memory feed needs no TensorFlow

    from app.data.pipeline import load_dataset_info, make_train_dataset

    info = load_dataset_info(data)
    if info.multi_label:
        raise UserError(f"{data}: multi-label records; the device benchmark trains single-label heads")
    classes = len(info.classes)
    ds = make_train_dataset(data, image_size=size, batch_size=batch_size, repeat=True)
    batches = ds.map(lambda images, labels: (images, tf.one_hot(labels, classes))).as_numpy_iterator()

    def stream() -> Iterator:  # a generator, which Keras' fit/predict take as one; tf's iterator type they do not
        yield from batches

    return stream(), classes


def _feeds(setup: DeviceSetup, size: int, steps: int) -> tuple[dict[str, Feed], DeviceSetup]:
    """The memory feed, and the pipeline feed when `setup.data` is given; `setup` with the
    dataset's class count, so both feeds train the same head."""
    feeds = {}
    if setup.data:
        stream, classes = _pipeline_stream(setup.data, size, setup.batch_size)
        feeds["pipeline"] = Feed(steps, setup.batch_size, stream=stream)
        setup = replace(setup, num_classes=classes)
    images, labels = _batches(setup, size, steps)
    feeds["memory"] = Feed(steps, setup.batch_size, images, labels)
    return feeds, setup


def _images_per_s(step: Step, images: int) -> float:
    start = time.perf_counter()
    step()
    return images / (time.perf_counter() - start)


def run_device_benchmark(
    setup: DeviceSetup,
    variants: list[Variant],
    *,
    steps: int = 20,
    rounds: int = 5,
    warmup: int = 2,
    log: Callable[[str], None] = print,
) -> dict:
    """Build and warm up every variant (compilation and autotuning stay out of the figures),
    then time them in alternating rounds; report each one's median images/s and range."""
    size = _image_size(setup)
    feeds, setup = _feeds(setup, size, steps)
    prepared: dict[Variant, Step] = {}
    for variant in variants:
        start = time.perf_counter()
        prepared[variant] = _compiled_step(_classifier(setup, variant.precision), variant, feeds[variant.feed])
        for _ in range(warmup):
            prepared[variant]()
        log(f"{variant.label}: built, compiled and warmed up in {time.perf_counter() - start:.1f} s")
    samples: dict[Variant, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant, step in prepared.items():
            samples[variant].append(_images_per_s(step, feeds[variant.feed].images_per_pass))
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{v.label} {s[-1]:.0f}" for v, s in samples.items()))
    return {
        "backend": keras.backend.backend(),
        "device": device_name(),
        "backbone": setup.backbone,
        "image_size": size,
        "batch_size": setup.batch_size,
        "steps": steps,
        "rounds": rounds,
        "data": setup.data,
        "results": [
            {
                "workload": v.workload,
                "precision": v.precision,
                "xla": v.jit,
                "feed": v.feed,
                "images_per_s": round(statistics.median(s), 1),
                "range": [round(min(s), 1), round(max(s), 1)],
            }
            for v, s in samples.items()
        ],
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
    """The report as a Markdown table, for the README and for reading at a glance. A pipeline-fed
    row's last column is its rate over the same variant's memory-fed rate: the share of what the
    device could train that the host's input sustains."""
    memory = {_key(r): r["images_per_s"] for r in report["results"] if r["feed"] == "memory"}
    rows = [
        "| workload | precision | XLA | feed | images/s (median) | range | of memory-fed |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in report["results"]:
        share = f"{r['images_per_s'] / memory[_key(r)]:.0%}" if r["feed"] == "pipeline" and _key(r) in memory else ""
        rows.append(
            f"| {r['workload']} | {r['precision']} | {'on' if r['xla'] else 'off'} | {r['feed']} | "
            f"{r['images_per_s']:,.0f} | {r['range'][0]:,.0f}–{r['range'][1]:,.0f} | {share} |"
        )
    return "\n".join(rows)


def _key(result: dict) -> tuple:
    return result["workload"], result["precision"], result["xla"]


def _items(parser: argparse.ArgumentParser, flag: str, text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated flag's items, each one of `allowed`; anything else is argparse's usage error."""
    items = tuple(text.split(","))
    bad = [item for item in items if item not in allowed]
    if bad:
        parser.error(f"argument {flag}: {', '.join(bad)} not among {', '.join(allowed)}")
    return items


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbone", default="mobilenet_v2", help="backbone (default mobilenet_v2)")
    p.add_argument(
        "--weights", default="none", help="none | imagenet | PATH (default none: speed does not depend on them)"
    )
    p.add_argument("--image-size", type=int, default=0, help="input size; 0 = the backbone's default")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--workloads", default="features,phase1,phase2", help="comma-separated (default all three)")
    p.add_argument(
        "--precisions",
        default="float32,mixed_float16",
        help="comma-separated among float32, mixed_float16, mixed_bfloat16 (default float32,mixed_float16)",
    )
    p.add_argument("--xla", default="off,on", help="off, on or off,on (default)")
    p.add_argument("--steps", type=int, default=20, help="steps timed per variant per round (default 20)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds; medians are reported (default 5)")
    p.add_argument(
        "--data",
        default=None,
        help="TFRecord folder (make_tfrecords.py): also time each variant fed by the input pipeline over it",
    )
    args = p.parse_args()

    workloads = _items(p, "--workloads", args.workloads, WORKLOADS)
    precisions = _items(p, "--precisions", args.precisions, PRECISIONS)
    xla = _items(p, "--xla", args.xla, ("off", "on"))
    feeds = FEEDS if args.data else FEEDS[:1]
    setup = DeviceSetup(args.backbone, args.weights, args.image_size, args.batch_size, data=args.data)
    variants = [
        Variant(w, precision, x == "on", feed)
        for precision in precisions
        for x in xla
        for w in workloads
        for feed in feeds
    ]
    report = run_device_benchmark(
        setup, variants, steps=args.steps, rounds=args.rounds, log=lambda m: print(m, file=sys.stderr)
    )
    print(
        f"{report['backend']} on {report['device']}, {report['backbone']} at {report['image_size']} px, "
        f"batch {report['batch_size']}:\n{format_table(report)}"
    )
    print(json.dumps(report))


if __name__ == "__main__":
    run_cli(main)
