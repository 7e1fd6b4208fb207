"""python -m fuzz --list | TARGET [--seconds N] [--out DIR]: run one target under libFuzzer and
print what it found. Exit 1 when it found a crash, a hang or a memory blow-up (the input is saved
in DIR), or when the run tested nothing (set-up failed, no input executed, the process died);
2 on bad arguments."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fuzz.run import run_target
from fuzz.targets import TARGETS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("target", nargs="?", help="a target's name (see --list)")
    p.add_argument("--list", action="store_true", help="name the targets and what each parses")
    p.add_argument("--seconds", type=int, default=60, help="how long to fuzz (default 60)")
    p.add_argument(
        "--out", type=Path, default=Path("fuzz-out"), help="corpus and crashing inputs, per target (default fuzz-out)"
    )
    args = p.parse_args(argv)
    if args.list:
        for name, target in TARGETS.items():
            print(f"{name:14s} {target.describe}")
        return 0
    if args.target not in TARGETS:
        p.error(f"TARGET: expected one of {', '.join(TARGETS)}, got {args.target!r}")
    if args.seconds < 1:
        p.error(f"--seconds: expected at least 1, got {args.seconds}")
    report = run_target(args.target, args.seconds, args.out / args.target)
    print(report.summary())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
