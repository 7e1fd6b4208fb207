"""The local server as a client sees it: a real subprocess, real HTTP, TF Serving's REST shapes."""

from __future__ import annotations

import base64
import io
import json
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import with_tiny_backbone
from PIL import Image

from app.export.run_export import export_run
from app.net import free_port

pytestmark = pytest.mark.start_first  # its tests take over a minute in all


class Server:
    def __init__(self, model_dir: Path, *extra: str) -> None:
        self.port = free_port("127.0.0.1")
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(  # a process that knows the tiny backbone: Grad-CAM rebuilds the model
            with_tiny_backbone("serve.py", str(model_dir), "--port", str(self.port), "--poll-seconds", "0.5", *extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                self.get("/v1/models/shapes")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.3)
        self.proc.kill()
        raise RuntimeError("server did not start")

    def request(self, path: str, body: bytes | None = None, content_type: str = "application/json") -> tuple[int, dict]:
        req = urllib.request.Request(self.base + path, data=body, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def get(self, path: str) -> dict:
        status, body = self.request(path)
        assert status == 200, body
        return body

    def predict(self, payload, path: str = "/v1/models/shapes:predict") -> tuple[int, dict]:
        return self.request(path, payload if isinstance(payload, bytes) else json.dumps(payload).encode())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def _b64(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode()}


@pytest.fixture(scope="module")
def images(demo_images: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(demo_images.glob("*/*_00[0-3].*"))]


@pytest.fixture(scope="module")
def model_dir(trained_run: Path, tmp_path_factory) -> Path:
    """A private copy of the export folder, so hot-swap can add versions without touching others."""
    target = tmp_path_factory.mktemp("serving") / "shapes"
    shutil.copytree(trained_run / "export" / "shapes" / "1", target / "1")
    return target


@pytest.fixture(scope="module")
def server(model_dir: Path):
    # LiteRT's float32 file: the answers are the SavedModel's within 1e-5 (auto may pick a bfloat16 IR)
    srv = Server(model_dir, "--max-instances", "16", "--max-body-mb", "0.5", "--runtime", "litert")
    yield srv
    assert srv.stop() == 0  # SIGTERM: clean shutdown, exit status 0


@pytest.fixture(scope="module")
def expected(model_dir: Path, images: list[bytes]) -> np.ndarray:
    serve = tf.saved_model.load(str(model_dir / "1")).signatures["serving_default"]
    return serve(image_bytes=tf.constant(images))["probabilities"].numpy()


def test_status_and_metadata(server: Server):
    status = server.get("/v1/models/shapes")
    assert status["model_version_status"][0]["state"] == "AVAILABLE"
    meta = server.get("/v1/models/shapes/metadata")
    defs = meta["metadata"]["signature_def"]["signature_def"]
    assert {"serving_default", "serving_keyed", "predict_images"} <= defs.keys()
    assert defs["serving_default"]["inputs"]["image_bytes"]["dtype"] == "DT_STRING"


def test_the_served_metadata_names_the_weights_file_without_the_training_machine_s_folders():
    from app.serving.rest import _for_clients

    local = {"weights": "/home/alice/w/mnv2.weights.h5 (from $PHOTOCLF_WEIGHTS)", "classes": ["a", "b"]}
    assert _for_clients(local) == {"weights": "mnv2.weights.h5 (from $PHOTOCLF_WEIGHTS)", "classes": ["a", "b"]}
    for kept in ("imagenet", "none (random initialisation)", "SavedModel https://tfhub.dev/google/x/5", "w/m.h5"):
        assert _for_clients({"weights": kept}) == {"weights": kept}
    assert _for_clients({}) == {}


def test_the_model_card_is_served_beside_the_metadata_and_the_page_links_it(server: Server):
    with urllib.request.urlopen(server.base + "/v1/models/shapes/card", timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("text/markdown")
        assert resp.read().decode().startswith("# Model card: shapes")
    with urllib.request.urlopen(server.base + "/", timeout=60) as resp:
        assert "/card`" in resp.read().decode()
    assert server.request("/v1/models/shapes/versions/7/card")[0] == 404  # a version not served


def test_row_and_columnar_predict_match_the_savedmodel(server: Server, images: list[bytes], expected: np.ndarray):
    status, rows = server.predict({"instances": [_b64(i) for i in images]})
    assert status == 200
    np.testing.assert_allclose([r["probabilities"] for r in rows["predictions"]], expected, atol=1e-5)
    assert all(isinstance(c, str) for c in rows["predictions"][0]["classes"])
    status, cols = server.predict(
        {"inputs": {"image_bytes": [_b64(i) for i in images[:2]]}}, "/v1/models/shapes/versions/1:predict"
    )
    assert status == 200
    np.testing.assert_allclose(cols["outputs"]["probabilities"], expected[:2], atol=1e-5)
    status, keyed = server.predict(
        {
            "signature_name": "serving_keyed",
            "instances": [{"image_bytes": _b64(images[0]), "key": "a"}, {"image_bytes": _b64(images[1]), "key": "b"}],
        }
    )
    assert status == 200 and [p["key"] for p in keyed["predictions"]] == ["a", "b"]


def test_classify_raw_and_multipart(server: Server, images: list[bytes]):
    status, body = server.request("/v1/models/shapes:classify", images[0], "image/jpeg")
    assert status == 200, body
    assert len(body["predictions"]) == 4 and {"label", "score"} <= body["predictions"][0].keys()
    # "none of these": the export's out-of-distribution score, over its threshold or not
    assert isinstance(body["ood_score"], float) and isinstance(body["unknown"], bool)
    boundary = "xYzBoUnDaRy"
    multipart = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.jpg"\r\n'
            f"Content-Type: image/jpeg\r\n\r\n"
        ).encode()
        + images[0]
        + f"\r\n--{boundary}--\r\n".encode()
    )
    status, up = server.request("/v1/models/shapes:classify", multipart, f"multipart/form-data; boundary={boundary}")
    assert status == 200, up
    assert up["predictions"] == body["predictions"]


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([("field", None)] * 17, "no file in the first 16 parts"),
        ([("field", None), ("image", "a.jpg")], None),  # a form's other fields come before its file
    ],
)
def test_a_multipart_upload_is_read_within_its_limits(server: Server, images: list[bytes], parts, message):
    boundary = "limitboundary"
    body = (
        b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"'.encode()
            + (f'; filename="{filename}"'.encode() if filename else b"")
            + b"\r\n\r\n"
            + (images[0] if filename else b"a value")
            + b"\r\n"
            for name, filename in parts
        )
        + f"--{boundary}--\r\n".encode()
    )
    status, answer = server.request("/v1/models/shapes:classify", body, f"multipart/form-data; boundary={boundary}")
    if message is None:
        assert (
            status == 200
            and answer["predictions"]
            == server.request("/v1/models/shapes:classify", images[0], "image/jpeg")[1]["predictions"]
        )
    else:
        assert status == 400 and answer["error"] == f"malformed multipart body: {message}", answer


