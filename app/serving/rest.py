"""TF Serving's REST API (the parts clients use) over a ModelStore, with aiohttp.

GET  /v1/models/NAME[/versions/V]             status
GET  /v1/models/NAME[/versions/V]/metadata    signatures
GET  /v1/models/NAME[/versions/V]/card        the version's MODEL_CARD.md (404 when it has none)
POST /v1/models/NAME[/versions/V]:predict     {"instances": [...]} or {"inputs": ...}
POST /v1/models/NAME:classify                 raw image body or multipart upload → top-k labels
POST /v1/models/NAME:explain[?class=LABEL]    the same body → a Grad-CAM map of the top class (or LABEL)
GET  /  and  /v1/models/NAME/ui               a page to try the model (app/serving/page.html)
GET  /monitoring/prometheus/metrics           Prometheus metrics (TF Serving's path)

Bad input is a 4xx JSON {"error": "..."}, as TF Serving answers, and the server keeps serving.
Image bytes are checked from their header before they are queued: over `max_megapixels` is a
413 naming the size and the limit. A full queue is a 503 with Retry-After; a request not
answered within `request_timeout_ms` is a 504 (and dropped if it had not started); a body that
takes longer than `client_timeout_s` to arrive is a 408 and its connection closed after it (slow
headers and too many connections: app.serving.connections).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from html import escape
from importlib import resources

import numpy as np
import tensorflow as tf
from aiohttp import web

from app.data.image_header import ImageRejected, check_size
from app.errors import UserError
from app.export import layout
from app.inference.explain import PhotoExplainer, explain_answer
from app.inference.runtime import tiny_jpeg
from app.serving.app_state import (
    BATCHER,
    CHECKING,
    EXPLAINERS,
    EXPLAINERS_LOCK,
    HEADER_POOL,
    INSTANCES,
    LIMITS,
    METRICS,
    RETRY_AFTER_SECONDS,
    STORE,
    Limits,
)
from app.serving.batcher import Batcher, InferenceError, Overloaded
from app.serving.bodies import image_body, json_body
from app.serving.memory import release_free_memory
from app.serving.metrics import CONTENT_TYPE, ServingMetrics
from app.serving.middleware import declared_size_first, errors_as_json, observed
from app.serving.store import LoadedModel, ModelStore
from app.serving.tf_json import ApiError, format_predict, parse_predict, signature_inputs, tensor_info

RELEASE_SECONDS = 2.0


def _model(request: web.Request) -> LoadedModel:
    store: ModelStore = request.app[STORE]
    name = request.match_info["name"]
    if name != store.name:
        raise ApiError(404, f"Servable not found for request: Latest({name})")
    model = store.current
    version = request.match_info.get("version")
    if version is not None and int(version) != model.version:
        raise ApiError(
            404, f"Servable not found for request: Specific({name}, {version}); serving version {model.version}"
        )
    return model


def _check_images(images: np.ndarray, max_megapixels: float, metrics: ServingMetrics) -> None:
    """The image-bomb guard, from the headers, before anything is queued or decoded."""
    for i, data in enumerate(images):
        try:
            check_size(data, max_megapixels)
        except ImageRejected as err:
            metrics.image_failures.labels("too_large" if err.status == 413 else "unreadable").inc()
            raise ApiError(err.status, f"instance {i}: {err}") from None


async def _infer(request: web.Request, model: LoadedModel, signature: str, inputs: dict[str, np.ndarray]) -> dict:
    """Header checks, then the batcher, all within the deadline; a full server answers 503 at once."""
    app, limits, batcher = request.app, request.app[LIMITS], request.app[BATCHER]
    request[INSTANCES] = count = len(next(iter(inputs.values())))
    pending = batcher.waiting + app[CHECKING][0]
    if pending > 0 and pending + count > batcher.max_queue:
        raise ApiError(
            503,
            f"{pending} instances are waiting (limit {batcher.max_queue}); retry shortly",
            {"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    async def checked_then_run() -> dict:
        if "image_bytes" in inputs:  # off the event loop: a hostile GIF costs time
            app[CHECKING][0] += count
            try:
                await asyncio.get_running_loop().run_in_executor(
                    app[HEADER_POOL], _check_images, inputs["image_bytes"], limits.max_megapixels, app[METRICS]
                )
            finally:
                app[CHECKING][0] -= count
        return await batcher.submit(model, signature, inputs)

    try:
        return await asyncio.wait_for(checked_then_run(), limits.request_timeout_ms / 1000)
    except Overloaded as err:
        raise ApiError(503, str(err), {"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
    except TimeoutError:
        raise ApiError(504, f"no answer within the {limits.request_timeout_ms:g} ms deadline") from None
    except InferenceError:
        app[METRICS].image_failures.labels("undecodable").inc()
        raise


async def predict(request: web.Request) -> web.Response:
    model = _model(request)
    body = await json_body(request)
    signature = body.get("signature_name") or "serving_default"
    inputs, rows = parse_predict(body, signature_inputs(model, signature), request.app[LIMITS].max_instances)
    outputs = await _infer(request, model, signature, inputs)
    return web.json_response(format_predict(outputs, rows))


def _side_from_query(request: web.Request, model: LoadedModel) -> dict[str, np.ndarray]:
    """A side-features model's other inputs, from the query string (`?age=54&site=arm`); one
    left out is missing (NaN or ""), as the model's missing-value policy expects."""
    specs = {k: v for k, v in signature_inputs(model, "serving_default").items() if k != "image_bytes"}
    unknown = sorted(set(request.query) - set(specs))
    if unknown:
        raise ApiError(400, f"unknown query parameter(s) {unknown}; this model's side features are {sorted(specs)}")
    inputs = {}
    for name, spec in specs.items():
        raw = request.query.get(name, "")
        if spec.dtype == tf.string:
            inputs[name] = np.array([raw.encode()], dtype=object)
            continue
        try:
            inputs[name] = np.array([float(raw) if raw.strip() else np.nan], dtype=np.float32)
        except ValueError:
            raise ApiError(400, f"query parameter {name}: expected a number, got '{raw}'") from None
    return inputs


