"""Soak the local server as a hostile world would: minutes of mixed traffic, slow clients and
hot swaps, then SIGTERM.

    python -m benchmarks.soak runs/demo/export/demo --images datasets/demo/images --minutes 5

Against a real `scripts/serve.py` on loopback (serving a private copy of the model folder):
1. capacity: --clients concurrent clients send normal photos for --capacity-seconds (15; closed loop).
2. soak, --minutes long, at --load (0.7) of that capacity, an open loop of mixed requests:
   normal photos, random bytes, 12000x12000 JPEGs (bombs), bodies over the size limit (with a
   Content-Length, and chunked without one) and malformed JSON; beside them --slow-clients
   connections that send their headers or their body a byte every 0.5 s, reconnecting when cut
   off. Every --swap-seconds a new version is published,
   in turn: whole; with saved_model.pb cut short; without assets/; whole; copied in place and
   left half-written for 3 polls before it completes.
3. SIGTERM while requests are in flight: how many were answered, the exit status, the time to exit.

Prints the promises kept (no 500, no reset connection for a well-behaved client, no broken or
half-written version ever served, slow clients cut off, open file descriptors bounded, a clean
drain) and the figures behind them: requests by kind and status, p50/p99 of normal photos,
server RSS and open files at the start and the end, versions published and served. One JSON
line at the end; exits 1 when a promise was broken.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
from PIL import Image

from app.cli import run_cli
from app.export import layout
from app.net import free_port
from app.serving.connections import MAX_REFUSING
from benchmarks.common import SCRIPTS
from benchmarks.serving import bomb_jpeg

POLL_SECONDS = 1.0
PUBLISH_CYCLE = ("whole", "truncated_saved_model", "no_assets", "whole", "half_written")
TRAFFIC_MIX = {
    "normal": 0.85,
    "random_bytes": 0.05,
    "bad_json": 0.04,
    "bomb": 0.02,
    "oversized": 0.02,
    "oversized_chunked": 0.02,
}
EXPECTED_STATUS = {
    "normal": 200,
    "random_bytes": 400,
    "bad_json": 400,
    "bomb": 413,
    "oversized": 413,
    "oversized_chunked": 413,
}
TRICKLE_SECONDS = 0.5


@dataclass
class Server:
    """serve.py on a free loopback port, with what the soak reads of its process."""

    model_dir: Path
    client_timeout: float
    max_connections: int
    log_path: Path
    proc: subprocess.Popen = field(init=False)
    port: int = field(init=False)

    def __post_init__(self) -> None:
        self.port = free_port("127.0.0.1")
        flags = ["--port", str(self.port), "--poll-seconds", str(POLL_SECONDS)]
        flags += ["--client-timeout-s", str(self.client_timeout), "--max-connections", str(self.max_connections)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(SCRIPTS / "serve.py"), str(self.model_dir), *flags],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/models/{self.model_dir.name}"

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def errors_logged(self) -> list[str]:
        """Tracebacks in the server's log that were not a refused version (which is logged on purpose)."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [line for line in lines if line.startswith("Error handling request") or "Unhandled exception" in line]

    def log_tail(self, lines: int = 20) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()[-lines:]


async def wait_until_up(server: Server, seconds: float = 120) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(int(seconds / 0.3)):
            try:
                async with session.get(server.url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.3)
    raise RuntimeError("the server did not start")


