"""Phase 1's features: K augmented views, gathered once, kept in the feature store, reused on resume,
computed again on change; and the decision whether phase 1 trains on them."""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import stored_weight_shapes

from app.config import TrainConfig
from app.data.pipeline import make_eval_dataset
from app.inference import host_forward
from app.training.context import setup
from app.training.frozen import FrozenBackbone, model_outputs, phase1_bytes, phase1_mode
from app.training.frozen.gather import gather
from app.training.frozen.passes import one_stream
from app.training.train import run_phase1


def load_or_build(ctx, on_first_batch=None):
    """Phase 1's features alone, as a learning-rate sweep gathers them."""
    return FrozenBackbone.phase1_only(ctx).phase1_features(on_first_batch)


def _train_counts(ctx) -> np.ndarray:
    return np.array([ctx.info.counts["train"][c] for c in ctx.info.classes])


@pytest.fixture
def cached_config(tiny_config: TrainConfig, demo_records: Path, tmp_path: Path) -> TrainConfig:
    data = tmp_path / "data"
    shutil.copytree(demo_records, data)  # a private copy: one test changes its dataset.json
    return tiny_config.replace(data=str(data), feature_views="3")


def test_one_stream_runs_the_parts_in_order_and_tags_every_row_with_its_part():
    def part(first_label: int, rows: int) -> tf.data.Dataset:
        images = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + first_label
        return tf.data.Dataset.from_tensor_slices((images, np.arange(rows, dtype=np.int32) + first_label)).batch(2)

    outputs, (labels, parts) = model_outputs(lambda x, _: 2 * x, one_stream([part(0, 5), part(10, 3), part(20, 1)]))
    assert labels.tolist() == [0, 1, 2, 3, 4, 10, 11, 12, 20]
    assert parts.tolist() == [0] * 5 + [1] * 3 + [2]
    assert outputs[5].tolist() == [20.0, 22.0]  # the outputs stay on their rows: part 1's first image, doubled


def test_model_outputs_traces_the_model_once_whatever_the_batch_sizes():
    traces = []

    def double(x, _):
        traces.append(x.shape.as_list())  # runs only while tracing
        return 2 * x

    rows = np.arange(10, dtype=np.float32).reshape(5, 2)
    outputs, labels = model_outputs(double, tf.data.Dataset.from_tensor_slices((rows, np.arange(5))).batch(2))
    assert traces == [[None, 2]]  # batches of 2, 2 and then 1: one trace
    assert outputs.tolist() == (2 * rows).tolist() and labels.tolist() == [0, 1, 2, 3, 4]


def test_each_view_covers_every_training_image_once_and_val_is_the_eval_pipeline(cached_config: TrainConfig):
    ctx = setup(cached_config)
    first_batches = []
    cache = load_or_build(ctx, on_first_batch=first_batches.append)
    n = ctx.info.num_examples("train")
    # The sample TensorBoard shows is the first batch as the backbone got it (float 0..255).
    (sample,) = first_batches
    assert sample.shape == (ctx.cfg.batch_size, 64, 64, 3) and sample.dtype == np.float32
    assert sample.min() >= 0 and sample.max() <= 255 and sample.max() > 1
    np.testing.assert_allclose(
        ctx.clf.features_model(sample, training=False).numpy(),
        cache.train_features[: len(sample)],
        rtol=1e-3,
        atol=1e-5 * np.abs(cache.train_features).max(),
    )
    width = ctx.clf.backbone.output.shape[-1]  # pooled: one value per channel
    assert cache.train_features.shape == (3 * n, width) and cache.train_features.dtype == np.float32
    assert cache.val_features.shape == (ctx.info.num_examples("val"), width)
    for view in range(3):  # each block of n rows is one pass over the training split
        assert (np.bincount(cache.train_labels[view * n : (view + 1) * n], minlength=4) == _train_counts(ctx)).all()
    # What `auto` weighs against its memory limit is what the cache holds.
    assert phase1_bytes(ctx) == cache.train_features.nbytes + cache.val_features.nbytes
    plain_ctx = setup(cached_config.replace(augment=False, out=cached_config.out + "-plain"))
    plain = load_or_build(plain_ctx)
    assert plain.train_features.shape == (n, width)  # augment = false: one unaugmented view
    plain_bytes = plain.train_features.nbytes + plain.val_features.nbytes
    assert phase1_bytes(plain_ctx) == plain_bytes
    # Validation features are the backbone on the eval pipeline, the same in both.
    images, labels = zip(*make_eval_dataset(ctx.cfg.data, split="val", image_size=64, batch_size=64))
    expected = ctx.clf.features_model(np.concatenate(images), training=False).numpy()
    # Batch size changes the rounding; random-init features are ~1e-12, so the floor is relative too.
    np.testing.assert_allclose(cache.val_features, expected, rtol=1e-2, atol=1e-4 * np.abs(expected).max())
    assert cache.val_labels.tolist() == plain.val_labels.tolist() == np.concatenate(labels).tolist()
    # Augmented views are not the unaugmented image: the mean feature of each class moves.
    for label in range(4):
        aug = cache.train_features[cache.train_labels == label].mean(0)
        raw = plain.train_features[plain.train_labels == label].mean(0)
        assert not np.allclose(aug, raw, rtol=1e-3, atol=0)  # relative: random-init features are tiny


