"""Two-phase fine-tuning, end to end: data → model → phase 1 → phase 2 → test → export → metrics.

Phase 1 trains a new head on a frozen backbone; phase 2 unfreezes the top of the backbone at a
low learning rate (warmup + cosine), BatchNorm kept frozen. Used by scripts/fine_tune.py, the
notebook and the tests.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from app.config import TrainConfig
from app.data.pipeline import DatasetInfo, load_dataset_info, make_eval_dataset, make_train_dataset, shard_policy
from app.data.preprocess import Augment
from app.data.service import check_reachable
from app.data.service import job_name as service_job_name
from app.errors import UserError
from app.models.backbones import get_backbone
from app.models.classifier import Classifier, build_classifier, freeze_backbone, unfreeze_top
from app.models.weights import resolve_backbone
from app.training.history import History, plot_learning_curves
from app.training.phase import PhaseFiles, PhaseResult, PhaseSpec, run_phase, save_weights_atomic
from app.training.run_dir import (
    RunDir, check_run_state, completed_run, prepare_run_dir, validate_run_dir, write_json_atomic,
)
from app.training.steps import Steps
from app.training.strategy import barrier, is_chief, make_strategy, num_workers, set_precision, strategy_name

log = logging.getLogger(__name__)


@dataclass
class Context:
    cfg: TrainConfig
    info: DatasetInfo
    run: RunDir
    strategy: tf.distribute.Strategy
    clf: Classifier
    image_size: int
    history: History
    policy: str
    weights_used: str
    weights_warning: str | None
    scratch: Path | None  # a non-chief worker's private dir for what it must write; None for the chief

    @property
    def chief(self) -> bool:
        return self.scratch is None

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def global_batch(self) -> int:
        return self.cfg.batch_size * self.replicas

    def phase_files(self, phase: int) -> PhaseFiles:
        write_dir = self.scratch / "checkpoints" if self.scratch else self.run.checkpoints
        return PhaseFiles(read_dir=self.run.checkpoints, write_dir=write_dir, phase=phase)

    @property
    def steps_per_epoch(self) -> int:
        steps = self.info.num_examples("train") // self.global_batch
        return min(steps, self.cfg.max_steps_per_epoch) if self.cfg.max_steps_per_epoch else steps


def class_weights(info: DatasetInfo) -> list[float]:
    """Inverse class frequency, normalised so a balanced dataset gets all 1.0."""
    counts = np.array([info.counts["train"].get(c, 0) for c in info.classes], dtype=float)
    return (counts.sum() / (len(counts) * np.maximum(counts, 1))).round(6).tolist()


def _optimizer(ctx: "Context", learning_rate, model: keras.Model) -> keras.optimizers.Optimizer:
    """AdamW, its slot variables built here under the strategy's scope: created lazily inside
    the first replicated step instead, they fail under MirroredStrategy with several devices."""
    with ctx.strategy.scope():
        opt = keras.optimizers.AdamW(learning_rate=learning_rate, weight_decay=ctx.cfg.weight_decay)
        opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
        if ctx.policy == "mixed_float16":
            opt = keras.optimizers.LossScaleOptimizer(opt)
        opt.build(model.trainable_variables)
    return opt


def _distribute(ctx: Context, make) -> object:
    """make(input_context) → per-replica dataset; sharded per worker by TensorFlow's input contexts."""
    return ctx.strategy.distribute_datasets_from_function(make)


def _image_datasets(ctx: Context, phase: int):
    """Training input is decoded here, or on the tf.data service with `data_service`;
    validation is always read here (unaugmented, and small next to the training split)."""
    cfg = ctx.cfg
    augment = Augment(color_jitter=cfg.color_jitter) if cfg.augment else Augment.off()
    job = service_job_name(str(Path(cfg.out).resolve()), phase) if cfg.data_service else None

    def train_iterator():
        return iter(_distribute(ctx, lambda ic: make_train_dataset(
            cfg.data, image_size=ctx.image_size, batch_size=cfg.batch_size, augment=augment, seed=cfg.seed,
            repeat=True, input_context=ic, data_service=cfg.data_service or None, service_job=job,
        )))

    def val_dataset():
        return _distribute(ctx, lambda ic: make_eval_dataset(
            cfg.data, split="val", image_size=ctx.image_size, batch_size=cfg.batch_size, input_context=ic,
        ))

    return train_iterator, val_dataset


