"""The fuzz targets: each is a function of one input's bytes that returns normally or raises
only what its parser documents, and the seeds it starts from."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class Target:
    describe: str
    modules: tuple[str, ...]  # imported under atheris' instrumentation: their branches guide it
    make: Callable[[], Callable[[bytes], None]]  # called once: the function of one input
    seeds: Callable[[], list[bytes]]


def _image(fmt: str, size: tuple[int, int] = (24, 16), **options) -> bytes:
    pixels = (np.arange(size[0] * size[1] * 3) % 251).astype(np.uint8).reshape(size[1], size[0], 3)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **options)
    return out.getvalue()


def image_seeds() -> list[bytes]:
    """Small images of every format the guard and the converter read."""
    return [
        _image("JPEG"),
        _image("JPEG", progressive=True),
        _image("PNG"),
        _image("BMP"),
        _image("GIF"),
        _image("WEBP"),
        _image("TIFF"),
    ]


def _image_header() -> Callable[[bytes], None]:
    from app.data.image_header import ImageRejected, read_header

    def run(data: bytes) -> None:
        try:
            size = read_header(data)
        except ImageRejected:
            return
        area = max(size.height, 0) * max(size.width, 0)  # Python's ints do not overflow
        assert size.pixels >= min(area, 2**63 - 1), size  # never less than the header's own area

    return run


def _convert() -> Callable[[bytes], None]:
    from app.data.convert import ImageRejected, convert_image

    def run(data: bytes) -> None:
        try:
            converted = convert_image(data, max_side=64, max_pixels=4_000_000)
        except ImageRejected:
            return
        import tensorflow as tf

        # What is written must decode in the training pipeline, at the size recorded for it.
        shape = tuple(tf.io.decode_jpeg(converted.jpeg, channels=3).shape)
        assert shape == (converted.height, converted.width, 3), (shape, converted)

    return run


class _Requests:
    """aiohttp requests made in memory, with the body already received, on one event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def request(self, body: bytes, content_type: str, max_size: int = 2**20):
        from unittest import mock

        from aiohttp import streams, web
        from aiohttp.test_utils import make_mocked_request

        from app.serving.app_state import LIMITS, Limits

        payload = streams.StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=self.loop)
        payload.feed_data(body)
        payload.feed_eof()
        headers = {"Content-Type": content_type, "Content-Length": str(len(body))}
        app = web.Application()
        app[LIMITS] = Limits(max_body_bytes=max_size)  # what the body readers ask of the server's app
        return make_mocked_request(
            "POST", "/v1/models/m:predict", headers, payload=payload, client_max_size=max_size, app=app, loop=self.loop
        )

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)


def _allowed_http_error(err: Exception) -> bool:
    """What the server answers with a 4xx: its ApiError, or aiohttp's own HTTP errors."""
    from aiohttp import web

    from app.serving.tf_json import ApiError

    status = err.status if isinstance(err, ApiError | web.HTTPException) else 500
    return 400 <= status < 500


def _predict_specs():
    import tensorflow as tf

    text = tf.TensorSpec([None], tf.string)
    return [
        {"image_bytes": text},
        {"image_bytes": text, "age": tf.TensorSpec([None], tf.float32), "site": text},
        {"images": tf.TensorSpec([None, 4, 4, 3], tf.float32)},
    ]


def _rest_predict() -> Callable[[bytes], None]:
    """`:predict`: the JSON body (first byte: which model's inputs), both of TF Serving's forms."""
    from app.serving.bodies import json_body
    from app.serving.tf_json import parse_predict

    requests, specs = _Requests(), _predict_specs()

    def run(data: bytes) -> None:
        if not data:
            return
        try:
            body = requests.run(json_body(requests.request(data[1:], "application/json")))
            inputs, _ = parse_predict(body, specs[data[0] % len(specs)], max_instances=64)
        except Exception as err:
            if _allowed_http_error(err):
                return
            raise
        assert inputs and len({len(v) for v in inputs.values()}) == 1

    return run


BOUNDARY = "fuzzboundary"


