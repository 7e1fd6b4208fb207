"""Grow a model the way datasets grow: more classes, or more photos of the same classes.

    python -m benchmarks.init_from ../shared/data/flowers17 --hold-out 5 --grow 0.1 --seeds 0,1,2 \
        --weights $PHOTOCLF_WEIGHTS

FOLDER is a photo folder already split (train/ val/ test/, one subfolder per class). Whole
fine_tune.py commands with the default config, timed from start to exit; test accuracy on the
whole folder's test split. Per seed, two scenarios:

- classes: the earlier run on all but the last --hold-out classes (by name); then all classes
  from scratch (its own, empty feature store: a cold start) and with `--init-from` the earlier
  run (sharing the earlier run's feature store, as one user's runs do).
- photos: the first run without the last --grow fraction of each class's training photos; then
  the same command on all of them (sharing the first run's feature store), without and with
  `--init-from` the first run.

Prints test accuracy and wall time, mean ± sd over seeds, and each later run's time as a ratio
(mean over seeds) of the run it is compared with: scratch for `--init-from`, the first run for
the grown ones. `--set KEY=VALUE` (repeatable) changes every run (`--set
backbone=efficientnet_lite0` with that backbone's --weights); `--warm-set KEY=VALUE` the two
`--init-from` runs only, to measure another plan for them (`--warm-set phase2_mode=images`).
`--other-warm KEY=VALUE` measures both plans in one command: each warm run is followed by the
same run with the override (`init_from_other`, `grown_init_from_other`), on the feature store as
the first found it; `--scenario classes|photos` runs one scenario only.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from app.cli import run_cli
from app.config import load_config, parse_set
from app.errors import UserError
from app.table import format_table, mean_sd
from benchmarks.common import check_split_folder
from benchmarks.training_choices import Run, run_once

SPLITS = ("train", "val", "test")


def _classes(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "train").iterdir() if p.is_dir())


def _linked_copy(folder: Path, out: Path, keep: Callable[[str, str, list[Path]], list[Path]]) -> Path:
    """A copy of `folder` of symlinks to the photos `keep(split, class, photos)` returns."""
    for split in SPLITS:
        for name in _classes(folder):
            source = folder / split / name
            photos = sorted(p for p in source.iterdir() if p.is_file()) if source.is_dir() else []
            for photo in keep(split, name, photos):
                (out / split / name).mkdir(parents=True, exist_ok=True)
                (out / split / name / photo.name).symlink_to(photo.resolve())
    return out


def fewer_classes(folder: Path, out: Path, hold_out: int) -> tuple[Path, list[str]]:
    """`folder` without its last `hold_out` classes; → (it, the classes held out)."""
    classes = _classes(folder)
    if not 0 < hold_out < len(classes) - 1:
        raise UserError(f"--hold-out must leave at least 2 of the {len(classes)} classes, got {hold_out}")
    held = classes[-hold_out:]
    return _linked_copy(folder, out, lambda split, name, photos: [] if name in held else photos), held


def fewer_photos(folder: Path, out: Path, grow: float) -> Path:
    """`folder` without the last `grow` fraction (by name) of each class's training photos."""
    if not 0 < grow < 1:
        raise UserError(f"--grow must be a fraction in (0, 1), got {grow}")

    def keep(split: str, name: str, photos: list[Path]) -> list[Path]:
        return photos[: len(photos) - round(grow * len(photos))] if split == "train" else photos

    return _linked_copy(folder, out, keep)


def convert(folder: Path, out: Path) -> Path:
    from app.data.writer import write_tfrecords

    write_tfrecords(folder, out, num_shards=8)
    return out


RUNS = ("earlier", "scratch", "init_from", "first", "grown", "grown_init_from")
OTHER = "_other"  # the name's suffix of a warm run with --other-warm (it names the run dir and the export)
WARM = ("init_from", "grown_init_from")  # the runs started --init-from an earlier one


