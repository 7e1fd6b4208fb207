"""Batch prediction for unlabelled photos: a folder, a glob or a list of paths → CSV, JSONL or JSON.

What a user does with a new folder of photos (evaluate.py needs labels). Files are read ahead
on a thread and run in batches through the runtime chosen (app.inference.runtime); a file that
cannot be read, is not an image or is over the pixel limit gets a row with its reason and never
stops the run. The output is written to a temp name and renamed when complete.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app import storage
from app.data.image_header import DEFAULT_MAX_MEGAPIXELS
from app.data.photo_lists import evaluate_instead, list_inputs, read_or_reason
from app.data.sources import check_out_beside_src
from app.errors import UserError
from app.export import layout
from app.inference.host_runtimes import above_threshold
from app.inference.runtime import answers_or_reasons, load_runtime, runtime_label
from app.progress import progress_bar

FORMATS = ("csv", "jsonl", "json")


UNKNOWN_ANSWER = "unknown"  # the answer of a photo unlike every training photo ("none of these")


@dataclass
class PredictionSummary:
    output: Path
    predicted: int = 0
    failed: list[dict] = field(default_factory=list)  # {path, error}
    runtime: str = ""
    unknown: int = 0  # of the predicted photos, those answered "none of these"
    no_label: int = 0  # of a multi-label model's predicted photos, those with no label at or above its threshold
    warning: str | None = None  # the model's own (trained from random weights)


def read_batches(paths: list[Path], batch_size: int) -> Iterator[list[tuple[Path, bytes | str]]]:
    """Reads one batch ahead on a thread, so disk and model overlap."""
    chunks = [paths[i : i + batch_size] for i in range(0, len(paths), batch_size)]

    def read(chunk: list[Path]) -> list[tuple[Path, bytes | str]]:
        return [(p, read_or_reason(p)) for p in chunk]

    with ThreadPoolExecutor(1, thread_name_prefix="read") as pool:
        pending = pool.submit(read, chunks[0]) if chunks else None
        for nxt in [*chunks[1:], None]:
            batch = pending.result()
            pending = pool.submit(read, nxt) if nxt else None
            yield batch


def _rows(
    batch: list[tuple[Path, bytes | str]],
    model,
    classes: list[str],
    top_k: int,
    limit: float,
    thresholds: list[float] | None = None,
) -> list[dict]:
    """One row per file; a multi-label model's rows answer with the labels at or above its
    thresholds, and a model with an out-of-distribution score adds its `ood_score` and `unknown`."""
    rows = []
    for (path, _), result in zip(batch, answers_or_reasons(model, [data for _, data in batch], limit)):
        if isinstance(result, str):
            rows.append({"path": str(path), "answer": "", "predictions": [], "error": result})
            continue
        answer, result = result, result["probabilities"]
        ranked = np.argsort(-result, kind="stable")
        unknown = bool(answer["unknown"]) if "unknown" in answer else None
        rows.append(
            {
                "path": str(path),
                "answer": UNKNOWN_ANSWER if unknown else classes[ranked[0]],  # first: what a person reads
                "predictions": [{"label": classes[c], "score": round(float(result[c]), 6)} for c in ranked[:top_k]],
                "error": None,
            }
        )
        if unknown is not None:
            rows[-1].update(ood_score=round(float(answer["ood_score"]), 6), unknown=unknown)
        if thresholds:  # the answer is its labels, as a manifest's label cell lists them ("": none)
            names = above_threshold(result[None], thresholds, np.array([c.encode() for c in classes], dtype=object))[0]
            rows[-1]["labels_above_threshold"] = [n.decode() for n in names if n]
            rows[-1]["answer"] = "|".join(rows[-1]["labels_above_threshold"])
    return rows


def _check_explain(explain: str | Path | None, source: str) -> None:
    """A folder that can take the maps, and not inside a folder INPUT: its overlays are PNGs the
    next predict of INPUT would answer as photos."""
    if explain is not None:
        storage.check_output_folder(explain, "--explain")
        check_out_beside_src(Path(source), explain, "--explain", "INPUT", reader="predict")


def _explainer(version: Path, explain: str | Path | None):
    if explain is None:
        return None
    from app.inference.explain import PhotoExplainer

    return PhotoExplainer(version, Path(explain))


def _common_root(paths: list[Path], source: str) -> Path:
    """What each photo's path is taken relative to: the folder given, else the photos' common folder."""
    if Path(source).is_dir():
        return Path(source)
    return Path(os.path.commonpath([str(p.absolute().parent) for p in paths]))


def _explain(explainer, batch: list[tuple[Path, bytes | str]], rows: list[dict], classes: list[str], root: Path):
    """Maps of each predicted photo's top label; photos that failed get none."""
    done = [(path.absolute().relative_to(root.absolute()), data, row) for (path, data), row in zip(batch, rows)
            if not row["error"]]  # fmt: skip
    if done:
        top = [classes.index(row["predictions"][0]["label"]) for _, _, row in done]
        explainer.write([(relative, data) for relative, data, _ in done], top)