class Publisher(threading.Thread):
    """Every `interval` s, the next version of PUBLISH_CYCLE's kinds, made from a whole `template`."""

    def __init__(self, model_dir: Path, template: Path, interval: float, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="publisher")
        self.model_dir, self.template, self.interval, self.stop = model_dir, template, interval, stop
        self.published: list[dict] = []  # {"version", "kind", "whole_at"}: when its files were complete, if ever

    def run(self) -> None:
        for i in range(10**6):
            if self.stop.wait(self.interval):
                return
            kind = PUBLISH_CYCLE[i % len(PUBLISH_CYCLE)]
            version = layout.next_version(self.model_dir)
            record = {"version": version, "kind": kind, "whole_at": None, "published_at": time.monotonic()}
            self.published.append(record)
            getattr(self, f"_{kind}")(self.model_dir / str(version), record)

    def _atomically(self, target: Path, damage=lambda folder: None) -> None:
        staging = self.model_dir / f".incomplete-{target.name}"
        shutil.copytree(self.template, staging)
        damage(staging)
        os.rename(staging, target)

    def _whole(self, target: Path, record: dict) -> None:
        self._atomically(target)
        record["whole_at"] = time.monotonic()

    def _truncated_saved_model(self, target: Path, record: dict) -> None:
        def cut(folder: Path) -> None:
            pb = folder / layout.SAVED_MODEL_FILE
            pb.write_bytes(pb.read_bytes()[: pb.stat().st_size // 3])

        self._atomically(target, cut)

    def _no_assets(self, target: Path, record: dict) -> None:
        self._atomically(target, lambda folder: shutil.rmtree(folder / layout.ASSETS))

    def _half_written(self, target: Path, record: dict) -> None:
        """Copied in place, as `cp -r` would: saved_model.pb and half the rest, then a pause of
        3 polls, then the rest."""
        files = sorted(p for p in self.template.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name != layout.SAVED_MODEL_FILE)  # the file that makes it look like a version
        half = len(files) // 2
        for i, source in enumerate(files):
            if i == half and self.stop.wait(3 * POLL_SECONDS):
                return
            destination = target / source.relative_to(self.template)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
        record["whole_at"] = time.monotonic()


class Watcher(threading.Thread):
    """The served version (status endpoint), RSS and open files of the server, twice a second."""

    def __init__(self, server: Server, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="watcher")
        self.server, self.stop = server, stop
        self.versions: list[tuple[float, int]] = []  # (time first seen, version)
        self.rss_mb: list[float] = []
        self.open_files: list[int] = []

    def run(self) -> None:
        import urllib.request

        while not self.stop.wait(0.5):
            try:
                with urllib.request.urlopen(self.server.url, timeout=5) as resp:
                    version = int(json.loads(resp.read())["model_version_status"][0]["version"])
            except OSError:
                continue
            if not self.versions or self.versions[-1][1] != version:
                self.versions.append((time.monotonic(), version))
            self.rss_mb.append(self.server.rss_mb())
            self.open_files.append(self.server.open_files())


@dataclass
class Bodies:
    photos: list[bytes]
    bomb: bytes
    oversized: bytes

    def request(self, kind: str, rng: random.Random) -> tuple[str, object, str]:
        """→ (endpoint suffix, body, content type) of one request of `kind`; an oversized_chunked
        body is a generator, sent without a Content-Length."""
        if kind == "normal":
            return ":classify", rng.choice(self.photos), "image/jpeg"
        if kind == "random_bytes":
            return ":classify", rng.randbytes(2048), "image/jpeg"
        if kind == "bad_json":
            return ":predict", b'{"instances": [', "application/json"
        if kind == "oversized_chunked":
            return ":classify", self._chunks(), "image/jpeg"
        return ":classify", self.bomb if kind == "bomb" else self.oversized, "image/jpeg"

    async def _chunks(self):
        for start in range(0, len(self.oversized), 2**20):
            yield self.oversized[start : start + 2**20]


@dataclass
class Answer:
    kind: str
    outcome: int | str  # the status, or the exception's name when there was no answer
    seconds: float
    version: int | None = None
    at: float = field(default_factory=time.monotonic)  # when the answer came


async def send(session: aiohttp.ClientSession, url: str, kind: str, bodies: Bodies, rng: random.Random) -> Answer:
    suffix, body, content_type = bodies.request(kind, rng)
    start = time.perf_counter()
    try:
        async with session.post(url + suffix, data=body, headers={"Content-Type": content_type}) as resp:
            answer = await resp.read()
            version = json.loads(answer).get("model_version") if resp.status == 200 else None
            return Answer(kind, resp.status, time.perf_counter() - start, version)
    except (TimeoutError, aiohttp.ClientError) as err:
        return Answer(kind, type(err).__name__, time.perf_counter() - start)


def session(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit), timeout=aiohttp.ClientTimeout(total=60))


async def capacity(url: str, bodies: Bodies, clients: int, seconds: float) -> float:
    """Normal photos per second that `clients` clients get, each sending as soon as answered."""
    rng, done = random.Random(0), []
    async with session(clients) as http:
        stop_at = time.perf_counter() + seconds

        async def client() -> None:
            while time.perf_counter() < stop_at:
                done.append(await send(http, url, "normal", bodies, rng))

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
    return sum(a.outcome == 200 for a in done) / (time.perf_counter() - start)


async def open_loop(url: str, bodies: Bodies, rate: float, seconds: float, seed: int) -> list[Answer]:
    """Requests of TRAFFIC_MIX's kinds at a fixed rate whatever the answers."""
    rng = random.Random(seed)
    kinds, weights = zip(*TRAFFIC_MIX.items())
    async with session(512) as http:
        tasks, start = [], time.perf_counter()
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            kind = rng.choices(kinds, weights)[0]
            tasks.append(asyncio.create_task(send(http, url, kind, bodies, rng)))
        return list(await asyncio.gather(*tasks))


async def slow_client(port: int, model: str, part: str, stop_at: float, endings: list) -> None:
    """Send a request's headers (or its body) a byte every TRICKLE_SECONDS, reconnecting when
    cut off; each connection's (part, ending, seconds to the server's first byte or close)."""
    pad = b"a" * 400
    while time.monotonic() < stop_at:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        start = time.monotonic()
        if part == "headers":
            head, trickled = b"", b"GET /v1/models/" + model.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Pad: " + pad
        else:
            head = f"POST /v1/models/{model}:classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
            head, trickled = (head + f"Content-Length: {len(pad)}\r\n\r\n").encode(), pad
        writer.write(head)
        trickling = asyncio.create_task(_trickle(writer, trickled))
        try:
            first = await reader.read(64)
            ending = "closed" if not first else first.split(b" ")[1].decode(errors="replace")
        except ConnectionError:
            ending = "reset"
        seconds = time.monotonic() - start
        trickling.cancel()
        writer.close()
        endings.append((part, ending, seconds))


async def _trickle(writer: asyncio.StreamWriter, data: bytes) -> None:
    try:
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(TRICKLE_SECONDS)
    except ConnectionError:
        pass


async def soak(server: Server, bodies: Bodies, rate: float, args: argparse.Namespace) -> tuple[list, list]:
    """The open loop and the slow clients together, for --minutes."""
    seconds = args.minutes * 60
    endings: list = []
    stop_at = time.monotonic() + seconds
    slow = [
        asyncio.create_task(
            slow_client(server.port, server.model_dir.name, ("headers", "body")[i % 2], stop_at, endings)
        )
        for i in range(args.slow_clients)
    ]
    answers = await open_loop(server.url, bodies, rate, seconds, args.seed)
    await asyncio.gather(*slow)
    return answers, endings


async def drain(server: Server, bodies: Bodies, requests: int) -> dict:
    """`requests` normal photos on open connections, SIGTERM 0.1 s later: how many were answered."""
    rng = random.Random(1)
    async with session(requests) as http:
        await asyncio.gather(*(http.get(server.url) for _ in range(requests)))  # connections open
        tasks = [asyncio.create_task(send(http, server.url, "normal", bodies, rng)) for _ in range(requests)]
        await asyncio.sleep(0.1)
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*tasks)
    status = await asyncio.get_running_loop().run_in_executor(None, server.proc.wait, 60)
    return {
        "in_flight": requests,
        "answered_200": sum(a.outcome == 200 for a in answers),
        "exit_status": status,
        "seconds_to_exit": round(time.monotonic() - signalled, 2),
        **({"log_tail": server.log_tail()} if status else {}),  # why it did not exit 0
    }


