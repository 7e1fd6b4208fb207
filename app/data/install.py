"""Finished shards moved from a convert's staging folder into OUT, dataset.json last.

Readers list shards from dataset.json, so it only ever names complete shards. A single writer
installs with OUT claimed (`storage.claimed`): two converts into one OUT at once never mix
their shards, and the one that finishes second replaces nothing without --overwrite.
"""

from __future__ import annotations

from app import storage
from app.data import schema
from app.errors import UserError
from app.labels import LABELS_FILE, write_labels


def install(
    shards: list[str],
    staging: str,
    out: str,
    metadata: dict,
    classes: list[str],
    part: str | None = None,
    overwrite: bool = False,
) -> None:
    """Move the `shards` (names in `staging`) into OUT, then labels.txt and dataset.json. In
    split-writer mode this writer's `part` file goes last instead, and dataset.json waits for the
    merge."""
    if part is not None:
        storage.remove(storage.join(out, schema.METADATA_FILE))  # stale after --overwrite until the merge
        _move(shards, staging, out)
        write_labels(storage.join(out, LABELS_FILE), classes)
        storage.write_json_atomic(storage.join(out, part), metadata)
        return
    with storage.claimed(
        out, f"{out}: another convert is installing its shards here; wait for it, or choose another OUT"
    ):
        _install_whole(shards, staging, out, metadata, classes, overwrite)


def _install_whole(
    shards: list[str], staging: str, out: str, metadata: dict, classes: list[str], overwrite: bool
) -> None:
    """A single writer's install, with OUT claimed: no other convert's install runs between its
    renames. One that finished while this one ran is not replaced without --overwrite."""
    old_meta = storage.join(out, schema.METADATA_FILE)
    if not overwrite and storage.exists(old_meta):
        raise UserError(
            f"{out}: another convert installed a dataset here while this one ran; nothing of this one was"
            " installed (pass --overwrite to replace it)"
        )
    old_shards = set()
    if storage.exists(old_meta):
        old_shards = {n for names in storage.read_json_object(old_meta).get("shards", {}).values() for n in names}
        storage.remove(old_meta)
    _move(shards, staging, out)
    for stale in old_shards - set(shards):
        storage.remove(storage.join(out, stale))
    write_labels(storage.join(out, LABELS_FILE), classes)
    storage.write_json_atomic(storage.join(out, schema.METADATA_FILE), metadata)


def _move(shards: list[str], staging: str, out: str) -> None:
    for name in shards:
        storage.rename(storage.join(staging, name), storage.join(out, name))