@pytest.mark.slow  # three gathers: the fast tier stays under 3 minutes
def test_a_resumed_run_reads_its_features_back_and_other_settings_compute_their_own(
    cached_config: TrainConfig, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO)
    ctx = setup(cached_config)
    first = load_or_build(ctx)
    assert "not a valid node name" not in caplog.text  # TensorFlow's warning for a traced argument named `_`
    rows = 3 * ctx.info.num_examples("train") + ctx.info.num_examples("val")
    assert f"{rows} rows" in caplog.text and "0 from the feature store" in caplog.text
    caplog.clear()
    samples = []
    again_ctx = setup(cached_config)
    gathered = gather(again_ctx, on_first_batch=samples.append)  # the same command again: a resume
    again = gathered.features
    assert f"{rows} from the feature store" in caplog.text and ", 0 computed" in caplog.text
    (sample,) = samples  # TensorBoard's sample is still what the backbone got: the first photos' first view
    np.testing.assert_allclose(
        ctx.clf.features_model(sample, training=False).numpy(),
        first.train_features[: len(sample)],
        rtol=1e-3,
        atol=1e-5 * np.abs(first.train_features).max(),
    )
    np.testing.assert_array_equal(first.train_features, again.train_features)
    np.testing.assert_array_equal(first.val_features, again.val_features)
    caplog.clear()
    more_views = load_or_build(setup(cached_config.replace(feature_views="4", out=cached_config.out + "-4")))
    n = ctx.info.num_examples("train")
    assert f"{rows} from the feature store" in caplog.text and f", {n} computed" in caplog.text  # only view 4
    np.testing.assert_array_equal(more_views.train_features[: 3 * n], first.train_features)
    assert not np.allclose(more_views.train_features[3 * n :], first.train_features[:n])  # a view of its own