def test_a_webp_photo_is_classified_as_the_same_pixels_in_png(server: Server, images: list[bytes]):
    """The page shows WebP photos: the server takes them too (lossless here, so the pixels match)."""
    pixels = np.asarray(Image.open(io.BytesIO(images[0])).convert("RGB"))
    encoded = {}
    for fmt, options in (("WEBP", {"lossless": True}), ("PNG", {})):
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format=fmt, **options)
        encoded[fmt] = out.getvalue()
    status, webp = server.request("/v1/models/shapes:classify", encoded["WEBP"], "image/webp")
    assert status == 200, webp
    assert webp == server.request("/v1/models/shapes:classify", encoded["PNG"], "image/png")[1]


def test_a_malformed_multipart_body_is_a_400_not_a_500(server: Server, images: list[bytes]):
    """Found by python -m fuzz rest_classify: a NUL inside a part's header made aiohttp's parser
    raise InvalidHeader, which reached the client as a 500."""
    boundary = "fuzzboundary"
    body = f"--{boundary}\r\nContent-Disposition: form-da\x00".encode() + images[0] + b'ta; name="file"\r\n\r\n'
    status, answer = server.request("/v1/models/shapes:classify", body, f"multipart/form-data; boundary={boundary}")
    assert status == 400 and answer["error"].startswith("malformed multipart body: "), answer
    assert server.request("/v1/models/shapes:classify", images[0], "image/jpeg")[0] == 200


@pytest.mark.parametrize(
    "path,payload,code,message",
    [
        (None, b"{not json", 400, "malformed JSON"),
        (None, b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "nested deeper than 32 levels"),  # was a 500
        (None, {"instances": [{"b64": "%%%not-base64"}]}, 400, "invalid base64"),
        (None, {"instances": [_b64(b"JPEG? no, text")]}, 400, "instance 0"),
        (None, {"signature_name": "nope", "instances": [_b64(b"x")]}, 400, "not found in signature def"),
        ("/v1/models/other:predict", {"instances": [_b64(b"x")]}, 404, "Servable not found"),
        ("/v1/models/shapes/versions/7:predict", {"instances": [_b64(b"x")]}, 404, "Specific"),
        (None, {"instances": [_b64(b"x")] * 17}, 400, "too many instances"),
        (None, {"instances": [_b64(b"x" * 600_000)]}, 413, "too large"),
        (None, {"instances": [], "inputs": []}, 400, "exactly one of"),
    ],
)
def test_bad_requests_get_clear_4xx_and_the_server_keeps_serving(server: Server, images, path, payload, code, message):
    status, body = server.predict(payload, path or "/v1/models/shapes:predict")
    assert status == code and message in body["error"], body
    assert server.predict({"instances": [_b64(images[0])]})[0] == 200


