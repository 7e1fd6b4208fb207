"""What each of the frozen backbone's shortcuts saves, against the runs they fire in.

    python -m benchmarks.shortcuts ../shared/data/flowers17 --weights $PHOTOCLF_WEIGHTS

FOLDER is a photo folder already split (train/ val/ test/). Two whole fine_tune.py commands
with the default config, timed from start to exit, as benchmarks/init_from.py runs them: a cold
run without the last 10% of each class's training photos, then a warm run (`--init-from` it)
on all of them, sharing its feature store. Then, in this process on all the photos, the work
each shortcut skips, timed once each, tracing its graph included (as in a run):

- the test split through the layers above phase 2's cut (the gather kept its activations)
  against decoding its photos and running the whole classifier, as a run without it would;
- the layers above the cut over every training view and val photo: what the "none of these"
  fit skips where phase 2 kept phase 1's weights (it reads phase 1's features instead);
- the same over the earlier run's photos only: what a warm run skips because the earlier run
  kept its weights' features in the store (`keep_features`).

Prints the runs, then each shortcut's seconds and their share of the cold and the warm run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.cli import run_cli
from app.config import TrainConfig
from app.data.pipeline import load_dataset_info
from app.errors import UserError
from app.table import format_table
from benchmarks.common import check_split_folder
from benchmarks.init_from import convert, fewer_photos
from benchmarks.training_choices import Run, run_once


def _timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def whole_runs(folder: Path, work: Path, weights: str, seed: int) -> tuple[Run, Run, Path, Path]:
    """(the cold run, the warm run, the earlier photos' records, all photos' records)."""
    fewer = convert(fewer_photos(folder, work / "fewer-photos", 0.1), work / "fewer")
    every = convert(folder, work / "all")
    store = str(work / "store")
    cold = run_once(fewer, ("cold", {"feature_store": store}), seed, weights, work / "cold", work / "cold.log")
    warm_overrides = {"feature_store": store, "init_from": str(work / "cold")}
    warm = run_once(every, ("warm", warm_overrides), seed, weights, work / "warm", work / "warm.log")
    return cold, warm, fewer, every


def skipped_work(cfg: TrainConfig, earlier: Path) -> dict[str, float]:
    """Seconds of the work each shortcut skips in a run of `cfg`; `earlier`: the records of the
    run a warm run starts from (its photos' rows are the ones the store holds features of)."""
    from app.training import train
    from app.training.context import setup
    from app.training.frozen import FrozenBackbone
    from app.training.frozen import backbone as door
    from app.training.frozen.rows import ActivationRows

    ctx = setup(cfg)
    frozen = FrozenBackbone(ctx)
    if not (frozen.decision.keeps_views and frozen.decision.keeps_test):  # decided before any photo runs
        raise UserError(f"a run on {cfg.data} keeps no views' or test photos' activations to time")
    frozen.phase1_features()
    cut, batch, rows = frozen.cut, cfg.batch_size, {"train": frozen._train, "val": frozen._val}
    info = load_dataset_info(str(earlier))
    old = {"train": cfg.cached_views * info.num_examples("train"), "val": info.num_examples("val")}

    def upper(counts: dict[str, int]) -> None:
        for split, count in counts.items():
            r = rows[split]
            door._upper_features(cut, ActivationRows(r.activations[:count], None, r.labels[:count]), batch)

    return {
        "test split on images": _timed(lambda: train.evaluate_split(ctx, "test")),
        "test split above the cut": _timed(lambda: train._evaluate_test(ctx, frozen, None)),
        "all rows above the cut": _timed(lambda: upper({s: len(r.labels) for s, r in rows.items()})),
        "earlier photos' rows above the cut": _timed(lambda: upper(old)),
    }


def report(cold: Run, warm: Run, seconds: dict[str, float]) -> str:
    runs = [["run", "wall s", "test accuracy", "phase 2"]]
    runs += [[r.variant, f"{r.seconds:.1f}", f"{r.test_accuracy:.4f}", r.phase2] for r in (cold, warm)]
    saved = {
        "test split through the cut": seconds["test split on images"] - seconds["test split above the cut"],
        "'none of these' fit on phase 1's features": seconds["all rows above the cut"],
        "kept weights' features in the store": seconds["earlier photos' rows above the cut"],
    }
    rows = [["shortcut", "saves s", "of the cold run", "of the warm run"]]
    rows += [[name, f"{s:.1f}", f"{s / cold.seconds:.1%}", f"{s / warm.seconds:.1%}"] for name, s in saved.items()]
    timed = "\n".join(f"  {name}: {s:.2f} s" for name, s in seconds.items())
    return f"{format_table(runs)}\n\nwork timed:\n{timed}\n\n{format_table(rows)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="a split photo folder: train/ val/ test/, one subfolder per class")
    p.add_argument("--weights", required=True, help="fine_tune.py --weights (MobileNetV2's file)")
    p.add_argument("--seed", type=int, default=0, help="seed of both runs (default 0)")
    args = p.parse_args()
    check_split_folder(args.folder)
    if not (args.folder / "test").is_dir():  # the first shortcut is the test split's: say so before the runs
        raise UserError(f"{args.folder}: no test/ folder; the benchmark times the test split's pass")
    with tempfile.TemporaryDirectory(prefix="photoclf-shortcuts-") as tmp:
        work = Path(tmp)
        cold, warm, fewer, every = whole_runs(args.folder, work, args.weights, args.seed)
        print(f"cold {cold.seconds:.1f} s, warm {warm.seconds:.1f} s", flush=True)
        cfg = TrainConfig(data=str(every), out=str(work / "parts"), weights=args.weights, seed=args.seed,
                          feature_store=str(work / "parts-store"))  # fmt: skip
        seconds = skipped_work(cfg, fewer)
    print(report(cold, warm, seconds))


if __name__ == "__main__":
    run_cli(main)