def _feature_datasets(ctx: Context):
    """Cached-features mode: backbone features computed once per split, then only the head trains."""
    cfg, cache = ctx.cfg, {}
    extract = tf.function(lambda images: ctx.clf.features_model(images, training=False), reduce_retracing=True)

    def features(split: str) -> tuple[np.ndarray, np.ndarray]:
        if split not in cache:
            start = time.perf_counter()
            feats, labels = [], []
            for images, y in make_eval_dataset(cfg.data, split=split, image_size=ctx.image_size, batch_size=cfg.batch_size):
                feats.append(extract(images).numpy())
                labels.append(y.numpy())
            cache[split] = (np.concatenate(feats), np.concatenate(labels))
            log.info("cached %s features %s in %.1fs", split, cache[split][0].shape, time.perf_counter() - start)
        return cache[split]

    def train_iterator():
        x, y = features("train")
        return iter(_distribute(ctx, lambda ic: tf.data.Dataset.from_tensor_slices((x, y))
                                .shuffle(len(x), seed=cfg.seed).repeat().batch(cfg.batch_size, drop_remainder=True)))

    def val_dataset():
        x, y = features("val")
        return _distribute(ctx, lambda ic: tf.data.Dataset.from_tensor_slices((x, y)).batch(cfg.batch_size))

    return train_iterator, val_dataset


def run_phase1(ctx: Context) -> PhaseResult:
    cfg = ctx.cfg
    freeze_backbone(ctx.clf)
    model = ctx.clf.head_model if cfg.cache_features else ctx.clf.logits_model
    datasets = _feature_datasets(ctx) if cfg.cache_features else _image_datasets(ctx, phase=1)
    optimizer = _optimizer(ctx, cfg.lr_head, model)
    steps = Steps(ctx.strategy, model, optimizer, len(ctx.info.classes), ctx.global_batch, cfg.label_smoothing,
                  class_weights(ctx.info) if cfg.class_weights else None)
    spec = PhaseSpec(1, cfg.epochs_head, ctx.steps_per_epoch, cfg.steps_per_execution, cfg.early_stopping_patience, 0)
    return run_phase(spec, steps, *datasets, ctx.clf.model, optimizer, ctx.phase_files(1), ctx.history, ctx.global_batch)


def run_phase2(ctx: Context, phase1: PhaseResult | None) -> PhaseResult:
    """Starts from phase 1's best weights, which also stay the result unless phase 2 beats them."""
    cfg = ctx.cfg
    trained = unfreeze_top(ctx.clf, cfg.unfreeze)
    log.info("phase 2 trains %d backbone layers (%s ... %s); BatchNorm stays frozen", len(trained),
             trained[0] if trained else "-", trained[-1] if trained else "-")
    total = max(1, cfg.epochs_finetune * ctx.steps_per_epoch)
    warmup = int(total * cfg.warmup_fraction)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0 if warmup else cfg.lr_finetune, decay_steps=max(1, total - warmup),
        warmup_target=cfg.lr_finetune if warmup else None, warmup_steps=warmup,
    )
    optimizer = _optimizer(ctx, schedule, ctx.clf.logits_model)
    steps = Steps(ctx.strategy, ctx.clf.logits_model, optimizer, len(ctx.info.classes), ctx.global_batch,
                  cfg.label_smoothing, class_weights(ctx.info) if cfg.class_weights else None)
    spec = PhaseSpec(2, cfg.epochs_finetune, ctx.steps_per_epoch, cfg.steps_per_execution,
                     cfg.early_stopping_patience, phase1.epochs if phase1 else 0)
    return run_phase(spec, steps, *_image_datasets(ctx, phase=2), ctx.clf.model, optimizer, ctx.phase_files(2),
                     ctx.history, ctx.global_batch, baseline=phase1)


def evaluate_split(ctx: Context, split: str) -> dict[str, float]:
    steps = Steps(ctx.strategy, ctx.clf.logits_model, None, len(ctx.info.classes), ctx.global_batch)
    dataset = _distribute(ctx, lambda ic: make_eval_dataset(
        ctx.cfg.data, split=split, image_size=ctx.image_size, batch_size=ctx.cfg.batch_size, input_context=ic))
    return steps.evaluate(dataset)


def save_final_weights(ctx: Context) -> Path:
    """The kept weights of the whole run: what scripts/export.py rebuilds the model from."""
    from app.export.run_export import FINAL_WEIGHTS

    path = ctx.run.root / FINAL_WEIGHTS
    save_weights_atomic(ctx.clf.model, path)
    return path


def _check_data(cfg: TrainConfig, info: DatasetInfo, strategy: tf.distribute.Strategy) -> None:
    global_batch = cfg.batch_size * strategy.num_replicas_in_sync
    for split in ("train", "val"):
        if info.num_examples(split) == 0:
            raise UserError(f"{cfg.data}: the '{split}' split is empty; phase training needs train and val")
    if info.num_examples("train") < global_batch:
        raise UserError(
            f"batch size {global_batch} is larger than the train split ({info.num_examples('train')} images);"
            " lower --batch-size"
        )
    if cfg.cache_features and num_workers(strategy) > 1:
        raise UserError("cache_features is not supported with several workers (each would cache every split)")
    if cfg.data_service:
        check_reachable(cfg.data_service)


