"""Two MultiWorkerMirroredStrategy workers on localhost: both phases, SIGKILL + resume, export."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf
from conftest import TINY_BACKBONE, with_tiny_backbone

from app.data import schema
from app.data.pipeline import load_dataset_info
from app.net import free_port

pytestmark = pytest.mark.start_first  # its tests take over a minute in all

ROOT = Path(__file__).resolve().parents[2]


def _start_workers(cmd: list[str], logs: Path, tmp: Path, attempt: int) -> list[subprocess.Popen]:
    cluster = {"worker": [f"localhost:{free_port()}" for _ in range(2)]}
    procs = []
    for index in range(2):
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(tmp),
            "CUDA_VISIBLE_DEVICES": "",
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        }
        env.pop("PHOTOCLF_WEIGHTS", None)
        log = (logs / f"attempt{attempt}-worker{index}.log").open("w")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
    return procs


def _worker_scratch(tmp: Path) -> set[Path]:
    """The workers' scratch dirs in their TMPDIR (ONNX Runtime also leaves a small `.ses` file there)."""
    return {p for p in tmp.iterdir() if p.name.startswith("photoclf-worker-")}


def _history_rows(run: Path) -> list[tuple[str, str]]:
    if not (run / "history.csv").exists():
        return []
    with (run / "history.csv").open() as f:
        return [(r["phase"], r["phase_epoch"]) for r in csv.DictReader(f)]


@pytest.mark.slow
def test_two_workers_train_both_phases_resume_and_the_chief_exports(demo_records: Path, tmp_path: Path):
    run, scratch = tmp_path / "run", tmp_path / "scratch"
    scratch.mkdir()
    cmd = with_tiny_backbone(
        "fine_tune.py", "--backbone", TINY_BACKBONE, "--weights", "none",
        "--data", str(demo_records), "--out", str(run), "--image-size", "64",
        "--batch-size", "4", "--epochs-head", "4", "--epochs-finetune", "1",
        "--set", "max_steps_per_epoch=2", "--set", "early_stopping_patience=10",
        "--set", "phase2_mode=images",  # as set: auto would lengthen phase 2 for a random backbone
    )  # fmt: skip

    first = _start_workers(cmd, tmp_path, scratch, attempt=1)
    deadline = time.monotonic() + 300
    checkpoint = run / "checkpoints" / "phase1" / "checkpoint"  # written last in an epoch
    while time.monotonic() < deadline and not checkpoint.exists() and all(p.poll() is None for p in first):
        time.sleep(0.1)
    for proc in first:
        proc.kill()
        proc.wait()
    done_before = len(_history_rows(run))
    logs = "\n".join((tmp_path / f"attempt1-worker{i}.log").read_text() for i in range(2))
    assert 1 <= done_before < 4, f"not killed in phase 1 ({done_before} epochs done):\n{logs[-3000:]}"
    left_by_the_kill = _worker_scratch(scratch)

    second = _start_workers(cmd, tmp_path, scratch, attempt=2)
    codes = [proc.wait(timeout=400) for proc in second]
    logs = [(tmp_path / f"attempt2-worker{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    for log in logs:
        assert "strategy MultiWorkerMirroredStrategy: 2 worker(s), 2 replica(s) in sync; global batch 8" in log
        assert "input sharded by FILE" in log
        assert "resuming phase 1 after epoch" in log
    assert "model: exported by the chief worker" in logs[1]

    # Only the chief wrote the run dir; the other worker removed its scratch dir when it finished.
    assert _history_rows(run) == [("1", str(e)) for e in range(1, 5)] + [("2", "1")]
    metrics = json.loads((run / "metrics.json").read_text())
    info = load_dataset_info(demo_records)
    assert metrics["test"]["count"] == info.num_examples("test")  # uneven per-worker shards, all counted
    assert _worker_scratch(scratch) == left_by_the_kill

    serve = tf.saved_model.load(metrics["export"]).signatures["serving_default"]
    record = next(iter(tf.data.TFRecordDataset(info.shard_paths("val")[0])))
    image = tf.train.Example.FromString(record.numpy()).features.feature[schema.ENCODED].bytes_list.value[0]
    out = serve(image_bytes=tf.constant([image]))
    assert out["probabilities"].shape == (1, len(info.classes))


MIRRORED_ON_TWO_CPUS = """
import json, logging, sys
import pytest
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from app.config import TrainConfig
import app.training.context as context_module
import app.training.train as train_module
context_module.make_strategy = lambda cfg: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
sys.path.insert(0, "tests")
import conftest  # registers the tests' tiny backbone in this process too

logging.basicConfig(level=logging.INFO, format="%(message)s")
cfg = TrainConfig(**json.loads(sys.argv[1]))
print("METRICS", json.dumps(train_module.train(cfg)))
"""


def _side_feature_records(tmp_path: Path) -> Path:
    from app.data.side_demo import FEATURE_COLUMNS, generate_side_feature_dataset
    from app.data.writer import write_tfrecords

    manifest = generate_side_feature_dataset(tmp_path / "photos", per_class=8, image_size=48)
    write_tfrecords(
        manifest,
        tmp_path / "records",
        feature_columns=FEATURE_COLUMNS,
        val_fraction=0.25,
        test_fraction=0.25,
        num_shards=2,
    )
    return tmp_path / "records"


def _multilabel_records(tmp_path: Path) -> Path:
    from app.data.multilabel_demo import generate_multilabel_dataset
    from app.data.writer import write_tfrecords

    manifest = generate_multilabel_dataset(tmp_path / "photos", photos=32, image_size=48)
    write_tfrecords(
        manifest, tmp_path / "records", multi_label=True, val_fraction=0.25, test_fraction=0.25, num_shards=2
    )
    return tmp_path / "records"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["images", "side features", "multi-label"])
def test_mirrored_strategy_with_two_replicas_trains_and_exports(demo_records: Path, tmp_path: Path, kind: str):
    """Several GPUs on one host, stood in for by two logical CPU devices (set before TF starts,
    hence the subprocess): global batch = per-replica batch x 2, every val example counted; the
    {image, side} inputs of a side-features dataset, and a multi-label dataset's multi-hot labels,
    are split between the replicas alike."""
    data = {
        "images": lambda: demo_records,
        "side features": lambda: _side_feature_records(tmp_path),
        "multi-label": lambda: _multilabel_records(tmp_path),
    }[kind]()
    cfg = {
        "data": str(data),
        "out": str(tmp_path / "run"),
        "backbone": TINY_BACKBONE,
        "weights": "none",
        "image_size": 64,
        "batch_size": 4,
        "epochs_head": 1,
        "epochs_finetune": 1,
        "max_steps_per_epoch": 2,
        "phase2_mode": "views",
    }
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("PHOTOCLF_WEIGHTS", None)
    out = subprocess.run(
        [sys.executable, "-c", MIRRORED_ON_TWO_CPUS, json.dumps(cfg)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert "strategy MirroredStrategy: 1 worker(s), 2 replica(s) in sync; global batch 8 (4 per replica)" in log
    metrics = json.loads(log.split("METRICS ", 1)[1].splitlines()[0])
    assert metrics["test"]["count"] == load_dataset_info(data).num_examples("test")
    signature = tf.saved_model.load(metrics["export"]).signatures["serving_default"]
    inputs, outputs = signature.structured_input_signature[1], signature.structured_outputs
    assert sorted(inputs) == (["image_bytes", "reading", "site"] if kind == "side features" else ["image_bytes"])
    assert ("labels_above_threshold" in outputs) == (kind == "multi-label")
