"""Two-phase fine-tuning, end to end: data → model → phase 1 → phase 2 → test → export → metrics.

Phase 1 trains a new head on a frozen backbone; phase 2 unfreezes the top of the backbone at a
low learning rate (warmup + cosine), BatchNorm kept frozen. Both are one `Phase` built by
`build_phase` and run by `run_phase`. Used by scripts/fine_tune.py, the notebook and the tests.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from app import storage
from app.config import TrainConfig
from app.data.pipeline import dataset_fingerprint
from app.data.summary import few_photos_warning
from app.evaluation.metrics import per_class
from app.models import ood
from app.models.classifier import freeze_backbone, served_model, unfreeze_top
from app.run_dir import check_trained_on, completed_run, release_run_dirs
from app.training.builders import finetune_schedule, make_optimizer, make_steps
from app.training.context import Context, describe_distribution, setup
from app.training.frozen import FrozenBackbone
from app.training.inputs import SAMPLE_IMAGES, augmented_sample, eval_dataset, image_inputs
from app.training.lr_finder import RULE, read_suggestions, resolve_rate
from app.training.ood_fit import fit_and_record
from app.training.phase import KeptPhases, Phase, PhaseResult, PhaseSpec, run_phase
from app.training.phase_weights import save_weights_atomic
from app.training.report import majority_warning, print_model_summary
from app.training.side_check import SidePath, side_features_warning, val_probe
from app.training.steps import CompiledSteps, Evaluation
from app.training.strategy import barrier

log = logging.getLogger(__name__)


def build_phase(
    ctx: Context, number: int, baseline: PhaseResult | None = None, frozen: FrozenBackbone | None = None
) -> Phase:
    """Phase 1 (the head; on cached features where the frozen backbone decided so) or phase 2 (the
    unfrozen top, from phase 1's kept weights, which stay the result unless phase 2 beats
    `baseline`; validated from the cut, and trained from it on phase 1's views or on fresh images'
    activations where the frozen backbone decided so).
    Pass both phases the same `frozen`: phase 1's gather then keeps what phase 2 works on."""
    cfg, clf = ctx.cfg, ctx.clf
    frozen = frozen or FrozenBackbone(ctx)
    plan = frozen.decision.plan
    cached = number == 1 and frozen.decision.phase1_cached
    cut = frozen.cut if number == 2 else None
    on_activations = number == 2 and frozen.phase2_on_activations  # the tail trains on activations at the cut
    model = clf.head_model if cached else cut.tail if on_activations else clf.logits_model
    peak = resolve_rate(ctx, number)  # lr_head / lr_finetune, or the finder's suggestion for "auto"
    rate = peak if number == 1 else finetune_schedule(cfg, peak, ctx.steps_per_epoch, plan.epochs)
    spec = PhaseSpec(
        phase=number,
        epochs=cfg.epochs_head if number == 1 else plan.epochs,
        steps_per_epoch=ctx.steps_per_epoch,
        steps_per_execution=cfg.steps_per_execution,
        patience=cfg.early_stopping_patience if number == 1 else plan.patience,
        epoch_offset=baseline.epochs if baseline else 0,
        select_by=cfg.select_by,
        keep_last=number == 2 and plan.keep_last,
    )
    sample = None
    if ctx.history.enabled and (number == 1 or not cfg.epochs_head):  # once a run: both phases augment alike
        sample = _sample_writer(ctx, spec.epoch_offset)
        if not cached:  # a cached phase 1 hands over its first batch as it builds the cache
            sample(augmented_sample(ctx))
    steps = make_steps(ctx, model, make_optimizer(ctx, rate, model, number), number)
    inputs = frozen.phase1_inputs(sample) if cached else image_inputs(ctx, number)
    if number == 2:
        inputs = frozen.phase2_inputs(inputs)
    return Phase(
        spec=spec,
        steps=steps,
        inputs=inputs,
        model=clf.head_model if cached else clf.model,
        files=ctx.phase_files,
        history=ctx.history,
        baseline=baseline,
        val_steps=steps.evaluating(cut.tail) if cut and not on_activations else None,
    )


def run_phase1(ctx: Context, frozen: FrozenBackbone | None = None, side_path: SidePath | None = None) -> PhaseResult:
    """Phase 1; with side features on cached features, `side_path` (the run's, by default) is
    judged before its first step."""
    freeze_backbone(ctx.clf)
    frozen = frozen or FrozenBackbone(ctx)
    phase = build_phase(ctx, 1, frozen=frozen)
    side_path = side_path or SidePath.of_run(ctx)
    if side_path and frozen.decision.phase1_cached:
        phase = replace(phase, inputs=side_path.judging(frozen.phase1_features, phase.inputs))
    return run_phase(phase)


