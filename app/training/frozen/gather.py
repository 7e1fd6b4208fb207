"""Phase 1's features and the activations at phase 2's cut, gathered in one pass over the
photos and kept in the feature store by photo content.

Phase 1 trains only the head on a frozen backbone, so the backbone's output for a given input
image never changes. Computing it once for each of K augmented views of every training image
(random-resized crop, flip, colour jitter: the training pipeline's own augmentation) costs K
forward passes per image in all, where training on images costs one per image per epoch. The
validation split is computed once, unaugmented.

Each view is seeded by the photo's content and the view's seed (`app.data.keyed.make_keyed_dataset`),
so a photo has the same views in every dataset it is in, and its rows are kept in the feature
store (store.py) by content key: a resumed run, a run over a dataset that grew, or one that
renamed photos computes only the photos the store has not seen. Where phase 2's trained layers
begin at a cut, the store also keeps the activations there: they come from the frozen layers
below it, the same in a run started from an earlier run's fine-tuned weights (`--init-from`),
which then runs only the layers above the cut for photos the earlier run saw. The features take
K x N x D x 4 bytes (MobileNetV2: D = 1280), in memory or, past decide.ROWS_IN_MEMORY, in files
on disk (rows.DiskRows); float16 would halve that but flushes the tiny activations of a randomly
initialised backbone to 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import keras
import numpy as np
import tensorflow as tf

from app.data.keyed import make_keyed_dataset, record_table
from app.data.preprocess import EVAL_DECODE
from app.inference.host_forward import Choice, HostForward
from app.progress import progress_bar
from app.training.context import Context
from app.training.frozen.passes import forward_batches, model_outputs, one_stream
from app.training.frozen.rows import ActivationRows, DiskRows, PartSink, Phase1Features, RowsAt, copy_rows, new_rows
from app.training.frozen.store import FeatureStore, store_root, weights_fingerprint
from app.training.inputs import row_batches

if TYPE_CHECKING:
    from app.models.classifier import FrozenCut

log = logging.getLogger(__name__)
CACHE_VERSION = 3  # bump when what is stored changes


@dataclass(frozen=True)
class Part:
    """One pass over a split: a view of the training photos (`view_seed`) or the eval decode."""

    split: str
    view_seed: int | None
    keeps_activations: bool  # phase 2 takes this part's activations at its cut
    keeps_features: bool = True  # False: only the activations (the test split, read once through the layers above)


@dataclass
class PartRows:
    """A part's rows, one per photo of its split in stored order, looked up or computed."""

    part: Part
    keys: np.ndarray
    features: np.ndarray | None = None
    activations: np.ndarray | None = None


@dataclass(frozen=True)
class Gathered:
    features: Phase1Features
    val_activations: ActivationRows | None  # at the cut, when one was given
    train_activations: ActivationRows | None  # ... and the views' too were asked for
    test_activations: ActivationRows | None  # ... and the test photos' too were asked for
    forward: Choice | None  # the runtime the missing rows ran on; None when the store had them all


def gather(
    ctx: Context,
    on_first_batch: Callable[[np.ndarray], None] | None = None,
    cut: FrozenCut | None = None,
    train_activations: bool = False,
    test_activations: bool = False,
    on_disk: Path | None = None,
) -> Gathered:
    """Phase 1's features and, with phase 2's `cut`, the activations there in the same pass: the
    val photos', the training views' too with `train_activations`, and the test photos' with
    `test_activations` (the test pass then runs only the layers above the cut). `on_first_batch`
    sees the first computed batch's images (float32 0..255) as the backbone gets them: a sample
    at no extra cost. `on_disk`: a directory where the rows are kept in files instead of memory."""
    parts = _parts(ctx, cut, train_activations, test_activations)
    tables = {split: record_table(ctx.cfg.data, split) for split in dict.fromkeys(part.split for part in parts)}
    parts = [PartRows(part, tables[part.split]["key"]) for part in parts]
    store = FeatureStore(store_root(ctx.cfg.feature_store, ctx.run))
    start = time.perf_counter()
    counts, forward = _fill(ctx, store, _Spaces(ctx, cut), parts, cut, on_first_batch, on_disk)
    above = f", {counts['upper']} through the layers above {cut.layer} only" if cut is not None else ""
    test = f", {len(tables['test']['key'])} test photos (activations only)" if "test" in tables else ""
    log.info(
        "phase 1 features of %d rows (%d view(s) of %d training photos, %d val photos%s): %d from the feature store"
        " (%s)%s, %d computed; %.1fs",
        sum(len(p.keys) for p in parts), ctx.views_per_image, len(tables["train"]["key"]), len(tables["val"]["key"]),
        test, counts["stored"], store.root, above, counts["computed"], time.perf_counter() - start,
    )  # fmt: skip
    features = _phase1_features(parts, tables, on_disk)
    if cut is None:
        return Gathered(features, None, None, None, forward)
    return Gathered(features, *_activation_rows(parts, features, tables, on_disk), forward)