def setup(cfg: TrainConfig, overwrite: bool = False) -> Context:
    """Validate everything, build the model, claim the run dir. Bad input fails here, before
    anything is written (the model is built before the run dir is touched)."""
    info = load_dataset_info(cfg.data)
    spec = get_backbone(cfg.backbone)
    image_size = cfg.image_size or spec.default_size
    if image_size < spec.min_size:
        raise UserError(f"--image-size {image_size} is too small for {spec.name} (minimum {spec.min_size})")
    policy = set_precision(cfg)
    strategy = make_strategy(cfg)
    _check_data(cfg, info, strategy)
    keras.utils.set_random_seed(cfg.seed)
    with strategy.scope():
        backbone, weights_used, warning = resolve_backbone(spec, image_size, cfg.weights)
        clf = build_classifier(spec, backbone, len(info.classes), image_size, cfg.dropout)
    chief = is_chief(strategy)
    run = prepare_run_dir(cfg, overwrite) if chief else validate_run_dir(cfg, overwrite, chief=False)
    facts = {"classes": info.classes, "image_size": image_size, "backbone": spec.name, "weights": weights_used}
    check_run_state(run, facts, write=chief)
    scratch = None
    if not chief:
        scratch = Path(tempfile.mkdtemp(prefix="photoclf-worker-"))
        (scratch / "checkpoints").mkdir()
    barrier(strategy)  # the chief has claimed (or cleared) the run dir before anyone reads it
    return Context(cfg, info, run, strategy, clf, image_size, History(run.root, enabled=chief), policy, weights_used,
                   warning, scratch)


def describe_distribution(ctx: Context) -> str:
    workers = num_workers(ctx.strategy)
    text = (f"strategy {strategy_name(ctx.strategy)}: {workers} worker(s), {ctx.replicas} replica(s) in sync;"
            f" global batch {ctx.global_batch} ({ctx.cfg.batch_size} per replica)")
    if ctx.cfg.data_service:
        text += f"; training input decoded by the tf.data service at {ctx.cfg.data_service} (DYNAMIC sharding)"
    elif workers > 1:
        shards = len(ctx.info.shards.get("train", []))
        text += f"; input sharded by {shard_policy(shards, workers).name} ({shards} train shards, {workers} workers)"
    return text


def train(cfg: TrainConfig, overwrite: bool = False) -> dict:
    """Run (or resume) both phases, evaluate, export. Returns the metrics.json contents."""
    done = None if overwrite else completed_run(cfg)
    if done:  # before building anything: a finished run needs neither the model nor its weights
        log.info("%s is already complete; pass --overwrite to train again", done.root)
        return json.loads(done.metrics.read_text())
    ctx = setup(cfg, overwrite)
    try:
        return _train(ctx)
    finally:
        if ctx.scratch:
            shutil.rmtree(ctx.scratch, ignore_errors=True)


def _train(ctx: Context) -> dict:
    cfg = ctx.cfg
    if ctx.weights_warning:
        log.warning("WARNING: %s", ctx.weights_warning)
    log.info("backbone %s at %dx%d, weights: %s; precision %s", ctx.clf.spec.name, ctx.image_size, ctx.image_size,
             ctx.weights_used, ctx.policy)
    log.info("%s", describe_distribution(ctx))
    ctx.clf.model.summary(show_trainable=True, line_length=100)
    metrics: dict = {"weights": ctx.weights_used, "weights_warning": ctx.weights_warning,
                     "backbone": ctx.clf.spec.name, "image_size": ctx.image_size, "classes": ctx.info.classes}
    phase1 = run_phase1(ctx) if cfg.epochs_head else None
    metrics["phase1"] = phase1.to_dict() if phase1 else None
    phase2 = run_phase2(ctx, phase1) if cfg.epochs_finetune else None
    metrics["phase2"] = phase2.to_dict() if phase2 else None
    if ctx.info.num_examples("test"):
        metrics["test"] = evaluate_split(ctx, "test")
    if ctx.chief:
        from app.export.run_export import export_run

        save_final_weights(ctx)
        metrics["export"] = export_run(ctx.run.root, model=ctx.clf.model, metrics=metrics)["saved_model"]
        plot_learning_curves(ctx.run.root / "history.csv", ctx.run.root / "learning_curves.png")
        write_json_atomic(ctx.run.metrics, metrics)
    barrier(ctx.strategy)  # no worker leaves the cluster while the chief is still exporting
    return metrics


def train_main(cfg: TrainConfig, overwrite: bool = False) -> dict:
    """`train`, with `data=""` meaning the built-in demo (generated on first use)."""
    if not cfg.data:
        from app.data.demo import ensure_demo_records

        cfg = cfg.replace(data=str(ensure_demo_records()))
    return train(cfg, overwrite)
