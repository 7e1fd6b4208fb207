"""Serve an exported model over TF Serving's REST API (plus a simple image-upload endpoint).

    python scripts/serve.py runs/demo/export/demo            # http://127.0.0.1:8501/v1/models/demo
    curl -s localhost:8501/v1/models/demo:classify --data-binary @cat.jpg -H 'Content-Type: image/jpeg'

Serves the newest version folder and picks up new ones without a restart. Ctrl-C or SIGTERM
stops it cleanly.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from app.cli import run_cli


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path, help="EXPORT_DIR/<name>: the folder holding numbered versions")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8501, help="port (default 8501, as TF Serving's REST port)")
    p.add_argument("--max-batch", type=int, default=32, help="most instances merged into one model call (default 32)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="longest a request waits for others to batch with (default 5)")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="largest request body in MB (default 8)")
    p.add_argument("--max-instances", type=int, default=64, help="most instances per request (default 64)")
    p.add_argument("--poll-seconds", type=float, default=2.0, help="how often to look for new versions (default 2)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from aiohttp import web

    from app.serving.batcher import Batcher
    from app.serving.rest import Limits, make_app
    from app.serving.store import ModelStore

    store = ModelStore(args.model_dir, poll_seconds=args.poll_seconds)
    limits = Limits(max_body_bytes=int(args.max_body_mb * 2**20), max_instances=args.max_instances)
    app = make_app(store, Batcher(args.max_batch, args.max_wait_ms), limits)
    print(f"serving {store.name} version {store.current.version} at http://{args.host}:{args.port}/v1/models/{store.name}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=True)


if __name__ == "__main__":
    run_cli(main)
