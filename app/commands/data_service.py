"""Start a tf.data service server: one dispatcher, and any number of workers that decode and
augment training input for scripts/fine_tune.py --data-service grpc://DISPATCHER_HOST:PORT.

    photoclf data-service dispatcher --port 5050
    photoclf data-service worker --dispatcher dispatcher-host:5050      # on each CPU machine

Workers read the TFRecords themselves, so the data must be at the same path for them as for the
trainer (shared storage or gs://). Runs until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket

from app.cli import host_and_port, tcp_port

HELP = "start a tf.data service dispatcher or worker, to decode and augment on other machines"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("role", choices=["dispatcher", "worker"], help="which server to start")
    p.add_argument(
        "--port",
        type=tcp_port,
        default=None,
        help="port to listen on (default: 5050 for the dispatcher, any free port for a worker)",
    )
    p.add_argument(
        "--dispatcher", type=host_and_port, default=None, help="worker only: the dispatcher's HOST:PORT (required)"
    )
    p.add_argument(
        "--advertise",
        default=socket.gethostname(),
        help="worker only: the host name trainers reach this worker by (default: this machine's name)",
    )
    p.add_argument(
        "--work-dir",
        default=None,
        help="dispatcher only: folder (or gs:// path) where it journals its state, to recover after a restart",
    )


def run(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from app.data import service
    from app.errors import UserError
    from app.net import check_bindable, free_port

    if args.role == "dispatcher":
        if args.dispatcher:
            raise UserError("--dispatcher is for workers; a dispatcher takes --port (and --work-dir)")
        port = service.DEFAULT_DISPATCHER_PORT if args.port is None else args.port
        check_bindable("", port, f"--port {port}")  # gRPC's own refusal is a bare RuntimeError
        server = service.start_dispatcher(port, args.work_dir)
        target = f"grpc://{socket.gethostname()}:{port}"
        print(f"dispatcher at {target}  (photoclf train --data-service {target})", flush=True)
    else:
        if not args.dispatcher:
            raise UserError("--dispatcher: a worker needs the dispatcher's HOST:PORT")
        port = args.port or free_port()
        check_bindable("", port, f"--port {port}")
        server = service.start_worker(args.dispatcher, port, args.advertise)
        print(f"worker at {args.advertise}:{port}, serving dispatcher {args.dispatcher}", flush=True)
    service.wait_for_signal(server)
    print(f"{args.role} stopped", flush=True)
    # A server's graceful stop waits for every trainer to hang up; a signal means stop now
    # (a dispatcher with --work-dir has journaled its state already).
    os._exit(0)
