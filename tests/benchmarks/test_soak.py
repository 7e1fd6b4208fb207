"""The soak tool against a real server, briefly: every promise it checks holds, and its report
shows the broken versions it published were refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a real server for about a minute
def test_a_short_soak_keeps_every_promise(trained_run: Path, demo_images: Path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", str(trained_run / "export" / "shapes"), "--images",
         str(demo_images), "--minutes", "0.5", "--swap-seconds", "4", "--slow-clients", "4",
         "--client-timeout-s", "2", "--capacity-seconds", "4", "--clients", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["promises_kept"], done.stdout[-3000:]
    published = report["versions"]["published"]
    broken = [int(v.split(":")[0]) for v in published if v.split(":")[1] in ("truncated_saved_model", "no_assets")]
    assert broken and not set(broken) & set(report["versions"]["served"])
    assert report["traffic"]["by_kind"]["bomb"].keys() <= {"413", "503"}
    assert report["slow_clients"]["headers"]["endings"].get("closed", 0) > 0
    assert report["slow_clients"]["body"]["endings"].get("408", 0) > 0
    assert report["drain"]["exit_status"] == 0, report["drain"]
