"""Serve an exported model over TF Serving's REST API, with an image-upload endpoint and a page.

    photoclf serve runs/demo/export/demo            # http://127.0.0.1:8501/ to try it
    photoclf serve runs/demo                        # the same: a run dir serves its exported model
    curl -s localhost:8501/v1/models/demo:classify --data-binary @cat.jpg -H 'Content-Type: image/jpeg'

Serves the newest version folder and picks up new ones without a restart. --runtime auto runs
the fastest, timed as it loads (once per export and host), of TensorFlow and the export's LiteRT,
OpenVINO and ONNX files whose parity checks passed (benchmarks/README.md, "Serving", has their
throughput and latency).
Images over --max-megapixels are refused from their header (413); a full queue answers 503
with Retry-After; a request past --request-timeout-ms answers 504. A client gets
--client-timeout-s to send a request's headers (else its connection is closed) and as long again
for its body (else 408); past --max-connections a new connection is answered 503 and closed, so
slow clients cannot starve the others. Metrics for Prometheus at
/monitoring/prometheus/metrics; one JSON access-log line per request on stderr. Ctrl-C or
SIGTERM stops accepting, answers the requests in flight, then exits 0.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys
from pathlib import Path

from app.cli import add_runtime_flag, finite_float, lasting_imports, tcp_port
from app.errors import UserError
from app.export import layout
from app.net import check_bindable

HELP = "serve an exported model over TF Serving's REST API, with an image-upload endpoint and a page"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model_dir",
        type=Path,
        help="EXPORT_DIR/<name> (the folder holding numbered versions), an EXPORT_DIR of one model, or a run dir",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=tcp_port, default=8501, help="port (default 8501, as TF Serving's REST port)")
    p.add_argument("--max-batch", type=int, default=32, help="most instances merged into one model call (default 32)")
    p.add_argument(
        "--max-wait-ms",
        type=finite_float,
        default=0.0,
        help="also hold a batch this long for company (default 0: batch what queued while the model was busy)",
    )
    p.add_argument(
        "--poll-seconds", type=finite_float, default=2.0, help="how often to look for new versions (default 2)"
    )
    add_runtime_flag(p)
    p.add_argument(
        "--litert-model",
        choices=["float32", "float16", "int8"],
        default="float32",
        help="which LiteRT file of the export to serve (default float32)",
    )
    _add_limits(p.add_argument_group("limits (a request past one is answered with an error; the server keeps serving)"))


def _add_limits(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--max-body-mb", type=finite_float, default=8.0, help="largest request body in MB (default 8)")
    g.add_argument("--max-instances", type=int, default=64, help="most instances per request (default 64)")
    g.add_argument(
        "--max-megapixels",
        type=finite_float,
        default=70.0,
        help="refuse larger images, read from the header (default 70)",
    )
    g.add_argument(
        "--max-queue", type=int, default=128, help="most instances waiting; beyond, 503 + Retry-After (default 128)"
    )
    g.add_argument(
        "--request-timeout-ms", type=finite_float, default=10_000, help="answer 504 after this long (default 10000)"
    )
    g.add_argument(
        "--client-timeout-s",
        type=finite_float,
        default=20.0,
        help="time a client has for a request's headers, and again for its body; also the idle"
        " keep-alive time (default 20)",
    )
    g.add_argument(
        "--max-connections",
        type=int,
        default=256,
        help="most open connections; beyond, a new one is answered 503 and closed (default 256)",
    )


def run(args: argparse.Namespace) -> None:
    for flag, value in (
        ("--max-megapixels", args.max_megapixels),
        ("--max-queue", args.max_queue),
        ("--request-timeout-ms", args.request_timeout_ms),
        ("--max-batch", args.max_batch),
        ("--client-timeout-s", args.client_timeout_s),
        ("--max-connections", args.max_connections),
    ):
        if not value > 0:
            raise UserError(f"{flag} must be > 0, got {value}")
    model_dir = layout.served_model_folder(args.model_dir)  # a wrong folder is said before TensorFlow's import
    check_bindable(args.host, args.port)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    faulthandler.enable()  # a crash in a runtime's native code leaves every thread's stack on stderr, not a bare signal
    with lasting_imports():
        from app.serving.batcher import Batcher
        from app.serving.connections import serve
        from app.serving.rest import Limits, make_app
        from app.serving.store import ModelStore

    store = ModelStore(model_dir, poll_seconds=args.poll_seconds, runtime=args.runtime, litert_mode=args.litert_model)
    limits = Limits(
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_instances=args.max_instances,
        max_megapixels=args.max_megapixels,
        request_timeout_ms=args.request_timeout_ms,
        client_timeout_s=args.client_timeout_s,
    )
    app = make_app(store, Batcher(args.max_batch, args.max_wait_ms, args.max_queue), limits)
    serve(
        app,
        args.host,
        args.port,
        max_connections=args.max_connections,
        client_timeout=args.client_timeout_s,
        on_started=lambda: print(
            f"serving {store.name} version {store.current.version} ({store.current.runtime.name}) at"
            f" http://{args.host}:{args.port}/ (API: /v1/models/{store.name})",
            flush=True,
        ),
    )
    _exit_once_drained()


def _exit_once_drained() -> None:
    """Exit 0 without Python's finalization, which ends the daemon threads (the version poller,
    the runtimes' workers) wherever they are: one ended inside a native runtime's C++ code aborts
    the process (OpenVINO's threads: "FATAL: exception not rethrown", exit status -6)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
