"""The defaults suite: `photoclf train` as a user runs it, over unlike photo sets, both real
backbones and several seeds, so that a default is chosen where it generalises.

    python -m benchmarks.suite --shared ../shared                      # defaults, every set, seeds 0,1,2
    python -m benchmarks.suite --shared ../shared --variant previous --variant b2:unfreeze=blocks:2
    python -m benchmarks.suite --shared ../shared --quick              # 20 photos a class, seed 0: minutes

The sets (`../shared/data`, read its README) are cut the same way every time (a fixed seed, not
the runs' seeds): cats-dogs (its val halves become val and test), flowers17, food10, clothing10
(a third of each class's training photos: its imbalance kept) and eurosat5 (200 training photos
a class; its val split becomes val and test). Each is converted once with `photoclf convert`
into --work and reused. Per set, backbone and seed the variants run in turn (A B A B ...), so
the machine's drift falls on all of them; `defaults` always runs first and is the baseline.

The variant `previous` replays the plan phase 2 had before the suite: phase 2 on phase 1's views
for 5 epochs where phase 1's kept val accuracy reached 0.95, else what the defaults do now (10
epochs on images; there the defaults' own run is its run, not run twice).

Prints a line per run, then per set and backbone a table (test accuracy mean ± sd and per seed,
median wall time and its ratio to the defaults', the difference from the defaults per seed),
then per variant its mean difference on every set and the worst set, and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from app.cli import int_list, run_cli
from app.config import load_config
from app.errors import UserError
from app.table import format_table, mean_sd
from benchmarks.common import SCRIPTS, Variant, parse_variant
from benchmarks.training_choices import Run, brief_metrics, run_once

WEIGHTS = {
    "mobilenet_v2": "weights/mobilenet_v2_1.0_no_top.weights.h5",
    "efficientnet_lite0": "weights/efficientnet_lite0_imagenet_torch_state.npz",
}


@dataclass(frozen=True)
class Cut:
    """How a shared set becomes a suite set: photos per class taken from each split."""

    train: float | int | None = None  # None: all; float: that share of each class; int: at most that many
    val: int | None = None  # at most this many per class stay in val
    test_from_val: int = 0  # this many more per class of val become test/ (sets without a test split)


SETS = {
    "cats-dogs": Cut(val=50, test_from_val=50),
    "flowers17": Cut(),
    "food10": Cut(),
    "clothing10": Cut(train=1 / 3),
    "eurosat5": Cut(train=200, val=100, test_from_val=200),
}
QUICK_TRAIN = 20  # --quick: at most this many training photos a class


def _take(files: list[Path], rule: float | int | None) -> list[Path]:
    if rule is None:
        return files
    return files[: max(1, round(len(files) * rule))] if isinstance(rule, float) else files[:rule]


def cut_folder(source: Path, out: Path, cut: Cut, quick: bool) -> None:
    """`out`/{train,val,test}/CLASS/ as symlinks into `source`, chosen with a fixed seed."""
    for split in ("train", "val", "test"):
        if not (source / split).is_dir():
            continue
        for class_dir in sorted(p for p in (source / split).iterdir() if p.is_dir()):
            files = sorted(p for p in class_dir.iterdir() if p.is_file() and not p.name.startswith("."))
            random.Random(f"suite:{split}:{class_dir.name}").shuffle(files)
            chosen = {split: files}
            if split == "train":
                chosen = {"train": _take(files, QUICK_TRAIN if quick else cut.train)}
            elif split == "val" and (cut.val or cut.test_from_val):
                keep = cut.val or len(files) - cut.test_from_val
                chosen = {"val": files[:keep], "test": files[keep : keep + cut.test_from_val]}
            for name, picked in chosen.items():
                (out / name / class_dir.name).mkdir(parents=True, exist_ok=True)
                for f in picked:
                    (out / name / class_dir.name / f.name).symlink_to(f.resolve())


def prepare(shared: Path, work: Path, name: str, quick: bool) -> Path:
    """The set's TFRecords in WORK/full/NAME (or quick/), converted once (a finished conversion is
    reused); `work` may name that full/ (or quick/) folder itself, which is then not nested again."""
    kind = "quick" if quick else "full"
    records = (work if work.name == kind else work / kind) / name
    if (records / "dataset.json").is_file():
        return records
    source = shared / "data" / name
    if not (source / "train").is_dir():
        raise UserError(f"--shared: {source} has no train/ folder (see ../shared/data/README.md)")
    with tempfile.TemporaryDirectory() as tmp:
        cut_folder(source, Path(tmp) / name, SETS[name], quick)
        convert = [
            sys.executable,
            str(SCRIPTS / "make_tfrecords.py"),
            str(Path(tmp) / name),
            str(records),
            "--overwrite",
        ]
        done = subprocess.run(convert, capture_output=True, text=True)
        if done.returncode:
            raise UserError(f"photoclf convert of {source} failed: {done.stderr.strip().splitlines()[-1]}")
    return records


PREVIOUS = "previous"  # the variant that replays the plan before the suite (see the module's docstring)
PREVIOUS_VIEWS = {"phase2_mode": "views", "epochs_finetune": "5"}  # what it chose at phase 1 val >= 0.95
PREVIOUS_ABOVE = 0.95


def run_suite(
    sets: dict[str, Path],
    backbones: dict[str, str],
    variants: list[Variant],
    seeds: tuple[int, ...],
    logs: Path,
    report,
    runs: list[Run] | None = None,
) -> list[Run]:
    """Every run, seed by seed (a suite stopped early has every set of its first seeds), appended
    to `runs` as each ends, so a caller stopped early still has them."""
    runs = [] if runs is None else runs
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for name, records in sets.items():
                for backbone, weights in backbones.items():
                    where = f"{name} {backbone}"
                    for variant, overrides in variants:
                        run = _run_variant(records, where, variant, overrides, seed, weights, runs, Path(tmp), logs)
                        runs.append(run)
                        test = "-" if run.test_accuracy is None else f"{run.test_accuracy:.4f}"
                        report(f"{where} {variant} seed {seed}: test {test}, phase 2 {run.phase2}, {run.seconds:.0f} s")
    return runs


def _run_variant(records: Path, where: str, variant: str, overrides: dict, seed: int, weights: str,
                 runs: list[Run], tmp: Path, logs: Path) -> Run:  # fmt: skip
    """One run; `previous` is the defaults' own run where the plan before would have run the same
    (phase 1 under PREVIOUS_ABOVE: phase 2 on images for 10 epochs, as now), else phase 2 on the views."""
    backbone = where.split()[-1]
    if variant == PREVIOUS:
        defaults = next(r for r in runs if r.data == where and r.seed == seed and r.variant == "defaults")
        if defaults.metrics["phase1"]["val_accuracy"] < PREVIOUS_ABOVE:
            return Run(where, variant, seed, defaults.seconds, defaults.peak_mb, defaults.metrics)
        overrides = PREVIOUS_VIEWS
    log = logs / f"{where.replace(' ', '-')}-{variant}-{seed}.log"
    run = run_once(records, (variant, {"backbone": backbone, **overrides}), seed, weights, tmp / "run", log)
    return Run(where, variant, seed, run.seconds, run.peak_mb, run.metrics)


def set_table(runs: list[Run], where: str) -> str:
    """One row per variant on one set and backbone: accuracy, time, and the difference from the defaults."""
    rows = [r for r in runs if r.data == where]
    names = list(dict.fromkeys(r.variant for r in rows))
    base = {r.seed: r for r in rows if r.variant == names[0]}
    base_seconds = statistics.median(r.seconds for r in base.values())
    table = [["variant", "test accuracy", "per seed", "wall s", "x defaults", "diff per seed (points)"]]
    for name in names:
        group = [r for r in rows if r.variant == name]
        seconds = statistics.median(r.seconds for r in group)
        diffs = [100 * (r.test_accuracy - base[r.seed].test_accuracy) for r in group if r.seed in base]
        table.append([
            name,
            mean_sd([r.test_accuracy for r in group]),
            " ".join(f"{r.test_accuracy:.3f}" for r in group),
            f"{seconds:.0f}",
            f"{seconds / base_seconds:.2f}",
            "-" if name == names[0] else " ".join(f"{d:+.1f}" for d in diffs),
        ])  # fmt: skip
    return f"{where} ({len(base)} seed{'' if len(base) == 1 else 's'})\n" + format_table(table)


def worst_sets(runs: list[Run]) -> str:
    """Each variant's mean difference from the defaults on every set and backbone; the worst named."""
    wheres = list(dict.fromkeys(r.data for r in runs))
    names = list(dict.fromkeys(r.variant for r in runs))[1:]
    table = [["variant", *wheres, "worst"]]
    for name in names:
        means = {}
        for where in wheres:
            base = {r.seed: r.test_accuracy for r in runs if r.data == where and r.variant not in names}
            diffs = [100 * (r.test_accuracy - base[r.seed]) for r in runs if r.data == where and r.variant == name]
            means[where] = statistics.mean(diffs) if diffs else float("nan")
        worst = min(means, key=means.get)
        table.append([name, *(f"{means[w]:+.1f}" for w in wheres), f"{worst} ({means[worst]:+.1f})"])
    return "difference from the defaults, points of test accuracy (mean over seeds)\n" + format_table(table)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", type=Path, default=Path("../shared"), help="folder with data/ and weights/")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "photoclf-suite",
                   help="where the converted sets are kept between runs of the suite (WORK/full/SET,"
                   " WORK/quick/SET)")  # fmt: skip
    p.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    p.add_argument("--backbones", default=",".join(WEIGHTS), help=f"comma-separated, of {', '.join(WEIGHTS)}")
    p.add_argument("--seeds", type=int_list, default=None, help="comma-separated (default 0,1,2; --quick: 0)")
    p.add_argument("--variant", action="append", default=[], help="NAME:key=value,... compared with the defaults")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_TRAIN} training photos a class, seed 0")
    p.add_argument("--logs", type=Path, default=None, help="folder for each run's log (default: a temporary one)")
    args = p.parse_args()
    try:
        variants = [("defaults", {})] + [parse_variant(v) for v in args.variant]
    except ValueError as err:
        p.error(str(err))
    for _, overrides in variants:  # a bad key fails now, not after an hour of runs
        load_config(None, overrides)
    unknown = set(args.sets.split(",")) - set(SETS) or set(args.backbones.split(",")) - set(WEIGHTS)
    if unknown:
        p.error(f"unknown set or backbone: {', '.join(sorted(unknown))}")
    backbones = {b: str(args.shared / WEIGHTS[b]) for b in args.backbones.split(",")}
    for path in backbones.values():
        if not Path(path).is_file():
            raise UserError(f"--shared: no weights file {path}")
    sets = {name: prepare(args.shared, args.work, name, args.quick) for name in args.sets.split(",")}
    logs = args.logs or Path(tempfile.mkdtemp(prefix="suite-"))
    logs.mkdir(parents=True, exist_ok=True)
    seeds = args.seeds or ((0,) if args.quick else (0, 1, 2))
    runs: list[Run] = []
    stopped = False
    try:
        run_suite(sets, backbones, variants, seeds, logs, lambda line: print(line, file=sys.stderr, flush=True), runs)
    except KeyboardInterrupt:  # hours of runs: a suite stopped early still prints the tables of those that ended
        stopped = True
        print(f"stopped: the tables hold the {len(runs)} runs that ended", file=sys.stderr)
        runs = [r for r in runs if any(b.data == r.data and b.seed == r.seed and b.variant == "defaults" for b in runs)]
    for where in dict.fromkeys(r.data for r in runs):
        print(set_table(runs, where), end="\n\n")
    if len(variants) > 1:
        print(worst_sets(runs), end="\n\n")
    print(json.dumps([{**r.__dict__, "metrics": brief_metrics(r.metrics)} for r in runs]))
    return 130 if stopped else 0


if __name__ == "__main__":
    run_cli(main)
