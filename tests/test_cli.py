"""app/cli.py: how every script starts (its imports) and ends (errors, exit status, the last collections)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def run(code: str, *arguments: str) -> subprocess.CompletedProcess:
    """A fresh interpreter: garbage collection and imports are per process."""
    return subprocess.run(
        [sys.executable, "-c", code, *arguments], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_a_finished_script_freezes_its_objects_so_the_exit_skips_collecting_them():
    done = run(SCRIPT, "ok")
    assert done.returncode == 0, done.stderr
    frozen = int(done.stdout.split("frozen objects:")[1])
    assert frozen > 1000  # every module and object alive at exit, not a handful


def test_a_file_name_that_is_not_utf8_is_printed_escaped_where_the_terminal_takes_utf8_strictly():
    """Under a UTF-8 locale other than C, Python's stdout is strict: predict's list of failed files
    ended in UnicodeEncodeError on a name it could not encode."""
    code = "import os\nfrom app.cli import run_cli\nrun_cli(lambda: print(os.fsdecode(b'/p/\\xfa.jpg: unreadable')))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"/p/\\udcfa.jpg: unreadable\n"


def test_bad_input_exits_2_with_one_line_and_is_frozen_too():
    done = run(SCRIPT, "bad")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --data 'x' does not exist"
    assert int(done.stdout.split("frozen objects:")[1]) > 1000


IMPORTS = """
import gc, json
from app.cli import lasting_imports
with lasting_imports():
    collecting_while_importing = gc.isenabled()
    import email.mime.text, http.client
print(json.dumps({"collecting_while_importing": collecting_while_importing, "collecting_after": gc.isenabled(),
                  "frozen": gc.get_freeze_count(), "left_to_collect": len(gc.get_objects())}))
"""


@pytest.mark.slow  # a subprocess: the fast tier stays under 3 minutes
def test_lasting_imports_load_without_collections_and_are_never_walked_again():
    done = run(IMPORTS)
    found = json.loads(done.stdout)
    assert not found["collecting_while_importing"] and found["collecting_after"]
    assert found["frozen"] > 1000 and found["left_to_collect"] < 100  # later collections walk almost nothing


KERAS = """
import json, sys
from app.cli import lasting_imports
with lasting_imports():
    pass
loaded = {name: name in sys.modules for name in ("keras", "sklearn")}
from sklearn.linear_model import LogisticRegression  # the audit's import still works
print(json.dumps({**loaded, "fitted": float(LogisticRegression().fit([[0.0], [1.0]], [0, 1]).coef_[0][0])}))
"""


@pytest.mark.slow  # a subprocess: the fast tier stays under 3 minutes
def test_lasting_imports_load_keras_without_scikit_learn_which_still_imports_later():
    done = run(KERAS)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["keras"] and not found["sklearn"]
    assert found["fitted"] > 0


# Runs a script with TensorFlow unimportable: an error it gives there is given before the
# seconds TensorFlow takes to import (6-8 s on 2 cores), as every script should for a wrong path.
WITHOUT_TENSORFLOW = """
import runpy, sys
sys.modules["tensorflow"] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize(
    "script,args,message",
    [
        ("fine_tune.py", ["--set", "no_such_key=1"], "--set: unknown config key 'no_such_key'"),
        ("fine_tune.py", ["--config", "{tmp}/missing.toml"], "--config: no such file {tmp}/missing.toml"),
        ("fine_tune.py", ["--config", "{tmp}"], "--config {tmp}: a folder; give a TOML file"),
        ("fine_tune.py", ["--data", "{tmp}/records"], "--data {tmp}/records: no such folder"),
        ("fine_tune.py", ["--out", "/proc/run"], "--out /proc/run: cannot write in /proc ("),  # Linux's /proc
        ("make_tfrecords.py", ["{tmp}/photos", "{tmp}/out"], "{tmp}/photos: no such file or folder"),
        ("audit.py", ["{tmp}/photos"], "{tmp}/photos: no such file or folder"),
        ("export.py", ["{tmp}"], "{tmp}: not a finished run"),
        ("evaluate.py", ["{tmp}", "--data", "{tmp}"], "{tmp}: no SavedModel found"),
        ("predict.py", ["{tmp}", "{tmp}"], "{tmp}: no SavedModel found"),
        ("serve.py", ["{tmp}/models"], "{tmp}/models: no such model folder"),
        ("serve.py", ["{tmp}"], "{tmp}: no version folders holding a saved_model.pb"),
        ("serve.py", ["{tmp}", "--max-queue", "0"], "--max-queue must be > 0, got 0"),
        ("find_lr.py", ["--steps", "5"], "--steps must be >= 10, got 5"),
        ("find_lr.py", ["--lr-min", "1", "--lr-max", "0.1"], "--lr-min 1 and --lr-max 0.1: need 0 < --lr-min"),
    ],
)
def test_a_wrong_path_or_flag_is_refused_before_tensorflow_is_imported(
    tmp_path: Path, script: str, args: list[str], message: str
):
    filled = [a.format(tmp=tmp_path) for a in args]
    done = run(WITHOUT_TENSORFLOW, str(ROOT / "scripts" / script), *filled)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {message.format(tmp=tmp_path)}") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "script,args,message",
    [
        ("export.py", ["{tmp}", "--max-megapixels", "inf"], "argument --max-megapixels: 'inf' is not a finite number"),
        ("serve.py", ["{tmp}", "--max-megapixels", "nan"], "argument --max-megapixels: 'nan' is not a finite number"),
        ("make_tfrecords.py", ["{tmp}", "{tmp}/o", "--val-fraction", "nan"], "argument --val-fraction: 'nan' is not"),
        ("find_lr.py", ["--lr-max", "big"], "argument --lr-max: 'big' is not a number"),
    ],
)
def test_a_number_flag_that_is_not_finite_is_a_usage_error(tmp_path: Path, script: str, args: list[str], message: str):
    """inf reached int() as an OverflowError's traceback after the model had loaded."""
    done = run(WITHOUT_TENSORFLOW, str(ROOT / "scripts" / script), *[a.format(tmp=tmp_path) for a in args])
    assert done.returncode == 2, done.stderr
    assert message in done.stderr.splitlines()[-1], done.stderr


@pytest.mark.parametrize(
    "script,args,message",
    [
        ("serve.py", ["{tmp}", "--port", "99999"], "argument --port: 99999 is not a port number (0 to 65535)"),
        ("serve.py", ["{tmp}", "--port", "-5"], "argument --port: -5 is not a port number (0 to 65535)"),
        ("review.py", ["{tmp}", "{tmp}", "--port", "web"], "argument --port: 'web' is not a port number"),
        ("data_service.py", ["dispatcher", "--port", "65536"], "argument --port: 65536 is not a port number"),
        ("data_service.py", ["worker", "--dispatcher", "host"], "argument --dispatcher: 'host' is not HOST:PORT"),
        ("data_service.py", ["worker", "--dispatcher", "host:70000"], "argument --dispatcher: 70000 is not a port"),
    ],
)
def test_a_port_no_socket_can_have_is_a_usage_error_not_a_traceback_once_the_model_loaded(
    tmp_path: Path, script: str, args: list[str], message: str
):
    done = run(WITHOUT_TENSORFLOW, str(ROOT / "scripts" / script), *[a.format(tmp=tmp_path) for a in args])
    assert done.returncode == 2, done.stderr
    assert message in done.stderr.splitlines()[-1], done.stderr
    assert "Traceback" not in done.stderr
