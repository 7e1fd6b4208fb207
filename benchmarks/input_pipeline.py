"""Measure input-pipeline throughput (images/s): ours vs the naive recipe vs JPEG decode alone.

    python -m benchmarks.input_pipeline --data data/      # your shards (the train split)
    python -m benchmarks.input_pipeline                   # synthetic 500x375 photos
    python -m benchmarks.input_pipeline --data data/ --profile   # + where our pipeline's time goes

Prints progress per round, then one JSON line with the medians and ratios.

Input-pipeline throughput: this project's training pipeline vs the usual recipe (the baseline)
vs JPEG decode alone.

"Ours" counts the colour jitter, which the training step applies on the device: here it runs
per batch in a compiled function on the host's cores, as it does in a CPU run, so all three
variants pay for comparable augmentation. `pipeline_images_per_s` leaves it out: what the host
spends when an accelerator does the jitter.

`--profile` adds variants of ours with one part changed (an assert for incomplete JPEGs instead of
the skip check; no flip; a centre crop resized with antialiasing instead of the random crop) and
times the colour
jitter alone on one batch, so the difference from the usual recipe can be placed.

Variants run in alternation (A B C, A B C, ...) and the median per variant is reported,
because this kind of machine drifts in speed; ratios are taken within the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.cli import run_cli
from app.data import schema
from app.data.pipeline import load_dataset_info, make_train_dataset
from app.data.preprocess import Augment, color_jitter

AUTOTUNE = tf.data.AUTOTUNE


def baseline_recipe(files: list[str], image_size: int, batch_size: int) -> tf.data.Dataset:
    """The baseline: the recipe users start from (per-record parse and full decode, float
    convert, resize, flip + brightness)."""

    def parse(raw: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        ex = tf.io.parse_single_example(raw, schema.FEATURE_SPEC)
        image = tf.io.decode_jpeg(ex[schema.ENCODED], channels=3)
        image = tf.image.convert_image_dtype(image, tf.float32)
        return tf.image.resize(image, [image_size, image_size]), ex[schema.LABEL]

    def augment(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return tf.image.random_brightness(tf.image.random_flip_left_right(image), 0.2), label

    ds = tf.data.Dataset.from_tensor_slices(files).interleave(tf.data.TFRecordDataset, num_parallel_calls=AUTOTUNE)
    ds = ds.map(parse, num_parallel_calls=AUTOTUNE).map(augment, num_parallel_calls=AUTOTUNE)
    return ds.shuffle(1024).batch(batch_size).prefetch(AUTOTUNE)


def decode_only(files: list[str], batch_size: int) -> tf.data.Dataset:
    """Lower bound on work: parse and full JPEG decode of the same records, nothing else."""

    def decode(raw: tf.Tensor) -> tf.Tensor:
        ex = tf.io.parse_single_example(raw, {schema.ENCODED: schema.FEATURE_SPEC[schema.ENCODED]})
        image = tf.io.decode_jpeg(ex[schema.ENCODED], channels=3)
        # Keep one pixel: every image is fully decoded, but no batching/copying of
        # variable-size images is charged to the decoder.
        return image[0, 0]

    ds = tf.data.Dataset.from_tensor_slices(files).interleave(tf.data.TFRecordDataset, num_parallel_calls=AUTOTUNE)
    return ds.map(decode, num_parallel_calls=AUTOTUNE).batch(batch_size).prefetch(AUTOTUNE)


def device_jitter(strength: float, seed: int = 0) -> Callable[[tf.Tensor], tf.Tensor]:
    """The train step's share of augmentation, as a compiled function of a uint8 batch."""
    step = tf.Variable(0, dtype=tf.int32)

    @tf.function
    def jitter(images: tf.Tensor) -> tf.Tensor:
        step.assign_add(1)
        return color_jitter(images, tf.stack([seed, step]), strength)

    return jitter


