"""Stream a dataset through an export's serving signature and collect predictions.

It evaluates exactly what will be deployed: raw encoded bytes in, the export's own
preprocessing and pixel limit, `serving_default` out, through the runtime chosen
(app.inference.runtime: the SavedModel by default, or its checked LiteRT file). Only labels,
probabilities and a handful of the most confident mistakes are kept, never the images, so any
dataset size fits in memory.
"""

from __future__ import annotations

import heapq
import itertools
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorflow as tf

from app import storage
from app.data import schema, side_features
from app.data.image_header import DEFAULT_MAX_MEGAPIXELS
from app.data.photo_lists import read_or_reason
from app.data.pipeline import load_dataset_info
from app.data.sources import class_dirs, files_and_broken_links
from app.errors import UserError
from app.export import layout
from app.inference.runtime import HostRuntime, TFRuntime, answers_or_reasons, load_runtime, runtime_label
from app.progress import progress_bar

# encoded image (or why the file could not be read), dataset label id (multi-label: a tuple of ids),
# filename, side features ({} if none)
Example = tuple[bytes | str, int | tuple[int, ...], str, dict]


@dataclass
class Predictions:
    labels: np.ndarray  # model label ids; multi-label: multi-hot [N, C]
    probabilities: np.ndarray
    filenames: list[str]
    classes: list[str]  # the model's classes
    mistakes: list[dict] = field(default_factory=list)  # most confident wrong predictions, with image bytes
    skipped: list[dict] = field(default_factory=list)  # undecodable or over-limit inputs, with the reason
    runtime: str = "tf"
    ood_scores: np.ndarray | None = None  # per image, where the export has an out-of-distribution score


def tfrecord_examples(data_dir: str | Path, split: str) -> tuple[list[str], int, Iterator[Example]]:
    info = load_dataset_info(data_dir)
    paths = info.shard_paths(split)
    total = info.num_examples(split)

    def gen() -> Iterator[Example]:
        keys = (schema.ENCODED, schema.LABEL, schema.FILENAME) + ((schema.SIDE_VALUES,) if info.side_width else ())
        spec = {k: schema.feature_spec(info.side_width, info.multi_label)[k] for k in keys}
        for raw in tf.data.TFRecordDataset(paths).ignore_errors(log_warning=True):
            ex = tf.io.parse_single_example(raw, spec)
            side = side_features.decode(info.side_features, ex[schema.SIDE_VALUES].numpy()) if info.side_width else {}
            label = (
                tuple(int(i) for i in ex[schema.LABEL].values.numpy()) if info.multi_label else int(ex[schema.LABEL])
            )
            yield ex[schema.ENCODED].numpy(), label, schema.stored_filename(ex[schema.FILENAME].numpy()), side

    return info.classes, total, gen()


def folder_examples(folder: str | Path) -> tuple[list[str], int, Iterator[Example]]:
    """A folder of class folders, found as `photoclf convert` finds them (hidden files ignored); a
    file that cannot be read (a link whose target is gone) is listed as skipped, with why."""
    folder = Path(folder)
    class_folders = class_dirs(folder)
    files = [(f, i) for i, c in enumerate(class_folders) for f in sorted(sum(files_and_broken_links(c), []))]
    return (
        [c.name for c in class_folders],
        len(files),
        ((read_or_reason(f), i, str(f.relative_to(folder)), {}) for f, i in files),
    )


def label_mapping(data_classes: list[str], classes: list[str], label_map: dict[str, str] | None) -> np.ndarray:
    """dataset label id → model label id; by name, optionally renamed through `label_map`. Names
    match as Unicode text, not as code points: a folder copied from a Mac may spell `crème` as
    e + a combining accent where the model's label has the one character è."""
    label_map = label_map or {}
    names = [_nfc(label_map.get(c, c)) for c in data_classes]
    classes = [_nfc(c) for c in classes]
    missing = [c for c, n in zip(data_classes, names) if n not in classes]
    if missing:
        raise UserError(
            f"dataset classes {missing} are not among the model's classes {classes};"
            ' pass --label-map FILE with a JSON object {"dataset class": "model class"};'
            " photos of things the model was never taught belong in a folder of their own, given as --ood"
        )
    return np.array([classes.index(n) for n in names])


def _nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)


def load_label_map(path: str | Path | None) -> dict[str, str] | None:
    if path is None:
        return None
    try:
        mapping = storage.read_json_object(path)
    except UserError as err:
        raise UserError(f"--label-map {err}") from None
    except OSError as err:
        raise UserError(f"--label-map {path}: {err.strerror or err}") from None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise UserError(f"--label-map {path}: expected a JSON object of strings")
    return mapping


