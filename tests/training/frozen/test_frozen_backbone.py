"""The frozen backbone's door: phase 2 validates, and trains on phase 1's cached views, from
activations computed once below its trained layers, with the same results as working on images."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from app.config import TrainConfig
from app.data.keyed import make_keyed_dataset, record_table
from app.models.classifier import unfreeze_top
from app.training import ood_fit, train
from app.training.context import setup
from app.training.frozen import FrozenBackbone, decide, gather, model_outputs
from app.training.frozen import backbone as door
from app.training.inputs import eval_dataset
from app.training.train import build_phase, run_phase1, run_phase2

pytestmark = pytest.mark.start_first  # its tests take over a minute in all


@pytest.fixture(scope="module")
def side_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from app.data.side_demo import FEATURE_COLUMNS, generate_side_feature_dataset
    from app.data.writer import write_tfrecords

    tmp = tmp_path_factory.mktemp("side")
    manifest = generate_side_feature_dataset(tmp / "photos", per_class=6, image_size=48)
    write_tfrecords(
        manifest, tmp / "records", feature_columns=FEATURE_COLUMNS, val_fraction=0.25, test_fraction=0.0, num_shards=1
    )
    return tmp / "records"


def _assert_as_stored(read: np.ndarray, computed: np.ndarray) -> None:
    """Rows read back from the store are the computed ones as float16 keeps them: within half
    its spacing (2^-11 of a value; 2^-25 below its smallest normal number)."""
    np.testing.assert_allclose(read, computed, rtol=2**-11, atol=2**-25)
    assert read.dtype == np.float32


def _config(data: str, tiny_config: TrainConfig, side_records: Path) -> TrainConfig:
    if data == "images_and_side_features":
        return tiny_config.replace(data=str(side_records), image_size=32, batch_size=4)
    return tiny_config


def _phase2_after_phase1(cfg: TrainConfig):
    ctx = setup(cfg)
    phase1 = run_phase1(ctx)
    unfreeze_top(ctx.clf, cfg.unfreeze)
    return ctx, build_phase(ctx, 2, phase1)


@pytest.mark.parametrize("data", ["images", "images_and_side_features"])
def test_validation_on_activations_equals_validation_on_images(data: str, tiny_config: TrainConfig, side_records: Path):
    cfg = _config(data, tiny_config, side_records).replace(
        label_smoothing=0.1,  # the tail's loss: the steps' own
        feature_views="0",
    )  # phase 2 trains on images
    ctx, phase = _phase2_after_phase1(cfg)
    assert phase.val_steps is not None and phase.val_steps.model.name == "tail"
    assert phase.spec.keep_last and phase.spec.patience == phase.spec.epochs  # on images: its whole schedule's end

    phase.inputs.train_iterator()  # computes the activations, as the phase's first epoch does
    _assert_same_validation(ctx, phase)


@pytest.mark.parametrize("data", ["images", "images_and_side_features"])
@pytest.mark.slow  # the fast tier's phase 2 on cached views checks this hand-over too
def test_phase1s_gather_hands_phase2_its_activations(
    data: str,
    tiny_config: TrainConfig,
    side_records: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """Phase 1's cache runs every val photo through the backbone; phase 2 then computes nothing."""
    cfg = _config(data, tiny_config, side_records).replace(feature_views="2")
    ctx = setup(cfg)
    frozen = FrozenBackbone(ctx)
    with caplog.at_level(logging.INFO, logger="app.training.frozen"):
        phase1 = run_phase1(ctx, frozen)
    assert "computed once, as phase 1's features were gathered" in caplog.text
    unfreeze_top(ctx.clf, cfg.unfreeze)
    monkeypatch.setattr(door, "_activations", lambda *_: pytest.fail("phase 2 computed them again"))
    phase = build_phase(ctx, 2, phase1, frozen)
    phase.inputs.train_iterator()
    _assert_same_validation(ctx, phase)


def _assert_same_validation(ctx, phase) -> None:
    cached = phase.validation.evaluate(phase.inputs.val_dataset())
    on_images = phase.steps.evaluating(ctx.clf.logits_model).evaluate(eval_dataset(ctx, "val"))
    assert cached.count == on_images.count == ctx.info.num_examples("val") > 0
    assert cached.loss == pytest.approx(on_images.loss, abs=1e-5)
    assert cached.accuracy == on_images.accuracy
    np.testing.assert_array_equal(cached.confusion_matrix, on_images.confusion_matrix)
    np.testing.assert_array_equal(cached.labels, on_images.labels)
    np.testing.assert_allclose(cached.logits, on_images.logits, atol=1e-5)


