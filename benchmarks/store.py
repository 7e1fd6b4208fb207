"""The feature store as a space grows: each add's wall time, a lookup's, the process's peak
memory and the space's size on disk, for rows the size of phase 2's cut (MobileNetV2 at 224:
14 x 14 x 96 float32, 75 KB a row) or of pooled features.

    python -m benchmarks.store --rows 20000 --batch 2000
    python -m benchmarks.store --rows 20000 --batch 2000 --shape 1280      # pooled features

Adds `--batch` new rows at a time (random values, fresh keys) until the space holds `--rows`,
then looks up `--lookup` stored keys in random order. Only the store's public calls are used, so
the same command measures any version of it (run it with PYTHONPATH pointing at another
checkout to compare). Prints one line per add, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from app.cli import run_cli
from app.inference.runtime_choice import cpu_name
from app.training.frozen import FeatureStore
from benchmarks.common import disk_bytes

SPACE = {"kind": "activations", "backbone": "benchmark", "weights": "random", "view": 0}


def grow(root: Path, rows: int, batch: int, shape: tuple[int, ...], lookups: int, seed: int = 0) -> dict:
    """Add rows in batches until the space holds `rows`, then look some up; the times of each."""
    rng = np.random.default_rng(seed)
    store = FeatureStore(root, limit=2**50)
    adds = []
    for start in range(0, rows, batch):
        keys = np.arange(start, min(start + batch, rows), dtype=np.int64)
        values = rng.standard_normal((len(keys), *shape), dtype=np.float32)
        began = time.perf_counter()
        store.add(SPACE, keys, values)
        adds.append(time.perf_counter() - began)
        print(f"add rows {start}..{start + len(keys)}: {adds[-1]:.2f} s", flush=True)
    wanted = rng.choice(rows, size=min(lookups, rows), replace=False).astype(np.int64)
    began = time.perf_counter()
    found, got = FeatureStore(root, limit=2**50).lookup(SPACE, wanted)
    lookup = time.perf_counter() - began
    assert found.all() and got.shape == (len(wanted), *shape)
    return {"adds_s": [round(a, 3) for a in adds], "last_add_s": round(adds[-1], 3),
            "median_add_s": round(statistics.median(adds), 3), "lookup_s": round(lookup, 3),
            "disk_bytes": disk_bytes(root)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=20_000, help="rows the space holds at the end")
    p.add_argument("--batch", type=int, default=2_000, help="rows per add (a run's new photos)")
    p.add_argument("--shape", default="14,14,96", help="one row's shape, comma-separated (default: MobileNetV2's cut)")
    p.add_argument("--lookup", type=int, default=2_000, help="stored rows looked up at the end")
    p.add_argument("--root", type=Path, default=None, help="the store's folder (default: a temporary one)")
    args = p.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(","))
    with tempfile.TemporaryDirectory(prefix="store-bench-", dir=args.root) as root:
        result = grow(Path(root), args.rows, args.batch, shape, args.lookup)
    result["disk_mb"] = round(result["disk_bytes"] / 2**20, 1)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps({"cpu": cpu_name(), "rows": args.rows, "batch": args.batch, "shape": shape, **result}))
    return 0


if __name__ == "__main__":
    run_cli(main)
