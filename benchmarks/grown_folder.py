"""A folder of photos that grows and is converted again: how many of the grown dataset's val and
test photos were training photos of the earlier one, which an `--init-from` run of the earlier
model is then scored on. Under convert's split (`app.data.sources.split_stratified`) and under a
seeded shuffle of each class with the same counts (the split a shuffle-then-slice recipe gives).

Every photo of SET (its split folders merged, or its class folders) is one class folder; the
earlier folder lacks the last `--grow` of each class's photos by name (a camera numbers new
photos after the old ones). Nothing is converted or trained: the splits are the converter's own.

    python -m benchmarks.grown_folder ../shared/data/flowers17 --grow 0.1 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from app.data.sources import class_dirs, list_files, split_stratified

SPLITS = ("train", "val", "test")


def photos_by_class(folder: Path) -> dict[str, list[Path]]:
    """Each class's photos, from class folders or from train/val/test folders of class folders."""
    tops = {p.name: p for p in class_dirs(folder)}
    roots = [tops[s] for s in SPLITS if s in tops] or [folder]
    by_class: dict[str, list[Path]] = {}
    for root in roots:
        for class_dir in class_dirs(root):
            by_class.setdefault(class_dir.name, []).extend(list_files(class_dir))
    return by_class


def shuffled_like(by_class: dict[str, list[Path]], counts: dict, seed: int) -> dict[str, dict[str, list[Path]]]:
    """Each class shuffled whole, then sliced into val, test and train of `counts`' sizes."""
    splits: dict[str, dict[str, list[Path]]] = {s: {} for s in SPLITS}
    for name, paths in by_class.items():
        paths = sorted(paths)
        random.Random(f"{seed}:{name}").shuffle(paths)
        n_val, n_test = len(counts["val"][name]), len(counts["test"][name])
        splits["val"][name], splits["test"][name] = paths[:n_val], paths[n_val : n_val + n_test]
        splits["train"][name] = paths[n_val + n_test :]
    return splits


def trained_then_evaluated(before: dict, after: dict) -> tuple[int, int]:
    """(photos in `after`'s val or test that were in `before`'s train, photos in `after`'s val and test)."""
    trained = {p for paths in before["train"].values() for p in paths}
    evaluated = [p for split in ("val", "test") for paths in after[split].values() for p in paths]
    return sum(p in trained for p in evaluated), len(evaluated)


def measure(by_class: dict[str, list[Path]], grow: float, seed: int, fractions: tuple[float, float]) -> dict:
    earlier = {name: sorted(paths)[: round(len(paths) * (1 - grow))] for name, paths in by_class.items()}
    grown_split = split_stratified(by_class, *fractions, seed)
    rows = {}
    for method, split in (
        ("convert", lambda photos: split_stratified(photos, *fractions, seed)),
        ("shuffle", lambda photos: shuffled_like(photos, split_stratified(photos, *fractions, seed), seed)),
    ):
        rows[method] = trained_then_evaluated(split(earlier), split(by_class))
    rows["grown val+test"] = sum(len(p) for s in ("val", "test") for p in grown_split[s].values())
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--grow", type=float, default=0.1, help="share of each class's photos added (default 0.1)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--test-fraction", type=float, default=0.1)
    args = p.parse_args(argv)
    by_class = photos_by_class(args.folder)
    total = sum(len(v) for v in by_class.values())
    print(f"{args.folder.name}: {total} photos in {len(by_class)} classes; the last {args.grow:.0%} of each added")
    print("seed  grown val+test  earlier training photos among them: convert's split  a whole-class shuffle")
    found = {"convert": [], "shuffle": []}
    for seed in (int(s) for s in args.seeds.split(",")):
        rows = measure(by_class, args.grow, seed, (args.val_fraction, args.test_fraction))
        for method in found:
            found[method].append(rows[method][0])
        print(f"{seed:>4}  {rows['grown val+test']:>14}  {rows['convert'][0]:>35}  {rows['shuffle'][0]:>20}")
    print(f"mean  {'':>14}  {statistics.mean(found['convert']):>35.1f}  {statistics.mean(found['shuffle']):>20.1f}")


if __name__ == "__main__":
    main()
