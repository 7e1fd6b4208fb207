"""tf.data service: an in-process dispatcher with 2 workers, and the real data_service.py servers."""

from __future__ import annotations

import collections
import gc
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from app.config import TrainConfig, load_config
from app.data import service
from app.data.pipeline import load_dataset_info, make_train_dataset
from app.data.preprocess import Augment
from app.errors import UserError
from app.net import free_port
from app.training.train import train

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dispatcher():
    """An in-process dispatcher with two workers (deleting the objects stops the servers). The
    workers heartbeat every half second: stopping one waits for its heartbeat thread, up to
    TensorFlow's default interval otherwise (scripts/data_service.py's workers are stopped by a
    signal instead, tested below)."""
    server = service.start_dispatcher(0)
    address = server.target.split("://")[1]
    config = tf.data.experimental.service.WorkerConfig(address, port=0, heartbeat_interval_ms=500)
    workers = [tf.data.experimental.service.WorkerServer(config) for _ in range(2)]
    yield server.target
    # The tests' data-service iterators are collected first: with one still alive, stopping a
    # worker waited for it, holding an xdist worker idle.
    gc.collect()
    del workers, server


def _label_counts(ds: tf.data.Dataset) -> collections.Counter:
    return collections.Counter(int(label) for _, labels in ds for label in labels.numpy())


def test_one_pass_through_the_service_sees_every_example_once(dispatcher: str, demo_records: Path):
    kwargs = dict(image_size=32, batch_size=4, augment=Augment(), seed=0)
    local = _label_counts(make_train_dataset(demo_records, **kwargs))
    for job in ("pass-1", "pass-2"):  # two epochs, each its own job
        remote = _label_counts(make_train_dataset(demo_records, data_service=dispatcher, service_job=job, **kwargs))
        assert remote == local
    assert sum(local.values()) == load_dataset_info(demo_records).num_examples("train")


@pytest.mark.slow
def test_training_through_the_service_finishes_both_phases(dispatcher: str, tiny_config: TrainConfig, caplog):
    caplog.set_level("INFO")
    metrics = train(tiny_config.replace(data_service=dispatcher))
    assert f"training input decoded by the tf.data service at {dispatcher} (DYNAMIC sharding)" in caplog.text
    assert metrics["phase1"]["epochs"] == 1 and metrics["phase2"]["epochs"] == 1
    assert Path(metrics["export"], "saved_model.pb").exists()


@pytest.mark.parametrize("address", ["localhost:5050", "grpc://localhost", "http://localhost:5050", "grpc://h:port"])
def test_bad_address_is_refused_by_the_config(address: str):
    with pytest.raises(UserError, match="--data-service: expected grpc://HOST:PORT"):
        load_config(overrides={"data_service": address})


def test_unreachable_dispatcher_fails_before_training(tiny_config: TrainConfig):
    port = free_port()
    with pytest.raises(UserError, match=f"cannot reach the dispatcher at localhost:{port}"):
        train(tiny_config.replace(data_service=f"grpc://localhost:{port}"))
    assert not Path(tiny_config.out).exists()


@pytest.mark.slow
def test_data_service_script_serves_batches_and_stops_on_sigterm(demo_records: Path, tmp_path: Path):
    port = free_port()
    script = [sys.executable, str(ROOT / "scripts/data_service.py")]
    procs = [subprocess.Popen(script + ["dispatcher", "--port", str(port)], stdout=subprocess.PIPE, text=True)]
    try:
        assert f":{port}  (photoclf train --data-service grpc://" in procs[0].stdout.readline()
        procs.append(
            subprocess.Popen(
                script + ["worker", "--dispatcher", f"localhost:{port}", "--advertise", "localhost"],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
        assert "worker at localhost:" in procs[1].stdout.readline()
        ds = make_train_dataset(
            demo_records,
            image_size=32,
            batch_size=4,
            repeat=True,
            data_service=f"grpc://localhost:{port}",
            service_job="script-test",
        )
        batches = list(ds.take(3))
        assert [int(labels.shape[0]) for _, labels in batches] == [4, 4, 4]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for proc in procs]
    assert codes == [0] * len(procs)


@pytest.mark.parametrize("role,flags", [("dispatcher", []), ("worker", ["--dispatcher", "localhost:5050"])])
def test_a_port_already_taken_is_refused_naming_it_before_grpc_tries(role: str, flags: list[str]):
    import argparse
    import socket

    from app.commands import data_service

    parser = argparse.ArgumentParser()
    data_service.add_arguments(parser)
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = parser.parse_args([role, "--port", str(port), *flags])
        with pytest.raises(UserError, match=f"^--port {port}: cannot listen there \\(Address already in use\\)$"):
            data_service.run(args)


def test_a_worker_whose_dispatcher_does_not_answer_yet_says_it_waits(monkeypatch, caplog):
    monkeypatch.setattr(tf.data.experimental.service, "WorkerServer", lambda config: config)  # would block till then
    config = service.start_worker(f"localhost:{free_port()}", free_port(), "here")
    assert config.dispatcher_address.startswith("localhost:")
    assert "does not answer" in caplog.text and "waiting for it (Ctrl-C to stop)" in caplog.text