def _rest_classify() -> Callable[[bytes], None]:
    """`:classify`: the image as the raw body or as a multipart upload (first byte: which)."""
    from app.serving.bodies import image_body

    requests = _Requests()
    types = ["image/jpeg", f"multipart/form-data; boundary={BOUNDARY}", "multipart/mixed", "application/octet-stream"]

    def run(data: bytes) -> None:
        if not data:
            return
        try:
            image = requests.run(image_body(requests.request(data[1:], types[data[0] % len(types)], 4096)))
        except Exception as err:
            if _allowed_http_error(err):
                return
            raise
        assert isinstance(image, bytes) and image

    return run


def predict_seeds() -> list[bytes]:
    b64 = base64.b64encode(_image("JPEG", (8, 8))).decode()
    return [
        b"\x00" + json.dumps({"instances": [{"b64": b64}]}).encode(),
        b"\x00" + json.dumps({"inputs": {"image_bytes": [{"b64": b64}, {"b64": b64}]}}).encode(),
        b"\x01" + json.dumps({"instances": [{"image_bytes": {"b64": b64}, "age": 3.5, "site": "leg"}]}).encode(),
        b"\x01" + json.dumps({"inputs": {"image_bytes": [{"b64": b64}], "age": [None], "site": [None]}}).encode(),
        b"\x02" + json.dumps({"instances": [[[[0.5] * 3] * 4] * 4]}).encode(),
        # Shapes byte mutation rarely builds: nesting past the depth limit, numbers past their type.
        b"\x00" + b'{"instances": ' + b"[" * 40 + b"]" * 40 + b"}",
        b"\x02" + json.dumps({"instances": [[[[1e300, 2**64, -0.0]] * 4] * 4]}).encode(),
        b"\x01"
        + json.dumps({"inputs": {"image_bytes": [{"b64": b64}], "age": [[[[[]]]]], "site": [{"b64": {}}]}}).encode(),
    ]


def classify_seeds() -> list[bytes]:
    jpeg = _image("JPEG", (8, 8))
    part = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.jpg"\r\n'
            f"Content-Type: image/jpeg\r\n\r\n"
        ).encode()
        + jpeg
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )
    field = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="f"\r\n\r\nv\r\n'.encode()
    many_headers = f"--{BOUNDARY}\r\n".encode() + b"X-A: b\r\n" * 17 + b"\r\n" + jpeg + f"\r\n--{BOUNDARY}--".encode()
    return [b"\x00" + jpeg, b"\x01" + part, b"\x01" + field * 16 + part, b"\x01" + many_headers]


SCRATCH_ENV = "PHOTOCLF_FUZZ_SCRATCH"


class _Scratch:
    """One temporary folder per fuzzing process: the files an input is written to, and four
    small photos a manifest can name (a photo may be listed once)."""

    def __init__(self) -> None:
        given = os.environ.get(SCRATCH_ENV)  # fuzz.run names one inside --out: libFuzzer's exit skips clean-up
        self.root = Path(given) if given else Path(tempfile.mkdtemp(prefix="photoclf-fuzz-"))
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("a.jpg", "b.png", "c.jpg", "d.png"):
            (self.root / name).write_bytes(_image("JPEG" if name.endswith("jpg") else "PNG"))

    def write(self, name: str, data: bytes) -> Path:
        path = self.root / name
        path.write_bytes(data)
        return path


def _manifest() -> Callable[[bytes], None]:
    """The CSV manifest reader, with side-feature and (first byte odd) multi-label columns."""
    from app.data import side_features
    from app.data.sources import scan_source
    from app.errors import UserError

    scratch = _Scratch()
    columns = tuple(side_features.parse_columns("age,site:categorical"))

    def run(data: bytes) -> None:
        if not data:
            return
        csv_path = scratch.write("manifest.csv", data[1:])
        multi_label, side = bool(data[0] & 1), columns if data[0] & 2 else ()
        try:
            source = scan_source(csv_path, 0.5, 0.0, 0, side, multi_label)
        except UserError:
            return
        assert source.images and all(image.path.is_file() for image in source.images)

    return run


