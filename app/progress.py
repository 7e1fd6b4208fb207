"""Progress bars for long work, on stderr: redrawn as a person reads them at a terminal; where
stderr is a file or a pipe (a log, CI), once in LOGGED_EVERY_S seconds, so a long run's log holds
a few lines of progress instead of every redraw joined into one line."""

from __future__ import annotations

import sys

from tqdm import tqdm

LOGGED_EVERY_S = 30.0


def progress_bar(total: int, unit: str, desc: str) -> tqdm:
    interactive = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    return tqdm(
        total=total, unit=unit, desc=desc, dynamic_ncols=True, mininterval=0.1 if interactive else LOGGED_EVERY_S
    )