def served_versions(watcher: Watcher, answers: list[Answer]) -> set[int]:
    return {v for _, v in watcher.versions} | {a.version for a in answers if a.version is not None}


def version_promises(publisher: Publisher, watcher: Watcher, answers: list[Answer], ended: float) -> dict:
    """No version that was never whole is served; a half-written one only once it was whole;
    every whole one (but those published in the last 15 s, still loading) is swapped in."""
    served = served_versions(watcher, answers)
    first_seen = {v: t for t, v in reversed(watcher.versions)}
    for answer in sorted(answers, key=lambda a: -a.at):
        if answer.version is not None:
            first_seen[answer.version] = min(answer.at, first_seen.get(answer.version, answer.at))
    never_whole = [p["version"] for p in publisher.published if p["whole_at"] is None]
    early = [
        p["version"]
        for p in publisher.published
        if p["kind"] == "half_written" and p["version"] in first_seen and first_seen[p["version"]] < p["whole_at"]
    ]
    return {
        "published": [f"{p['version']}:{p['kind']}" for p in publisher.published],
        "served": sorted(served),
        "whole": [p["version"] for p in publisher.published if p["whole_at"] and p["whole_at"] < ended - 15],
        "swaps": len(watcher.versions) - 1,
        "broken_served": sorted(served & set(never_whole)),
        "served_before_whole": early,
    }


