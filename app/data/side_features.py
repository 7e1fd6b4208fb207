"""Side features: numbers and categories that come with a photo in a CSV manifest.

`--feature-columns age,site:categorical` names manifest columns (numeric unless marked
`:categorical`). Each photo's values are stored as one fixed-length float vector
(`side/values` in schema.py), in the order given:
- numeric: the value as a float; missing is NaN;
- categorical: the index in the column's vocabulary (built from the training split, sorted);
  0 means missing or not seen in training.
Missing means an empty cell or NA/N/A/NaN/null/none (any case). The model replaces a missing
number with the training mean (normalised 0) and gives a missing category its own index 0, so
missing values are a documented input, not a crash; dataset.json counts them per split.

What the model needs (type, vocabulary, training mean/std) is stored in dataset.json under
"side_features" and built into the model, so serving needs nothing else.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from app.errors import UserError

NUMERIC, CATEGORICAL = "numeric", "categorical"
MISSING_WORDS = {"", "na", "n/a", "nan", "null", "none"}
MISSING_INDEX = 0  # a categorical column's index for a missing or unseen value


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # NUMERIC or CATEGORICAL


def parse_columns(spec: str | None) -> list[Column]:
    """'age,site:categorical' → columns, checked for names a signature can use and duplicates."""
    if not spec:
        return []
    columns = []
    for item in spec.split(","):
        name, _, kind = item.strip().partition(":")
        kind = kind or NUMERIC
        if kind not in (NUMERIC, CATEGORICAL):
            raise UserError(f"--feature-columns: '{item}': the type must be ':{NUMERIC}' or ':{CATEGORICAL}'")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            raise UserError(f"--feature-columns: '{name}' is not usable as an input name (letters, digits, '_')")
        if name in ("path", "label", "split", "keep", "image_bytes", "key"):
            raise UserError(f"--feature-columns: '{name}' is reserved")
        columns.append(Column(name, kind))
    if len({c.name for c in columns}) != len(columns):
        raise UserError(f"--feature-columns: a column is named twice in '{spec}'")
    return columns


def is_missing(raw: str) -> bool:
    return raw.strip().lower() in MISSING_WORDS


def parse_numeric(raw: str, where: str, column: str) -> float:
    """A numeric cell → float (NaN when missing); anything else is the user's error, named."""
    if is_missing(raw):
        return math.nan
    try:
        value = float(raw)
    except ValueError:
        raise UserError(
            f"{where}: column '{column}' is numeric but holds '{raw.strip()}'"
            f" (mark it '{column}:{CATEGORICAL}' if it is a category)"
        ) from None
    if not math.isfinite(value):
        raise UserError(f"{where}: column '{column}' holds '{raw.strip()}'; numbers must be finite")
    return value


def fit(columns: list[Column], train_rows: list[tuple[str, ...]]) -> list[dict]:
    """Per column, from the training split only: numeric mean/std, categorical vocabulary."""
    described = []
    for i, column in enumerate(columns):
        values = [row[i] for row in train_rows]
        if column.kind == NUMERIC:
            numbers = np.array([float(v) for v in values if not is_missing(v)], dtype=np.float64)
            if numbers.size == 0:
                raise UserError(f"--feature-columns: column '{column.name}' has no value in the training split")
            std = float(numbers.std())
            described.append(
                {"name": column.name, "kind": NUMERIC, "mean": float(numbers.mean()), "std": std if std > 0 else 1.0}
            )
        else:
            vocabulary = sorted({v.strip() for v in values if not is_missing(v)})
            described.append({"name": column.name, "kind": CATEGORICAL, "vocabulary": vocabulary})
    return described


def encode(described: list[dict], row: tuple[str, ...]) -> tuple[list[float], list[bool]]:
    """One photo's raw cells → (the stored float vector, which cells count as missing or unseen)."""
    values, missing = [], []
    for column, raw in zip(described, row):
        if column["kind"] == NUMERIC:
            value = math.nan if is_missing(raw) else float(raw)
            values.append(value)
            missing.append(math.isnan(value))
        else:
            vocabulary = column["vocabulary"]
            index = (
                MISSING_INDEX if is_missing(raw) or raw.strip() not in vocabulary else vocabulary.index(raw.strip()) + 1
            )
            values.append(float(index))
            missing.append(index == MISSING_INDEX)
    return values, missing


def input_width(described: list[dict]) -> int:
    """Width of the model's side input after normalisation: 1 per number, vocabulary + 1 per category."""
    return sum(1 if c["kind"] == NUMERIC else len(c["vocabulary"]) + 1 for c in described)


def decode(described: list[dict], vector) -> dict[str, float | str]:
    """A stored vector → the raw values a serving signature takes (a number, NaN if missing; a
    category's name, "" if missing): how evaluation feeds TFRecords to an export."""
    values: dict[str, float | str] = {}
    for column, value in zip(described, vector):
        if column["kind"] == NUMERIC:
            values[column["name"]] = float(value)
        else:
            index = int(value)
            values[column["name"]] = column["vocabulary"][index - 1] if 1 <= index <= len(column["vocabulary"]) else ""
    return values
