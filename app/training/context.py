"""Everything a run needs before its first step, checked and built once: `setup(cfg) → Context`.

Bad input fails here, before anything is written: the data, the backbone and its weights, the
batch size, the run dir. The model is built before the run dir is touched.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import keras
import tensorflow as tf

from app.config import TrainConfig
from app.data.pipeline import DatasetInfo, dataset_fingerprint, load_dataset_info, shard_policy
from app.data.preprocess import Augment
from app.data.service import check_reachable
from app.data.shard_check import verify_shards
from app.errors import UserError
from app.models.backbones import get_backbone
from app.models.classifier import Classifier, build_classifier
from app.models.pretrained import load_pretrained_backbone
from app.run_dir import DATASET_FACT, RunDir, check_run_state, hold_run_dir, prepare_run_dir, validate_run_dir
from app.training.history import History
from app.training.init_from import Start, check_start, seen_in_training, start_from
from app.training.phase import PhaseFiles
from app.training.strategy import barrier, is_chief, make_strategy, num_workers, set_precision, strategy_name

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Context:
    """A run's settings and what setup built from them; nothing changes it during the run."""

    cfg: TrainConfig
    info: DatasetInfo
    run: RunDir
    strategy: tf.distribute.Strategy
    clf: Classifier
    image_size: int
    history: History
    policy: str  # the Keras dtype policy: float32, mixed_float16 or mixed_bfloat16
    weights_used: str
    weights_warning: str | None
    scratch: RunDir | None  # a non-chief worker's private run dir for what it must write; None for the chief
    jit_compile: bool  # XLA-compile the train step (see xla_mode)
    jit_reason: str  # why, for the log
    start: Start | None = None  # where --init-from started it

    # Settings derived from cfg, the data and the strategy, decided once by setup (see _derived).
    augmentation: Augment
    views_per_image: int  # augmented views of each training image phase 1's gather runs; 1 without augmentation
    label_smoothing: float  # the training loss's: side_label_smoothing for a dataset with side features
    replicas: int
    batch_size: int  # per replica: cfg.batch_size, or the train split where that is smaller
    global_batch: int
    steps_per_epoch: int
    phase_files: PhaseFiles
    chief: bool  # the worker that writes the run dir (scratch is None)


def _derived(
    cfg: TrainConfig, info: DatasetInfo, strategy: tf.distribute.Strategy, run: RunDir, scratch: RunDir | None
) -> dict:
    """The settings every phase reads, derived from cfg once so that no phase derives them again."""
    replicas = strategy.num_replicas_in_sync
    batch_size = _batch_per_replica(cfg, info, replicas)
    global_batch = batch_size * replicas
    steps = info.num_examples("train") // global_batch
    return {
        "batch_size": batch_size,
        "augmentation": Augment(color_jitter=cfg.color_jitter) if cfg.augment else Augment.off(),
        "views_per_image": max(cfg.cached_views, 1) if cfg.augment else 1,
        "label_smoothing": cfg.side_label_smoothing if info.side_width else cfg.label_smoothing,
        "replicas": replicas,
        "global_batch": global_batch,
        "steps_per_epoch": min(steps, cfg.max_steps_per_epoch) if cfg.max_steps_per_epoch else steps,
        "phase_files": PhaseFiles(read=run, write=scratch or run),
        "chief": scratch is None,
    }


def _batch_per_replica(cfg: TrainConfig, info: DatasetInfo, replicas: int) -> int:
    """cfg.batch_size, or the train split where that is smaller: a batch larger than the split
    would give epochs of no step (the last partial batch is dropped). The log says so."""
    photos = info.num_examples("train")
    if photos >= cfg.batch_size * replicas:
        return cfg.batch_size
    if photos < replicas:
        raise UserError(f"{cfg.data}: the train split holds {photos} photo(s), fewer than the {replicas} replicas")
    fitted = photos // replicas
    log.warning("batch size %d: the train split holds %d photos, fewer than a batch of %d (batch_size)", fitted,
                photos, cfg.batch_size * replicas)  # fmt: skip
    return fitted


def _check_data(cfg: TrainConfig, info: DatasetInfo, strategy: tf.distribute.Strategy) -> None:
    for split in ("train", "val"):
        if info.num_examples(split) == 0:
            raise UserError(f"{cfg.data}: the '{split}' split is empty; phase training needs train and val")
    if cfg.feature_views not in ("auto", "0") and num_workers(strategy) > 1:
        raise UserError(
            f"feature_views = {cfg.feature_views}: cached views need one worker (each would cache every split);"
            " use auto or 0"
        )
    if cfg.data_service:
        check_reachable(cfg.data_service)
    for split in info.shards:  # a damaged shard is named before anything is built
        verify_shards(info.shard_paths(split))