def _parts(ctx: Context, cut: FrozenCut | None, train_activations: bool, test_activations: bool) -> list[Part]:
    """K seeded views of the training split (one plain pass when augmentation is off), then val,
    then (activations only) test."""
    trains = cut is not None and train_activations
    if ctx.cfg.augment:
        train = [Part("train", ctx.cfg.seed * 1000 + view, trains) for view in range(ctx.views_per_image)]
    else:
        train = [Part("train", None, trains)]
    test = [Part("test", None, True, keeps_features=False)] if cut is not None and test_activations else []
    return [*train, Part("val", None, cut is not None), *test]


class _Spaces:
    """What decides a part's stored rows: features depend on the whole backbone's weights,
    activations at the cut only on the frozen layers below it. Every row is float32 (a store's
    older bfloat16 rows are keyed apart, by "precision", and never read)."""

    def __init__(self, ctx: Context, cut: FrozenCut | None) -> None:
        self.ctx = ctx
        self.common = {
            "version": CACHE_VERSION,
            "decode": EVAL_DECODE,
            "backbone": ctx.clf.spec.name,
            "image_size": ctx.image_size,
            "policy": keras.mixed_precision.global_policy().name,
        }
        self.backbone_weights = weights_fingerprint(ctx.clf.backbone)
        self.lower_weights = weights_fingerprint(cut.lower) if cut is not None else None
        self.cut_layer = cut.layer if cut is not None else None

    def features(self, part: Part) -> dict:
        return {**self.common, **self._view(part), "kind": "features", "weights": self.backbone_weights}

    def activations(self, part: Part) -> dict:
        return {**self.common, **self._view(part), "kind": "activations", "weights": self.lower_weights,
                "cut": self.cut_layer}  # fmt: skip

    def _view(self, part: Part) -> dict:
        if part.view_seed is None:
            return {"view": "eval"}
        return {"view": part.view_seed, "augment": repr(self.ctx.augmentation)}


def _fill(
    ctx: Context,
    store: FeatureStore,
    spaces: _Spaces,
    parts: list[PartRows],
    cut: FrozenCut | None,
    on_first_batch,
    on_disk: Path | None,
) -> tuple[dict[str, int], Choice | None]:
    """Every part's features (and activations where it keeps them): looked up, then the missing
    ones run through the layers above the cut (activations stored) or the whole backbone; what
    was computed is added to the store."""
    total = sum(len(rows.keys) for rows in parts)
    stored = [_lookup(store, spaces, rows, on_disk) for rows in parts]
    full = [missing_act if rows.part.keeps_activations else missing_feat for rows, (missing_feat, missing_act) in
            zip(parts, stored)]  # fmt: skip
    computed, choice = _full_pass(ctx, parts, full, cut, total, on_first_batch, on_disk)
    computed_rows = sum(int(m.sum()) for m in full)
    upper = 0
    for rows, (missing_feat, missing_act), new in zip(parts, stored, computed):
        if rows.part.keeps_activations:
            rows.activations = _merged(rows.keys, rows.activations, missing_act, new["keys"], new["activations"],
                                       on_disk)  # fmt: skip
            store.add(spaces.activations(rows.part), new["keys"], new["activations"])
            above = missing_feat & ~missing_act  # stored activations, no stored features
            if above.any():
                new = _joined(new, _above_cut(ctx, cut, rows.keys[above], RowsAt(rows.activations, above)))
                upper += int(above.sum())
        if rows.part.keeps_features:
            rows.features = _merged(rows.keys, rows.features, missing_feat, new["keys"], new["features"], on_disk)
            store.add(spaces.features(rows.part), new["keys"], new["features"])
    return {"computed": computed_rows, "upper": upper, "stored": total - computed_rows - upper}, choice


