"""The frozen backbone's forward pass on each runtime this host has: TensorFlow, and OpenVINO in
float32 and (where the CPU has bfloat16 instructions) bfloat16, at several batch sizes.

    python -m benchmarks.runtimes --shared ../shared
    python -m benchmarks.runtimes --shared ../shared --backbones mobilenet_v2 --batches 1,32 --rounds 3

Real photos (flowers17's val split, decoded as evaluation decodes them) go through each
backbone's pooled-features model, as `app.inference.host_forward` runs it. The runtimes alternate
within each round (A B C A B C ...), so the machine's drift falls on all of them; each line is the
median over rounds of ms per photo, its speed against TensorFlow at the same batch size, and each
output's cosine similarity to TensorFlow's (mean and lowest). Prints the CPU first, then a table,
then a JSON line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from app.cli import run_cli
from app.inference.runtime_choice import cpu_name
from app.table import format_table
from benchmarks.common import alternated_ms_per_photo

WEIGHTS = {
    "mobilenet_v2": "weights/mobilenet_v2_1.0_no_top.weights.h5",
    "efficientnet_lite0": "weights/efficientnet_lite0_imagenet_torch_state.npz",
}


def photos(shared: Path, count: int) -> np.ndarray:
    """`count` real photos as float32 0..255 at 224, by the evaluation decode."""
    from app.data.image_header import DEFAULT_MAX_MEGAPIXELS
    from app.data.preprocess import DEFAULT_CROP_FRACTION, decode_batch

    files = sorted((shared / "data" / "flowers17" / "val").glob("*/*"))[:count]
    encoded = np.array([f.read_bytes() for f in files], object)
    return decode_batch(encoded, 224, DEFAULT_CROP_FRACTION, DEFAULT_MAX_MEGAPIXELS).numpy().astype(np.float32)


def runners(backbone: str, weights: Path) -> dict[str, object]:
    """name → a call on a numpy batch: TensorFlow, then OpenVINO in each precision the host has."""
    import tensorflow as tf

    from app.inference import host_forward
    from app.models.backbones import get_backbone
    from app.models.classifier import build_classifier
    from app.models.pretrained import load_backbone

    spec = get_backbone(backbone)
    model, _ = load_backbone(spec, 224, str(weights))
    features = build_classifier(spec, model, 2, 224, 0.0).features_model
    tf_call = tf.function(
        lambda x: features(x, training=False), input_signature=[tf.TensorSpec([None, 224, 224, 3])], autograph=False
    )
    runs = {"tensorflow float32": lambda x: tf_call(tf.constant(x)).numpy()}
    converted = host_forward._converted(tf_call)
    for precision in host_forward.openvino_precisions():
        compiled = host_forward._compiled(converted, precision, single=True)
        runs[f"openvino {precision}"] = lambda x, run=compiled: run(x)["output"]
    return runs


def measure(runs: dict[str, object], images: np.ndarray, batch: int, rounds: int) -> dict[str, dict]:
    from app.inference import host_forward

    batches = [images[i : i + batch] for i in range(0, len(images) - batch + 1, batch)]
    reference = np.concatenate([runs["tensorflow float32"](b) for b in batches])
    outputs = {}
    for name, run in runs.items():  # a first, untimed pass: traced or compiled, caches warm
        outputs[name] = np.concatenate([run(b) for b in batches])
    times = alternated_ms_per_photo(runs, batches, rounds)
    base = times["tensorflow float32"]
    result = {}
    for name in runs:
        cos = host_forward._cosines(outputs[name], reference)
        ms = times[name]
        result[name] = {
            "ms_per_photo": round(ms, 3),
            "x_tensorflow": round(base / ms, 2),
            "cosine_mean": round(float(cos.mean()), 5),
            "cosine_lowest": round(float(cos.min()), 5),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", type=Path, default=Path("../shared"), help="folder with data/ and weights/")
    p.add_argument("--backbones", default=",".join(WEIGHTS), help=f"comma-separated, of {', '.join(WEIGHTS)}")
    p.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    p.add_argument("--photos", type=int, default=256, help="real photos per timed pass")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    print(f"CPU: {cpu_name()}", flush=True)
    images = photos(args.shared, args.photos)
    rows, results = [["backbone", "runtime", "batch", "ms/photo", "x TensorFlow", "cosine mean", "lowest"]], {}
    for backbone in args.backbones.split(","):
        runs = runners(backbone, args.shared / WEIGHTS[backbone])
        for batch in (int(b) for b in args.batches.split(",")):
            for name, r in measure(runs, images, batch, args.rounds).items():
                results[f"{backbone} {name} {batch}"] = r
                rows.append([backbone, name, str(batch), f"{r['ms_per_photo']:.2f}", f"{r['x_tensorflow']:.2f}",
                             f"{r['cosine_mean']:.4f}", f"{r['cosine_lowest']:.4f}"])  # fmt: skip
                print(" ".join(rows[-1]), flush=True)
    print(format_table(rows))
    print(json.dumps({"cpu": cpu_name(), "photos": len(images), "rounds": args.rounds, "results": results}))
    return 0


if __name__ == "__main__":
    run_cli(main)