@pytest.mark.slow  # OpenVINO's conversion and three gathers: the fast tier stays under 3 minutes
def test_openvino_gathers_tensorflow_s_features_in_float32_even_where_the_host_has_bfloat16(
    cached_config: TrainConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """The gather's pass on OpenVINO gives TensorFlow's features (float32), says so and records it.
    Its rows train and judge the model, so on a host with bfloat16 it is not even tried: the rows
    are float32's, and a later float32 run finds them all in the store."""
    caplog.set_level(logging.INFO)
    by_tf = gather(setup(cached_config.replace(forward_runtime="tensorflow", out=cached_config.out + "-tf")))
    assert (by_tf.forward.runtime, by_tf.forward.precision) == ("tensorflow", "float32")
    monkeypatch.setattr(host_forward, "openvino_precisions", lambda: ("float32", "bfloat16"))
    store = str(Path(cached_config.out).parent / "store-ov")  # apart from the TensorFlow run's rows
    float32 = cached_config.replace(forward_runtime="openvino", feature_store=store, out=cached_config.out + "-f32")
    by_ov = gather(setup(float32))
    assert (by_ov.forward.runtime, by_ov.forward.precision) == ("openvino", "float32")
    assert [c.name for c in by_ov.forward.tried] == ["tensorflow float32", "openvino float32"]
    assert "forward passes: openvino float32" in caplog.text and "bfloat16" not in caplog.text
    scale = np.abs(by_tf.features.train_features).max()
    np.testing.assert_allclose(by_ov.features.train_features, by_tf.features.train_features, atol=1e-4 * scale)
    np.testing.assert_allclose(by_ov.features.val_features, by_tf.features.val_features, atol=1e-4 * scale)
    caplog.clear()
    monkeypatch.setattr(host_forward, "openvino_precisions", lambda: ("float32",))
    assert gather(setup(float32.replace(out=cached_config.out + "-again"))).forward is None
    assert ", 0 computed" in caplog.text


def _split_folder(images: Path, out: Path) -> Path:
    """A copy of the demo images split by hand (train: the first 9 of each class, val: the rest),
    so a renamed photo stays in its split."""
    for class_dir in sorted(p for p in images.iterdir() if p.is_dir()):
        photos = sorted(class_dir.glob("*_0*.*"))
        for i, photo in enumerate(photos):
            split = "train" if i < 9 else "val"
            (out / split / class_dir.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(photo, out / split / class_dir.name / photo.name)
    return out


@pytest.mark.slow  # three gathers: the fast tier stays under 3 minutes
def test_features_are_kept_by_photo_content_a_renamed_photo_reuses_them_a_changed_one_does_not(
    tiny_config: TrainConfig, demo_images: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    from PIL import Image

    from app.data.writer import write_tfrecords

    photos = _split_folder(demo_images, tmp_path / "photos")
    write_tfrecords(photos, tmp_path / "before", num_shards=2, workers=1)
    cfg = tiny_config.replace(data=str(tmp_path / "before"), feature_views="2")
    before = load_or_build(setup(cfg))
    renamed, changed = sorted((photos / "train" / "circle").iterdir())[:2]
    renamed.rename(renamed.with_name("renamed" + renamed.suffix))
    with Image.open(changed) as image:
        image.convert("RGB").rotate(90).save(changed.with_suffix(".png"))  # other pixels, other bytes
    changed.unlink()
    write_tfrecords(photos, tmp_path / "after", num_shards=3, workers=1)  # other shards too
    caplog.set_level(logging.INFO)
    after = load_or_build(setup(cfg.replace(data=str(tmp_path / "after"), out=cfg.out + "-after")))
    rows = len(after.train_labels) + len(after.val_labels)
    assert f"{rows - 2} from the feature store" in caplog.text and ", 2 computed" in caplog.text  # 2 views of one
    kept = {row.tobytes() for row in before.train_features}
    new = [row.tobytes() not in kept for row in after.train_features]
    assert sum(new) == 2  # the changed photo's two views; the renamed one's rows are the ones it had
    assert {row.tobytes() for row in after.val_features} == {row.tobytes() for row in before.val_features}


def test_cached_phase1_checkpoints_only_the_head_and_trains_it(cached_config: TrainConfig):
    ctx = setup(cached_config.replace(epochs_head=2))
    head = [w.numpy().copy() for w in ctx.clf.model.get_layer("logits").weights]
    result = run_phase1(ctx)
    assert result.epochs == 2 and np.isfinite(result.val_loss)
    assert any(
        not np.array_equal(w.numpy(), before) for w, before in zip(ctx.clf.model.get_layer("logits").weights, head)
    )
    stored = stored_weight_shapes(ctx.run.best_weights(1, result.best_epoch))  # the head's kernel and bias, no backbone
    assert sorted(math.prod(shape) for shape in stored) == sorted(
        w.numpy().size for w in ctx.clf.model.get_layer("logits").weights
    )


def test_auto_caches_on_a_cpu_and_says_why(tiny_config: TrainConfig):
    decision = FrozenBackbone(setup(tiny_config)).decision
    assert tiny_config.feature_views == "auto" and decision.phase1_cached
    assert "on a CPU" in decision.phase1_reason and "2 augmented view(s)" in decision.phase1_reason
    off = FrozenBackbone(setup(tiny_config.replace(feature_views="0", out=tiny_config.out + "-off"))).decision
    assert not off.phase1_cached and off.phase1_reason == "feature_views = 0: phase 1 on images"


def test_auto_caches_on_a_gpu_too_unless_the_cache_would_not_fit_on_disk(tiny_config: TrainConfig, monkeypatch):
    strategy = tf.distribute.get_strategy()
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"] if kind == "GPU" else [])
    limit = 4 * 2**30  # what the disk beside the run has free
    cached, why = phase1_mode(tiny_config, strategy, cache_bytes=2**20, limit=limit, views=2)
    assert cached and "on a GPU the CPU's decoding is the bottleneck" in why
    cached, why = phase1_mode(tiny_config, strategy, cache_bytes=limit + 2**29, limit=limit, views=2)
    assert (
        not cached
        and "would take 4.5 GiB, more than the 4.0 GiB free" in why
        and "set a number of views to cache anyway" in why
    )
    assert phase1_mode(tiny_config.replace(feature_views="2"), strategy, cache_bytes=limit + 1, limit=limit, views=2)[0]
    cached, why = phase1_mode(tiny_config.replace(data_service="grpc://host:5000"), strategy, 2**20, limit, views=2)
    assert not cached and "tf.data service" in why
