"""tf.data pipelines from a TFRecord folder: one for training, one for evaluation, and keyed
passes for the feature cache (photos matched by content key, views seeded by it).

Both yield (images uint8 [B, S, S, 3], labels int32 [B]): a quarter of float32's bytes to copy,
batch and send to an accelerator. A dataset with side features (app/data/side_features.py)
yields ({"image": images, "side": float32 [B, F]}, labels) instead; `map_image` applies a
function to the images of either. Colour jitter and pixel normalisation belong to the training
step and the model, which run on the device. Corrupt records are skipped by default; `strict=True` raises instead,
naming the shard. Pass a `tf.distribute.InputContext` to shard per worker.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from app import storage
from app.data import schema
from app.data.preprocess import DEFAULT_CROP_FRACTION, Augment, as_written, decode_random_crop, eval_decoder
from app.data.shard_check import verify_shards
from app.errors import UserError

AUTOTUNE = tf.data.AUTOTUNE
AutoShardPolicy = tf.data.experimental.AutoShardPolicy
PARSE_BATCH = 64  # records per tf.io.parse_example call


@dataclass(frozen=True)
class DatasetInfo:
    """What dataset.json says about a TFRecord folder."""

    root: str  # local path or gs:// (any tf.io.gfile) URL
    classes: list[str]
    counts: dict[str, dict[str, int]]
    shards: dict[str, list[str]]
    shard_records: dict[str, int]
    side_features: list[dict] = dataclasses.field(default_factory=list)  # side_features.fit's columns
    task: str = "single_label"  # or "multi_label": labels are then multi-hot, counts are per label
    examples: dict[str, int] = dataclasses.field(default_factory=dict)  # photos per split (multi-label)

    @property
    def side_width(self) -> int:
        return len(self.side_features)

    @property
    def multi_label(self) -> bool:
        return self.task == "multi_label"

    def num_examples(self, split: str) -> int:
        if self.multi_label:  # a photo counts once, whatever number of labels it has
            return self.examples.get(split, 0)
        return sum(self.counts.get(split, {}).values())

    def shard_paths(self, split: str) -> list[str]:
        if split not in self.shards:
            raise UserError(f"{self.root}: no '{split}' split (has: {', '.join(sorted(self.shards))})")
        return [storage.join(self.root, name) for name in self.shards[split]]


def load_dataset_info(data_dir: str | Path) -> DatasetInfo:
    root = str(data_dir)
    storage.check_url(root, "--data")
    meta_path = storage.join(root, schema.METADATA_FILE)
    if not storage.exists(meta_path) or storage.isdir(meta_path):
        raise UserError(schema.not_a_tfrecord_folder(root))
    meta = storage.read_json_object(meta_path)
    if meta.get("schema_version") != schema.SCHEMA_VERSION:
        raise UserError(f"{meta_path}: schema_version {meta.get('schema_version')} != {schema.SCHEMA_VERSION}")
    schema.check_dataset_json(meta, meta_path)
    return DatasetInfo(
        root,
        meta["classes"],
        meta["counts"],
        meta["shards"],
        meta.get("shard_records", {}),
        meta.get("side_features", []),
        meta.get("task", "single_label"),
        meta.get("examples", {}),
    )


def photo_index(info: DatasetInfo) -> list[tuple[str, str, str]]:
    """(split, photo's path relative to its source, class) of every record of a single-label
    dataset, read from the shards (only those two features are parsed)."""
    spec = {k: schema.FEATURE_SPEC[k] for k in (schema.FILENAME, schema.LABEL)}
    found = []
    for split in sorted(info.shards):
        for raw in tf.data.TFRecordDataset(info.shard_paths(split)).batch(256):
            parsed = tf.io.parse_example(raw, spec)
            for name, label in zip(parsed[schema.FILENAME].numpy(), parsed[schema.LABEL].numpy()):
                found.append((split, schema.stored_filename(name), info.classes[int(label)]))
    return found


def map_image(inputs, fn):
    """`fn(images)` for a batch's model inputs: the images themselves, or the "image" entry of
    a side-features dict (everything else in it passes through, as does a dict without images:
    cached features)."""
    if isinstance(inputs, dict):
        return {**inputs, "image": fn(inputs["image"])} if "image" in inputs else inputs
    return fn(inputs)


def model_inputs(example: dict[str, tf.Tensor]):
    """A decoded example's model inputs: the image, or {"image", "side"} with side features."""
    return {"image": example["image"], "side": example["side"]} if "side" in example else example["image"]


def dataset_fingerprint(data_dir: str | Path) -> str:
    """sha256 of dataset.json: names the exact shards, counts and split of a dataset."""
    path = storage.join(str(data_dir), schema.METADATA_FILE)
    return hashlib.sha256(storage.read_bytes(path)).hexdigest() if storage.exists(path) else "unknown"


class RecordCounter:
    """Counts records read and records decoded, so skipped ones are visible, not silent.

    Optional: its variables live on the host and are updated from inside tf.data functions.
    """

    def __init__(self) -> None:
        self.read = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.decoded = tf.Variable(0, dtype=tf.int64, trainable=False)

    @property
    def skipped_undecodable(self) -> int:
        return int(self.read.numpy() - self.decoded.numpy())


def _is_complete_jpeg(encoded: tf.Tensor) -> tf.Tensor:
    """Cheap structural check (start and end markers): catches truncated and non-JPEG payloads.

    Records that pass their CRC hold exactly the bytes the writer validated with a full decode,
    so this check, not a try/except around decoding, is what guards the hot path: it keeps
    map+batch fusable, which `ignore_errors` after decoding would not.
    """
    return tf.logical_and(tf.io.is_jpeg(encoded), tf.equal(tf.strings.substr(encoded, -2, 2), b"\xff\xd9"))


def _assert_complete_jpeg(encoded: tf.Tensor, shard: tf.Tensor) -> tf.Tensor:
    """Strict mode: a truncated or non-JPEG payload raises with its shard's name."""
    check = tf.debugging.Assert(_is_complete_jpeg(encoded), ["Undecodable JPEG record in shard", shard])
    with tf.control_dependencies([check]):
        return tf.identity(encoded)


def shard_policy(num_files: int, pipelines: int) -> AutoShardPolicy:
    """How input is split between workers: whole files (FILE) when every worker gets at least one,
    otherwise every worker reads every file and keeps every n-th record of each (DATA).

    The input functions given to `distribute_datasets_from_function` shard themselves (TensorFlow
    does not auto-shard them); these are the same two policies `AutoShardPolicy` names.
    """
    if pipelines <= 1:
        return AutoShardPolicy.OFF
    return AutoShardPolicy.FILE if num_files >= pipelines else AutoShardPolicy.DATA


def _pipelines(input_context: tf.distribute.InputContext | None) -> int:
    return input_context.num_input_pipelines if input_context else 1


def _shard_files(files: list[str], input_context: tf.distribute.InputContext | None) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices(files)
    if shard_policy(len(files), _pipelines(input_context)) == AutoShardPolicy.FILE:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds


def _records(
    files: tf.data.Dataset,
    *,
    strict: bool,
    deterministic: bool,
    cycle_length: int | None = None,
    record_shard: tuple[int, int] | None = None,
) -> tf.data.Dataset:
    """(serialized, shard_path) pairs, read from several shards at once. `record_shard=(n, i)`
    keeps every n-th record of each file, starting at i: a split that does not depend on the
    order files are read in (DATA sharding)."""

    @as_written
    def read(path: tf.Tensor) -> tf.data.Dataset:
        records = tf.data.TFRecordDataset(path, buffer_size=8 * 2**20)
        if record_shard:
            records = records.shard(*record_shard)
        if not strict:
            records = records.ignore_errors(log_warning=True)  # the rest of a corrupt shard is lost
        return records.map(as_written(lambda r: (r, path)))

    return files.interleave(read, cycle_length=cycle_length, num_parallel_calls=AUTOTUNE, deterministic=deterministic)


def _record_shard(files: list[str], input_context: tf.distribute.InputContext | None) -> tuple[int, int] | None:
    if shard_policy(len(files), _pipelines(input_context)) == AutoShardPolicy.DATA:
        return input_context.num_input_pipelines, input_context.input_pipeline_id
    return None


def _multi_hot(ids: tf.SparseTensor, num_labels: int) -> tf.Tensor:
    """[B, ?] sparse label ids → float32 [B, num_labels] (1 where the photo has the label)."""
    dense = tf.sparse.to_dense(ids, default_value=-1)
    return tf.reduce_max(tf.one_hot(dense, num_labels, dtype=tf.float32), axis=1)  # -1 one-hots to zeros


def _parse(
    records: tf.data.Dataset, counter: RecordCounter | None, info: DatasetInfo, *, complete_only: bool
) -> tf.data.Dataset:
    """Batched parse (one parse_example per PARSE_BATCH records), then back to single examples.
    Labels: int32 class ids, or (multi-label) float32 multi-hot vectors. `complete_only` drops
    the records whose payload is not a complete JPEG (`_is_complete_jpeg`) within each parsed
    batch: a `filter` stage per record instead cost the training input about 6%."""
    parse = _parser(info.side_width, info.multi_label, len(info.classes), complete_only)
    if counter is not None:
        parse_only = parse

        @as_written
        def parse(serialized: tf.Tensor, shards: tf.Tensor) -> dict[str, tf.Tensor]:
            counter.read.assign_add(tf.cast(tf.size(serialized), tf.int64))  # this pipeline's own variable
            return parse_only(serialized, shards)

    return records.batch(PARSE_BATCH).map(parse, num_parallel_calls=AUTOTUNE).unbatch()


@functools.cache
def _parser(side_width: int, multi_label: bool, num_classes: int, complete_only: bool) -> Callable:
    """The parse of a batch of records, traced once per process and setting: every pipeline maps
    the same graph instead of tracing its ops again (a run builds several pipelines)."""

    def parse(serialized: tf.Tensor, shards: tf.Tensor) -> dict[str, tf.Tensor]:
        features = schema.parse_batch(serialized, side_width, multi_label)
        labels = features[schema.LABEL]
        labels = _multi_hot(labels, num_classes) if multi_label else tf.cast(labels, tf.int32)
        parsed = {
            "encoded": features[schema.ENCODED],
            "label": labels,
            "filename": features[schema.FILENAME],
            "shard": shards,
        }
        if side_width:
            parsed["side"] = features[schema.SIDE_VALUES]
        if complete_only:
            complete = _is_complete_jpeg(parsed["encoded"])
            return {name: tf.boolean_mask(values, complete) for name, values in parsed.items()}
        return parsed

    strings = tf.TensorSpec([None], tf.string)
    return tf.function(parse, input_signature=[strings, strings], autograph=False)


def _decoded(
    examples: tf.data.Dataset, decode, *, strict: bool, deterministic: bool, counter: RecordCounter | None
) -> tf.data.Dataset:
    """Decode each example (in skip mode `_parse` has dropped the bad payloads; strict mode raises
    on one here, naming its shard)."""

    @as_written
    def fn(example: dict[str, tf.Tensor], *seed: tf.Tensor) -> dict[str, tf.Tensor]:
        encoded = example["encoded"]
        if strict:
            encoded = _assert_complete_jpeg(encoded, example["shard"])
        if counter is not None:
            with tf.control_dependencies([counter.decoded.assign_add(1)]):
                encoded = tf.identity(encoded)
        decoded = {"image": decode(encoded, *seed), "label": example["label"], "filename": example["filename"]}
        return {**decoded, "side": example["side"]} if "side" in example else decoded

    return examples.map(fn, num_parallel_calls=AUTOTUNE, deterministic=deterministic)


def train_decoder(image_size: int, augment: Augment):
    """(encoded, seed) → image: random-resized crop + flip, or eval decoding (+ optional flip)."""
    if augment.random_crop:
        return _traced_random_crop(image_size, augment)
    if augment.flip:
        return lambda encoded, seed: tf.image.stateless_random_flip_left_right(eval_decoder(image_size)(encoded), seed)
    return lambda encoded, seed: eval_decoder(image_size)(encoded)


@functools.cache
def _traced_random_crop(image_size: int, augment: Augment) -> Callable:
    """The random-resized crop traced once per process and setting (like `eval_decoder`): a run's
    pipelines and its views' pipelines call one graph instead of each building the crop's ops."""
    return tf.function(lambda encoded, seed: decode_random_crop(encoded, image_size, seed, augment), autograph=False)


def _files_records(
    files: list[str],
    input_context: tf.distribute.InputContext | None,
    seed: int | None,
    repeat: bool,
    strict: bool,
    deterministic: bool,
) -> tf.data.Dataset:
    """The records of this worker's share of `files`, read in a new file order each epoch."""
    file_ds = _shard_files(files, input_context).shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        file_ds = file_ds.repeat()
    shard = _record_shard(files, input_context)
    return _records(
        file_ds, strict=strict, deterministic=deterministic, cycle_length=min(len(files), 8), record_shard=shard
    )


def make_train_dataset(
    data_dir: str | Path,
    *,
    split: str = "train",
    image_size: int = 224,
    batch_size: int = 32,
    augment: Augment | None = None,
    shuffle_buffer: int = 2048,
    seed: int | None = None,
    deterministic: bool = False,
    repeat: bool = False,
    strict: bool = False,
    input_context: tf.distribute.InputContext | None = None,
    counter: RecordCounter | None = None,
    data_service: str | None = None,
    service_job: str | None = None,
) -> tf.data.Dataset:
    """Shuffled batches for training, with the host's share of `augment` (random-resized crop and
    flip, done while decoding; default `Augment()`); `augment.color_jitter` is the training step's.
    `batch_size` is the batch this dataset yields
    (per replica under a distribution strategy). `deterministic=True` (with a seed) gives the
    same stream every time, for tests; otherwise order is traded for speed.

    With `data_service` (grpc://host:port) everything up to the batches runs on a tf.data
    service cluster (see app/data/service.py), which also splits the data between trainers,
    so `input_context` sharding is not applied."""
    if data_service:
        input_context = None
    info = load_dataset_info(data_dir)
    files = info.shard_paths(split)
    verify_shards(files)
    if deterministic and seed is None:
        seed = 0
    ds = _files_records(files, input_context, seed, repeat, strict, deterministic)
    ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = _parse(ds, counter, info, complete_only=not strict)
    seeds = tf.data.Dataset.random(seed=seed).batch(2)  # one stateless seed per image
    ds = tf.data.Dataset.zip(ds, seeds)
    ds = _decoded(
        ds, train_decoder(image_size, augment or Augment()), strict=strict, deterministic=deterministic, counter=counter
    )
    ds = ds.batch(batch_size, drop_remainder=repeat)
    ds = ds.map(as_written(lambda e: (model_inputs(e), e["label"])))
    if data_service:
        from app.data.service import distribute

        ds = distribute(ds, data_service, service_job)
    return ds.prefetch(AUTOTUNE)


def make_eval_dataset(
    data_dir: str | Path,
    *,
    split: str = "val",
    image_size: int = 224,
    batch_size: int = 32,
    crop_fraction: float = DEFAULT_CROP_FRACTION,
    strict: bool = False,
    with_filenames: bool = False,
    input_context: tf.distribute.InputContext | None = None,
    counter: RecordCounter | None = None,
) -> tf.data.Dataset:
    """Deterministic, unaugmented batches: decode, centre crop, resize (`decode_for_eval`).
    With `with_filenames=True` it yields (images, labels, filenames)."""
    info = load_dataset_info(data_dir)
    files = info.shard_paths(split)
    verify_shards(files)
    ds = _records(
        _shard_files(files, input_context),
        strict=strict,
        deterministic=True,
        cycle_length=1,
        record_shard=_record_shard(files, input_context),
    )
    ds = _parse(ds, counter, info, complete_only=not strict)
    decode = eval_decoder(image_size, crop_fraction)
    ds = _decoded(ds, decode, strict=strict, deterministic=True, counter=counter).batch(batch_size)
    if with_filenames:
        return ds.map(as_written(lambda e: (model_inputs(e), e["label"], e["filename"]))).prefetch(AUTOTUNE)
    return ds.map(as_written(lambda e: (model_inputs(e), e["label"]))).prefetch(AUTOTUNE)


def read_records(files: list[str], info: DatasetInfo) -> tf.data.Dataset:
    """Every complete photo's parsed record in `files`, in stored order, one file at a time: the
    order app.data.keyed matches rows by."""
    records = _records(_shard_files(files, None), strict=False, deterministic=True, cycle_length=1)
    return _parse(records, None, info, complete_only=True)