def images_per_second(
    ds: tf.data.Dataset, num_images: int, batch_size: int, on_batch: Callable[[tf.Tensor], tf.Tensor] | None = None
) -> float:
    """Time `num_images` images through an already warmed-up, repeating dataset, with
    `on_batch` (if given) applied to each batch's images as a training step would."""
    iterator = iter(ds.repeat())
    first = next(iterator)[0]  # start-up (threads, autotune, compiling on_batch) is not throughput
    if on_batch is not None:
        on_batch(first)
    batches = max(1, num_images // batch_size)
    start = time.perf_counter()
    for _ in range(batches):
        images = next(iterator)[0]
        if on_batch is not None:
            on_batch(images)  # synchronous: the next batch waits for it, as it would for a train step
    return batches * batch_size / (time.perf_counter() - start)


def make_benchmark_records(out: Path, num_images: int, width: int = 500, height: int = 375) -> Path:
    """Synthetic photo-like JPEGs at a typical photo size (default 500×375), as TFRecords."""
    from app.data.demo import CLASSES, draw_image
    from app.data.writer import write_tfrecords

    src = out / "images"
    for k in range(num_images):
        kind = CLASSES[k % len(CLASSES)]
        (src / kind).mkdir(parents=True, exist_ok=True)
        image = draw_image(kind, np.random.default_rng([7, k]), size=(width, height))
        image.save(src / kind / f"{k:05d}.jpg", quality=90)
    write_tfrecords(src, out / "records", val_fraction=0.0, test_fraction=0.0, num_shards=8)
    return out / "records"


def run_input_benchmark(
    data: str | Path | None,
    *,
    image_size: int = 224,
    batch_size: int = 32,
    num_images: int = 2048,
    rounds: int = 5,
    synthetic_images: int = 1024,
    profile: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        if data is None:
            log(f"no --data: writing {synthetic_images} synthetic 500x375 JPEGs")
            data = make_benchmark_records(Path(tmp), synthetic_images)
        files = load_dataset_info(data).shard_paths("train")
        ours = make_train_dataset(data, image_size=image_size, batch_size=batch_size)
        variants = {
            "images_per_s": (ours, device_jitter(Augment().color_jitter)),
            "pipeline_images_per_s": (ours, None),
            "baseline_images_per_s": (baseline_recipe(files, image_size, batch_size), None),
            "decode_images_per_s": (decode_only(files, batch_size), None),
        }
        if profile:
            variants.update(profile_variants(data, image_size, batch_size))
        samples: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(rounds):
            for name, (ds, on_batch) in variants.items():
                samples[name].append(images_per_second(ds, num_images, batch_size, on_batch))
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{k}={v[-1]:.0f}" for k, v in samples.items()))
    result = {k: round(statistics.median(v), 1) for k, v in samples.items()}
    result["ratio_vs_baseline"] = round(result["images_per_s"] / result["baseline_images_per_s"], 3)
    result["ratio_vs_decode"] = round(result["images_per_s"] / result["decode_images_per_s"], 3)
    if profile:
        result["jitter_ms_per_batch"] = round(jitter_milliseconds(image_size, batch_size), 2)
    return result


def profile_variants(data: str | Path, image_size: int, batch_size: int) -> dict[str, tuple[tf.data.Dataset, None]]:
    """Our pipeline (host part) with one piece changed or taken out each."""

    def ours(**kwargs) -> tf.data.Dataset:
        return make_train_dataset(data, image_size=image_size, batch_size=batch_size, **kwargs)

    return {
        "assert_not_skip_images_per_s": (ours(strict=True), None),  # strict: an assert in the decode instead
        "without_flip_images_per_s": (ours(augment=Augment(flip=False)), None),
        "centre_crop_images_per_s": (ours(augment=Augment(random_crop=False)), None),
    }


def jitter_milliseconds(image_size: int, batch_size: int, repeats: int = 50) -> float:
    """The train step's colour jitter on one uint8 batch, alone (median of `repeats`)."""
    images = tf.constant(np.random.default_rng(0).integers(0, 256, (batch_size, image_size, image_size, 3), np.uint8))
    jitter = device_jitter(Augment().color_jitter)
    jitter(images).numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jitter(images).numpy()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data", default=None, help="TFRecord folder or gs:// URL from make_tfrecords.py (default: synthetic)"
    )
    p.add_argument("--image-size", type=int, default=224, help="output size (default 224)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size (default 32)")
    p.add_argument("--num-images", type=int, default=2048, help="images timed per variant per round (default 2048)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds; medians are reported (default 5)")
    p.add_argument(
        "--synthetic-images", type=int, default=1024, help="images to generate without --data (default 1024)"
    )
    p.add_argument("--profile", action="store_true", help="also time ours with one part taken out, and the jitter")
    args = p.parse_args()

    result = run_input_benchmark(
        args.data,
        image_size=args.image_size,
        batch_size=args.batch_size,
        num_images=args.num_images,
        rounds=args.rounds,
        synthetic_images=args.synthetic_images,
        profile=args.profile,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli(main)
