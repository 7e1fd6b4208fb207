"""Runs one target in a child process under libFuzzer and reads what it reported."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fuzz.targets import SCRATCH_ENV, TARGETS

KINDS = {"crash": "crashes", "timeout": "hangs", "oom": "memory blow-ups"}  # libFuzzer's artifact prefixes


@dataclass
class Report:
    target: str
    seconds: int  # the child's wall time, set-up included
    executions: int
    start_rss_mb: int
    peak_rss_mb: int
    found: dict[str, list[Path]] = field(default_factory=dict)  # kind → saved inputs
    first_error: str = ""

    def summary(self) -> str:
        rate = self.executions / max(self.seconds, 1)
        counts = ", ".join(f"{len(self.found.get(kind, []))} {words}" for kind, words in KINDS.items())
        lines = [
            f"{self.target}: {self.executions:,} executions in {self.seconds} s ({rate:,.0f}/s), {counts};"
            f" memory {self.start_rss_mb} MB after set-up, peak {self.peak_rss_mb} MB"
        ]
        lines += [f"  saved: {path}" for paths in self.found.values() for path in paths]
        if self.first_error:
            lines.append(f"  first error: {self.first_error}")
        return "\n".join(lines)


def _write_seeds(name: str, corpus: Path) -> None:
    """The target's own seeds, beside whatever earlier runs grew the corpus to."""
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(TARGETS[name].seeds()):
        (corpus / f"seed-{i:02d}").write_bytes(seed)


def _artifacts(folder: Path) -> set[Path]:
    return {p for p in folder.iterdir() if p.name.split("-")[0] in KINDS} if folder.exists() else set()


def run_target(name: str, seconds: int, out: Path) -> Report:
    corpus, found_dir = out / "corpus", out / "found"
    _write_seeds(name, corpus)
    found_dir.mkdir(parents=True, exist_ok=True)
    before = _artifacts(found_dir)
    child = [sys.executable, "-m", "fuzz.child", name, str(corpus), str(found_dir), str(seconds)]
    log = out / "last-run.log"
    started = time.monotonic()
    env = {**os.environ, SCRATCH_ENV: str(out / "scratch")}
    with log.open("w") as sink:
        subprocess.run(child, stdout=sink, stderr=subprocess.STDOUT, check=False, env=env)
    elapsed = round(time.monotonic() - started)
    return _read_report(name, elapsed, log.read_text(errors="replace"), _artifacts(found_dir) - before)


def _last_int(pattern: str, text: str, default: int = 0) -> int:
    values = re.findall(pattern, text, flags=re.MULTILINE)
    return int(values[-1]) if values else default


def _read_report(name: str, seconds: int, text: str, new: set[Path]) -> Report:
    found: dict[str, list[Path]] = {}
    for path in sorted(new):
        found.setdefault(path.name.split("-")[0], []).append(path)
    error = re.search(r"^(\w[\w.]*(?:Error|Exception)\b.*)$", text, flags=re.MULTILINE)
    if error is None and found:
        error = re.search(r"ERROR: libFuzzer: (.*)$", text, flags=re.MULTILINE)
    if "READY" not in text and not found:  # the child failed before fuzzing: say why
        found["crash"] = []
        error = re.search(r"^(.*\S)\s*\Z", text)
    return Report(
        name,
        seconds,
        executions=_last_int(r"stat::number_of_executed_units: (\d+)", text, _last_int(r"^#(\d+)\s", text)),
        start_rss_mb=_last_int(r"^READY rss (\d+) MB", text),
        peak_rss_mb=_last_int(r"stat::peak_rss_mb: (\d+)", text, _last_int(r"rss: (\d+)Mb", text)),
        found=found,
        first_error=error.group(1).strip() if error else "",
    )