def _write(rows: list[dict], output: Path, fmt: str, top_k: int) -> None:
    # UTF-8 whatever the locale. A file name that is not UTF-8 (Python holds its bytes as surrogates)
    # keeps its bytes in a CSV, and is JSON's \udcff escape in JSON, where raw bytes would not parse.
    errors = "surrogateescape" if fmt == "csv" else "backslashreplace"
    with storage.atomic_path(output) as tmp, open(tmp, "w", newline="", encoding="utf-8", errors=errors) as f:
        if fmt == "jsonl":  # labels and paths as written (日本, not \u65e5\u672c), as JSON's RFC asks
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            return
        if fmt == "json":  # one document (an array of the rows): what json.load reads
            json.dump(rows, f, indent=1, ensure_ascii=False)
            f.write("\n")
            return
        writer = csv.writer(f)
        multi = any("labels_above_threshold" in row for row in rows)  # a multi-label model's: labels joined by |
        unknown = any("unknown" in row for row in rows)
        writer.writerow(
            [
                "path",
                "answer",
                *[f"{k}_{i}" for i in range(1, top_k + 1) for k in ("label", "score")],
                *(["unknown", "ood_score"] if unknown else []),
                "error",
                *(["labels_above_threshold"] if multi else []),
            ]
        )
        for row in rows:
            cells = [v for p in row["predictions"] for v in (p["label"], p["score"])]
            cells += [""] * (2 * top_k - len(cells))
            ood_cells = [_yes_no(row.get("unknown")), row.get("ood_score", "")] if unknown else []
            extra = ["|".join(row.get("labels_above_threshold", []))] if multi else []
            writer.writerow(
                [
                    row["path"],
                    row["answer"],
                    *cells,
                    *[""] * (2 * top_k - len(cells)),
                    *ood_cells,
                    row["error"] or "",
                    *extra,
                ]
            )


def _yes_no(value: bool | None) -> str:
    return "" if value is None else ("yes" if value else "no")


def _format_of(output: Path) -> str:
    """The format `--output`'s suffix names (none: CSV); another suffix is refused, not written as CSV."""
    suffix = output.suffix.lower()
    if suffix and suffix[1:] not in FORMATS:
        raise UserError(
            f"--output {output}: {suffix} is none of .csv, .jsonl, .json; name the file so, or give --format"
        )
    return suffix[1:] or "csv"


def _photos_to_predict(source: str, model_dir: str | Path, version: Path, metadata: dict) -> list[Path]:
    """INPUT's photo files, refused where predict cannot answer them: a model that also takes side
    features (photo files do not carry them), or TFRecords (evaluate reads those)."""
    layout.check_takes_photos_alone(version, metadata)
    return list_inputs(str(source), tfrecords_hint=evaluate_instead(model_dir, source))


def predict_files(
    model_dir: str | Path,
    source: str,
    output: str | Path,
    *,
    runtime: str = "auto",
    top_k: int = 5,
    batch_size: int = 32,
    fmt: str | None = None,
    explain: str | Path | None = None,
) -> PredictionSummary:
    """`explain`: a folder for a Grad-CAM map of each photo's top label (app.inference.explain)."""
    output = Path(output)
    fmt = fmt or _format_of(output)
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {FORMATS}, got '{fmt}'")
    for flag, value in (("--top-k", top_k), ("--batch-size", batch_size)):
        if value < 1:
            raise UserError(f"{flag} must be >= 1, got {value}")
    storage.check_output_file(output, "--output")
    _check_explain(explain, source)
    version = layout.resolve_model_dir(model_dir)
    metadata = layout.read_metadata(version)
    paths = _photos_to_predict(source, model_dir, version, metadata)
    classes = layout.read_classes(version)
    model = load_runtime(version, runtime, batch=min(batch_size, max(len(paths), 1)))  # timed as it will run
    limit = float(metadata.get("max_megapixels", DEFAULT_MAX_MEGAPIXELS))
    top_k = min(top_k, len(classes))
    thresholds = metadata.get("thresholds")  # a multi-label model's
    explainer = _explainer(version, explain)
    root = _common_root(paths, source)
    rows: list[dict] = []
    with progress_bar(len(paths), "img", "Predicting") as bar:
        for batch in read_batches(paths, batch_size):
            batch_rows = _rows(batch, model, classes, top_k, limit, thresholds)
            if explainer is not None:
                _explain(explainer, batch, batch_rows, classes, root)
            rows.extend(batch_rows)
            bar.update(len(batch))
    _write(rows, output, fmt, top_k)
    failed = [{"path": r["path"], "error": r["error"]} for r in rows if r["error"]]
    unknown = sum(1 for r in rows if r.get("unknown"))
    no_label = sum(1 for r in rows if r.get("labels_above_threshold") == [] and not r["error"])
    warning = layout.random_init_warning(metadata)
    return PredictionSummary(output, len(rows) - len(failed), failed, runtime_label(model), unknown, no_label, warning)
