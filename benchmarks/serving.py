"""Measure the local server as clients see it: speed per runtime, image bombs, overload.

    python -m benchmarks.serving runs/demo/export/demo --images datasets/demo/images

speed: a server per runtime (tf, litert, openvino, auto), alternated over rounds (medians):
single-image latency p50/p99 and throughput with --clients concurrent clients. bombs: peak
server memory with and without 12000x12000 JPEGs mixed in, bombs refused, normal requests
failed. overload: 4x the measured capacity for --overload-seconds, answers by status, peak
memory, time to the first normal answer after. Prints one JSON line.

Serving benchmark: what a client of scripts/serve.py sees, in three scenarios, in one run.

1. speed: a server per runtime, alternated over rounds, medians of single-image latency p50/p99
   (one client, sequential) and throughput (N clients): `tf` (the SavedModel, as TF Serving runs
   it), `litert`, `openvino` and `auto` (what it picks, read from its metadata), each against `tf`.
2. bombs: two fresh `auto` servers, one sent only normal images, one a mix of normal images and
   12000x12000 JPEGs (2.2 MB each) by the same N clients: peak server memory (VmHWM) of each,
   bombs refused, normal requests failed.
3. overload: requests at 4x the measured capacity for 20 s, then normal requests: answers by
   status, peak memory, and how soon after the load a request is served normally again.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from app.cli import run_cli
from app.net import free_port
from benchmarks.common import SCRIPTS

SERVE_SCRIPT = SCRIPTS / "serve.py"


class ServerProcess:
    def __init__(self, model_dir: Path, *flags: str) -> None:
        port = free_port("127.0.0.1")
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVE_SCRIPT), str(model_dir), "--port", str(port), *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{port}/v1/models/{Path(model_dir).name}"
        for _ in range(300):
            try:
                urllib.request.urlopen(self.url, timeout=1).read()
                return
            except OSError:
                time.sleep(0.3)
        self.proc.kill()
        raise RuntimeError(f"server {' '.join(flags)} did not start")

    def peak_rss_mb(self) -> float:
        """VmHWM: the most resident memory the process has had since it started."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def classify(self, body: bytes, timeout: float = 60) -> int:
        req = urllib.request.Request(self.url + ":classify", data=body, headers={"Content-Type": "image/jpeg"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read()
                return resp.status
        except urllib.error.HTTPError as err:
            err.read()
            return err.code

    def runtime(self) -> str:
        """What the server runs (under auto: what it chose as it loaded), from its metadata."""
        with urllib.request.urlopen(self.url + "/metadata", timeout=10) as resp:
            return json.load(resp)["metadata"]["runtime"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def bomb_jpeg(side: int = 12000) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (90, 120, 150)).save(buffer, "JPEG", quality=20)
    return buffer.getvalue()


def _p50_p99(seconds: list[float]) -> tuple[float, float]:
    ms = np.array(seconds) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def _latencies(server: ServerProcess, images: list[bytes], requests: int) -> list[float]:
    times = []
    for i in range(requests):
        start = time.perf_counter()
        assert server.classify(images[i % len(images)]) == 200
        times.append(time.perf_counter() - start)
    return times


def _throughput(server: ServerProcess, bodies: list[bytes], clients: int) -> tuple[float, Counter]:
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        statuses = Counter(pool.map(server.classify, bodies))
    return len(bodies) / (time.perf_counter() - start), statuses


def speed(model_dir: Path, images: list[bytes], requests: int, clients: int, rounds: int, log: Callable) -> dict:
    variants = {name: ("--runtime", name) for name in ("tf", "litert", "openvino", "auto")}
    servers = {name: ServerProcess(model_dir, *flags) for name, flags in variants.items()}
    samples: dict[str, list[float]] = {}
    try:
        auto_runs = servers["auto"].runtime()
        log(f"auto serves {auto_runs}")
        for server in servers.values():  # warm-up: connections, first calls
            _latencies(server, images, 10)
        for r in range(rounds):
            for name, server in servers.items():
                p50, p99 = _p50_p99(_latencies(server, images, requests))
                rate, _ = _throughput(server, [images[i % len(images)] for i in range(requests)], clients)
                for key, value in (("p50_ms", p50), ("p99_ms", p99), ("images_per_s", rate)):
                    samples.setdefault(f"{name}_{key}", []).append(value)
            log(f"speed round {r + 1}/{rounds}: " + ", ".join(f"{k}={v[-1]:.1f}" for k, v in samples.items()))
    finally:
        for server in servers.values():
            server.stop()
    result = {k: round(statistics.median(v), 2) for k, v in samples.items()}
    for name in ("litert", "openvino", "auto"):
        result[f"{name}_vs_tf_throughput"] = round(result[f"{name}_images_per_s"] / result["tf_images_per_s"], 2)
        result[f"{name}_vs_tf_p50"] = round(result[f"{name}_p50_ms"] / result["tf_p50_ms"], 2)
    return {**result, "auto_runs": auto_runs}


def bombs(model_dir: Path, images: list[bytes], requests: int, clients: int, bomb_every: int, log: Callable) -> dict:
    bomb = bomb_jpeg()
    normal_only = [images[i % len(images)] for i in range(requests)]
    mixed = [bomb if i % bomb_every == 0 else images[i % len(images)] for i in range(requests)]
    result = {"bomb_bytes": len(bomb), "bombs_sent": sum(body is bomb for body in mixed)}
    for name, bodies in (("normal_only", normal_only), ("mixed", mixed)):
        server = ServerProcess(model_dir, "--runtime", "auto")
        try:
            _latencies(server, images, 5)
            with ThreadPoolExecutor(clients) as pool:
                statuses = list(pool.map(server.classify, bodies))
            result[f"{name}_peak_rss_mb"] = round(server.peak_rss_mb(), 1)
        finally:
            server.stop()
        is_bomb = [body is bomb for body in bodies]
        result[f"{name}_normal_failed"] = sum(s != 200 for s, b in zip(statuses, is_bomb) if not b)
        if name == "mixed":
            result["bombs_refused_413"] = sum(s == 413 for s, b in zip(statuses, is_bomb) if b)
        log(f"bombs {name}: {result}")
    result["peak_rss_difference_mb"] = round(result["mixed_peak_rss_mb"] - result["normal_only_peak_rss_mb"], 1)
    return result


async def _open_loop(url: str, images: list[bytes], rate: float, seconds: float) -> Counter:
    """Requests at a fixed rate whatever the answers (an open loop), as many in flight as it takes."""
    import aiohttp

    statuses: Counter = Counter()

    async def one(session: aiohttp.ClientSession, body: bytes) -> None:
        try:
            async with session.post(url + ":classify", data=body, headers={"Content-Type": "image/jpeg"}) as resp:
                await resp.read()
                statuses[resp.status] += 1
        except (TimeoutError, aiohttp.ClientError) as err:
            statuses[type(err).__name__] += 1

    connector = aiohttp.TCPConnector(limit=512)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks, start = [], time.perf_counter()
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(one(session, images[i % len(images)])))
        await asyncio.gather(*tasks)
    return statuses


def overload(model_dir: Path, images: list[bytes], capacity: float, seconds: float, log: Callable) -> dict:
    server = ServerProcess(model_dir, "--runtime", "auto")
    try:
        _latencies(server, images, 5)
        statuses = asyncio.run(_open_loop(server.url, images, 4 * capacity, seconds))
        after = time.perf_counter()
        while server.classify(images[0], timeout=30) != 200:
            time.sleep(0.05)
        recovered = time.perf_counter() - after
        normal_after = _p50_p99(_latencies(server, images, 50))[0]
        alive = server.proc.poll() is None
        peak = server.peak_rss_mb()
    finally:
        server.stop()
    result = {
        "offered_per_s": round(4 * capacity, 1),
        "seconds": seconds,
        "sent": int(4 * capacity * seconds),
        "answers": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        "other_answers": sum(v for k, v in statuses.items() if k not in (200, 503, 504)),
        "server_alive": alive,
        "peak_rss_mb": round(peak, 1),
        "first_200_after_load_s": round(recovered, 3),
        "p50_ms_after_load": round(normal_after, 2),
    }
    log(f"overload: {result}")
    return result


def run_serving_benchmark(
    model_dir: Path,
    images: list[bytes],
    *,
    requests: int = 200,
    clients: int = 8,
    rounds: int = 3,
    overload_seconds: float = 20.0,
    bomb_every: int = 4,
    scenarios: tuple[str, ...] = ("speed", "bombs", "overload"),
    log: Callable[[str], None] = print,
) -> dict:
    model_dir = Path(model_dir)
    result: dict = {"clients": clients, "requests": requests}
    if "speed" in scenarios:
        result["speed"] = speed(model_dir, images, requests, clients, rounds, log)
    if "bombs" in scenarios:
        result["bombs"] = bombs(model_dir, images, requests, clients, bomb_every, log)
    if "overload" in scenarios:
        capacity = result.get("speed", {}).get("auto_images_per_s") or _capacity(model_dir, images, requests, clients)
        result["overload"] = overload(model_dir, images, capacity, overload_seconds, log)
    return result


def _capacity(model_dir: Path, images: list[bytes], requests: int, clients: int) -> float:
    server = ServerProcess(model_dir, "--runtime", "auto")
    try:
        return _throughput(server, [images[i % len(images)] for i in range(requests)], clients)[0]
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path, help="EXPORT_DIR/<name> with numbered versions")
    p.add_argument("--images", type=Path, default=None, help="folder of JPEGs to send (default: the demo images)")
    p.add_argument("--requests", type=int, default=200, help="requests per measurement (default 200)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients for throughput (default 8)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--overload-seconds", type=float, default=20.0, help="length of the 4x-capacity load (default 20)")
    p.add_argument("--scenarios", default="speed,bombs,overload", help="comma-separated subset (default all three)")
    args = p.parse_args()
    from app.data.demo import demo_root
    from app.errors import UserError

    folder = args.images or demo_root() / "images"
    images = [f.read_bytes() for f in sorted(folder.rglob("*.jpg"))[:64]]
    if not images:
        raise UserError(f"--images: no .jpg files under {folder}")
    scenarios = tuple(s.strip() for s in args.scenarios.split(","))
    unknown = set(scenarios) - {"speed", "bombs", "overload"}
    if unknown:
        raise UserError(f"--scenarios: unknown {sorted(unknown)} (choose from speed, bombs, overload)")
    result = run_serving_benchmark(
        args.model_dir,
        images,
        requests=args.requests,
        clients=args.clients,
        rounds=args.rounds,
        overload_seconds=args.overload_seconds,
        scenarios=scenarios,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli(main)