def run_seed(
    data: dict[str, Path],
    seed: int,
    weights: str,
    work: Path,
    report,
    every: dict[str, str] | None = None,
    warm: dict[str, str] | None = None,
    other_warm: dict[str, str] | None = None,
    scenario: str = "both",
) -> dict[str, Run]:
    """The runs of both scenarios for one seed; feature stores are per seed and scenario; `every`:
    config overrides of every run, `warm`: of the two --init-from runs. With `other_warm`, each
    warm run is followed by the same run with those overrides instead (named `NAME_other`), on the
    feature store as the first one found it, so that both start alike. `scenario`: "classes" or
    "photos" runs that scenario's three runs only."""
    classes, photos = ({"feature_store": str(work / f"store-{name}-{seed}")} for name in ("classes", "photos"))
    warm = warm or {}
    plan = [
        ("earlier", "fewer_classes", classes),
        ("scratch", "all", {}),
        ("init_from", "all", {**classes, "init_from": str(work / "earlier"), **warm}),
        ("first", "fewer_photos", photos),
        ("grown", "all", photos),
        ("grown_init_from", "all", {**photos, "init_from": str(work / "first"), **warm}),
    ]
    if scenario != "both":
        plan = plan[:3] if scenario == "classes" else plan[3:]
    runs = {}
    for name, dataset, overrides in plan:
        store = Path(overrides.get("feature_store", work / "none"))
        if other_warm is not None and name in WARM and store.is_dir():
            shutil.copytree(store, work / "store-before")  # the other plan starts from the same store
        runs[name] = _run(data[dataset], name, {**(every or {}), **overrides}, seed, weights, work, report)
        if other_warm is not None and name in WARM:
            if (work / "store-before").is_dir():
                shutil.rmtree(store)
                (work / "store-before").rename(store)
            changed = {**(every or {}), **overrides, **other_warm}
            runs[name + OTHER] = _run(data[dataset], name + OTHER, changed, seed, weights, work, report)
    return runs


def _run(data: Path, name: str, overrides: dict[str, str], seed: int, weights: str, work: Path, report) -> Run:
    run = run_once(data, (name, overrides), seed, weights, work / name, work / f"{name}-{seed}.log")
    report(f"seed {seed} {name}: test {run.test_accuracy:.4f}, phase 2 {run.phase2}, {run.seconds:.1f} s")
    return run


def _overrides(flag: str, items: list[str]) -> dict[str, str]:
    """KEY=VALUE items as config overrides, checked now rather than after the first runs."""
    try:
        found = parse_set(items)
        load_config(None, found)
    except UserError as err:
        raise UserError(f"{flag}: {str(err).removeprefix('--set: ')}") from None
    return found


def summary(by_seed: list[dict[str, Run]], held: list[str], grow: float) -> str:
    rows = [["run", "data", "test accuracy", "wall s", "time ratio"]]
    compared = {"init_from": "scratch", "grown": "first", "grown_init_from": "first"}
    what = {"earlier": "fewer classes", "first": f"{grow:.0%} fewer photos"}
    for name in [n for n in by_seed[0] if n.removesuffix(OTHER) in RUNS]:
        runs = [seed[name] for seed in by_seed]
        base = compared.get(name.removesuffix(OTHER))
        ratio = f"{statistics.mean(s[name].seconds / s[base].seconds for s in by_seed):.2f}x {base}" if base else ""
        rows.append([name, what.get(name, "all"), mean_sd([r.test_accuracy for r in runs]),
                     mean_sd([r.seconds for r in runs]), ratio])  # fmt: skip
    return f"classes held out of the earlier run: {', '.join(held)}\n{format_table(rows)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="a split photo folder: train/ val/ test/, one subfolder per class")
    p.add_argument("--hold-out", type=int, default=5, help="classes the earlier run does not see (default 5)")
    p.add_argument("--grow", type=float, default=0.1, help="fraction of training photos the first run lacks (0.1)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--weights", default="auto", help="fine_tune.py --weights (default auto)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override of every run (repeatable)")  # fmt: skip
    p.add_argument("--warm-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override of the two --init-from runs only (repeatable)")  # fmt: skip
    p.add_argument("--other-warm", action="append", default=None, metavar="KEY=VALUE",
                   help="each --init-from run again with this override (repeatable), as NAME_other")  # fmt: skip
    p.add_argument("--scenario", choices=("both", "classes", "photos"), default="both",
                   help="classes added, photos added, or both (default)")  # fmt: skip
    args = p.parse_args()
    check_split_folder(args.folder)
    every, warm = _overrides("--set", args.set), _overrides("--warm-set", args.warm_set)
    other = _overrides("--other-warm", args.other_warm) if args.other_warm else None
    seeds = [int(s) for s in args.seeds.split(",")]
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="photoclf-init-from-") as tmp:
        work = Path(tmp)
        subset, held = fewer_classes(args.folder, work / "fewer-classes-photos", args.hold_out)
        first = fewer_photos(args.folder, work / "fewer-photos-photos", args.grow)
        data = {
            "fewer_classes": convert(subset, work / "fewer-classes"),
            "fewer_photos": convert(first, work / "fewer-photos"),
            "all": convert(args.folder, work / "all"),
        }
        by_seed = [run_seed(data, seed, args.weights, work, log, every, warm, other, args.scenario) for seed in seeds]
    print(summary(by_seed, held, args.grow))


if __name__ == "__main__":
    run_cli(main)