@pytest.mark.slow  # a real phase 2; the equalities themselves are checked above in the fast tier
def test_phase2_trains_the_layers_the_tail_validates(tiny_config: TrainConfig, caplog: pytest.LogCaptureFixture):
    """The tail shares the classifier's weights: what phase 2 trains is what it validates."""
    cfg = tiny_config.replace(lr_finetune=1e-2, warmup_fraction=0.0)
    ctx = setup(cfg)
    phase1 = run_phase1(ctx)
    with caplog.at_level(logging.INFO, logger="app.training.frozen"):
        run_phase2(ctx, phase1)
    assert "phase 2 validates from block_2_relu" in caplog.text
    phase = build_phase(ctx, 2, phase1)
    phase.inputs.train_iterator()
    _assert_same_validation(ctx, phase)


def _views_activations(ctx, split, views: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """The training views made again (each photo's seeded by its content and the view) and run
    through the frozen layers; with the labels of their photos."""
    table = record_table(ctx.cfg.data, "train")
    outputs = []
    for view in range(views):
        seed = ctx.cfg.seed * 1000 + view
        ds = make_keyed_dataset(ctx.cfg.data, split="train", image_size=ctx.image_size, batch_size=16,
                                wanted=table["key"], view_seed=seed, augment=ctx.augmentation)  # fmt: skip
        activations, keys = model_outputs(lambda x, k: split.lower(x, training=False), ds)
        assert keys.tolist() == table["key"].tolist()  # every photo once, in stored order
        outputs.append(activations)
    return np.concatenate(outputs), np.concatenate([table["label"]] * views)


def test_phase2_trains_the_tail_on_the_activations_of_phase1s_cached_views(
    tiny_config: TrainConfig, caplog: pytest.LogCaptureFixture
):
    """The cache build hands phase 2 the activations of every training view, the same ones the
    views give when made again; phase 2's train step then runs only the layers above the cut."""
    cfg = tiny_config.replace(feature_views="2")
    ctx = setup(cfg)
    frozen = FrozenBackbone(ctx)
    assert frozen.decision.keeps_views and frozen.decision.phase2_on_views
    phase1 = run_phase1(ctx, frozen)
    again, labels = _views_activations(ctx, frozen.cut)
    np.testing.assert_allclose(frozen._train.activations, again, atol=1e-5)
    np.testing.assert_array_equal(frozen._train.labels, labels)
    assert len(labels) == 2 * ctx.info.num_examples("train")

    unfreeze_top(ctx.clf, cfg.unfreeze)
    phase = build_phase(ctx, 2, phase1, frozen)
    assert phase.steps.model.name == "tail" and phase.val_steps is None and phase.model is ctx.clf.model
    with caplog.at_level(logging.INFO, logger="app.training.frozen"):
        batch, batch_labels = next(phase.inputs.train_iterator())
    assert "phase 2 trains from block_2_relu too, on phase 1's cached views: 48 activations" in caplog.text
    assert batch.shape == (cfg.batch_size, *frozen.cut.lower.output.shape[1:]) and batch.dtype == tf.float32
    rows = {row.tobytes(): label for row, label in zip(frozen._train.activations, frozen._train.labels)}
    assert [rows[row.tobytes()] for row in batch.numpy()] == batch_labels.numpy().tolist()  # rows of the views
    _assert_same_validation(ctx, phase)


@pytest.mark.slow  # a resume: the fast tier stays under 3 minutes
def test_a_resumed_phase2_makes_the_views_activations_again(tiny_config: TrainConfig, caplog: pytest.LogCaptureFixture):
    """Without the activations (phase 1 built its cache without phase 2's cut: nothing of them
    was stored), phase 2 runs the same content-seeded views through the frozen layers as it
    starts."""
    cfg = tiny_config.replace(feature_views="2")
    ctx = setup(cfg)
    phase1 = run_phase1(ctx, FrozenBackbone.phase1_only(ctx))  # no cut: phase 2's door below holds nothing
    unfreeze_top(ctx.clf, cfg.unfreeze)
    frozen = FrozenBackbone(ctx)
    phase = build_phase(ctx, 2, phase1, frozen)
    with caplog.at_level(logging.INFO):
        phase.inputs.train_iterator()
    assert "on phase 1's cached views: 48 activations" in caplog.text
    assert "0 from the feature store" in caplog.text  # the features were there, not the activations
    again, labels = _views_activations(ctx, frozen.cut)
    np.testing.assert_allclose(frozen._train.activations, again, atol=1e-5)
    np.testing.assert_array_equal(frozen._train.labels, labels)


@pytest.mark.slow  # a resume: the fast tier stays under 3 minutes
def test_a_resumed_phase2_reads_the_views_activations_from_the_feature_store(
    tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """Phase 1's cache build stored the activations at the cut; a resumed run's phase 2 (a new
    process: a fresh FrozenActivations) runs nothing through the backbone to get them back."""
    cfg = tiny_config.replace(feature_views="2")
    ctx = setup(cfg)
    built = FrozenBackbone(ctx)
    phase1 = run_phase1(ctx, built)
    unfreeze_top(ctx.clf, cfg.unfreeze)
    frozen = FrozenBackbone(ctx)
    monkeypatch.setattr(gather, "host_forward", lambda *_: pytest.fail("the backbone ran again"))
    with caplog.at_level(logging.INFO):
        build_phase(ctx, 2, phase1, frozen).inputs.train_iterator()
    assert "72 from the feature store" in caplog.text  # 2 views of 24 training photos, 12 val, 12 test photos
    _assert_as_stored(frozen._train.activations, built._train.activations)
    _assert_as_stored(frozen._val.activations, built._val.activations)


@pytest.mark.parametrize(
    "rows_in_memory",
    [pytest.param(decide.ROWS_IN_MEMORY, id="in memory"), pytest.param(1000, id="on disk", marks=pytest.mark.slow)],
)
@pytest.mark.slow  # three gathers: the fast tier stays under 3 minutes
def test_with_other_weights_above_the_cut_only_those_layers_run_on_the_stored_activations(
    rows_in_memory: int,
    tiny_config: TrainConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """A run started from an earlier one (--init-from) has the earlier run's fine-tuned layers
    above the cut and the pretrained ones below: the stored activations still hold, and the
    features come from the layers above alone, the same as from the whole backbone (but for
    the stored activations' float16 rounding)."""
    monkeypatch.setattr(decide, "ROWS_IN_MEMORY", rows_in_memory)
    ctx = setup(tiny_config.replace(feature_views="2"))
    FrozenBackbone(ctx).phase1_features()  # stores the activations at the cut
    trained = unfreeze_top(ctx.clf, ctx.cfg.unfreeze)  # the layers phase 2 would have changed
    for layer in ctx.clf.backbone.layers:
        if layer.name in trained:
            layer.set_weights([w * 1.5 for w in layer.get_weights()])
    with caplog.at_level(logging.INFO):
        above = FrozenBackbone(ctx).phase1_features()
    assert "60 through the layers above block_2_relu only, 0 computed" in caplog.text  # 2 views of 24, 12 val
    monkeypatch.setenv("PHOTOCLF_CACHE_DIR", str(tmp_path / "empty"))
    whole = FrozenBackbone(ctx).phase1_features()  # every row through the backbone
    scale = np.abs(whole.train_features[:]).max()  # [:]: the rows, read whole where they are on disk
    np.testing.assert_allclose(above.train_features[:], whole.train_features[:], rtol=5e-3, atol=1e-4 * scale)
    np.testing.assert_allclose(above.val_features[:], whole.val_features[:], rtol=5e-3, atol=1e-4 * scale)


@pytest.mark.parametrize(
    "setting, why",
    [
        ({"phase2_mode": "images"}, "phase2_mode = images"),
        pytest.param(
            {"feature_views": "0"},
            "phase2_mode = views; no cached views: phase 1 trained on images, so there are no"
            " cached views (feature_views)",
            marks=pytest.mark.slow,  # the fast tier stays under 3 minutes
        ),
    ],
)
def test_phase2_trains_on_images_when_asked_or_without_cached_views(setting: dict, why: str, tiny_config: TrainConfig):
    cfg = tiny_config.replace(**setting)
    ctx = setup(cfg)
    frozen = FrozenBackbone(ctx)
    phase1 = run_phase1(ctx, frozen)
    plan = frozen.decision.plan
    assert (plan.mode, plan.reason) == ("images", why) and not frozen.decision.phase2_on_views
    unfreeze_top(ctx.clf, cfg.unfreeze)
    phase = build_phase(ctx, 2, phase1, frozen)
    assert phase.steps.model is ctx.clf.logits_model and phase.val_steps.model.name == "tail"
    images, _ = next(phase.inputs.train_iterator())
    assert images.dtype == tf.uint8 and images.shape[1:] == (64, 64, 3)


def test_phase2_trains_on_images_when_the_views_activations_would_not_fit(
    tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """The val activations fit, the training views' do not: validation from the cut, training on images."""
    ctx = setup(tiny_config)
    split = FrozenBackbone(ctx).cut
    val_bytes = decide._bytes(ctx, split, "val")
    monkeypatch.setattr(decide, "cache_limit", lambda _: val_bytes)
    frozen = FrozenBackbone(ctx)
    assert frozen.cut is not None and not frozen.decision.keeps_views and not frozen.decision.phase2_on_views
    assert frozen.decision.no_views.startswith("the views' activations would take")


@pytest.mark.slow  # two runs: the fast tier stays under 3 minutes
def test_the_kept_weights_features_go_to_the_store_for_a_run_started_from_them(
    tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """The "none of these" fit runs the views and the val photos through the layers above the
    cut with the kept weights; their features go to the store, so a run with those weights (one
    started from this run, --init-from) finds every row and runs no layer at all."""
    ctx = setup(tiny_config.replace(feature_views="2", phase2_mode="views"))
    frozen = FrozenBackbone(ctx)
    frozen.phase1_features()
    for weight in frozen.cut.upper.weights:  # what phase 2 trains, changed as its steps would
        weight.assign(weight * 1.5 + 0.01)
    train_features, *_ = frozen.pooled_features("train")
    val_features, *_ = frozen.pooled_features("val")

    monkeypatch.setattr(gather, "host_forward", lambda *_: pytest.fail("the backbone ran"))
    monkeypatch.setattr(gather, "_above_cut", lambda *_: pytest.fail("the layers above the cut ran"))
    with caplog.at_level(logging.INFO):
        again = FrozenBackbone(ctx).phase1_features()
    assert "72 from the feature store" in caplog.text  # 2 views of 24 training photos, 12 val, 12 test photos
    assert "0 through the layers above block_2_relu only, 0 computed" in caplog.text
    _assert_as_stored(again.train_features, train_features)
    _assert_as_stored(again.val_features, val_features)


def test_validation_stays_on_images_when_the_activations_would_not_fit(
    tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setattr(decide, "cache_limit", lambda _: 1000)
    with caplog.at_level(logging.INFO, logger="app.training.frozen"):
        _, phase = _phase2_after_phase1(tiny_config)
    assert phase.val_steps is None and phase.validation is phase.steps
    assert "phase 2 validates on images: the val activations at block_2_relu would take" in caplog.text


@pytest.mark.slow  # both phases and a gather: the fast tier stays under 3 minutes
def test_after_phase2_on_images_the_views_activations_still_give_the_training_features(tiny_config: TrainConfig):
    """`auto` chose fresh crops for phase 2 (a cold start), which trains only the
    layers above the cut: the views' activations kept from phase 1 then still give the trained
    model's features of those views, which the out-of-distribution fit reads instead of making a
    pass over every training photo."""
    cfg = tiny_config.replace(phase2_mode="auto", feature_views="2")
    ctx = setup(cfg)
    frozen = FrozenBackbone(ctx)
    run_phase1(ctx, frozen)
    assert frozen.decision.keeps_views  # phase 1's gather kept the views' activations ...
    assert frozen.decision.plan.mode == "images" and not frozen.decision.phase2_on_views  # ... phase 2 trains on images
    for weight in frozen.cut.upper.weights:  # what phase 2 trains, changed as its steps would
        weight.assign(weight * 1.5 + 0.01)

    pooled, labels, _ = frozen.pooled_features("train")
    table = record_table(cfg.data, "train")
    made_again = []
    for view in range(2):
        ds = make_keyed_dataset(cfg.data, split="train", image_size=ctx.image_size, batch_size=16, wanted=table["key"],
                                view_seed=cfg.seed * 1000 + view, augment=ctx.augmentation)  # fmt: skip
        made_again.append(model_outputs(lambda x, k: ctx.clf.features_model(x, training=False), ds)[0])
    np.testing.assert_allclose(pooled, np.concatenate(made_again), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(labels, np.concatenate([table["label"]] * 2))


@pytest.mark.slow  # both phases, read twice: the fast tier stays under 3 minutes
def test_the_test_split_is_read_through_the_layers_above_the_cut_with_the_figures_of_images(
    tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch
):
    """Phase 1's cache build also runs the test photos through the frozen layers; the test pass
    after training then runs only the layers above (trained since), with the loss, accuracy and
    confusion matrix a pass over the decoded photos gives."""
    ctx = setup(tiny_config.replace(feature_views="2"))
    frozen = FrozenBackbone(ctx)
    assert frozen.decision.keeps_test
    run_phase1(ctx, frozen)
    assert len(frozen._test.labels) == ctx.info.num_examples("test") > 0
    for weight in frozen.cut.upper.weights:  # what phase 2 trains, changed as its steps would
        weight.assign(weight * 1.5 + 0.01)
    on_images = train.evaluate_split(ctx, "test")
    monkeypatch.setattr(train, "evaluate_split", lambda *_: pytest.fail("the test photos were decoded again"))
    through_cut = train._evaluate_test(ctx, frozen, train.make_steps(ctx, ctx.clf.logits_model, None))
    assert through_cut.count == on_images.count == ctx.info.num_examples("test")
    assert through_cut.loss == pytest.approx(on_images.loss, abs=1e-5)
    assert through_cut.accuracy == on_images.accuracy
    np.testing.assert_array_equal(through_cut.confusion_matrix, on_images.confusion_matrix)
    np.testing.assert_allclose(through_cut.logits, on_images.logits, atol=1e-5)


def test_the_test_split_stays_on_images_when_its_activations_would_not_fit(
    tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch
):
    ctx = setup(tiny_config.replace(feature_views="2"))
    cut = FrozenBackbone(ctx).cut
    held = decide._bytes(ctx, cut, "val") + 2 * decide._bytes(ctx, cut, "train")
    monkeypatch.setattr(decide, "cache_limit", lambda _: held)  # the views fit, the test photos do not
    frozen = FrozenBackbone(ctx)
    assert frozen.decision.keeps_views and not frozen.decision.keeps_test
    frozen.phase1_features()
    assert frozen.test_dataset() is None  # train._evaluate_test then decodes the test photos


@pytest.mark.parametrize(
    "rows_in_memory",
    [pytest.param(decide.ROWS_IN_MEMORY, id="in memory"), pytest.param(1000, id="on disk", marks=pytest.mark.slow)],
)
@pytest.mark.slow  # a gather and an OOD fit: the fast tier stays under 3 minutes
def test_where_the_backbone_is_as_phase_1_left_it_the_ood_fit_reads_its_cached_features(
    rows_in_memory: int, tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch
):
    """Phase 2 did not run (or kept none of its epochs): the layers above the cut hold the weights
    phase 1's cache was built with, so the out-of-distribution fit takes that cache's pooled
    features, the ones the layers above the cut would give, and runs no layer."""
    monkeypatch.setattr(decide, "ROWS_IN_MEMORY", rows_in_memory)
    ctx = setup(tiny_config.replace(feature_views="2", phase2_mode="views"))
    frozen = FrozenBackbone(ctx)
    phase1 = run_phase1(ctx, frozen)
    through_upper = frozen.pooled_features("train")
    assert through_upper is not None
    cached = frozen.pooled_features("train", upper_unchanged=True)
    np.testing.assert_allclose(cached[0], through_upper[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(cached[1], through_upper[1])
    np.testing.assert_allclose(frozen.pooled_features("val", upper_unchanged=True)[0],
                               frozen.pooled_features("val")[0], rtol=1e-4, atol=1e-4)  # fmt: skip

    assert (frozen.decision.rows_on_disk is not None) == (rows_in_memory == 1000)
    monkeypatch.setattr(door, "_upper_features", lambda *_: pytest.fail("a layer ran"))
    monkeypatch.setattr(door, "split_features", lambda *_: pytest.fail("a pass over photos ran"))
    _, fitted_on, _ = ood_fit.fit_ood_score(ctx, {1: phase1, 2: None}, 1.0, frozen)
    assert fitted_on == f"{len(cached[1])} train views, {ctx.info.num_examples('val')} val photos"
