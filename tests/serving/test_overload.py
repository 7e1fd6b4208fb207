"""Overload, deadlines, the bomb guard and metrics, in process, with a model whose speed the test
controls (a gate it opens), so queue-full and deadline answers are deterministic."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image

from app.serving.batcher import Batcher
from app.serving.rest import BATCHER, Limits, make_app
from app.serving.store import LoadedModel


class GatedRuntime:
    """Answers [0.25, 0.75] for every image once `gate` is open; counts the images it was
    given (started) and those it answered (ran)."""

    name = "gated"

    def __init__(self) -> None:
        self.gate, self.started, self.ran = threading.Event(), 0, 0

    def signatures(self) -> dict:
        outputs = {
            "probabilities": tf.TensorSpec([None, 2], tf.float32),
            "classes": tf.TensorSpec([None, 2], tf.string),
            "scores": tf.TensorSpec([None, 2], tf.float32),
        }
        return {"serving_default": ({"image_bytes": tf.TensorSpec([None], tf.string)}, outputs)}

    def run(self, signature: str, inputs: dict) -> dict:
        n = len(inputs["image_bytes"])
        self.started += n
        assert self.gate.wait(30)
        self.ran += n
        return {
            "probabilities": np.tile([[0.25, 0.75]], (n, 1)).astype(np.float32),
            "classes": np.array([[b"dog", b"cat"]] * n, dtype=object),
            "scores": np.tile([[0.75, 0.25]], (n, 1)),
        }


class OneModelStore:
    name = "pets"

    def __init__(self, runtime: GatedRuntime, tmp: Path) -> None:
        self.current = LoadedModel(3, tmp, runtime)

    def start(self) -> None: ...

    def stop(self) -> None: ...


def jpeg(width: int = 32, height: int = 32) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (1, 2, 3)).save(buffer, "JPEG")
    return buffer.getvalue()


def serve(tmp_path: Path, runtime: GatedRuntime, scenario, **limits) -> None:
    """Run `scenario(client)` against an in-process server."""
    batcher = Batcher(max_batch=1, max_wait_ms=0, max_queue=limits.pop("max_queue", 128))
    app = make_app(OneModelStore(runtime, tmp_path), batcher, Limits(**limits))

    async def main() -> None:
        async with TestClient(TestServer(app)) as client:
            await scenario(client)

    asyncio.run(main())


async def until(condition, what: str, seconds: float = 20) -> None:
    """Poll instead of sleeping a fixed time: a slow machine takes longer to get the requests queued."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"still not {what} after {seconds} s")


def classify(client: TestClient, body: bytes):
    return client.post("/v1/models/pets:classify", data=body, headers={"Content-Type": "image/jpeg"})


def test_a_full_queue_answers_503_with_retry_after_and_the_queued_ones_finish(tmp_path: Path):
    runtime = GatedRuntime()

    async def scenario(client: TestClient) -> None:
        batcher = client.server.app[BATCHER]
        # One at a time: three sent together may be refused already, while the first is still
        # queued or in its header check (it counts against the limit until the model takes it).
        waiting = [asyncio.create_task(classify(client, jpeg()))]
        await until(lambda: runtime.started == 1, "1 running")
        waiting += [asyncio.create_task(classify(client, jpeg())) for _ in range(2)]
        await until(lambda: batcher.waiting == 2, "1 running + 2 queued")
        refused = await classify(client, jpeg())
        assert refused.status == 503 and refused.headers["Retry-After"] == "1"
        assert "limit 2" in (await refused.json())["error"]
        runtime.gate.set()
        answers = await asyncio.gather(*waiting)
        assert [r.status for r in answers] == [200, 200, 200]
        assert (await answers[0].json())["predictions"][0] == {"label": "dog", "score": 0.75}

    serve(tmp_path, runtime, scenario, max_queue=2)
    assert runtime.ran == 3  # the refused request never reached the model


def test_past_the_deadline_the_client_gets_504_and_unstarted_work_is_dropped(tmp_path: Path):
    runtime = GatedRuntime()

    async def scenario(client: TestClient) -> None:
        first, second = (asyncio.create_task(classify(client, jpeg())) for _ in range(2))
        answers = await asyncio.gather(first, second)
        assert [r.status for r in answers] == [504, 504]
        assert "300 ms deadline" in (await answers[1].json())["error"]
        runtime.gate.set()
        batcher = client.server.app[BATCHER]  # it finishes the started call and skips the dropped one
        await until(lambda: runtime.ran == runtime.started and batcher.waiting == 0, "done with the first two")
        # The first reaches the model before its deadline unless the machine is too loaded to
        # start it within 300 ms; the second, queued behind the gated call, never does.
        assert runtime.started <= 1
        # The server still answers. A loaded machine can take the new request past its own 300 ms
        # too (504), so it may take a few tries: what is checked is that one gets through.
        statuses = []
        while len(statuses) < 5 and 200 not in statuses:
            statuses.append((await classify(client, jpeg())).status)
        assert statuses[-1] == 200 and set(statuses) <= {200, 504}, statuses

    serve(tmp_path, runtime, scenario, request_timeout_ms=300)
    assert runtime.ran == runtime.started  # only what was started ran, the last request included