def manifest_seeds() -> list[bytes]:
    rows = "a.jpg,cat,train,3,leg\nb.png,dog,train,,arm\nc.jpg,dog,val,7,\nd.png,cat,val,1.5,leg\n"
    return [
        b"\x00path,label\na.jpg,cat\nb.png,dog\nc.jpg,dog\nd.png,cat\n",
        b"\x02path,label,split,age,site\n" + rows.encode(),
        b"\x01path,label,split\na.jpg,cat|dog,train\nb.png,dog,train\nc.jpg,,val\nd.png,cat,val\n",
        b'\x00\xef\xbb\xbfpath,label,split,keep\r\na.jpg,"<b>&",train,true\r\nb.png,dog,train,\r\n'
        b'c.jpg,dog,val,1\r\nd.png,"<b>&",val,false\r\n',
        b"\x00path,label\na.jpg,cat\nb.png," + b"d" * 4097 + b"\n",  # a cell past the limit
        b"\x00path,label" + b",x" * 255 + b"\na.jpg,cat" + b"," * 255 + b"\n",  # columns at the limit
    ]


def _run_files() -> Callable[[bytes], None]:
    """dataset.json, a run's state.json or its config.json (first byte: which)."""
    from app.config import read_saved_config
    from app.data.pipeline import load_dataset_info
    from app.errors import UserError
    from app.run_dir import RunDir, check_run_state

    scratch = _Scratch()
    run_dir = RunDir(scratch.root / "run")
    run_dir.root.mkdir(exist_ok=True)  # a second run in the same --out finds it

    def run(data: bytes) -> None:
        if not data:
            return
        try:
            if data[0] % 3 == 0:
                scratch.write("dataset.json", data[1:])
                info = load_dataset_info(scratch.root)
                info.shard_paths("train")
            elif data[0] % 3 == 1:
                run_dir.state.write_bytes(data[1:])
                check_run_state(run_dir, {"num_classes": 3, "image_size": 224}, write=False)
            else:
                read_saved_config(scratch.write("config.json", data[1:]))
        except UserError:
            return

    return run


def run_file_seeds() -> list[bytes]:
    from app.config import TrainConfig

    dataset = {
        "schema_version": 1,
        "classes": ["cat", "dog"],
        "counts": {"train": {"cat": 1, "dog": 1}},
        "shards": {"train": ["train-00000-of-00001.tfrecord"]},
        "shard_records": {"train-00000-of-00001.tfrecord": 2},
    }
    return [
        b"\x00" + json.dumps(dataset).encode(),
        b"\x01" + json.dumps({"num_classes": 3, "image_size": 224}).encode(),
        b"\x02" + json.dumps(TrainConfig().to_dict()).encode(),
        b"\x00" + b'{"schema_version": 1, "classes": ' + b"[" * 40 + b"]" * 40 + b"}",  # past the depth limit
    ]


TARGETS: dict[str, Target] = {
    "image_header": Target(
        "the pixel-limit guard's header reader (JPEG, PNG, BMP, GIF, WebP, anything else)",
        ("app.data.image_header",),
        _image_header,
        image_seeds,
    ),
    "convert": Target(
        "the converter's per-file conversion: what it keeps must decode in the pipeline",
        ("app.data.convert",),
        _convert,
        image_seeds,
    ),
    "rest_predict": Target(
        ":predict's JSON body, row and columnar forms, three models' inputs",
        ("app.serving.bodies", "app.serving.tf_json"),
        _rest_predict,
        predict_seeds,
    ),
    "rest_classify": Target(
        ":classify's body: raw image bytes or a multipart upload",
        ("app.serving.bodies",),
        _rest_classify,
        classify_seeds,
    ),
    "manifest": Target(
        "the CSV manifest reader, with side-feature and multi-label columns",
        ("app.data.sources", "app.data.manifest", "app.data.side_features"),
        _manifest,
        manifest_seeds,
    ),
    "run_files": Target(
        "dataset.json, a run's state.json and its config.json",
        ("app.data.pipeline", "app.run_dir", "app.config"),
        _run_files,
        run_file_seeds,
    ),
}
