"""`photoclf COMMAND`: one front door to every job, in the order a user works.

Each command is a module here with `HELP` (its line in `photoclf --help`), `add_arguments(parser)`
and `run(args)`; its docstring is its `--help` description. The modules import only what parses
and checks arguments, so `--help` and bad flags answer before TensorFlow's seconds of import.
scripts/*.py run the same commands through `run_command`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from app.cli import refuse_unrecognized, run_cli

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