def _lookup(
    store: FeatureStore, spaces: _Spaces, rows: PartRows, on_disk: Path | None
) -> tuple[np.ndarray, np.ndarray]:
    """(features missing, activations missing) masks; the found rows are put on `rows` (in
    files in `on_disk` where it is given)."""
    room = lambda count, shape, dtype: new_rows(count, shape, dtype, on_disk)  # noqa: E731
    found, stored = store.lookup(spaces.features(rows.part), rows.keys, room) if rows.part.keeps_features else (
        np.ones(len(rows.keys), bool), None)  # fmt: skip
    rows.features = stored
    missing_act = np.zeros(len(rows.keys), bool)
    if rows.part.keeps_activations:
        found_act, rows.activations = store.lookup(spaces.activations(rows.part), rows.keys, room)
        missing_act = ~found_act
    return ~found, missing_act


def _full_pass(
    ctx: Context,
    parts: list[PartRows],
    wanted: list[np.ndarray],
    cut: FrozenCut | None,
    gather_rows: int,
    on_first_batch,
    on_disk: Path | None = None,
) -> tuple[list[dict[str, np.ndarray]], Choice | None]:
    """For each part, {"keys", "features"(, "activations")} of the photos `wanted` marks, from
    one stream over every part's missing photos through the backbone, and the runtime that ran
    it (`gather_rows`: the whole gather's, which the runtime's choice and the store's keys go by)."""
    keeps = [rows.part.keeps_activations for rows in parts]
    streams = [_stream(ctx, rows, rows.keys[want]) for rows, want in zip(parts, wanted)]
    total = sum(int(w.sum()) for w in wanted)
    empty = {"keys": np.zeros([0], np.int64), "features": None, "activations": None}
    if not total:
        if on_first_batch is not None and len(parts[0].keys):  # the sample still shows what the backbone got
            images, _ = next(iter(_stream(ctx, parts[0], parts[0].keys[: ctx.batch_size])))
            on_first_batch(images.numpy())
        return [dict(empty) for _ in parts], None
    forward = host_forward(ctx, cut, any(keeps), gather_rows)
    others = ", ".join(rows.part.split for rows in parts if rows.part.split != "train")
    desc = f"Caching features ({ctx.views_per_image} view(s) of train, {others})"
    sinks = [PartSink(int(w.sum()), keep, on_disk) for w, keep in zip(wanted, keeps)]
    with progress_bar(total, "img", desc) as bar:
        evaluates = [rows.part.split != "train" for rows in parts]  # val and test judge the model: float32
        exact = lambda keys_and_part: evaluates[int(keys_and_part[1][0])]  # noqa: E731
        for outputs, (keys, part) in forward_batches(forward, one_stream(streams), bar, on_first_batch, exact):
            sinks[int(part[0])].add(keys, outputs)  # a batch is of one part
    return [sink.rows() for sink in sinks], forward.choice


def _stream(ctx: Context, rows: PartRows, keys: np.ndarray) -> tf.data.Dataset:
    """Batches of the part's photos with these keys (its view of them), with their keys."""
    part = rows.part
    return make_keyed_dataset(ctx.cfg.data, split=part.split, image_size=ctx.image_size, batch_size=ctx.batch_size,
                              wanted=np.unique(keys), view_seed=part.view_seed, augment=ctx.augmentation)  # fmt: skip


def host_forward(ctx: Context, cut: FrozenCut | None, keeps_activations: bool, rows: int) -> HostForward:
    """The frozen pass on this host's runtime: a batch's pooled features and, with phase 2's `cut`
    where some part keeps them, the activations there, computed through it: one pass gives both,
    and one model is converted, not two."""
    shape = (ctx.image_size, ctx.image_size, 3)
    if cut is None or not keeps_activations:
        extract = lambda images: {"features": ctx.clf.features_model(images, training=False)}  # noqa: E731
    else:

        def extract(images):
            activations = cut.lower(images, training=False)
            return {"features": tf.cast(cut.upper(activations, training=False), tf.float32), "activations": activations}

    return HostForward(extract, shape, ctx.cfg.forward_runtime, rows)


def _above_cut(ctx: Context, cut: FrozenCut, keys: np.ndarray, activations: RowsAt) -> dict[str, np.ndarray]:
    batches = row_batches((activations, keys), ctx.batch_size)
    features, keys = model_outputs(lambda a, k: tf.cast(cut.upper(a, training=False), tf.float32), batches)
    return {"keys": keys.astype(np.int64), "features": features}


