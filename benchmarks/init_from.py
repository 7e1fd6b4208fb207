"""Grow a model by classes: a run on all classes from scratch against one started, with
`--init-from`, from a run on all but the last N.

    python -m benchmarks.init_from ../shared/data/flowers17 --hold-out 5 --seeds 0,1 --weights $PHOTOCLF_WEIGHTS

FOLDER is a photo folder already split (train/ val/ test/, one subfolder per class). Both
datasets are converted from it (the earlier one without the last --hold-out classes, by name).
Per seed: the earlier run, then the two runs on all classes (scratch, init_from); whole
fine_tune.py commands, timed from start to exit. Prints test accuracy and wall time, mean ± sd
over seeds, and the init_from run's time as a ratio of scratch's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from app.cli import run_cli
from app.errors import UserError
from app.table import format_table, mean_sd
from benchmarks.common import check_split_folder
from benchmarks.training_choices import Run, run_once

SPLITS = ("train", "val", "test")


def earlier_folder(folder: Path, out: Path, hold_out: int) -> tuple[Path, list[str]]:
    """A symlinked copy of `folder` without its last `hold_out` classes; → (it, the classes held out)."""
    classes = sorted(p.name for p in (folder / "train").iterdir() if p.is_dir())
    if not 0 < hold_out < len(classes) - 1:
        raise UserError(f"--hold-out must leave at least 2 of the {len(classes)} classes, got {hold_out}")
    kept, held = classes[:-hold_out], classes[-hold_out:]
    for split in SPLITS:
        for name in kept:
            if (folder / split / name).is_dir():
                (out / split).mkdir(parents=True, exist_ok=True)
                (out / split / name).symlink_to((folder / split / name).resolve())
    return out, held


def convert(folder: Path, out: Path) -> Path:
    from app.data.writer import write_tfrecords

    write_tfrecords(folder, out, num_shards=8)
    return out


def run_seed(earlier: Path, full: Path, seed: int, weights: str, work: Path, report) -> dict[str, Run]:
    plan = [("earlier", earlier, {}), ("scratch", full, {}), ("init_from", full, {"init_from": str(work / "earlier")})]
    runs = {}
    for name, data, overrides in plan:
        runs[name] = run_once(data, (name, overrides), seed, weights, work / name, work / f"{name}-{seed}.log")
    for name, run in runs.items():
        report(f"seed {seed} {name}: test {run.test_accuracy:.4f}, {run.seconds:.1f} s")
    return runs


def summary(by_seed: list[dict[str, Run]], held: list[str]) -> str:
    rows = [["run", "test accuracy", "wall s"]]
    for name in ("earlier", "scratch", "init_from"):
        runs = [seed[name] for seed in by_seed]
        rows.append([name, mean_sd([r.test_accuracy for r in runs]), mean_sd([r.seconds for r in runs])])
    ratio = statistics.mean(s["init_from"].seconds / s["scratch"].seconds for s in by_seed)
    table = format_table(rows)
    return f"held out for the earlier run: {', '.join(held)}\n{table}\ninit_from / scratch wall time: {ratio:.2f}x"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="a split photo folder: train/ val/ test/, one subfolder per class")
    p.add_argument("--hold-out", type=int, default=5, help="classes the earlier run does not see (default 5)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--weights", default="auto", help="fine_tune.py --weights (default auto)")
    args = p.parse_args()
    check_split_folder(args.folder)
    seeds = [int(s) for s in args.seeds.split(",")]
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="photoclf-init-from-") as tmp:
        work = Path(tmp)
        subset, held = earlier_folder(args.folder, work / "earlier-photos", args.hold_out)
        earlier, full = convert(subset, work / "earlier-records"), convert(args.folder, work / "full-records")
        by_seed = [run_seed(earlier, full, seed, args.weights, work, log) for seed in seeds]
    print(summary(by_seed, held))


if __name__ == "__main__":
    run_cli(main)
