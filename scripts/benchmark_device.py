"""Measure the accelerator alone (images/s): phase-1 and phase-2 train steps and the backbone's
forward pass, per precision and XLA on/off, on random batches in memory and, with --data, on
the training input pipeline's batches.

    python scripts/benchmark_device.py                                  # float32 and mixed_float16, XLA off and on
    KERAS_BACKEND=jax python scripts/benchmark_device.py --xla on       # where JAX, not TensorFlow, is beside the GPU
    python scripts/benchmark_device.py --data records/                  # also fed by the input pipeline

Divide a rate by scripts/benchmark_input.py's images/s per CPU core to get the cores that keep
the device fed, or pass --data: each variant is then also timed on the training input pipeline's
batches over those TFRecords, and the table says what share of the in-memory rate the host's
cores sustain (tf.data needs TensorFlow installed, whichever backend trains). Prints progress
per round, a Markdown table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys

from app.cli import run_cli


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
    p.add_argument("--weights", default="none", help="none | imagenet | PATH (default none: speed does not depend on them)")
    p.add_argument("--image-size", type=int, default=0, help="input size; 0 = the backbone's default")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--workloads", default="features,phase1,phase2", help="comma-separated (default all three)")
    p.add_argument("--precisions", default="float32,mixed_float16",
                   help="comma-separated among float32, mixed_float16, mixed_bfloat16 (default float32,mixed_float16)")
    p.add_argument("--xla", default="off,on", help="off, on or off,on (default)")
    p.add_argument("--steps", type=int, default=20, help="steps timed per variant per round (default 20)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds; medians are reported (default 5)")
    p.add_argument("--data", default=None,
                   help="TFRecord folder (make_tfrecords.py): also time each variant fed by the input pipeline over it")
    args = p.parse_args()
    from app.models.device_benchmark import (FEEDS, PRECISIONS, WORKLOADS, DeviceSetup, Variant, format_table,
                                             run_device_benchmark)

    workloads = _items(p, "--workloads", args.workloads, WORKLOADS)
    precisions = _items(p, "--precisions", args.precisions, PRECISIONS)
    xla = _items(p, "--xla", args.xla, ("off", "on"))
    feeds = FEEDS if args.data else FEEDS[:1]
    setup = DeviceSetup(args.backbone, args.weights, args.image_size, args.batch_size, data=args.data)
    variants = [Variant(w, precision, x == "on", feed)
                for precision in precisions for x in xla for w in workloads for feed in feeds]
    report = run_device_benchmark(setup, variants, steps=args.steps, rounds=args.rounds,
                                  log=lambda m: print(m, file=sys.stderr))
    print(f"{report['backend']} on {report['device']}, {report['backbone']} at {report['image_size']} px, "
          f"batch {report['batch_size']}:\n{format_table(report)}")
    print(json.dumps(report))


if __name__ == "__main__":
    run_cli(main)