async def classify(request: web.Request) -> web.Response:
    """Convenience: the image as the raw body (any image/* type) or as a multipart file field;
    a side-features model's other inputs as query parameters."""
    model = _model(request)
    data = await image_body(request)
    inputs = {"image_bytes": np.array([data], dtype=object), **_side_from_query(request, model)}
    outputs = await _infer(request, model, "serving_default", inputs)
    labels = [c.decode() for c in outputs["classes"][0]]
    answer = {
        "model_version": model.version,
        "predictions": [{"label": label, "score": float(score)} for label, score in zip(labels, outputs["scores"][0])],
    }
    if "labels_above_threshold" in outputs:  # a multi-label model's answer: the labels it says yes to
        answer["labels_above_threshold"] = [c.decode() for c in outputs["labels_above_threshold"][0] if c]
    if "unknown" in outputs:  # "none of these": the photo is unlike the training photos
        answer["unknown"] = bool(outputs["unknown"][0])
        answer["ood_score"] = float(outputs["ood_score"][0])
    return web.json_response(answer)


async def explain(request: web.Request) -> web.Response:
    """Why: the Grad-CAM map of the top class (or of ?class=LABEL) for the image in the body, as
    :classify takes it (app.inference.explain). Needs the export's run dir, for its weights."""
    model = _model(request)
    data = await image_body(request)
    classes = model.metadata().get("classes") or []
    wanted = request.query.get("class")
    if wanted is not None and wanted not in classes:
        raise ApiError(400, f"query parameter class: '{wanted}' is not one of the model's classes")
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(request.app[HEADER_POOL], _check_images, [data], request.app[LIMITS].max_megapixels,
                               request.app[METRICS])  # fmt: skip
    explainer = await loop.run_in_executor(request.app[HEADER_POOL], _explainer, request.app, model)
    class_id = classes.index(wanted) if wanted is not None else -1
    try:
        answer = await loop.run_in_executor(
            request.app[HEADER_POOL], explain_answer, explainer, data, class_id, classes
        )
    except tf.errors.InvalidArgumentError:
        raise ApiError(400, "instance 0: the image could not be decoded") from None
    return web.json_response({"model_version": model.version, **answer})


def _explainer(app: web.Application, model: LoadedModel) -> PhotoExplainer:
    """The version's Grad-CAM explainer, built once (a Keras model from its run dir)."""
    with app[EXPLAINERS_LOCK]:
        if model.version not in app[EXPLAINERS]:
            try:
                app[EXPLAINERS][model.version] = PhotoExplainer(model.path)
            except UserError as err:
                raise ApiError(404, f"no Grad-CAM for version {model.version}: {err}") from None
        return app[EXPLAINERS][model.version]