def test_images_over_the_limit_get_413_naming_size_and_limit_before_the_model(tmp_path: Path):
    runtime = GatedRuntime()
    runtime.gate.set()

    async def scenario(client: TestClient) -> None:
        response = await classify(client, jpeg(200, 100))  # 0.02 megapixels
        assert response.status == 413
        assert (await response.json())["error"] == "instance 0: image is 200x100 pixels; the limit is 0.01 megapixels"
        garbage = await client.post("/v1/models/pets:predict", json={"instances": [{"b64": "bm90IGFuIGltYWdl"}]})
        assert garbage.status == 400 and "not a JPEG, PNG, GIF, BMP or WebP" in (await garbage.json())["error"]
        assert (await classify(client, jpeg(50, 50))).status == 200

    serve(tmp_path, runtime, scenario, max_megapixels=0.01)
    assert runtime.ran == 1


class RefusingRuntime(GatedRuntime):
    """Refuses every image as TensorFlow refuses one it cannot decode, graph location and all."""

    def run(self, signature: str, inputs: dict) -> dict:
        raise tf.errors.InvalidArgumentError(
            None, None, "{{function_node __inference_<lambda>_5379}} Number of channels requested does not match input"
        )


def test_an_image_the_model_cannot_decode_is_a_400_in_the_decoders_words(tmp_path: Path):
    async def scenario(client: TestClient) -> None:
        response = await classify(client, jpeg(50, 50))
        assert response.status == 400
        assert (await response.json())["error"] == "instance 0: Number of channels requested does not match input"

    serve(tmp_path, RefusingRuntime(), scenario)


def _sample(text: str, name: str, **labels) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.split()[-1])
    return 0.0


def test_metrics_move_and_every_request_gets_one_access_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    runtime = GatedRuntime()
    runtime.gate.set()

    async def scenario(client: TestClient) -> None:
        before = await (await client.get("/monitoring/prometheus/metrics")).text()
        for _ in range(3):
            assert (await classify(client, jpeg())).status == 200
        assert (await classify(client, b"nope")).status == 400
        after = await (await client.get("/monitoring/prometheus/metrics")).text()
        assert _sample(before, "photoclf_requests_total", endpoint="classify", status="200") == 0
        assert _sample(after, "photoclf_requests_total", endpoint="classify", status="200") == 3
        assert _sample(after, "photoclf_requests_total", endpoint="classify", status="400") == 1
        assert _sample(after, "photoclf_request_latency_seconds_count", endpoint="classify") == 4
        assert _sample(after, "photoclf_batch_size_count") == 3
        assert _sample(after, "photoclf_image_decode_failures_total", reason="unreadable") == 1
        assert _sample(after, "photoclf_model_version", model="pets", runtime="gated") == 3
        assert _sample(after, "photoclf_queue_depth") == 0

    with caplog.at_level(logging.INFO, logger="photoclf.access"):
        serve(tmp_path, runtime, scenario)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "photoclf.access"]
    assert [(line["method"], line["status"], line["instances"]) for line in lines] == [
        ("GET", 200, 0),
        ("POST", 200, 1),
        ("POST", 200, 1),
        ("POST", 200, 1),
        ("POST", 400, 1),
        ("GET", 200, 0),
    ]
    assert lines[1]["path"] == "/v1/models/pets:classify" and lines[1]["latency_ms"] > 0


def test_the_page_is_self_contained_and_names_the_model(tmp_path: Path):
    async def scenario(client: TestClient) -> None:
        for path in ("/", "/v1/models/pets/ui"):
            response = await client.get(path)
            html = await response.text()
            assert response.status == 200 and response.content_type == "text/html"
            assert "<title>pets · photoclf</title>" in html and 'const MODEL = "pets";' in html
            assert "http://" not in html and "https://" not in html  # nothing fetched from elsewhere
        assert (await client.get("/v1/models/other/ui")).status == 404

    serve(tmp_path, GatedRuntime(), scenario)