def traffic_report(answers: list[Answer]) -> dict:
    by_kind = {kind: Counter(str(a.outcome) for a in answers if a.kind == kind) for kind in TRAFFIC_MIX}
    normal_ms = [a.seconds * 1000 for a in answers if a.kind == "normal" and a.outcome == 200]
    allowed = lambda kind, outcome: outcome in (EXPECTED_STATUS[kind], 503)  # noqa: E731
    return {
        "requests": len(answers),
        "by_kind": {kind: dict(counts) for kind, counts in by_kind.items()},
        "unexpected": sum(not allowed(a.kind, a.outcome) for a in answers),
        "server_errors_5xx_not_503": sum(
            isinstance(a.outcome, int) and a.outcome >= 500 and a.outcome != 503 for a in answers
        ),  # fmt: skip
        "no_answer": sum(isinstance(a.outcome, str) for a in answers),
        "normal_p50_ms": round(float(np.percentile(normal_ms, 50)), 1) if normal_ms else None,
        "normal_p99_ms": round(float(np.percentile(normal_ms, 99)), 1) if normal_ms else None,
    }


def slow_report(endings: list, client_timeout: float) -> dict:
    report = {}
    for part in ("headers", "body"):
        mine = [(ending, seconds) for p, ending, seconds in endings if p == part]
        cut = [seconds for _, seconds in mine]
        report[part] = {
            "connections": len(mine),
            "endings": dict(Counter(ending for ending, _ in mine)),
            "median_s_to_cut_off": round(statistics.median(cut), 1) if cut else None,
            "max_s_to_cut_off": round(max(cut), 1) if cut else None,
        }
    report["all_cut_off_within_timeout_plus_2s"] = all(s <= client_timeout + 2 for _, _, s in endings)
    return report


def promises(result: dict, limit_files: int) -> dict[str, bool]:
    traffic, versions, slow, drained = result["traffic"], result["versions"], result["slow_clients"], result["drain"]
    return {
        "no 500 (every answer 200, 4xx or 503)": traffic["server_errors_5xx_not_503"] == 0,
        "every request of a well-behaved client answered (no reset)": traffic["no_answer"] == 0,
        "every request answered as its kind expects (or 503)": traffic["unexpected"] == 0,
        "no broken version served": not versions["broken_served"],
        "no half-written version served before it was whole": not versions["served_before_whole"],
        "every whole version swapped in": set(versions["whole"]) <= set(versions["served"]),
        "slow clients cut off within the client timeout (+2 s)": slow["all_cut_off_within_timeout_plus_2s"],
        f"open files stayed under {limit_files}": result["server"]["open_files_max"] < limit_files,
        "SIGTERM: every request in flight answered, exit 0": drained["answered_200"] == drained["in_flight"]
        and drained["exit_status"] == 0,
        "nothing unhandled in the server's log": not result["server"]["errors_logged"],
    }


def load_bodies(folder: Path, max_body_mb: float = 8.0) -> Bodies:
    from app.errors import UserError

    photos = [f.read_bytes() for f in sorted(folder.rglob("*.jpg")) if _decodes(f)][:256]
    if not photos:
        raise UserError(f"--images: no .jpg files under {folder}")
    oversized = random.Random(2).randbytes(int((max_body_mb + 1) * 2**20))
    return Bodies(photos, bomb_jpeg(), oversized)