def run_phase2(ctx: Context, phase1: PhaseResult | None, frozen: FrozenBackbone | None = None) -> PhaseResult:
    frozen = frozen or FrozenBackbone(ctx)
    log.info("%s", frozen.decision.plan.describe())
    trained = unfreeze_top(ctx.clf, ctx.cfg.unfreeze)
    log.info(
        "phase 2 trains %d backbone layers (%s ... %s); BatchNorm stays frozen",
        len(trained),
        trained[0] if trained else "-",
        trained[-1] if trained else "-",
    )
    return run_phase(build_phase(ctx, 2, phase1, frozen))


def evaluate_split(ctx: Context, split: str, steps: CompiledSteps | None = None) -> Evaluation:
    """The current weights on `split`, unaugmented, with the plain (unsmoothed) loss. Pass the
    same evaluation `steps` for several splits: its graph is then traced once."""
    return (steps or make_steps(ctx, ctx.clf.logits_model, None)).evaluate(eval_dataset(ctx, split))


def train(cfg: TrainConfig, overwrite: bool = False) -> dict:
    """Run (or resume) both phases, evaluate, export. Returns the metrics.json contents.

    1. Set up: every check and the model before anything is written (`setup`); then `_train`."""
    done = None if overwrite else completed_run(cfg)
    if done:  # before building anything: a finished run needs neither the model nor its weights
        check_trained_on(done, dataset_fingerprint(cfg.data))
        log.info("%s is already complete; pass --overwrite to train again", done.root)
        return done.read_metrics()
    try:
        ctx = setup(cfg, overwrite)
        try:
            return _train(ctx)
        finally:
            if ctx.scratch:
                shutil.rmtree(ctx.scratch.root, ignore_errors=True)
    finally:
        release_run_dirs()  # claimed by setup: free for the next process (a resume, an export)


def _train(ctx: Context) -> dict:
    """The run after `setup` (step 1), top to bottom: phase 1, phase 2, test, calibrate, export."""
    cfg = ctx.cfg
    frozen = FrozenBackbone(ctx)  # what the frozen backbone does in both phases, decided once
    _log_setup(ctx, frozen)
    metrics = _run_facts(ctx, frozen)
    # 2. Phase 1: the new head on the frozen backbone.
    side_path = SidePath.of_run(ctx)
    phase1 = run_phase1(ctx, frozen, side_path) if cfg.epochs_head else None
    metrics["phase1"] = phase1.to_dict() if phase1 else None
    metrics["forward_runtime"] = frozen.forward.as_dict() if frozen.forward else None
    # 3. Phase 2: the top of the backbone, as planned from the settings (app/training/plan.py).
    phase2 = None
    if cfg.epochs_finetune:
        metrics["phase2_plan"] = frozen.decision.plan.to_dict()
        phase2 = run_phase2(ctx, phase1, frozen)
    metrics["phase2"] = phase2.to_dict() if phase2 else None
    metrics["phase2_below_runtime"] = frozen.below.choice.as_dict() if frozen.below and frozen.below.choice else None
    if "auto" in (cfg.lr_head, cfg.lr_finetune):
        metrics["lr_find"] = lr_find_record(cfg, read_suggestions(ctx.run.root))
    kept_phase = phase2 or phase1
    if side_path:
        metrics["side_path"] = side_path.record()
    if kept_phase and not ctx.info.multi_label:
        metrics |= _warnings(ctx, frozen, kept_phase.val_accuracy, side_path)
    # 4. Test: read once, by the kept weights; it chose nothing.
    confusion = _test(ctx, metrics, kept_phase, frozen)
    if ctx.chief:
        # 5. Calibrate: a temperature (single-label) or per-label thresholds, fitted on val.
        phases: KeptPhases = {1: phase1, 2: phase2}  # their kept epochs saved the validation logits both fits need
        if cfg.calibrate and not ctx.info.multi_label:  # temperature scaling is a softmax's; see docs/training.md
            metrics["calibration"] = _calibrate(ctx, phases)
        ood_score = None
        if not ctx.info.multi_label and cfg.unknown_accept > 0:
            metrics["ood"], ood_score = fit_and_record(ctx, phases, metrics.get("calibration"), frozen)
        if ctx.info.multi_label:
            metrics["thresholds"] = _thresholds(ctx, phases)
        # 6. Export, figures, then metrics.json, which marks the run complete.
        epochs = sum(p.epochs for p in (phase1, phase2) if p)
        kept = _kept_file(ctx, phases, frozen.decision.phase1_cached)
        frozen.release()
        _finish(ctx, metrics, confusion, epochs=epochs, kept=kept, ood_score=ood_score)
    barrier(ctx.strategy)  # no worker leaves the cluster while the chief is still exporting
    return metrics


