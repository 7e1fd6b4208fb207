"""Which training choices pay, judged as a user would: the whole `fine_tune.py` command per
variant, its wall time and peak memory, and accuracy on the held-out test split.

    python -m benchmarks.training_choices RECORDS [RECORDS ...] \\
        --variant defaults --variant k8:feature_views=8 --variant images:phase2_mode=images --seeds 0,1,2

RECORDS are make_tfrecords.py folders with a test split (without one, test accuracy is "-").
For each data set and seed, every variant runs in turn (A B C, A B C, ...), so the machine's
drifting speed falls on all of them alike. Prints one line per run, then one table per data
set: test accuracy (mean ± sd over seeds), kept validation accuracy, what phase 2 did, the
median wall time and its ratio to the first variant's, the median peak memory; then a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app.cli import add_weights_and_seeds, run_cli
from app.config import load_config
from app.errors import UserError
from app.table import format_table, mean_sd
from benchmarks.common import Variant, parse_variant

FINE_TUNE = Path(__file__).resolve().parent.parent / "scripts" / "fine_tune.py"


@dataclass(frozen=True)
class Run:
    data: str
    variant: str
    seed: int
    seconds: float  # wall time of the whole command
    peak_mb: float  # the command's peak resident memory
    metrics: dict  # its metrics.json

    @property
    def test_accuracy(self) -> float | None:
        return (self.metrics.get("test") or {}).get("accuracy")

    @property
    def kept_val_accuracy(self) -> float:
        kept = self.metrics.get("phase2") or self.metrics["phase1"]
        return kept["val_accuracy"]

    @property
    def phase2(self) -> str:
        """What phase 2 did: its mode and epochs, and whether its weights were kept."""
        p2 = self.metrics.get("phase2")
        if not p2:
            return "-"
        mode = (self.metrics.get("phase2_plan") or {}).get("mode", "?")
        return f"{mode} {p2['epochs']}ep" + (" (phase 1 kept)" if p2.get("best_epoch") == 0 else "")


def command(data: Path, out: Path, seed: int, weights: str, overrides: dict[str, str]) -> list[str]:
    # feature_store = run: each run computes its own features (timed cold), unless a variant shares a store
    sets = [f"--set={key}={value}" for key, value in {"seed": seed, "feature_store": "run", **overrides}.items()]
    return [
        sys.executable,
        str(FINE_TUNE),
        "--data",
        str(data),
        "--out",
        str(out),
        "--weights",
        weights,
        "--overwrite",
        *sets,
    ]


def run_once(data: Path, variant: Variant, seed: int, weights: str, out: Path, log_file: Path) -> Run:
    """One fine_tune.py command, timed from start to exit; its output goes to `log_file`."""
    name, overrides = variant
    with log_file.open("w") as log:
        start = time.perf_counter()
        process = subprocess.Popen(command(data, out, seed, weights, overrides), stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise UserError(f"{name} on {data} (seed {seed}) exited {process.returncode}; see {log_file}")
    metrics = json.loads((out / "metrics.json").read_text())
    return Run(str(data), name, seed, seconds, usage.ru_maxrss / 1024, metrics)


def run_benchmark(
    datasets: list[Path], variants: list[Variant], seeds: tuple[int, ...], weights: str, logs: Path, report=print
) -> list[Run]:
    for _, overrides in variants:  # a bad key or value fails now, not after an hour of runs
        load_config(None, overrides)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for data in datasets:
            for seed in seeds:
                for variant in variants:
                    log_file = logs / f"{data.name}-{variant[0]}-{seed}.log"
                    run = run_once(data, variant, seed, weights, Path(tmp) / "run", log_file)
                    runs.append(run)
                    test = "-" if run.test_accuracy is None else f"{run.test_accuracy:.4f}"
                    report(
                        f"{data.name} {run.variant} seed {seed}: test {test}, kept val {run.kept_val_accuracy:.4f},"
                        f" phase 2 {run.phase2}, {run.seconds:.1f} s, {run.peak_mb:.0f} MB"
                    )
    return runs


def summary_table(runs: list[Run], data: str) -> str:
    """One row per variant on one data set; times as medians and as a ratio to the first variant."""
    rows = [r for r in runs if r.data == data]
    names = list(dict.fromkeys(r.variant for r in rows))
    baseline = statistics.median(r.seconds for r in rows if r.variant == names[0])
    table = [
        ["variant", "test accuracy", "kept val accuracy", "phase 2 (per seed)", "wall s (median)", "x first", "peak MB"]
    ]
    for name in names:
        group = [r for r in rows if r.variant == name]
        tests = [r.test_accuracy for r in group if r.test_accuracy is not None]
        seconds = statistics.median(r.seconds for r in group)
        table.append(
            [
                name,
                mean_sd(tests) if tests else "-",
                mean_sd([r.kept_val_accuracy for r in group]),
                ", ".join(r.phase2 for r in group),
                f"{seconds:.1f}",
                f"{seconds / baseline:.2f}",
                f"{statistics.median(r.peak_mb for r in group):.0f}",
            ]
        )
    return f"{Path(data).name} ({len(rows) // len(names)} seeds)\n" + format_table(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("datasets", type=Path, nargs="+", help="make_tfrecords.py output folders (with a test split)")
    add_weights_and_seeds(p)
    p.add_argument(
        "--variant",
        action="append",
        default=None,
        help="NAME or NAME:key=value,... (fine_tune.py config keys); repeatable; the first is the"
        " baseline of the time ratio (default: defaults)",
    )
    p.add_argument("--logs", type=Path, default=None, help="folder for each run's log (default: a temporary one)")
    args = p.parse_args()
    for data in args.datasets:
        if not (data / "dataset.json").is_file():
            raise UserError(f"{data}: no dataset.json; make it with scripts/make_tfrecords.py")
    try:
        variants = [parse_variant(v) for v in args.variant or ["defaults"]]
    except ValueError as err:
        p.error(str(err))
    logs = args.logs or Path(tempfile.mkdtemp(prefix="training-choices-"))
    logs.mkdir(parents=True, exist_ok=True)
    runs = run_benchmark(
        args.datasets,
        variants,
        args.seeds,
        args.weights,
        logs,
        report=lambda line: print(line, file=sys.stderr, flush=True),
    )
    for data in dict.fromkeys(r.data for r in runs):
        print(summary_table(runs, data), end="\n\n")
    print(json.dumps([{**r.__dict__, "metrics": brief_metrics(r.metrics)} for r in runs]))


def brief_metrics(metrics: dict) -> dict:
    """What the JSON line keeps of a run's metrics.json: the phases without their confusion matrices."""
    keep = {k: metrics.get(k) for k in ("phase1", "phase2", "test", "phase2_plan")}
    return {
        k: {n: v for n, v in value.items() if n != "val_confusion_matrix"} if isinstance(value, dict) else value
        for k, value in keep.items()
    }


if __name__ == "__main__":
    run_cli(main)