def xla_mode(cfg: TrainConfig) -> tuple[bool, str]:
    """(XLA-compile the train step?, why). `auto` follows Keras' own default: on where a GPU is."""
    if cfg.jit_compile != "auto":
        return cfg.jit_compile == "true", f"jit_compile = {cfg.jit_compile}"
    if tf.config.list_physical_devices("GPU"):
        return True, "jit_compile = auto: on for GPUs"
    return False, "jit_compile = auto: off on CPUs, where XLA made training slower"


def _claim_run_dir(
    cfg: TrainConfig, overwrite: bool, strategy: tf.distribute.Strategy, facts: dict
) -> tuple[RunDir, RunDir | None]:
    """(the run dir, this worker's scratch run dir or None). Only the chief writes the run dir."""
    chief = is_chief(strategy)
    run = prepare_run_dir(cfg, overwrite) if chief else validate_run_dir(cfg, overwrite, chief=False)
    check_run_state(run, facts, write=chief)
    scratch = None
    if not chief:
        scratch = RunDir(Path(tempfile.mkdtemp(prefix="photoclf-worker-")))
        scratch.checkpoints.mkdir()
    barrier(strategy)  # the chief has claimed (or cleared) the run dir before anyone reads it
    return run, scratch


def setup(cfg: TrainConfig, overwrite: bool = False) -> Context:
    """Validate everything, build the model, claim the run dir."""
    info = load_dataset_info(cfg.data)
    spec = get_backbone(cfg.backbone)
    image_size = cfg.image_size or spec.default_size
    policy = set_precision(cfg)
    strategy = make_strategy(cfg)
    _check_data(cfg, info, strategy)
    validate_run_dir(cfg, overwrite, chief=is_chief(strategy))  # said before the weights load (or download)
    if is_chief(strategy):
        hold_run_dir(Path(cfg.out))  # another process training there: said now too
    facts = {"classes": info.classes, "image_size": image_size, "backbone": spec.name}
    if info.side_features:  # the model's side branch is built from them; a resume must see the same
        facts["side_features"] = info.side_features
    if info.multi_label:
        facts["task"] = info.task
    earlier = check_start(cfg.init_from, facts, info.side_features) if cfg.init_from else None
    keras.utils.set_random_seed(cfg.seed)
    with strategy.scope():
        backbone = load_pretrained_backbone(spec, image_size, cfg.weights)
        clf = build_classifier(
            spec, backbone.model, len(info.classes), image_size, cfg.dropout, info.side_features, info.multi_label
        )
        start = start_from(clf, spec, earlier, info.classes, cfg.dropout) if earlier else None
    if start:
        start = replace(start, seen=seen_in_training(earlier.config.data, cfg.data))
    facts["weights"] = backbone.weights_used
    facts[DATASET_FACT] = dataset_fingerprint(cfg.data)  # a resume on other data is refused
    run, scratch = _claim_run_dir(cfg, overwrite, strategy, facts)
    jit_compile, jit_reason = xla_mode(cfg)
    return Context(
        cfg=cfg,
        info=info,
        run=run,
        strategy=strategy,
        clf=clf,
        image_size=image_size,
        history=History(run, enabled=scratch is None),
        policy=policy,
        weights_used=backbone.weights_used,
        weights_warning=backbone.warning,
        scratch=scratch,
        jit_compile=jit_compile,
        jit_reason=jit_reason,
        start=start,
        **_derived(cfg, info, strategy, run, scratch),
    )


def describe_distribution(ctx: Context) -> str:
    """The log line that says how the run is spread over devices and workers."""
    workers = num_workers(ctx.strategy)
    text = (
        f"strategy {strategy_name(ctx.strategy)}: {workers} worker(s), {ctx.replicas} replica(s) in sync;"
        f" global batch {ctx.global_batch} ({ctx.batch_size} per replica)"
    )
    if ctx.cfg.data_service:
        text += f"; training input decoded by the tf.data service at {ctx.cfg.data_service} (DYNAMIC sharding)"
    elif workers > 1:
        shards = len(ctx.info.shards.get("train", []))
        text += f"; input sharded by {shard_policy(shards, workers).name} ({shards} train shards, {workers} workers)"
    return text
