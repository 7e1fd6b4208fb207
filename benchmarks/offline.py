"""`photoclf evaluate` and `photoclf predict` on a few thousand photos, whole commands, under each
runtime: what a user waits for when they score a folder.

    python -m benchmarks.offline --shared ../shared
    python -m benchmarks.offline --shared ../shared --runtimes tf,auto,openvino --rounds 3 --photos 600

The model: the suite's eurosat5 set (app defaults, MobileNetV2 with the shared weights), trained
once under --work and reused. The photos: --photos per class of eurosat5's train/ folder that the
suite did not train on (never seen by the model), as a folder of class folders. Each round runs
every runtime's evaluate, then every runtime's predict, in turn (A B A B ...), each as its own
process: wall time from start to exit and peak RSS. `auto` times the runtimes the first time it
meets an export on a host and remembers the fastest (app.inference.runtime_choice): its first
command of each kind (with that memory emptied) is its own row, "auto, first". The table gives medians over rounds, the
speed against `tf` (the SavedModel: evaluate's default before `auto`), the accuracy evaluate
measured, the runtime `auto` chose, and predict's top-1 agreement with `tf`'s answers. Prints the
CPU first, then the table, then a JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from app.cli import run_cli
from app.errors import UserError
from app.inference import runtime_choice
from app.inference.runtime_choice import cpu_name
from app.table import format_table
from benchmarks.common import COMMAND, timed
from benchmarks.suite import SETS, WEIGHTS, prepare

SET = "eurosat5"
FIRST = "auto, first"  # auto's first command on an export: it times every runtime


@dataclass
class Timed:
    command: str
    runtime: str
    seconds: float
    peak_rss_mb: float
    chosen: str = ""
    accuracy: float | None = None
    answers: dict[str, str] | None = None  # predict: path → top label


def held_out_photos(shared: Path, out: Path, per_class: int) -> Path:
    """`out`/CLASS/ as symlinks to train photos the suite's cut left out (the same seeded order)."""
    skip = SETS[SET].train
    for class_dir in sorted(p for p in (shared / "data" / SET / "train").iterdir() if p.is_dir()):
        files = sorted(p for p in class_dir.iterdir() if p.is_file() and not p.name.startswith("."))
        random.Random(f"suite:train:{class_dir.name}").shuffle(files)
        (out / class_dir.name).mkdir(parents=True, exist_ok=True)
        for f in files[skip : skip + per_class]:
            link = out / class_dir.name / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
    return out


def trained_run(shared: Path, work: Path) -> Path:
    """The suite set's default run under `work`, trained once."""
    run = work / f"run-{SET}"
    if (run / "metrics.json").is_file():
        return run
    records = prepare(shared, work, SET, quick=False)
    weights = shared / WEIGHTS["mobilenet_v2"]
    train = [*COMMAND, "train", "--data", str(records), "--out", str(run), "--weights", str(weights), "--overwrite"]
    done = subprocess.run(train, capture_output=True, text=True)
    if done.returncode:
        raise UserError(f"training the benchmark's model failed: {done.stderr.strip().splitlines()[-1]}")
    return run


def evaluate(run: Path, photos: Path, runtime: str, work: Path) -> Timed:
    report = work / f"report-{runtime}"
    seconds, rss = timed(["evaluate", str(run), "--data", str(photos), "--runtime", runtime, "--report", str(report)],
                         work / f"evaluate-{runtime}.log")  # fmt: skip
    metrics = json.loads((report / "metrics.json").read_text())
    return Timed("evaluate", runtime, seconds, rss, metrics["runtime"], metrics["accuracy"])


def predict(run: Path, photos: Path, runtime: str, work: Path) -> Timed:
    output = work / f"predictions-{runtime}.csv"
    log = work / f"predict-{runtime}.log"
    seconds, rss = timed(["predict", str(run), str(photos), "--runtime", runtime, "--output", str(output)], log)
    with output.open() as f:
        answers = {row["path"]: row["label_1"] for row in csv.DictReader(f)}
    chosen = log.read_text().rsplit("predicted (", 1)[-1].split(")", 1)[0]
    return Timed("predict", runtime, seconds, rss, chosen, answers=answers)


def rows(results: list[Timed], runtimes: list[str]) -> list[list[str]]:
    """Per command and runtime: median seconds, speed against tf, peak RSS, accuracy or agreement."""
    table = []
    for command in ("evaluate", "predict"):
        base = statistics.median(r.seconds for r in results if r.command == command and r.runtime == "tf")
        reference = next(r.answers for r in results if r.command == command and r.runtime == "tf")
        for runtime in runtimes:
            mine = [r for r in results if r.command == command and r.runtime == runtime]
            if not mine:  # `auto` with --rounds 1: its one command is "auto, first"
                continue
            seconds = statistics.median(r.seconds for r in mine)
            if command == "evaluate":
                quality = f"accuracy {mine[-1].accuracy:.4f}"
            else:
                same = sum(reference[p] == label for p, label in mine[-1].answers.items())
                quality = f"top-1 as tf {same}/{len(reference)}"
            table.append([command, runtime, mine[-1].chosen, f"{seconds:.1f}", f"{base / seconds:.2f}x",
                          f"{max(r.peak_rss_mb for r in mine):.0f}", quality])  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, required=True, help="the shared folder (weights/, data/)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/photoclf-offline"), help="model, photos, logs")
    parser.add_argument("--runtimes", default="tf,auto", help="comma-separated, tf first (default tf,auto)")
    parser.add_argument("--photos", type=int, default=600, help="held-out photos per class (default 600)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    args = parser.parse_args()
    runtimes = args.runtimes.split(",")
    if runtimes[0] != "tf":
        raise UserError("--runtimes: tf first, the baseline the others are measured against")
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    run = trained_run(args.shared, args.work)
    photos = held_out_photos(args.shared, args.work / "photos", args.photos)
    results = []
    for round_number in range(args.rounds):
        for job in (evaluate, predict):
            for runtime in runtimes:
                first = runtime == "auto" and round_number == 0
                if first:
                    (args.work / "cache" / runtime_choice.FILE).unlink(missing_ok=True)
                results.append(job(run, photos, runtime, args.work))
                r = results[-1]
                r.runtime = FIRST if first else runtime
                print(f"round {round_number + 1}: {r.command} {r.runtime} ({r.chosen}) {r.seconds:.1f} s", flush=True)
    runtimes = [*runtimes, FIRST] if "auto" in runtimes else runtimes
    header = ["command", "--runtime", "ran", "seconds", "speed vs tf", "peak RSS MB", "result"]
    print(format_table([header, *rows(results, runtimes)]))
    print(json.dumps([{k: v for k, v in vars(r).items() if k != "answers"} for r in results]))


if __name__ == "__main__":
    run_cli(main)
