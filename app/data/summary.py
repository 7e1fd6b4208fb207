"""Human-readable summary of a dataset.json: the table `photoclf convert` prints at the end."""

from __future__ import annotations

from app.data.sources import MIN_EVAL_PHOTOS, case_twins
from app.table import format_table


def format_summary(meta: dict, out_dir: str) -> str:
    splits = [s for s in ("train", "val", "test") if s in meta["counts"]]
    multi_label = meta.get("task") == "multi_label"  # counts: photos with each label; a photo may have several
    rows = [["label (photos with it)" if multi_label else "class"] + splits + ["total"]]
    for name in meta["classes"]:
        per_split = [meta["counts"][s].get(name, 0) for s in splits]
        rows.append([name] + [str(n) for n in per_split] + [str(sum(per_split))])
    totals = [meta["examples"][s] if multi_label else sum(meta["counts"][s].values()) for s in splits]
    rows.append(["PHOTOS" if multi_label else "TOTAL"] + [str(n) for n in totals] + [str(sum(totals))])
    shards = ", ".join(f"{s}: {len(meta['shards'][s])}" for s in splits)
    lines = [
        format_table(rows),
        "",
        f"shards: {shards}; {meta['bytes'] / 2**20:.1f} MiB of JPEG; {meta['reencoded']} images re-encoded,"
        f" the rest stored byte for byte",
    ]
    lines += _empty_lines(meta, splits, multi_label)
    lines += few_photos_warning(meta["counts"], meta["classes"]) if not multi_label else []
    lines += [
        f"WARNING: {' and '.join(map(repr, twins))} differ only in case, so they are separate classes;"
        " if they are one, write its label the same way everywhere"
        for twins in case_twins(meta["classes"])
    ]
    lines += _duplicate_lines(meta.get("duplicates"))
    lines += _side_feature_lines(meta)
    if meta["skipped"]:
        lines.append(f"skipped {len(meta['skipped'])} file(s):")
        lines += [f"  {s['path']}: {s['reason']}" for s in meta["skipped"]]
    lines.append(f"wrote {out_dir}")
    return "\n".join(lines)


def _empty_lines(meta: dict, splits: list[str], multi_label: bool) -> list[str]:
    """Warnings for a val split with no photos (--val-fraction 0: photoclf train refuses it), and
    for the classes a split holds no photo of once bad files were skipped."""
    lines = []
    val = meta["examples"].get("val", 0) if multi_label else sum(meta["counts"].get("val", {}).values())
    if not val:
        lines.append("WARNING: no val photos: photoclf train will refuse this data (it chooses its epochs and"
                     " thresholds on val photos)")  # fmt: skip
    empty = [f"{name} in {s}" for s in splits for name in meta["classes"] if meta["counts"][s].get(name, 0) == 0]
    if empty and multi_label:
        lines.append(f"WARNING: no photo with: {', '.join(empty)} (per-label figures there are undefined)")
    elif empty:
        lines.append(f"WARNING: no images left after skipping bad files for: {', '.join(empty)}")
    return lines


def few_photos_warning(counts: dict[str, dict[str, int]], classes: list[str]) -> list[str]:
    """A warning where val or test holds fewer than MIN_EVAL_PHOTOS of a class: what it means."""
    lines = []
    for split in ("val", "test"):
        per_class = counts.get(split, {})
        few = [f"{name} ({per_class[name]})" for name in classes if 0 < per_class.get(name, 0) < MIN_EVAL_PHOTOS]
        if few:
            total = sum(per_class.values())
            lines.append(
                f"WARNING: {split} holds fewer than {MIN_EVAL_PHOTOS} photos of {', '.join(few)}:"
                f" on {total} photos one photo moves its accuracy by {100 / total:.1f} points"
                " (read the 95% interval beside it); more photos, or a larger fraction, make it mean more"
            )
    return lines


def _duplicate_lines(found: dict | None) -> list[str]:
    if not found or not found["exact_groups"]:
        return []
    leaked = found["leaked_images"]
    text = (
        f"exact duplicates (byte-identical files): {len(found['exact_groups'])} group(s), {found['leaks']} across"
        f" splits ({leaked['val']} val and {leaked['test']} test images are copies of another split's)"
    )
    advice = (
        "; dropped: the train copy (else the first) of each was kept"
        if found["dropped"]
        else "; --drop-duplicates drops them; photoclf audit finds near duplicates too"
    )
    return [("WARNING: " if found["leaks"] and not found["dropped"] else "") + text + advice]


def _side_feature_lines(meta: dict) -> list[str]:
    """One line per side feature: what the model will get, and how many cells were missing."""
    lines = []
    for column in meta.get("side_features", []):
        missing = ", ".join(f"{s} {per[column['name']]}" for s, per in meta["side_feature_missing"].items())
        kind = (
            f"numeric, train mean {column['mean']:.4g}, std {column['std']:.4g}"
            if column["kind"] == "numeric"
            else f"categorical, {len(column['vocabulary'])} values in train"
        )
        lines.append(f"side feature {column['name']}: {kind}; missing or unseen: {missing}")
    return lines