def _warnings(
    ctx: Context, frozen: FrozenBackbone, val_accuracy: float, side_path: SidePath | None
) -> dict[str, str | None]:
    """What the user must hear of the kept weights, logged and for metrics.json: no better than
    always answering the most common class; side features left out, or kept and costing val accuracy."""
    warnings = {
        "learning_warning": majority_warning(ctx.info.counts.get("val", {}), val_accuracy),
        "side_features_warning": _side_warning(ctx, frozen, val_accuracy, side_path),
    }
    for warning in filter(None, warnings.values()):
        log.warning("WARNING: %s", warning)
    return warnings


def _side_warning(ctx: Context, frozen: FrozenBackbone, val_accuracy: float, side_path: SidePath | None) -> str | None:
    """Side features left out before phase 1; else kept ones that cost val accuracy (phase 1 gathered features)."""
    if side_path and not side_path.open:
        return side_path.left_out()
    features = frozen.gathered_phase1
    if not ctx.info.side_features or features is None:
        return None
    judged = side_path and side_path.probes  # the same regression, fitted before phase 1
    image_only = judged["image_only"][0] if judged else val_probe(features, len(ctx.info.classes))[0]
    return side_features_warning(val_accuracy, image_only, len(features.val_labels))


def _log_setup(ctx: Context, frozen: FrozenBackbone) -> None:
    """What setup chose, one line each: backbone and weights, distribution, phase 1's mode, XLA."""
    for warning in (ctx.weights_warning, ctx.start and ctx.start.warning):
        if warning:
            log.warning("WARNING: %s", warning)
    log.info("backbone %s at %dx%d, weights: %s; precision %s", ctx.clf.spec.name, ctx.image_size, ctx.image_size,
             ctx.weights_used, ctx.policy)  # fmt: skip
    log.info("%s", describe_distribution(ctx))
    cached = frozen.decision.phase1_cached
    log.info("phase 1 on %s (%s)", "cached backbone features" if cached else "images", frozen.decision.phase1_reason)
    log.info("XLA %s (%s)", "on" if ctx.jit_compile else "off", ctx.jit_reason)
    if not ctx.info.multi_label:
        for line in few_photos_warning(ctx.info.counts, ctx.info.classes):
            log.warning("%s", line)
    if ctx.info.multi_label:
        positives = ", ".join(f"{c} {ctx.info.counts['train'].get(c, 0)}" for c in ctx.info.classes)
        log.info("multi-label: %d training photos; photos with each label: %s", ctx.info.num_examples("train"),
                 positives)  # fmt: skip
    print_model_summary(ctx.clf.model)


def _run_facts(ctx: Context, frozen: FrozenBackbone) -> dict:
    """metrics.json's opening keys: what the run trained, with which weights."""
    return {
        "weights": ctx.weights_used,
        "weights_warning": ctx.weights_warning,
        "backbone": ctx.clf.spec.name,
        "image_size": ctx.image_size,
        "batch_size": ctx.batch_size,  # per replica, as it ran: the config's, or the train split where smaller
        "classes": ctx.info.classes,
        "phase1_mode": "features" if frozen.decision.phase1_cached else "images",
        **({"init_from": ctx.start.to_dict()} if ctx.start else {}),
    }


def _test(ctx: Context, metrics: dict, kept: PhaseResult | None, frozen: FrozenBackbone) -> np.ndarray:
    """The test split's figures into `metrics` (when there is one), and the kept weights' val
    confusion matrix: from the kept phase's validation pass, else one more pass."""
    evaluation = make_steps(ctx, ctx.clf.logits_model, None)
    if ctx.info.num_examples("test"):  # on every worker: evaluation is a collective under multi-worker training
        test = _evaluate_test(ctx, frozen, evaluation)
        metrics["test"] = test.summary()
        if test.confusion_matrix.ndim == 2:  # the model card's per-class figures
            metrics["test"]["per_class"] = per_class(test.confusion_matrix, ctx.info.classes)
    if kept:
        return np.array(kept.val_confusion_matrix)
    return evaluate_split(ctx, "val", evaluation).confusion_matrix


