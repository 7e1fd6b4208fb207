"""Serving latency and throughput: the local HTTP server vs direct in-process SavedModel calls.

One run, same images, variants alternated over rounds (medians reported): single-image latency
p50/p99 (one client, sequential), and throughput with concurrent clients (one image each).
"""

from __future__ import annotations

import base64
import json
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

from app.errors import UserError
from app.export import layout
from app.net import free_port

SERVE_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve.py"


def _percentiles(seconds: list[float]) -> tuple[float, float]:
    ms = np.array(seconds) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def _start_server(model_dir: Path, max_wait_ms: float) -> tuple[subprocess.Popen, str]:
    port = free_port("127.0.0.1")
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


def _latencies(call: Callable[[int], None], requests: int) -> list[float]:
    """One client, sequential requests: seconds per request."""
    times = []
    for i in range(requests):
        start = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - start)
    return times


def _throughput(call: Callable[[int], None], requests: int, clients: int) -> float:
    """`clients` concurrent callers: requests per second."""
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(call, range(requests)))
    return requests / (time.perf_counter() - start)


def _direct_caller(model_dir: Path, images: list[bytes]) -> Callable[[int], None]:
    """In-process calls of the newest version's serving_default, one at a time, as a naive embedding would."""
    newest = layout.latest_version(model_dir)
    if newest is None:
        raise UserError(f"{model_dir}: no version folders holding a saved_model.pb")
    serve = tf.saved_model.load(str(newest)).signatures["serving_default"]
    lock = threading.Lock()

    def direct(i: int) -> None:
        with lock:
            serve(image_bytes=tf.constant([images[i % len(images)]]))

    return direct


def _http_caller(url: str, images: list[bytes]) -> Callable[[int], None]:
    bodies = [json.dumps({"instances": [{"b64": base64.b64encode(im).decode()}]}).encode() for im in images]

    def http(i: int) -> None:
        req = urllib.request.Request(url + ":predict", data=bodies[i % len(bodies)], headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()

    return http


def run_serving_benchmark(model_dir: Path, images: list[bytes], *, requests: int = 200, clients: int = 8,
                          rounds: int = 3, max_wait_ms: float = 5.0, log: Callable[[str], None] = print) -> dict:
    model_dir = Path(model_dir)
    direct = _direct_caller(model_dir, images)
    proc, url = _start_server(model_dir, max_wait_ms)
    callers = {"direct": direct, "server": _http_caller(url, images)}
    samples: dict[str, list] = {f"{name}_{k}": [] for name in callers for k in ("p50_ms", "p99_ms", "images_per_s")}
    try:
        for call in callers.values():  # warm-up: tracing, connections
            for i in range(10):
                call(i)
        for r in range(rounds):
            for name, call in callers.items():
                p50, p99 = _percentiles(_latencies(call, requests))
                samples[f"{name}_p50_ms"].append(p50)
                samples[f"{name}_p99_ms"].append(p99)
                samples[f"{name}_images_per_s"].append(_throughput(call, requests, clients))
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{k}={v[-1]:.1f}" for k, v in samples.items()))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    result = {k: round(statistics.median(v), 2) for k, v in samples.items()}
    result["server_vs_direct_throughput"] = round(result["server_images_per_s"] / result["direct_images_per_s"], 2)
    result.update({"clients": clients, "requests": requests})
    return result
