"""Byte-identical files in a source, found before conversion: exact duplicates and the ones that
cross train/val/test (leaks, which inflate every accuracy measured on the affected images).

Cheap (one sha256 per file); `scripts/audit.py` finds pixel-identical and near duplicates too.
`--drop-duplicates` keeps one file of each group: the training copy when there is one, so the
evaluation splits lose their leaked copies.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict

from app.data.sources import Source, SourceImage

_SPLIT_ORDER = {"train": 0, "val": 1, "test": 2}


def duplicate_groups(source: Source) -> list[list[SourceImage]]:
    """Groups of two or more byte-identical files, each sorted train first, then by path."""
    by_hash: dict[str, list[SourceImage]] = defaultdict(list)
    for image in source.images:
        by_hash[hashlib.sha256(image.path.read_bytes()).hexdigest()].append(image)
    groups = [sorted(g, key=lambda i: (_SPLIT_ORDER[i.split], i.relpath)) for g in by_hash.values() if len(g) > 1]
    return sorted(groups, key=lambda g: g[0].relpath)


def describe(groups: list[list[SourceImage]]) -> dict:
    """What dataset.json records: every group, and how many val/test images are leaked copies."""
    leaks = [g for g in groups if len({i.split for i in g}) > 1]
    leaked = [i for g in leaks for i in g[1:] if i.split != g[0].split]
    return {
        "exact_groups": [[i.relpath for i in g] for g in groups],
        "leaks": len(leaks),
        "leaked_images": {s: sum(1 for i in leaked if i.split == s) for s in ("val", "test")},
    }


def drop_duplicates(source: Source, groups: list[list[SourceImage]]) -> Source:
    """The source without the second and later file of every group, each listed as skipped."""
    dropped = {id(i): g[0] for g in groups for i in g[1:]}
    skipped = [
        {
            "path": i.relpath,
            "reason": f"exact duplicate of {dropped[id(i)].relpath} ({dropped[id(i)].split}); --drop-duplicates",
        }
        for i in source.images
        if id(i) in dropped
    ]
    kept = [i for i in source.images if id(i) not in dropped]
    return dataclasses.replace(source, images=kept, skipped=source.skipped + skipped)
