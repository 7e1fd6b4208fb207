"""What several benchmarks share: config variants from the command line, subsets of a split
photo folder, a timed phase 1, calls timed in alternation, and where the scripts are."""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from app.config import TrainConfig
from app.errors import UserError

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
TUTORIAL_BACKBONE = "mobilenet_v2"  # the usual recipe's (benchmarks/usual_recipe.py), unless told otherwise
COMMAND = [sys.executable, "-c", "from app.commands import main; main()"]  # photoclf, this checkout's

Variant = tuple[str, dict[str, str]]  # name, config overrides


def parse_variant(text: str) -> Variant:
    """NAME or NAME:key=value,key=value (the config keys of fine_tune.py --set)."""
    name, _, settings = text.partition(":")
    overrides = {}
    for item in filter(None, settings.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--variant {text}: expected key=value, got '{item}'")
        overrides[key.strip().replace("-", "_")] = value.strip()
    return name, overrides


def subset_folder(folder: Path, out: Path, per_class: int | None, seed: int, test_per_class: int = 0) -> Path:
    """train/ cut to `per_class` photos per class (seeded choice, symlinks; None: all of them),
    val/ whole, and no other split of `folder`; with `test_per_class`, up to that many of the
    training photos left out become test/ (held out: they choose nothing)."""
    for split in ("train", "val"):
        for class_dir in sorted(p for p in (folder / split).iterdir() if p.is_dir()):
            files = sorted(p for p in class_dir.iterdir() if p.is_file() and not p.name.startswith("."))
            chosen = {split: files}
            if split == "train":
                random.Random(f"{seed}:{class_dir.name}").shuffle(files)
                kept = len(files) if per_class is None else per_class
                chosen = {"train": files[:kept], "test": files[kept : kept + test_per_class]}
            for name, picked in chosen.items():
                if not picked:
                    continue
                (out / name / class_dir.name).mkdir(parents=True)
                for f in picked:
                    (out / name / class_dir.name / f.name).symlink_to(f.resolve())
    return out


def check_split_folder(folder: Path) -> None:
    for split in ("train", "val"):
        if not (folder / split).is_dir():
            raise UserError(f"{folder}: needs train/ and val/ folders of class folders (missing {split}/)")


def timed_phase1(cfg: TrainConfig) -> tuple[float, object]:
    from app.training.context import setup
    from app.training.train import run_phase1

    ctx = setup(cfg.replace(feature_store="run"), overwrite=True)  # timed cold: no features from an earlier round
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # progress bars; stdout is for the JSON result
        result = run_phase1(ctx)
    return time.perf_counter() - start, (ctx, result)


def alternated_ms_per_photo(runs: dict[str, Callable], batches: list, rounds: int) -> dict[str, float]:
    """Median ms per photo of each call over `batches`, the calls alternating within each round
    (A B C A B C ...) so the machine's drift falls on all of them."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    photos = sum(len(b) for b in batches)
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            for b in batches:
                run(b)
            times[name].append((time.perf_counter() - start) * 1000 / photos)
    return {name: statistics.median(t) for name, t in times.items()}


def disk_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` (links not followed: what the folder itself adds)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def timed(args: list[str], log: Path, cache: Path | None = None) -> tuple[float, float]:
    """One photoclf command as its own process, its output into `log`: (wall seconds, peak RSS in
    MB). Its cache (the feature store, the runtime auto measured) is the benchmark's own: `cache`,
    else beside the log."""
    env = {**os.environ, "PHOTOCLF_CACHE_DIR": str(cache or log.parent / "cache")}
    with log.open("w") as out:
        start = time.perf_counter()
        process = subprocess.Popen([*COMMAND, *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise UserError(f"{' '.join(args[:2])} exited {os.waitstatus_to_exitcode(status)}; see {log}")
    return seconds, usage.ru_maxrss / 1024
