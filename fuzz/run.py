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
    failure: str = ""  # why the run tested nothing, or died: a failed run, whatever it found

    @property
    def failed(self) -> bool:
        return bool(self.failure or any(self.found.values()))

    def summary(self) -> str:
        rate = self.executions / max(self.seconds, 1)
        counts = ", ".join(f"{len(self.found.get(kind, []))} {words}" for kind, words in KINDS.items())
        lines = [
            f"{self.target}: {self.executions:,} executions in {self.seconds} s ({rate:,.0f}/s), {counts};"
            f" memory {self.start_rss_mb} MB after set-up, peak {self.peak_rss_mb} MB"
        ]
        lines += [f"  saved: {path}" for paths in self.found.values() for path in paths]
        if self.failure:
            lines.append(f"  FAILED: {self.failure}")
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
        done = subprocess.run(child, stdout=sink, stderr=subprocess.STDOUT, check=False, env=env)
    elapsed = round(time.monotonic() - started)
    text = log.read_text(errors="replace")
    return _read_report(name, elapsed, text, _artifacts(found_dir) - before, done.returncode)


def _last_int(pattern: str, text: str, default: int = 0) -> int:
    values = re.findall(pattern, text, flags=re.MULTILINE)
    return int(values[-1]) if values else default


def _read_report(name: str, seconds: int, text: str, new: set[Path], returncode: int = 0) -> Report:
    found: dict[str, list[Path]] = {}
    for path in sorted(new):
        found.setdefault(path.name.split("-")[0], []).append(path)
    error = re.search(r"^(\w[\w.]*(?:Error|Exception)\b.*)$", text, flags=re.MULTILINE)
    if error is None and found:
        error = re.search(r"ERROR: libFuzzer: (.*)$", text, flags=re.MULTILINE)
    executions = _last_int(r"stat::number_of_executed_units: (\d+)", text, _last_int(r"^#(\d+)\s", text))
    return Report(
        name,
        seconds,
        executions=executions,
        start_rss_mb=_last_int(r"^READY rss (\d+) MB", text),
        peak_rss_mb=_last_int(r"stat::peak_rss_mb: (\d+)", text, _last_int(r"rss: (\d+)Mb", text)),
        found=found,
        first_error=error.group(1).strip() if error else _last_line(text) if "READY" not in text else "",
        failure=_failure(text, executions, returncode, bool(found)),
    )


def _failure(text: str, executions: int, returncode: int, found: bool) -> str:
    """Why a run must not count as clean though it found nothing: it never started fuzzing, ran
    no input, or its process ended in a way libFuzzer does not end a finished run."""
    if "READY" not in text:
        return "set-up failed before fuzzing (the log's last line is below)"
    if executions == 0:
        return "no input was executed"
    if returncode != 0 and not found:
        return f"the fuzzing process exited with code {returncode} and saved no input"
    return ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(the log is empty)"
