"""Combine the per-writer metadata of a split-writer run into one dataset.json.

Refuses to write dataset.json unless every writer finished and every planned shard is present,
so readers never see a dataset with holes.
"""

from __future__ import annotations

import re
from pathlib import Path

from app import storage
from app.data import schema
from app.data.writer import writer_part_name
from app.errors import UserError

PART = re.compile(r"^dataset\.writer-(\d{5})-of-(\d{5})\.json$")


def merge_writers(out: str | Path) -> dict:
    """`out` may be local or a gs:// (any tf.io.gfile) URL."""
    out = str(out)
    storage.check_url(out, "OUT")
    parts = [storage.join(out, name) for name in storage.listdir(out) if PART.match(name)]
    if not parts:
        raise UserError(f"{out}: {_why_nothing_to_merge(out)}")
    metas = [storage.read_json_object(p) for p in parts]
    counts = {m["writer"]["count"] for m in metas}
    if len(counts) != 1:
        raise UserError(f"{out}: writer parts disagree on --num-writers ({sorted(counts)})")
    expected = counts.pop()
    missing = sorted(set(range(expected)) - {m["writer"]["index"] for m in metas})
    if missing:
        raise UserError(f"{out}: {_not_finished(missing, expected)}")
    first = metas[0]
    for m in metas[1:]:
        if m["classes"] != first["classes"] or m["options"] != first["options"]:
            raise UserError(f"{out}: writer parts were made with different classes or options")
    merged = {**first, "counts": {}, "shards": {}, "shard_records": {}, "reencoded": 0, "bytes": 0, "skipped": []}
    merged.pop("side_feature_missing", None)  # these two are summed over the parts below
    merged.pop("examples", None)
    merged.pop("writer")
    for m in metas:
        for split, per_class in m["counts"].items():
            target = merged["counts"].setdefault(split, {c: 0 for c in first["classes"]})
            for name, n in per_class.items():
                target[name] += n
        for split, names in m["shards"].items():
            merged["shards"].setdefault(split, []).extend(names)
        merged["shard_records"].update(m["shard_records"])
        merged["reencoded"] += m["reencoded"]
        merged["bytes"] += m["bytes"]
        merged["skipped"] += m["skipped"]
        for split, n in m.get("examples", {}).items():
            merged.setdefault("examples", {}).setdefault(split, 0)
            merged["examples"][split] += n
        for split, per_column in m.get("side_feature_missing", {}).items():
            target = merged.setdefault("side_feature_missing", {}).setdefault(split, dict.fromkeys(per_column, 0))
            for name, n in per_column.items():
                target[name] += n
    for split, names in merged["shards"].items():
        names.sort()
        total = int(schema.SHARD_PATTERN.match(names[0]).group("count"))
        if len(names) != total or any(not storage.exists(storage.join(out, n)) for n in names):
            raise UserError(f"{out}: split '{split}' has {len(names)} of {total} shards; a writer's output is missing")
    storage.write_json_atomic(storage.join(out, schema.METADATA_FILE), merged)
    for p in parts:
        storage.remove(p)
    return merged


def _not_finished(missing: list[int], expected: int) -> str:
    """Which writers to run (or wait for), in the flag's own words."""
    if len(missing) == 1:
        index = missing[0]
        return (
            f"writer {index} of {expected} has not finished (no {writer_part_name(index, expected)}): "
            f"run the same convert with --writer-index {index}, then merge again"
        )
    listed = ", ".join(str(i) for i in missing)
    return (
        f"writers {listed} of {expected} have not finished (no dataset.writer-*.json of theirs): "
        f"run the same convert with each of those --writer-index values, then merge again"
    )


def _why_nothing_to_merge(out: str) -> str:
    if not storage.isdir(out):
        return "no such folder"
    if storage.exists(storage.join(out, schema.METADATA_FILE)):
        return f"already one dataset ({schema.METADATA_FILE}): nothing to merge"
    return "no dataset.writer-*.json files to merge (convert --num-writers N writes them)"
