"""Distribution strategy and mixed precision, decided once per run from the config and hardware."""

from __future__ import annotations

import json
import os

import keras
import tensorflow as tf

from app.config import TrainConfig
from app.errors import UserError


def make_strategy(cfg: TrainConfig) -> tf.distribute.Strategy:
    """auto: MultiWorkerMirrored when TF_CONFIG names several workers, Mirrored for several GPUs,
    else the default (single-device) strategy."""
    kind = cfg.strategy
    if kind == "auto":
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
        workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
        gpus = tf.config.list_physical_devices("GPU")
        kind = "multiworker" if workers > 1 else "mirrored" if len(gpus) > 1 else "default"
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "mirrored":
        return tf.distribute.MirroredStrategy()
    if kind == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if kind == "tpu":
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, tf.errors.NotFoundError) as err:
            raise UserError(f"strategy=tpu: no TPU found ({err})") from None
        return tf.distribute.TPUStrategy(resolver)
    raise UserError(f"unknown strategy '{kind}'")


def set_precision(cfg: TrainConfig) -> str:
    """auto: mixed_float16 on GPU, float32 on CPU, where half precision is slower, not faster, even
    bfloat16 on a CPU with AMX (benchmarks/README.md, "Device")."""
    on = cfg.mixed_precision == "on" or (cfg.mixed_precision == "auto" and tf.config.list_physical_devices("GPU"))
    policy = ("mixed_bfloat16" if cfg.strategy == "tpu" else "mixed_float16") if on else "float32"
    keras.mixed_precision.set_global_policy(policy)
    return policy


def _multiworker_resolver(strategy: tf.distribute.Strategy):
    """The cluster resolver of a multi-worker strategy, else None."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    return getattr(strategy, "cluster_resolver", None)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Only the chief writes the run dir under multi-worker training."""
    resolver = _multiworker_resolver(strategy)
    if resolver is None:
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return (
        task_type is None
        or task_type == "chief"
        or (task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().as_dict())
    )


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The public name (MultiWorkerMirroredStrategy's class is called CollectiveAllReduceStrategy)."""
    for cls, name in (
        (tf.distribute.MultiWorkerMirroredStrategy, "MultiWorkerMirroredStrategy"),
        (tf.distribute.MirroredStrategy, "MirroredStrategy"),
        (tf.distribute.TPUStrategy, "TPUStrategy"),
    ):
        if isinstance(strategy, cls):
            return name
    return (
        "default (one device)" if type(strategy).__name__ == "_DefaultDistributionStrategy" else type(strategy).__name__
    )


def num_workers(strategy: tf.distribute.Strategy) -> int:
    resolver = _multiworker_resolver(strategy)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, len(spec.get("worker", [])) + len(spec.get("chief", [])))


def barrier(strategy: tf.distribute.Strategy) -> None:
    """Every worker waits here until all have arrived (a one-number all-reduce). Used after the
    chief has prepared the run dir, so no worker reads it half-prepared."""
    strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
