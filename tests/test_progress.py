"""Progress bars: redrawn as the work goes at a terminal, a few lines in a log."""

from __future__ import annotations

import io
import time

from app.progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _bars_drawn(stream: io.StringIO, monkeypatch) -> int:
    """Five steps, each longer than a terminal's redraw interval."""
    monkeypatch.setattr("sys.stderr", stream)
    with progress_bar(5, "img", "Work") as bar:
        for _ in range(5):
            time.sleep(0.12)
            bar.update(1)
    return stream.getvalue().count("Work:")


def test_a_log_gets_the_start_and_the_end_of_a_bar_not_every_redraw(monkeypatch):
    logged = io.StringIO()  # a file or a pipe: not a terminal
    assert _bars_drawn(logged, monkeypatch) == 2  # 0% as it starts, 100% as it ends
    assert "Work: 100%" in logged.getvalue()


def test_a_terminal_gets_the_bar_redrawn_at_every_step(monkeypatch):
    assert _bars_drawn(_Terminal(), monkeypatch) >= 6