async def status(request: web.Request) -> web.Response:
    model = _model(request)
    return web.json_response(
        {
            "model_version_status": [
                {
                    "version": str(model.version),
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
            ]
        }
    )


async def metadata(request: web.Request) -> web.Response:
    model = _model(request)
    defs = {}
    for name, (inputs, outputs) in model.signatures.items():
        defs[name] = {
            "inputs": {k: tensor_info(v) for k, v in inputs.items()},
            "outputs": {k: tensor_info(v) for k, v in outputs.items()},
            "method_name": "tensorflow/serving/predict",
        }
    return web.json_response(
        {
            "model_spec": {"name": request.app[STORE].name, "signature_name": "", "version": str(model.version)},
            "metadata": {
                "signature_def": {"signature_def": defs},
                "app": _for_clients(model.metadata()),
                "runtime": model.runtime.name,
            },
        }
    )


def _for_clients(metadata: dict) -> dict:
    return metadata | ({"weights": layout.weights_for_readers(metadata["weights"])} if "weights" in metadata else {})


async def model_card(request: web.Request) -> web.Response:
    """The served version's MODEL_CARD.md, as written beside it at export."""
    path = layout.model_card_path(_model(request).path, "md")
    if not path.is_file():
        raise ApiError(404, "this version has no model card (export it again with photoclf export)")
    return web.Response(text=path.read_text(encoding="utf-8"), content_type="text/markdown", charset="utf-8")


async def page(request: web.Request) -> web.Response:
    """The try-it page: one self-contained file, told its model's name through the URL it calls."""
    if "name" in request.match_info:
        _model(request)  # 404 for another model's name
    name = request.app[STORE].name
    html = resources.files("app.serving").joinpath("page.html").read_text()
    html = html.replace('"{{MODEL}}"', json.dumps(name).replace("<", "\\u003c")).replace("{{MODEL}}", escape(name))
    return web.Response(text=html, content_type="text/html")


async def prometheus(request: web.Request) -> web.Response:
    metrics: ServingMetrics = request.app[METRICS]
    model = request.app[STORE].current
    metrics.set_model(request.app[STORE].name, model.version, model.runtime.name)
    metrics.queue_depth.set(request.app[BATCHER].waiting + request.app[CHECKING][0])
    return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def _releasing_memory(app: web.Application) -> AsyncIterator[None]:
    """While the server runs: freed memory handed back every RELEASE_SECONDS. Big bodies fragment
    the heap; without this the server keeps their memory (app.serving.memory)."""

    async def every() -> None:
        loop = asyncio.get_running_loop()
        while await asyncio.sleep(RELEASE_SECONDS, result=True):
            await loop.run_in_executor(app[HEADER_POOL], release_free_memory)

    task = asyncio.create_task(every())
    yield
    task.cancel()


def make_app(store: ModelStore, batcher: Batcher, limits: Limits | None = None) -> web.Application:
    limits = limits or Limits()
    app = web.Application(
        client_max_size=limits.max_body_bytes, middlewares=[observed, errors_as_json, declared_size_first]
    )
    app[STORE], app[BATCHER], app[LIMITS] = store, batcher, limits
    app[METRICS] = metrics = ServingMetrics()
    app[HEADER_POOL] = ThreadPoolExecutor(2, thread_name_prefix="headers")
    app[CHECKING] = [0]
    app[EXPLAINERS], app[EXPLAINERS_LOCK] = {}, threading.Lock()
    batcher.on_batch = metrics.batch_size.observe
    name, version = r"{name:[^/:]+}", r"/versions/{version:\d+}"
    for prefix in (f"/v1/models/{name}", f"/v1/models/{name}{version}"):
        app.router.add_get(prefix, status)
        app.router.add_get(prefix + "/metadata", metadata)
        app.router.add_get(prefix + "/card", model_card)
        app.router.add_post(prefix + ":predict", predict)
    app.router.add_post(f"/v1/models/{name}:classify", classify)
    app.router.add_post(f"/v1/models/{name}:explain", explain)
    app.router.add_get(f"/v1/models/{name}/ui", page)
    app.router.add_get("/", page)
    app.router.add_get("/monitoring/prometheus/metrics", prometheus)

    async def on_startup(app: web.Application) -> None:
        check_size(tiny_jpeg(), limits.max_megapixels)  # traces the header check before the first request
        await batcher.start()
        store.start()

    async def on_cleanup(app: web.Application) -> None:  # after in-flight requests have been answered
        store.stop()
        await batcher.stop()
        app[HEADER_POOL].shutdown(wait=False)

    app.on_startup.append(on_startup)
    app.cleanup_ctx.append(_releasing_memory)
    app.on_cleanup.append(on_cleanup)
    return app