def _evaluate_test(ctx: Context, frozen: FrozenBackbone, on_images: CompiledSteps) -> Evaluation:
    """The test split through the layers above phase 2's cut, where phase 1's gather kept its
    photos' activations there (the same logits, up to float rounding), else on images."""
    test = frozen.test_dataset()
    if test is None:
        return evaluate_split(ctx, "test", on_images)
    return make_steps(ctx, frozen.cut.tail, None).evaluate(test)


def lr_find_record(cfg: TrainConfig, suggestions: dict[str, float]) -> dict:
    """metrics.json's account of `auto` rates: each sweep's suggestion, the rule, the rates used."""
    used = {
        key: suggestions.get(f"phase{phase}") if getattr(cfg, key) == "auto" else getattr(cfg, key)
        for phase, key in ((1, "lr_head"), (2, "lr_finetune"))
    }
    return {**suggestions, "rule": RULE, "used": used}


def _thresholds(ctx: Context, phases: KeptPhases) -> dict:
    from app.training.thresholds import choose_thresholds

    found = choose_thresholds(ctx, phases)
    log.info(
        "per-label decision thresholds (best F1 on val): %s",
        ", ".join(f"{c} {t:.2f}" for c, t in zip(ctx.info.classes, found["thresholds"])),
    )
    return found


def _calibrate(ctx: Context, phases: KeptPhases) -> dict:
    from app.training.calibration import calibrate

    found = calibrate(ctx, phases)
    if found.get("not_fitted"):
        log.warning("calibration: temperature 1 (%s)", found["not_fitted"])
        return found
    log.info(
        "calibration: temperature %.3f fitted on %s; val log loss %.4f -> %.4f, ECE %.4f -> %.4f",
        found["temperature"],
        found["fitted_on"],
        found["val_log_loss_before"],
        found["val_log_loss_after"],
        found["val_ece_before"],
        found["val_ece_after"],
    )
    return found


def _sample_writer(ctx: Context, step: int) -> Callable[[np.ndarray], None]:
    """Writes a few training images, as the backbone gets them, to TensorBoard."""

    def write(images: np.ndarray) -> None:
        ctx.history.board.images(
            "train/augmented_inputs",
            images[:SAMPLE_IMAGES],
            step=step,
            description="training images as the input pipeline makes them (before the backbone)",
        )

    return write


def _kept_file(ctx: Context, phases: KeptPhases, phase1_cached: bool) -> str | None:
    """The file the kept epoch's weights were written to, when it holds the whole model (phase 2's
    always do; a cached phase 1 keeps only the head), else None."""
    number = 2 if phases[2] else 1
    kept = phases[number]
    if kept is None or (number == 1 and phase1_cached):
        return None
    path = ctx.phase_files.best_to_load(number, kept.best_epoch)
    return path if storage.exists(path) else None


def _finish(
    ctx: Context,
    metrics: dict,
    val_confusion: np.ndarray,
    epochs: int,
    kept: str | None,
    ood_score: ood.ShippedScore | None = None,
) -> None:
    """The chief's last steps: final weights (a copy of the `kept` epoch's file when there is one:
    the model holds exactly those weights, and Keras would write them again), export,
    plots, then metrics.json (which marks the run complete)."""
    from app.evaluation.figures import confusion_matrix_figure, figure_png, plot_learning_curves
    from app.export.run_export import export_run

    if kept:
        storage.write_bytes_atomic(ctx.run.final_weights, storage.read_bytes(kept))
    else:
        save_weights_atomic(ctx.clf.model, ctx.run.final_weights)
    served = served_model(ctx.clf, metrics.get("calibration"), ood_score)
    exported = export_run(ctx.run.root, model=served, metrics=metrics)
    metrics["export"], metrics["litert"] = exported["saved_model"], exported["litert"]
    metrics["openvino"], metrics["onnx"] = exported["openvino"], exported["onnx"]
    plot_learning_curves(ctx.run.history, ctx.run.learning_curves)
    if not ctx.info.multi_label:  # multi-label: one 2x2 per label, drawn by the evaluation report
        figure = confusion_matrix_figure(val_confusion, ctx.info.classes)
        ctx.history.board.figure(
            "val/confusion_matrix",
            figure_png(figure),
            step=epochs,
            description="validation split, kept weights; rows: true class",
        )
    ctx.run.write_metrics(metrics)
