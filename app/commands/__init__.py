"""`photoclf COMMAND`: one front door to every job, in the order a user works.

Each command is a module here with `HELP` (its line in `photoclf --help`), `add_arguments(parser)`
and `run(args)`; its docstring is its `--help` description. The modules import only what parses
and checks arguments, so `--help` and bad flags answer before TensorFlow's seconds of import.
scripts/*.py run the same commands through `run_command`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from pathlib import Path
from types import ModuleType

from app.cli import run_cli
from app.config import FIELDS, nearest_keys

COMMANDS = (
    "convert",
    "audit",
    "train",
    "find-lr",
    "evaluate",
    "export",
    "serve",
    "predict",
    "review",
    "compare-backbones",
    "data-service",
    "merge",
)


def command_module(name: str) -> ModuleType:
    return importlib.import_module(f"app.commands.{name.replace('-', '_')}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="photoclf",
        description="Transfer-learning image classification: photos → TFRecords → a served model.",
        epilog="`photoclf COMMAND --help` for a command's flags.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = command_module(name)
        sub = commands.add_parser(
            name, help=module.HELP, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(sub)
        sub.set_defaults(run=module.run, command_parser=sub)  # an error about its flags shows its usage
    return parser


def main(argv: list[str] | None = None) -> None:
    """The `photoclf` console script."""
    args, extra = build_parser().parse_known_args(argv)
    refuse_unrecognized(args.command_parser, extra)
    run_cli(lambda: args.run(args))


def run_command(name: str, argv: list[str] | None = None) -> None:
    """scripts/NAME.py: the command `name` under the script's own name, same flags, same errors."""
    module = command_module(name)
    parser = argparse.ArgumentParser(
        prog=Path(sys.argv[0]).name, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    module.add_arguments(parser)
    args, extra = parser.parse_known_args(argv)
    refuse_unrecognized(parser, extra)
    run_cli(lambda: module.run(args))


# The flags that name where a command writes: a user who types one of them means the command's own.
OUTPUT_FLAGS = ("--out", "--output", "--report", "--export-dir", "--out-dir", "--output-dir")


def refuse_unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> None:
    """argparse's error for arguments `parser` does not take, with the command's usage and, for
    each unknown flag, the flag the user most likely meant (`--out`: audit's `--report`)."""
    if extra:
        hints = [hint for arg in extra if arg.startswith("--") and (hint := _flag_hint(parser, arg.split("=")[0]))]
        parser.error(f"unrecognized arguments: {' '.join(extra)}" + "".join(f"; {hint}" for hint in hints))


def _flag_hint(parser: argparse.ArgumentParser, flag: str) -> str | None:
    """A training setting that has no flag (--dropout: --set dropout=...); else a misspelling's
    nearest flag (--prot: --port); else the flags sharing a word with it (--epochs: --epochs-head,
    --epochs-finetune); else the command's output flag for another's (--out: --report); else the
    settings it may mean (--lr: --set lr_head=... or --set lr_finetune=...)."""
    known = [o for action in parser._actions for o in action.option_strings if o.startswith("--") and o != "--help"]
    takes_settings, key = "--set" in known, flag[2:].replace("-", "_")
    if takes_settings and key in FIELDS:
        return f"{flag}: did you mean --set {key}=...?"
    words = {word for word in flag[2:].split("-") if len(word) >= 2}
    meant = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
    meant = meant or [option for option in known if words & set(option[2:].split("-"))][:3]
    meant = meant or ([option for option in known if option in OUTPUT_FLAGS] if flag in OUTPUT_FLAGS else [])
    meant = meant or ([f"--set {name}=..." for name in nearest_keys(key)] if takes_settings else [])
    return f"{flag}: did you mean {' or '.join(meant)}?" if meant else None
