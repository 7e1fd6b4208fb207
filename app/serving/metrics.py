"""What the server exposes at /monitoring/prometheus/metrics (TF Serving's path), and its access log.

One registry per app (not prometheus-client's global one), so two servers in one process, as in
the tests, count separately.
"""

from __future__ import annotations

import json
import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

access_log = logging.getLogger("photoclf.access")
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServingMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "photoclf_requests", "HTTP requests by endpoint and status code", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "photoclf_request_latency_seconds",
            "Request latency, receipt to answer",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "photoclf_batch_size", "Instances per model call (server-side batching)", buckets=BATCH_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("photoclf_queue_depth", "Instances waiting for the model", registry=r)
        self.model_version = Gauge("photoclf_model_version", "Version being served", ["model", "runtime"], registry=r)
        self.image_failures = Counter(
            "photoclf_image_decode_failures", "Images refused or not decodable, by reason", ["reason"], registry=r
        )

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def set_model(self, name: str, version: int, runtime: str) -> None:
        self.model_version.clear()
        self.model_version.labels(name, runtime).set(version)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def log_access(method: str, path: str, status: int, instances: int, seconds: float) -> None:
    """One JSON line per request: easy to grep, easy to load."""
    access_log.info(
        json.dumps(
            {
                "method": method,
                "path": path,
                "status": status,
                "instances": instances,
                "latency_ms": round(seconds * 1000, 2),
            }
        )
    )