def _joined(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Computed features of both (the activations are already merged)."""
    if a["features"] is None:
        return b
    return {"keys": np.concatenate([a["keys"], b["keys"]]), "features": np.concatenate([a["features"], b["features"]])}


def _merged(
    keys: np.ndarray,
    stored: np.ndarray | None,
    missing: np.ndarray,
    new_keys: np.ndarray,
    new: np.ndarray | DiskRows | None,
    on_disk: Path | None = None,
) -> np.ndarray | DiskRows:
    """One row per key: the stored rows where found (in order), the computed ones by key where not.
    Where all were found, or all computed in this order (a cold run), those rows as they are: no
    second copy of what may be most of a run's memory."""
    if stored is None and new is None:
        return np.zeros([0, 0], np.float32)  # a split with no photos (nothing else has no rows at all)
    if not missing.any() and stored is not None and stored.dtype == np.float32:
        return stored
    if missing.all() and new.dtype == np.float32 and np.array_equal(new_keys, keys):
        return new
    shape = (stored if stored is not None else new).shape[1:]
    out = new_rows(len(keys), shape, np.float32, on_disk)
    if stored is not None:
        copy_rows(out, np.flatnonzero(~missing), stored, np.arange(len(stored)))
    if missing.any():
        order = np.argsort(new_keys, kind="stable")
        copy_rows(out, np.flatnonzero(missing), new, order[np.searchsorted(new_keys[order], keys[missing])])
    return out


def _phase1_features(parts: list[PartRows], tables: dict[str, dict], on_disk: Path | None) -> Phase1Features:
    train = [rows for rows in parts if rows.part.split == "train"]
    val = next(rows for rows in parts if rows.part.split == "val")
    repeat = lambda column: None if column is None else np.concatenate([column] * len(train))  # noqa: E731
    return Phase1Features(
        train_features=_stacked(train, "features", on_disk),
        train_labels=repeat(tables["train"]["label"]),
        val_features=val.features,
        val_labels=tables["val"]["label"],
        train_side=repeat(tables["train"]["side"]),
        val_side=tables["val"]["side"],
    )


def _stacked(parts: list[PartRows], field: str, on_disk: Path | None) -> np.ndarray | DiskRows:
    """The parts' `field` ("features" or "activations") one after another, each part's own rows
    let go once copied: at most one part more than the rows is held, where a concatenation holds
    them all twice. A single part's rows are taken as they are."""
    if len(parts) == 1:
        return getattr(parts[0], field)
    row_shape = getattr(parts[0], field).shape[1:]
    out = new_rows(sum(len(getattr(rows, field)) for rows in parts), row_shape, np.float32, on_disk)
    at = 0
    for rows in parts:
        count = len(getattr(rows, field))
        copy_rows(out, np.arange(at, at + count), getattr(rows, field), np.arange(count))
        at += count
        setattr(rows, field, None)
    return out


def _activation_rows(
    parts: list[PartRows], features: Phase1Features, tables: dict[str, dict], on_disk: Path | None
) -> tuple[ActivationRows, ActivationRows | None, ActivationRows | None]:
    """The activations at phase 2's cut: the val part's, every view's when phase 2 may train on
    them, and the test part's when it was gathered."""
    val = next(rows for rows in parts if rows.part.split == "val")
    train = None
    if any(rows.part.split == "train" and rows.part.keeps_activations for rows in parts):
        keys = np.concatenate([rows.keys for rows in parts if rows.part.split == "train"])
        activations = _stacked([rows for rows in parts if rows.part.split == "train"], "activations", on_disk)
        train = ActivationRows(activations, features.train_side, features.train_labels, keys)
    test = next((ActivationRows(rows.activations, tables["test"]["side"], tables["test"]["label"], rows.keys)
                 for rows in parts if rows.part.split == "test"), None)  # fmt: skip
    return ActivationRows(val.activations, features.val_side, features.val_labels, val.keys), train, test


def keep_features(ctx: Context, cut: FrozenCut, split: str, keys: np.ndarray, features: np.ndarray) -> None:
    """Add the pooled features of the backbone's current weights for `split`'s rows ("train":
    the cache's views of its photos, one view after another, as the cache build orders them;
    "val") to the feature store. The "none of these" fit computes them for the kept weights after
    phase 2; a run started from this one (`--init-from`) has those weights, finds them, and runs
    none of its old photos through the layers above the cut."""
    parts = [part for part in _parts(ctx, cut, False, False) if part.split == split]
    chunks = np.split(np.arange(len(keys)), len(parts))
    store = FeatureStore(store_root(ctx.cfg.feature_store, ctx.run))
    spaces = _Spaces(ctx, None)  # features depend on the whole backbone's weights only: no hash below the cut
    for part, rows in zip(parts, chunks):
        store.add(spaces.features(part), keys[rows], features[rows])