def _with_side_features(examples: Iterator[Example], model, tta: str, side_used: bool) -> Iterator[Example]:
    """The examples, checked first against what the model takes besides the image. Photos alone
    will do for a model whose run left its side features out (`side_used` False): the columns go
    as missing, which it ignores."""
    needed = sorted(set(model.signatures()["serving_default"][0]) - {"image_bytes"})
    first = next(examples, None)
    if first is None:
        return iter(())
    if needed and sorted(first[3]) != needed and (first[3] or side_used):
        raise UserError(
            f"the model takes side features {needed}; evaluate it on TFRecords written with"
            f" --feature-columns (this data has {sorted(first[3]) or 'none'})"
        )
    if needed and tta != "none":
        raise UserError(f"--tta {tta}: not supported for a model with side features (export it with --tta instead)")
    return itertools.chain([first], examples)


def predict(
    version_dir: Path,
    data_classes: list[str],
    total: int,
    examples: Iterator[Example],
    *,
    label_map: dict[str, str] | None = None,
    batch_size: int = 32,
    keep_mistakes: int = 16,
    runtime: str | TFRuntime | HostRuntime = "auto",
    tta: str = "none",
) -> Predictions:
    """`runtime`: a loaded runtime, or its name (app.inference.runtime.load_runtime)."""
    if total == 0:
        raise UserError("the evaluation data is empty")
    classes = layout.read_classes(version_dir)
    answers = _Answers(classes, label_mapping(data_classes, classes, label_map), keep_mistakes)
    model = load_runtime(version_dir, runtime, batch=batch_size) if isinstance(runtime, str) else runtime
    metadata = layout.read_metadata(version_dir)
    limit = metadata.get("max_megapixels", DEFAULT_MAX_MEGAPIXELS)
    side_used = layout.side_features_used(metadata)
    with progress_bar(total, "img", "Evaluating") as bar:
        for batch in _batched(_with_side_features(examples, model, tta, side_used), batch_size):
            side = {name: [ex[3][name] for ex in batch] for name in batch[0][3]}
            results = answers_or_reasons(model, [data for data, _, _, _ in batch], limit, tta, side)
            for example, answer in zip(batch, results):
                answers.add(example, answer)
            bar.update(len(batch))
    if not answers.labels:
        raise UserError("no image in the evaluation data could be decoded")
    return answers.predictions(runtime_label(model))


def _batched(examples: Iterator[Example], size: int) -> Iterator[list[Example]]:
    """Lists of `size` examples (the last one shorter), read as they are needed."""
    while batch := list(itertools.islice(examples, size)):
        yield batch


@dataclass
class _Answers:
    """What the pass keeps of each photo: its label and probabilities (or why it had no answer),
    and of the mistakes only the `keep_mistakes` most confident, with their bytes (a heap)."""

    classes: list[str]
    mapping: np.ndarray  # dataset label id → model label id
    keep_mistakes: int
    labels: list = field(default_factory=list)
    probs: list = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    mistakes: list[tuple] = field(default_factory=list)
    ood_scores: list[float] = field(default_factory=list)

    def add(self, example: Example, answer: dict | str) -> None:
        data, label, name, _ = example
        if isinstance(answer, str):
            self.skipped.append({"path": name, "reason": answer})
            return
        p = answer["probabilities"]
        if "ood_score" in answer:
            self.ood_scores.append(float(answer["ood_score"]))
        self.probs.append(p)
        self.names.append(name)
        if isinstance(label, tuple):  # multi-label: no single guess to call a mistake
            self.labels.append(np.isin(np.arange(len(self.classes)), self.mapping[list(label)]).astype(np.int64))
            return
        self.labels.append(int(self.mapping[label]))
        self._keep_if_mistake(data, int(self.mapping[label]), name, p)

    def _keep_if_mistake(self, data: bytes, label: int, name: str, p: np.ndarray) -> None:
        guess = int(p.argmax())
        if guess == label:
            return
        mistake = {"filename": name, "image": data, "true": self.classes[label], "predicted": self.classes[guess],
                   "confidence": float(p[guess])}  # fmt: skip
        item = (float(p[guess]), len(self.names), mistake)
        if len(self.mistakes) < self.keep_mistakes:
            heapq.heappush(self.mistakes, item)
        else:
            heapq.heappushpop(self.mistakes, item)

    def predictions(self, runtime: str) -> Predictions:
        return Predictions(
            np.array(self.labels),
            np.stack(self.probs),
            self.names,
            self.classes,
            [m[2] for m in sorted(self.mistakes, key=lambda m: -m[0])],
            self.skipped,
            runtime,
            np.array(self.ood_scores, np.float32) if self.ood_scores else None,
        )
