"""python -m fuzz.child TARGET CORPUS FOUND SECONDS: the libFuzzer process of one target (run by
fuzz.run). The target's modules are imported under atheris' instrumentation, every seed runs
once before fuzzing (so tracing and first-call allocations are part of the start), and the
memory limit is what the process then holds plus 200 MB."""

from __future__ import annotations

import hashlib
import resource
import sys
from pathlib import Path

import atheris

from fuzz.targets import TARGETS

HANG_SECONDS = 1
GROWTH_MB = 200


def _rss_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _saving_crashes(run, found: str):
    """`run`, but an input that raises is first saved as FOUND/crash-<sha1> (atheris' own writer
    depends on sanitizer hooks a plain CPython lacks)."""

    def guarded(data: bytes) -> None:
        try:
            run(data)
        except BaseException:
            Path(found, f"crash-{hashlib.sha1(data).hexdigest()}").write_bytes(data)
            raise

    return guarded


def main() -> None:
    name, corpus, found, seconds = sys.argv[1:5]
    target = TARGETS[name]
    with atheris.instrument_imports(include=["app"]):
        for module in target.modules:
            __import__(module)
    run = target.make()
    for seed in target.seeds():
        run(seed)
    start = _rss_mb()
    print(f"READY rss {start} MB", flush=True)
    argv = [
        sys.argv[0],
        f"-max_total_time={seconds}",
        f"-timeout={HANG_SECONDS}",
        f"-rss_limit_mb={start + GROWTH_MB}",
        f"-malloc_limit_mb={GROWTH_MB}",
        f"-artifact_prefix={found}/",
        "-print_final_stats=1",
        corpus,
    ]
    atheris.Setup(argv, _saving_crashes(run, found))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
