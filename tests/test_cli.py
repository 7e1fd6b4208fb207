"""run_cli: what every script does on the way out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# An atexit handler runs after run_cli has returned control to the interpreter, so it sees the
# state Python's final garbage collections will see.
SCRIPT = """
import atexit, gc, sys
from app.cli import run_cli
from app.errors import UserError
atexit.register(lambda: print("frozen objects:", gc.get_freeze_count()))
def main():
    if sys.argv[1] == "bad":
        raise UserError("--data 'x' does not exist")
run_cli(main)
"""


def run(argument: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, argument], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_finished_script_freezes_its_objects_so_the_exit_skips_collecting_them():
    done = run("ok")
    assert done.returncode == 0, done.stderr
    frozen = int(done.stdout.split("frozen objects:")[1])
    assert frozen > 1000  # every module and object alive at exit, not a handful


def test_bad_input_exits_2_with_one_line_and_is_frozen_too():
    done = run("bad")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --data 'x' does not exist"
    assert int(done.stdout.split("frozen objects:")[1]) > 1000
