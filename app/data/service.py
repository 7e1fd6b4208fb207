"""tf.data service: decoding and augmentation on a cluster of CPU workers instead of the trainer.

Training input is sent to the service in DYNAMIC sharding mode (`ShardingPolicy.DYNAMIC`, the
"distributed_epoch" mode): the dispatcher hands shard files out one split at a time to whichever
data worker asks next, so each training example is produced once per pass however many data
workers there are (the OFF mode would give every worker's full copy), slow or added workers
balance themselves, and all trainers of one multi-worker run read one shared job. The price is
TensorFlow's "at most once" guarantee: a data worker that dies mid-split loses the rest of that
split for the current pass.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import socket
import threading
from urllib.parse import urlsplit

import tensorflow as tf

from app.errors import UserError

log = logging.getLogger(__name__)
service = tf.data.experimental.service
SCHEME = "grpc"
DEFAULT_DISPATCHER_PORT = 5050


def parse_address(address: str, flag: str = "--data-service") -> tuple[str, int]:
    """'grpc://host:port' → (host, port), or a one-line error naming the flag."""
    parts = urlsplit(address)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != SCHEME or not parts.hostname or not port or parts.path not in ("", "/"):
        raise UserError(f"{flag}: expected grpc://HOST:PORT, got '{address}'")
    return parts.hostname, port


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail before training starts, rather than wait forever on a dispatcher that is not there."""
    host, port = parse_address(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        raise UserError(f"--data-service: cannot reach the dispatcher at {host}:{port} ({err})") from None


def job_name(run_id: str, phase: int) -> str:
    """One shared job per run and phase: the trainers of a multi-worker run split one stream
    between them instead of each reading all of it."""
    return f"photoclf-{hashlib.sha1(run_id.encode()).hexdigest()[:12]}-phase{phase}"


def distribute(dataset: tf.data.Dataset, address: str, job: str | None) -> tf.data.Dataset:
    """Run everything `dataset` does so far on the service; the trainer only receives batches."""
    return dataset.apply(
        service.distribute(processing_mode=service.ShardingPolicy.DYNAMIC, service=address, job_name=job)
    )


def start_dispatcher(port: int, work_dir: str | None = None) -> service.DispatchServer:
    """With `work_dir`, the dispatcher journals its state there and recovers it after a restart."""
    config = service.DispatcherConfig(port=port, work_dir=work_dir, fault_tolerant_mode=bool(work_dir))
    return service.DispatchServer(config)


def start_worker(dispatcher: str, port: int, advertise: str) -> service.WorkerServer:
    """`dispatcher` is HOST:PORT or grpc://HOST:PORT; `advertise` is the host name trainers use
    to reach this worker. The server starts once the dispatcher has registered it: one that does
    not answer yet is waited for (workers may start first), saying so."""
    if "://" in dispatcher:
        host, dispatcher_port = parse_address(dispatcher, "--dispatcher")
        dispatcher = f"{host}:{dispatcher_port}"
    elif ":" not in dispatcher:
        raise UserError(f"--dispatcher: expected HOST:PORT, got '{dispatcher}'")
    host, _, dispatcher_port = dispatcher.rpartition(":")
    try:
        socket.create_connection((host, int(dispatcher_port)), timeout=2.0).close()
    except (OSError, ValueError) as err:
        log.warning("the dispatcher at %s does not answer (%s); waiting for it (Ctrl-C to stop)", dispatcher, err)
    config = service.WorkerConfig(dispatcher_address=dispatcher, port=port, worker_address=f"{advertise}:%port%")
    return service.WorkerServer(config)


def wait_for_signal(server: object) -> None:
    """Block until Ctrl-C or SIGTERM while `server` runs on TensorFlow's own threads (it is held
    here: garbage collection would stop it)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
