"""Where a run's configuration goes: the modules of `app` that a real `photoclf train` hands its
configuration to, and how often it comes back to one it had left.

A call carries the configuration when one of its arguments is the run's `TrainConfig`, or holds
one as an attribute (the context, a callback). Every such call into `app` is recorded as the
command runs (sys.setprofile, in every thread), with its call site: the nearest `app` frame below
it. An **entry** is a distinct call site that hands the configuration from one module to another;
a **re-entry** one into a module it had entered before (entries less modules). Entries that read
a property of an object holding the configuration (the context's `global_batch`, a finished run's
`classes`) are counted apart as well. This is a trace of one run, so it counts the calls that
run makes, not every branch a static reading would follow.

    python -m benchmarks.config_path                        # the demo, as `photoclf train` runs it
    python -m benchmarks.config_path -- --data DATA --set epochs_head=2

Prints the modules by entries, then the totals, then a JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import app
from app.cli import run_cli
from app.config import TrainConfig
from app.table import format_table

APP_ROOT = Path(app.__file__).resolve().parent


@dataclass(frozen=True)
class Edge:
    """A call site that handed the configuration over: caller's module and line, callee's function."""

    caller: str
    site: str
    callee: str
    function: str
    reads: bool = False  # a property of an object that holds the configuration, read


def module_name(filename: str, root: Path = APP_ROOT) -> str | None:
    """`app.training.train` for a file under `root`; None outside it."""
    path = Path(filename)
    if not path.is_relative_to(root):
        return None
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def carries(value: object, kind: type = TrainConfig) -> bool:
    """The value is a `kind`, or holds one as an attribute."""
    if isinstance(value, kind):
        return True
    attributes = getattr(value, "__dict__", None)
    return isinstance(attributes, dict) and any(isinstance(v, kind) for v in list(attributes.values()))


class ConfigTracer:
    """Records each call into `root`'s modules whose arguments carry a `kind`, as an Edge."""

    def __init__(self, root: Path = APP_ROOT, kind: type = TrainConfig) -> None:
        self.root, self.kind, self._prefix = root, kind, str(root)
        self.edges: dict[Edge, None] = {}  # first-seen order

    def __call__(self, frame, event: str, arg) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(self._prefix):
            return
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        arguments = frame.f_locals
        if not any(carries(arguments.get(name), self.kind) for name in code.co_varnames[:count]):
            return
        caller = frame.f_back
        while caller is not None and module_name(caller.f_code.co_filename, self.root) is None:
            caller = caller.f_back
        site = f"{caller.f_code.co_qualname}:{caller.f_lineno}" if caller else "(outside)"
        from_module = module_name(caller.f_code.co_filename, self.root) if caller else "(outside)"
        reads = _is_property(arguments.get("self"), code.co_name)
        edge = Edge(from_module, site, module_name(code.co_filename, self.root), code.co_qualname, reads)
        self.edges.setdefault(edge, None)

    def trace(self, work: Callable[[], object]) -> None:
        sys.setprofile(self)
        threading.setprofile(self)
        try:
            work()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)


def _is_property(owner: object, name: str) -> bool:
    """`name` is a property (or cached property) of `owner`'s class."""
    if owner is None:
        return False
    found = next((vars(k)[name] for k in type(owner).__mro__ if name in vars(k)), None)
    return isinstance(found, property | functools.cached_property)


@dataclass
class PathSummary:
    modules: list[str]
    entries: Counter
    reads: Counter  # of the entries, those that read a property
    reentries: int


def summarise(edges: list[Edge]) -> PathSummary:
    """Modules the configuration reached, entries per module (and of them, property reads), and
    re-entries (entries into a module after its first)."""
    modules = list(dict.fromkeys(e.callee for e in edges))
    crossing = [e for e in edges if e.caller != e.callee]
    entries = Counter(e.callee for e in crossing)
    reads = Counter(e.callee for e in crossing if e.reads)
    return PathSummary(modules, entries, reads, sum(entries.values()) - len(entries))


def report(summary: PathSummary) -> str:
    order = sorted(summary.modules, key=lambda m: -summary.entries[m])
    rows = [[m, str(summary.entries[m]), str(summary.entries[m] - summary.reads[m])] for m in order]
    calls = summary.entries - summary.reads
    totals = (
        f"modules: {len(summary.modules)}; entries: {sum(summary.entries.values())}; re-entries: {summary.reentries};"
        f" most entered: {max(summary.entries.values(), default=0)}; without property reads:"
        f" {sum(calls.values())} entries, most entered {max(calls.values(), default=0)}"
    )
    return f"{format_table([['module', 'entries', 'not property reads'], *rows])}\n\n{totals}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("train_args", nargs="*", help="photoclf train's arguments, after -- (default: the demo)")
    args = parser.parse_args()
    from app.commands import main as photoclf

    tracer = ConfigTracer()
    with tempfile.TemporaryDirectory(prefix="photoclf-config-path-") as out:
        argv = ["train", *(args.train_args or []), *([] if "--out" in args.train_args else ["--out", out])]
        tracer.trace(lambda: _run(photoclf, argv))
    summary = summarise(list(tracer.edges))
    print(report(summary))
    figures = {"modules": summary.modules, "entries": dict(summary.entries), "property_reads": dict(summary.reads)}
    print(json.dumps({**figures, "reentries": summary.reentries}))


def _run(photoclf: Callable, argv: list[str]) -> None:
    try:
        photoclf(argv)
    except SystemExit as done:
        if done.code:
            raise


if __name__ == "__main__":
    run_cli(main)
