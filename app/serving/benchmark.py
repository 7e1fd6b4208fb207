"""Serving latency and throughput: the local HTTP server vs direct in-process SavedModel calls.

One run, same images, variants alternated over rounds (medians reported): single-image latency
p50/p99 (one client, sequential), and throughput with concurrent clients (one image each).
"""

from __future__ import annotations

import base64
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf

SERVE_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve.py"


def _percentiles(seconds: list[float]) -> tuple[float, float]:
    ms = np.array(seconds) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def _start_server(model_dir: Path, max_wait_ms: float) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(SERVE_SCRIPT), str(model_dir), "--port", str(port),
                             "--max-wait-ms", str(max_wait_ms)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1/models/{model_dir.name}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not start")


def run_serving_benchmark(model_dir: Path, images: list[bytes], *, requests: int = 200, clients: int = 8,
                          rounds: int = 3, max_wait_ms: float = 5.0, log: Callable[[str], None] = print) -> dict:
    model_dir = Path(model_dir)
    newest = max(int(p.name) for p in model_dir.iterdir() if p.name.isdigit())
    serve = tf.saved_model.load(str(model_dir / str(newest))).signatures["serving_default"]
    lock = threading.Lock()  # in-process: one caller at a time, as a naive embedding would do

    def direct(i: int) -> None:
        with lock:
            serve(image_bytes=tf.constant([images[i % len(images)]]))

    bodies = [json.dumps({"instances": [{"b64": base64.b64encode(im).decode()}]}).encode() for im in images]
    proc, url = _start_server(model_dir, max_wait_ms)

    def http(i: int) -> None:
        req = urllib.request.Request(url + ":predict", data=bodies[i % len(bodies)], headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()

    def latency(call) -> list[float]:
        times = []
        for i in range(requests):
            start = time.perf_counter()
            call(i)
            times.append(time.perf_counter() - start)
        return times

    def throughput(call) -> float:
        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(call, range(requests)))
        return requests / (time.perf_counter() - start)

    try:
        for call in (direct, http):  # warm-up: tracing, connections
            for i in range(10):
                call(i)
        samples: dict[str, list] = {k: [] for k in ("direct_p50", "direct_p99", "server_p50", "server_p99", "direct_rps", "server_rps")}
        for r in range(rounds):
            for name, call in (("direct", direct), ("server", http)):
                p50, p99 = _percentiles(latency(call))
                samples[f"{name}_p50"].append(p50)
                samples[f"{name}_p99"].append(p99)
                samples[f"{name}_rps"].append(throughput(call))
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{k}={v[-1]:.1f}" for k, v in samples.items()))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    names = {"direct_p50": "direct_p50_ms", "direct_p99": "direct_p99_ms", "server_p50": "server_p50_ms",
             "server_p99": "server_p99_ms", "direct_rps": "direct_images_per_s", "server_rps": "server_images_per_s"}
    result = {names[k]: round(statistics.median(v), 2) for k, v in samples.items()}
    result["server_vs_direct_throughput"] = round(statistics.median(samples["server_rps"]) / statistics.median(samples["direct_rps"]), 2)
    result.update({"clients": clients, "requests": requests})
    return result
