"""`photoclf COMMAND`: one front door, the same flags and errors as scripts/*.py."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.commands import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
CONSOLE_SCRIPT = Path(sys.executable).parent / "photoclf"


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_photoclf_help_lists_every_command_in_the_order_a_user_works(capsys):
    text = help_text(capsys)
    listed = re.findall(r"^    ([a-z-]+)", text, flags=re.MULTILINE)
    assert listed == list(COMMANDS)
    assert listed[:8] == ["convert", "audit", "train", "find-lr", "evaluate", "export", "serve", "predict"]


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_help_with_its_description_and_flags(capsys, command: str):
    text = help_text(capsys, command)
    assert text.startswith(f"usage: photoclf {command} [-h]")
    assert "options:" in text and len(text.splitlines()) > 8  # its description and its own flags


def test_the_installed_console_script_runs():
    if not CONSOLE_SCRIPT.exists():
        pytest.skip(f"no console script beside {sys.executable}: install with pip install -e .")
    done = subprocess.run([str(CONSOLE_SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "compare-backbones" in done.stdout


def wrapped_command(script: Path) -> str | None:
    found = re.search(r'run_command\("([a-z-]+)"\)', script.read_text())
    return found.group(1) if found else None


def test_every_script_is_a_wrapper_over_one_command_and_every_command_has_one():
    wrapped = {script.name: wrapped_command(script) for script in sorted((ROOT / "scripts").glob("*.py"))}
    assert None not in wrapped.values(), wrapped  # nothing in scripts/ but wrappers
    assert sorted(wrapped.values()) == sorted(COMMANDS)


@pytest.mark.parametrize("script", sorted((ROOT / "scripts").glob("*.py")), ids=lambda p: p.name)
def test_a_script_s_docstring_points_at_its_command_s_help_instead_of_copying_it(script: Path):
    """The command's own docstring is its --help; a second copy here went stale (a figure, a
    runtime choice that had changed), so a script says what it is, shows a use, and points there."""
    doc = ast.get_docstring(ast.parse(script.read_text()))
    command = wrapped_command(script)
    assert doc.endswith(f"The same command as `photoclf {command}` (its --help says more).")
    assert len(doc.splitlines()) <= 6, doc


def test_a_script_and_its_command_take_the_same_flags():
    script = subprocess.run(
        [sys.executable, str(ROOT / "scripts/fine_tune.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    command = subprocess.run(
        [sys.executable, "-c", "from app.commands import main; main()", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert script.returncode == command.returncode == 0
    flags = [re.findall(r"--[a-z-]+", done.stdout) for done in (script, command)]
    assert flags[0] == flags[1] and "--epochs-head" in flags[0]
    assert script.stdout.startswith("usage: fine_tune.py") and command.stdout.startswith("usage: photoclf train")


WITHOUT_TENSORFLOW = """
import sys
sys.modules["tensorflow"] = None
from app.commands import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize(
    "args,message",
    [
        (["train", "--set", "no_such_key=1"], "--set: unknown config key 'no_such_key'"),
        (["convert", "{tmp}/photos", "{tmp}/out"], "{tmp}/photos: no such file or folder"),
        (["serve", "{tmp}", "--max-queue", "0"], "--max-queue must be > 0, got 0"),
        (
            ["predict", "{tmp}/alone/shapes/1", "{tmp}", "--explain", "{tmp}/why"],
            "--explain: {tmp}/alone/shapes/1 is not inside its run dir",
        ),
        (["predict", "{tmp}/alone/shapes/1", "{tmp}/nowhere"], "INPUT {tmp}/nowhere: no such folder, list file or"),
        (["predict", "{tmp}/alone/shapes/1", "{tmp}/records"], "INPUT {tmp}/records: a TFRecord folder (dataset.json)"),
        (["predict", "{tmp}/fused/1", "{tmp}"], "{tmp}/fused/1 also takes side features (age), which image files do"),
    ],
)
def test_photoclf_refuses_a_wrong_path_or_flag_in_one_line_before_tensorflow(
    tmp_path: Path, args: list[str], message: str
):
    filled = [a.format(tmp=tmp_path) for a in args]
    (tmp_path / "alone" / "shapes" / "1").mkdir(parents=True)  # an export's version folder, outside any run dir
    (tmp_path / "alone" / "shapes" / "1" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "fused" / "1" / "assets").mkdir(parents=True)  # an export of a model with side features
    (tmp_path / "fused" / "1" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "fused" / "1" / "assets" / "metadata.json").write_text('{"side_features": [{"name": "age"}]}')
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "dataset.json").write_text("{}")  # what convert wrote: its shards are no photos
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TENSORFLOW, *filled], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {message.format(tmp=tmp_path)}") and done.stderr.count("\n") == 1


def test_serve_on_a_port_in_use_says_so_in_one_line_before_tensorflow(tmp_path: Path):
    import socket

    (tmp_path / "shapes" / "1").mkdir(parents=True)
    (tmp_path / "shapes" / "1" / "saved_model.pb").write_bytes(b"")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-c", WITHOUT_TENSORFLOW, "serve", str(tmp_path / "shapes"), "--port", str(port)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: --host 127.0.0.1 --port {port}: cannot listen there (Address already in use)\n"


@pytest.mark.parametrize(
    "argv,hint",
    [
        (["audit", "photos", "--out", "x"], "; --out: did you mean --report?"),  # another command's output flag
        (["serve", "m", "--prot", "8000"], "; --prot: did you mean --port?"),  # a misspelling
        (["train", "--epoch-head", "2"], "; --epoch-head: did you mean --epochs-head?"),
        (["train", "--dropout", "0.3"], "; --dropout: did you mean --set dropout=...?"),  # a setting with no flag
        (["train", "--lr", "0.1"], "; --lr: did you mean --set lr_head=... or --set lr_finetune=...?"),
        (["train", "--foo"], ""),  # nothing like it: no guess
    ],
)
def test_an_unknown_flag_is_refused_with_the_commands_usage_and_the_flag_meant(capsys, argv: list[str], hint: str):
    from app.commands import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2  # argparse's status for bad arguments, before any work
    err = capsys.readouterr().err
    assert err.startswith(f"usage: photoclf {argv[0]} [-h]")  # the command's usage, not photoclf's
    flags = " ".join(argv[2:] if argv[0] in ("audit", "serve") else argv[1:])
    assert err.splitlines()[-1] == f"photoclf {argv[0]}: error: unrecognized arguments: {flags}{hint}"


def test_evaluate_without_data_offers_the_command_for_the_test_split_of_the_data_its_run_trained_on(
    capsys, trained_run: Path
):
    from app.commands import main

    with pytest.raises(SystemExit) as done:
        main(["evaluate", str(trained_run)])
    assert done.value.code == 2
    data = json.loads((trained_run / "config.json").read_text())["data"]
    assert capsys.readouterr().err == (
        "error: --data is required: the photos to evaluate on (a TFRecord folder from photoclf convert, or class"
        f" folders); its run trained on {data}, whose test split it never saw: photoclf evaluate {trained_run}"
        f" --data {data} --split test\n"
    )
