"""What the server's routes and middleware share through the aiohttp application: its limits,
the model store, the batcher, the metrics, and the pools and counters beside them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiohttp import web

from app.data.image_header import DEFAULT_MAX_MEGAPIXELS
from app.serving.batcher import Batcher
from app.serving.metrics import ServingMetrics
from app.serving.store import ModelStore

RETRY_AFTER_SECONDS = 1


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 8 * 2**20
    max_instances: int = 64
    max_megapixels: float = DEFAULT_MAX_MEGAPIXELS
    request_timeout_ms: float = 10_000
    client_timeout_s: float = 20.0


STORE = web.AppKey("store", ModelStore)
BATCHER = web.AppKey("batcher", Batcher)
LIMITS = web.AppKey("limits", Limits)
METRICS = web.AppKey("metrics", ServingMetrics)
HEADER_POOL = web.AppKey("header_pool", ThreadPoolExecutor)
CHECKING = web.AppKey("checking", list)  # [instances in header checks], counted against the queue limit
EXPLAINERS = web.AppKey("explainers", dict)  # version → PhotoExplainer, built on the first :explain
EXPLAINERS_LOCK = web.AppKey("explainers_lock", object)
INSTANCES = web.RequestKey("instances", int)  # for the access log
