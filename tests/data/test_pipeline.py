"""Reading pipelines: preprocessing parity, corrupt-record handling, determinism, sharding."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from app.data import schema
from app.data.pipeline import RecordCounter, load_dataset_info, make_eval_dataset, make_train_dataset
from app.data.preprocess import Augment, color_jitter, decode_for_eval, decode_random_crop
from app.errors import UserError


def _first_encoded(records: Path) -> tf.Tensor:
    path = load_dataset_info(records).shard_paths("val")[0]
    raw = next(iter(tf.data.TFRecordDataset(path)))
    return tf.io.parse_single_example(raw, schema.FEATURE_SPEC)[schema.ENCODED]


def test_eval_preprocessing_is_the_same_eagerly_in_tf_function_and_in_tf_data(demo_records: Path):
    encoded = _first_encoded(demo_records)
    eager = decode_for_eval(encoded, 64).numpy()
    graph = tf.function(lambda x: decode_for_eval(x, 64))(encoded).numpy()
    in_data = next(iter(tf.data.Dataset.from_tensors(encoded).map(lambda x: decode_for_eval(x, 64)))).numpy()
    assert eager.shape == (64, 64, 3) and eager.dtype == np.uint8
    assert eager.max() > eager.min()
    np.testing.assert_array_equal(graph, eager)
    np.testing.assert_array_equal(in_data, eager)


def test_eval_pipeline_uses_decode_for_eval(demo_records: Path):
    images, _ = next(iter(make_eval_dataset(demo_records, split="val", image_size=48, batch_size=1)))
    np.testing.assert_array_equal(images[0].numpy(), decode_for_eval(_first_encoded(demo_records), 48).numpy())


def test_random_crop_is_seeded_and_in_range(demo_records: Path):
    encoded, seed = _first_encoded(demo_records), tf.constant([1, 2])
    a = decode_random_crop(encoded, 40, seed, Augment())
    b = decode_random_crop(encoded, 40, seed, Augment())
    c = decode_random_crop(encoded, 40, tf.constant([3, 4]), Augment())
    assert a.shape == (40, 40, 3)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(a.numpy(), c.numpy())


def _reference_jitter(image: np.ndarray, b: float, c: float, s: float) -> np.ndarray:
    """The plain three-step definition the fused colour matrix must reproduce."""
    x = image * b
    x = (x - x.mean()) * c + x.mean()
    gray = x @ np.array([0.2989, 0.5870, 0.1140])
    x = (x - gray[..., None]) * s + gray[..., None]
    return np.clip(x, 0, 255)


def test_color_jitter_matches_brightness_contrast_saturation_applied_in_turn():
    images = tf.random.stateless_uniform([4, 8, 8, 3], [0, 0], 0, 255)
    seed = tf.constant([5, 6])
    out = color_jitter(images, seed, 0.4).numpy()
    s_b, s_c, s_s = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    factors = [tf.random.stateless_uniform([4], s, 0.6, 1.4).numpy() for s in (s_b, s_c, s_s)]
    for i in range(4):
        expected = _reference_jitter(images[i].numpy(), factors[0][i], factors[1][i], factors[2][i])
        np.testing.assert_allclose(out[i], expected, atol=1e-2)
    assert not np.allclose(out, images.numpy())
    single = color_jitter(images[0], seed, 0.4).numpy()  # one image: same maths, scalar factors
    s = [tf.random.stateless_uniform([], k, 0.6, 1.4).numpy() for k in (s_b, s_c, s_s)]
    np.testing.assert_allclose(single, _reference_jitter(images[0].numpy(), *s), atol=1e-2)
    as_uint8 = tf.cast(tf.round(images), tf.uint8)  # what the pipeline hands the train step
    np.testing.assert_allclose(
        color_jitter(as_uint8, seed, 0.4).numpy(),
        color_jitter(tf.cast(as_uint8, tf.float32), seed, 0.4).numpy(),
        atol=1e-3,
    )


def test_flip_mirrors_the_crop():
    image = tf.cast(tf.reshape(tf.range(8 * 8 * 3) % 251, [8, 8, 3]), tf.uint8)
    encoded = tf.io.encode_jpeg(image, quality=100)
    no_flip = Augment(area_range=(1.0, 1.0), aspect_ratio_range=(1.0, 1.0), flip=False, color_jitter=0.0)
    flip_only = Augment(area_range=(1.0, 1.0), aspect_ratio_range=(1.0, 1.0), color_jitter=0.0)
    always = [decode_random_crop(encoded, 8, tf.constant([k, 0]), flip_only) for k in range(8)]
    plain = decode_random_crop(encoded, 8, tf.constant([0, 0]), no_flip).numpy()
    mirrored = [a.numpy() for a in always if not np.allclose(a.numpy(), plain)]
    assert mirrored, "no flip in 8 draws"
    np.testing.assert_allclose(mirrored[0], plain[:, ::-1], atol=1e-3)


def _noise_jpeg(side: int) -> tf.Tensor:
    """A square of pixel noise: what a bilinear shrink without antialiasing turns into noise again."""
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return tf.io.encode_jpeg(pixels, quality=95)


@pytest.mark.parametrize("side", [1024, 256])
def test_a_large_crop_is_decoded_at_a_reduced_scale_and_a_small_one_exactly_as_before(side: int):
    whole = Augment(area_range=(1.0, 1.0), aspect_ratio_range=(1.0, 1.0), flip=False, color_jitter=0.0)
    encoded = _noise_jpeg(side)
    out = decode_random_crop(encoded, 64, tf.constant([0, 0]), whole).numpy().astype(float)
    if side == 256:  # 256 // 64 = 4: decoded at 1/4 scale, 64 pixels, not whole
        np.testing.assert_array_equal(out, tf.io.decode_jpeg(encoded, channels=3, ratio=4).numpy())
        return
    # 1024 // 64 = 16: decoded at 1/8 scale, already low-passed, so close to an antialiased
    # resize of the whole photo, where the whole photo shrunk by plain bilinear keeps the noise.
    full = tf.cast(tf.io.decode_jpeg(encoded, channels=3), tf.float32)
    antialiased = tf.image.resize(full, [64, 64], method="bilinear", antialias=True).numpy()
    plain = tf.image.resize(full, [64, 64], method="bilinear").numpy()
    assert np.abs(out - antialiased).mean() < 8 < np.abs(plain - antialiased).mean()


def test_a_crop_smaller_than_twice_the_output_decodes_at_full_scale():
    whole = Augment(area_range=(1.0, 1.0), aspect_ratio_range=(1.0, 1.0), flip=False, color_jitter=0.0)
    encoded = _noise_jpeg(100)  # 100 // 64 = 1: no reduced scale can keep 64 pixels
    out = decode_random_crop(encoded, 64, tf.constant([0, 0]), whole).numpy()
    full = tf.cast(tf.io.decode_jpeg(encoded, channels=3), tf.float32)
    resized = tf.image.resize(full, [64, 64], method="bilinear").numpy()
    np.testing.assert_array_equal(out, np.floor(resized + 0.5))  # rounded half up


def test_train_batches_are_uint8_for_the_device(demo_records: Path):
    images, labels = next(iter(make_train_dataset(demo_records, image_size=56, batch_size=4, seed=0)))
    assert images.shape == (4, 56, 56, 3) and images.dtype == tf.uint8
    assert labels.dtype == tf.int32 and labels.shape == (4,)
    assert int(tf.reduce_max(images)) > int(tf.reduce_min(images))


def test_deterministic_mode_repeats_exactly(demo_records: Path):
    def stream():
        ds = make_train_dataset(demo_records, image_size=32, batch_size=8, seed=7, deterministic=True)
        return [(x.numpy(), y.numpy()) for x, y in ds.take(3)]

    for (xa, ya), (xb, yb) in zip(stream(), stream()):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_a_second_pipeline_calls_the_same_parse_crop_and_views_without_tracing_them_again(demo_records: Path):
    """A run builds several pipelines (K views, val, test, phase 2's images): each parse, crop and
    view is traced once per process and setting, not once per pipeline."""
    from app.data import keyed, pipeline
    from app.data.keyed import make_keyed_dataset, record_table

    info = load_dataset_info(demo_records)
    keys = record_table(demo_records, "train")["key"]

    def first_batches() -> list[np.ndarray]:
        views = [
            make_keyed_dataset(demo_records, split="train", image_size=40, batch_size=4, wanted=keys, view_seed=seed)
            for seed in (1, 2)
        ]
        train = make_train_dataset(demo_records, image_size=40, batch_size=4, seed=0, deterministic=True)
        return [next(iter(ds))[0].numpy() for ds in [*views, train]]

    traced = [
        pipeline._parser(info.side_width, info.multi_label, len(info.classes), True),
        pipeline._traced_random_crop(40, Augment()),
        keyed._traced_view(40, Augment()),
    ]
    before = first_batches()
    counts = [fn.experimental_get_tracing_count() for fn in traced]
    again = first_batches()
    assert [fn.experimental_get_tracing_count() for fn in traced] == counts
    assert min(counts) >= 1  # each was traced, by the first pipelines
    assert all(np.array_equal(a, b) for a, b in zip(before, again))  # the same views from the same graph
    assert not np.array_equal(before[0], before[1])  # ... and each view's seed still its own


def test_augmentation_off_gives_eval_style_images(demo_records: Path):
    ds = make_train_dataset(demo_records, image_size=32, batch_size=64, augment=Augment.off(), seed=0)
    train_images = sorted(x.numpy().sum() for batch, _ in ds for x in batch)
    eval_images = sorted(
        x.numpy().sum() for batch, _ in make_eval_dataset(demo_records, split="train", image_size=32) for x in batch
    )
    np.testing.assert_allclose(train_images, eval_images, rtol=1e-5)


def test_input_context_shards_by_file(demo_records: Path):
    def filenames(pipeline_id: int) -> list[bytes]:
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id)
        ds = make_eval_dataset(demo_records, split="train", image_size=16, with_filenames=True, input_context=ctx)
        return [f for _, _, files in ds for f in files.numpy()]

    first, second = filenames(0), filenames(1)
    everything = [
        f
        for _, _, files in make_eval_dataset(demo_records, split="train", image_size=16, with_filenames=True)
        for f in files.numpy()
    ]
    assert first and second and not set(first) & set(second)
    assert sorted(first + second) == sorted(everything)


def _corrupt_copy(src: Path, dst: Path, how: str) -> str:
    """Copy the dataset and corrupt the first val shard; returns that shard's name."""
    shutil.copytree(src, dst)
    name = load_dataset_info(dst).shards["val"][0]
    path = dst / name
    if how == "crc":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:  # a well-formed record whose JPEG payload is truncated
        raws = list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())
        example = tf.train.Example.FromString(raws[0])
        jpeg = example.features.feature[schema.ENCODED].bytes_list.value[0]
        example.features.feature[schema.ENCODED].bytes_list.value[0] = jpeg[: len(jpeg) // 2]
        with tf.io.TFRecordWriter(str(path)) as w:
            w.write(example.SerializeToString())
            for raw in raws[1:]:
                w.write(raw)
    return name


def test_undecodable_record_is_skipped_and_counted_or_raises_in_strict_mode(demo_records: Path, tmp_path: Path):
    data = tmp_path / "data"
    shard = _corrupt_copy(demo_records, data, "jpeg")
    expected = load_dataset_info(data).num_examples("val")
    counter = RecordCounter()
    seen = sum(len(y) for _, y in make_eval_dataset(data, split="val", image_size=16, counter=counter))
    assert seen == expected - 1 and counter.skipped_undecodable == 1
    with pytest.raises(tf.errors.InvalidArgumentError, match=shard):
        for _ in make_eval_dataset(data, split="val", image_size=16, strict=True):
            pass


@pytest.mark.parametrize("strict", [False, True])
def test_a_flipped_byte_in_a_shard_is_an_error_naming_the_shard_in_either_mode(
    demo_records: Path, tmp_path: Path, strict: bool
):
    """Skipping it would lose the rest of the shard without a word; only undecodable payloads are skipped."""
    data = tmp_path / "data"
    shard = _corrupt_copy(demo_records, data, "crc")
    for make in (make_train_dataset, make_eval_dataset):
        with pytest.raises(UserError, match=rf"{shard}: corrupt shard \(.*\); write the dataset again"):
            make(data, split="val", image_size=16, strict=strict)


def test_a_training_run_on_a_damaged_shard_stops_before_training_naming_it(
    tiny_config, tmp_path: Path, demo_records: Path
):
    from app.training.train import train

    data = tmp_path / "data"
    shard = _corrupt_copy(demo_records, data, "crc")
    config = dataclasses.replace(tiny_config, data=str(data))
    with pytest.raises(UserError, match=f"{shard}: corrupt shard"):
        train(config)
    assert not Path(config.out).exists()  # stopped before the run dir was claimed


def test_missing_dataset_json_or_split_is_a_clear_error(demo_records: Path, tmp_path: Path):
    with pytest.raises(UserError, match="no dataset.json, so not a TFRecord folder; create it with photoclf convert$"):
        make_train_dataset(tmp_path)
    (tmp_path / "cats").mkdir()  # photos where their TFRecords were meant: the command that makes those
    with pytest.raises(UserError, match=f"photoclf convert {tmp_path} DATA_DIR, then --data DATA_DIR$"):
        make_train_dataset(tmp_path)
    manifest = tmp_path / "photos.csv"  # --data given the manifest that convert reads
    manifest.write_text("path,label\n")
    with pytest.raises(UserError, match=f"^{manifest}: a CSV manifest is converted first: photoclf convert {manifest}"):
        make_train_dataset(manifest)
    shard = next(demo_records.glob("train-*"))  # one file of the folder, as a tab completion gives it
    with pytest.raises(UserError, match=f"^{shard}: one file of a TFRecord folder; give the folder: {demo_records}$"):
        make_train_dataset(shard)
    with pytest.raises(UserError, match="no 'holdout' split"):
        make_eval_dataset(demo_records, split="holdout")


def test_input_context_shards_by_record_when_files_are_fewer_than_workers(demo_records: Path):
    def filenames(pipeline_id: int) -> list[bytes]:
        ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=pipeline_id)  # 2 shards < 3
        ds = make_eval_dataset(demo_records, split="train", image_size=16, with_filenames=True, input_context=ctx)
        return [f for _, _, files in ds for f in files.numpy()]

    parts = [filenames(i) for i in range(3)]
    everything = [
        f
        for _, _, files in make_eval_dataset(demo_records, split="train", image_size=16, with_filenames=True)
        for f in files.numpy()
    ]
    assert all(parts) and sorted(sum(parts, [])) == sorted(everything)