def test_one_bad_image_names_its_instance(server: Server, images: list[bytes]):
    status, body = server.predict({"instances": [_b64(images[0]), _b64(b"garbage"), _b64(images[1])]})
    assert status == 400 and body["error"].startswith("instance 1:")


@pytest.mark.slow
def test_eight_clients_fifty_requests_each(server: Server, images: list[bytes], expected: np.ndarray):
    errors, wrong = [], []

    def client(k: int) -> None:
        for j in range(50):
            i = (k * 50 + j) % len(images)
            status, body = server.predict({"instances": [_b64(images[i])]})
            if status != 200:
                errors.append(body)
            elif not np.allclose(body["predictions"][0]["probabilities"], expected[i], atol=1e-5):
                wrong.append(i)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrong == []


@pytest.mark.slow
def test_new_version_is_picked_up_without_dropping_requests(server: Server, model_dir: Path, trained_run: Path, images):
    stop, failures, served = threading.Event(), [], set()

    def client() -> None:
        while not stop.is_set():
            status, body = server.predict({"instances": [_b64(images[0])]})
            if status != 200:
                failures.append(body)
            served.add(server.get("/v1/models/shapes")["model_version_status"][0]["version"])

    thread = threading.Thread(target=client)
    thread.start()
    try:
        assert export_run(trained_run, export_dir=model_dir.parent, name="shapes")["saved_model"].endswith("/2")
        deadline = time.monotonic() + 60
        while "2" not in served and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join()
    assert "2" in served and failures == []


@pytest.mark.slow
def test_sigterm_finishes_the_requests_in_flight_then_exits_0(model_dir: Path, images: list[bytes]):
    """The batcher holds the request for up to 1.5 s waiting for company; SIGTERM arrives meanwhile."""
    srv = Server(model_dir, "--max-wait-ms", "1500")
    answer: list = []
    thread = threading.Thread(target=lambda: answer.append(srv.predict({"instances": [_b64(images[0])]})))
    thread.start()
    time.sleep(0.5)
    srv.proc.send_signal(signal.SIGTERM)
    thread.join(timeout=30)
    assert srv.proc.wait(timeout=30) == 0
    assert answer and answer[0][0] == 200 and len(answer[0][1]["predictions"]) == 1
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        srv.get("/v1/models/shapes")  # no longer accepting


@pytest.mark.slow
def test_explain_answers_the_map_of_the_top_class_or_the_one_asked(trained_run: Path, images: list[bytes]):
    srv = Server(trained_run / "export" / "shapes")  # inside its run dir: Grad-CAM has the weights
    try:
        _, top = srv.request("/v1/models/shapes:classify", images[0], "image/jpeg")
        status, why = srv.request("/v1/models/shapes:explain", images[0], "image/jpeg")
        assert status == 200, why
        assert why["label"] == top["predictions"][0]["label"] and why["model_version"] == 1
        cam = np.array(why["map"])
        assert cam.ndim == 2 and cam.min() >= 0.0 and cam.max() <= 1.0
        assert why["overlay"].startswith("data:image/png;base64,")
        other = top["predictions"][1]["label"]
        status, second = srv.request(f"/v1/models/shapes:explain?class={other}", images[0], "image/jpeg")
        assert status == 200 and second["label"] == other
        for path, body, message in [
            ("/v1/models/shapes:explain?class=dragon", images[0], "not one of the model's classes"),
            ("/v1/models/shapes:explain", b"not an image", "instance 0"),
            ("/v1/models/shapes:explain", b"", "empty body"),
        ]:
            status, answer = srv.request(path, body, "image/jpeg")
            assert status == 400 and message in answer["error"], answer
        assert srv.request("/v1/models/shapes:explain", images[1], "image/jpeg")[0] == 200  # still serving
    finally:
        assert srv.stop() == 0


def test_explain_without_the_run_dir_says_why(server: Server, images: list[bytes]):
    status, body = server.request("/v1/models/shapes:explain", images[0], "image/jpeg")
    assert status == 404 and "not inside its run dir" in body["error"]
