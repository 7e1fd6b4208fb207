"""An export's OpenVINO IR and ONNX file on a host without TensorFlow (a serving box, a machine
lent for an accelerator): ms per photo of ONNX Runtime (float32) and OpenVINO (float32, and
bfloat16 where the CPU runs it), at each batch size and thread count, and each one's top-1
agreement with ONNX Runtime, whose file the export's own check tied to the SavedModel.

    python -m benchmarks.bare_runtimes runs/NAME/export/NAME/1 PHOTOS_DIR
    python -m benchmarks.bare_runtimes VERSION PHOTOS_DIR --threads 2,0 --batches 1,8 --rounds 5

PHOTOS_DIR holds one folder per class (a split of a photo set the model was trained for). The
photos are decoded by Pillow (centre crop, bilinear resize to the export's size), not by the
export's own decoding, which needs TensorFlow: every runtime gets the same pixels, so the
agreement compares runtimes, not decoders. Thread count 0 is every core. The runtimes alternate
within each round (A B C A B C ...); each line is the median over rounds. Prints the CPU and its
matrix extensions, a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from app.cli import run_cli
from app.export import layout
from app.export.file_runners import ONNXModel, OpenVINOModel, host_precisions
from app.inference.runtime_choice import cpu_name
from app.table import format_table
from benchmarks.common import alternated_ms_per_photo

BASELINE = "onnxruntime float32"


def photos(folder: Path, count: int, size: int) -> np.ndarray:
    """`count` photos, as many from each class folder (the first by name that Pillow reads), as
    float32 0..255 [N, size, size, 3]."""
    classes = sorted(d for d in folder.iterdir() if d.is_dir())
    each = -(-count // max(len(classes), 1))
    images = [image for d in classes for image in islice(_readable(sorted(d.iterdir()), size), each)][:count]
    if not images:
        raise SystemExit(f"error: no photos in class folders under {folder}")
    return np.stack(images).astype(np.float32)


def _readable(files: list[Path], size: int) -> Iterator[np.ndarray]:
    """Each file's centre square resized to `size`, skipping files that are not photos."""
    for path in files:
        try:
            with Image.open(path) as image:
                image = image.convert("RGB")
        except (OSError, UnidentifiedImageError):
            continue
        side = min(image.size)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        yield np.asarray(image.crop((left, top, left + side, top + side)).resize((size, size), Image.BILINEAR))


def runners(version: Path, threads: int | None) -> dict[str, object]:
    """name → a call on a float32 batch answering the probabilities."""
    runs = {BASELINE: ONNXModel(layout.onnx_model_path(version), threads)}
    for precision in host_precisions():
        runs[f"openvino {precision}"] = OpenVINOModel(layout.openvino_model_path(version), precision, threads)
    return {name: (lambda x, m=model: m(x)["probabilities"]) for name, model in runs.items()}


def agreement(runs: dict[str, object], images: np.ndarray) -> dict[str, dict]:
    """Each runtime's top-1 agreement and largest probability difference against the baseline."""
    outputs = {
        name: np.concatenate([run(images[i : i + 8]) for i in range(0, len(images), 8)]) for name, run in runs.items()
    }
    base = outputs[BASELINE]
    return {
        name: {
            "top1_agreement": float((out.argmax(1) == base.argmax(1)).mean()),
            "max_abs_diff": float(np.abs(out - base).max()),
        }
        for name, out in outputs.items()
    }


def timed(runs: dict[str, object], images: np.ndarray, batch: int, rounds: int) -> dict[str, float]:
    """Median ms per photo of each runtime at `batch`, the runtimes alternating in each round."""
    batches = [images[i : i + batch] for i in range(0, len(images) - batch + 1, batch)]
    for run in runs.values():  # warm: the first calls allocate and pick kernels
        run(batches[0])
    return alternated_ms_per_photo(runs, batches, rounds)


def cpu_extensions() -> str:
    """The CPU's matrix and bfloat16 flags (AMX, AVX-512 BF16), as the kernel reports them."""
    flags = next((line.split(":", 1)[1].split() for line in _cpuinfo() if line.startswith("flags")), [])
    found = [f for f in ("amx_tile", "amx_bf16", "amx_int8", "avx512_bf16", "avx512f") if f in flags]
    return ", ".join(found) or "none of amx/avx512"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("version", type=Path, help="an export's version folder (holding onnx/ and openvino/)")
    p.add_argument("photos", type=Path, help="a folder of class folders of photos")
    p.add_argument("--count", type=int, default=256, help="photos per timed pass and for the agreement")
    p.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    p.add_argument("--threads", default="2,0", help="comma-separated thread counts; 0 = every core")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    size = int(layout.read_metadata(args.version)["input_size"])
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores ({cpu_extensions()})", flush=True)
    images = photos(args.photos, args.count, size)
    rows, results = [["threads", "runtime", "batch", "ms/photo", "x ONNX Runtime", "top-1 agreement", "max diff"]], {}
    for threads in (int(t) for t in args.threads.split(",")):
        runs = runners(args.version, threads or None)
        agree = agreement(runs, images)
        for batch in (int(b) for b in args.batches.split(",")):
            ms = timed(runs, images, batch, args.rounds)
            for name in runs:
                results[f"{threads} {name} {batch}"] = {"ms_per_photo": round(ms[name], 3), **agree[name]}
                a = agree[name]
                speed, top1, diff = ms[BASELINE] / ms[name], a["top1_agreement"], a["max_abs_diff"]
                rows.append([str(threads or os.cpu_count()), name, str(batch), f"{ms[name]:.2f}", f"{speed:.2f}",
                             f"{top1:.4f}", f"{diff:.2g}"])  # fmt: skip
                print(" ".join(rows[-1]), flush=True)
    print(format_table(rows))
    print(json.dumps({"cpu": cpu_name(), "extensions": cpu_extensions(), "photos": len(images), "results": results}))
    return 0


if __name__ == "__main__":
    run_cli(main)