def _decodes(path: Path) -> bool:
    """Normal traffic is photos that decode (the demo folder holds a few broken files on purpose)."""
    try:
        with Image.open(path) as image:
            image.load()
        return True
    except (OSError, SyntaxError, ValueError):
        return False


def private_copy(model_dir: Path, scratch: Path) -> tuple[Path, Path]:
    """→ (a model folder holding only the newest version as 1, that version as the publisher's template)."""
    newest = layout.latest_version(model_dir)
    if newest is None:
        from app.errors import UserError

        raise UserError(f"{model_dir}: no version folders holding a {layout.SAVED_MODEL_FILE}")
    template = scratch / "template"
    shutil.copytree(newest, template)
    served = scratch / model_dir.name
    shutil.copytree(template, served / "1")
    return served, template


async def run_soak(args: argparse.Namespace, served: Path, template: Path, log) -> dict:
    bodies = load_bodies(args.images)
    server = Server(served, args.client_timeout_s, args.max_connections, served.parent / "server.log")
    try:
        await wait_until_up(server)
        start = {"rss_mb": round(server.rss_mb(), 1), "open_files": server.open_files()}
        rate = await capacity(server.url, bodies, args.clients, args.capacity_seconds)
        log(f"capacity {rate:.1f} photos/s with {args.clients} clients; soaking at {args.load * rate:.1f}/s")
        stop = threading.Event()
        publisher, watcher = Publisher(served, template, args.swap_seconds, stop), Watcher(server, stop)
        publisher.start(), watcher.start()
        answers, endings = await soak(server, bodies, args.load * rate, args)
        ended = time.monotonic()
        stop.set()
        publisher.join(), watcher.join()
        end = {"rss_mb": round(server.rss_mb(), 1), "open_files": server.open_files()}
        drained = await drain(server, bodies, args.clients * 2)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    return {
        "minutes": args.minutes,
        "capacity_per_s": round(rate, 1),
        "rate_per_s": round(args.load * rate, 1),
        "traffic": traffic_report(answers),
        "slow_clients": slow_report(endings, args.client_timeout_s),
        "versions": version_promises(publisher, watcher, answers, ended),
        "server": {
            "rss_mb_start": start["rss_mb"],
            "rss_mb_end": end["rss_mb"],
            "rss_mb_max": round(max(watcher.rss_mb, default=float("nan")), 1),
            "open_files_start": start["open_files"],
            "open_files_max": max(watcher.open_files, default=0),
            "open_files_end": end["open_files"],
            "errors_logged": server.errors_logged()[:5],
        },
        "drain": drained,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path, help="EXPORT_DIR/<name> (its newest version is copied)")
    p.add_argument("--images", type=Path, default=None, help="folder of JPEGs to send (default: the demo images)")
    p.add_argument("--minutes", type=float, default=5.0, help="length of the soak (default 5)")
    p.add_argument("--load", type=float, default=0.7, help="fraction of the measured capacity to send (default 0.7)")
    p.add_argument("--clients", type=int, default=8, help="clients for the capacity measurement (default 8)")
    p.add_argument("--capacity-seconds", type=float, default=15.0, help="length of that measurement (default 15)")
    p.add_argument("--slow-clients", type=int, default=64, help="connections trickling bytes at once (default 64)")
    p.add_argument("--swap-seconds", type=float, default=30.0, help="a new version this often (default 30)")
    p.add_argument("--client-timeout-s", type=float, default=10.0, help="serve.py's --client-timeout-s (default 10)")
    p.add_argument("--max-connections", type=int, default=256, help="serve.py's --max-connections (default 256)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from app.data.demo import demo_root

    args.images = args.images or demo_root() / "images"
    with tempfile.TemporaryDirectory(prefix="photoclf-soak-") as scratch:
        served, template = private_copy(args.model_dir, Path(scratch))
        result = asyncio.run(run_soak(args, served, template, lambda m: print(m, file=sys.stderr, flush=True)))
    kept = promises(result, result["server"]["open_files_start"] + args.max_connections + MAX_REFUSING)
    for promise, held in kept.items():
        print(f"{'kept  ' if held else 'BROKEN'}  {promise}")
    print(json.dumps({**result, "promises_kept": all(kept.values())}))
    return 0 if all(kept.values()) else 1


if __name__ == "__main__":
    run_cli(main)
