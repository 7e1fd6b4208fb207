"""benchmarks.config_path: which modules a configuration is handed to, and how often it returns."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.config_path import ConfigTracer, Edge, carries, module_name, summarise


class Settings:
    pass


class Holder:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings


@pytest.fixture
def toy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """pkg.a hands its settings to pkg.b twice (two call sites) and b hands a holder back to a;
    b reads a property of a's Box, which holds them; a call without the settings is not counted."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text(
        textwrap.dedent(
            """
            from pkg import b

            def start(settings):
                b.work(settings)
                b.work(settings)
                b.plain(1)
                b.hand_back(settings)
                b.peek(Box(settings))

            class Box:
                def __init__(self, settings):
                    self.settings = settings

                @property
                def size(self):
                    return 1

            def receive(holder):
                return inner(holder.settings)

            def inner(settings):
                return 1
            """
        )
    )
    (root / "b.py").write_text(
        textwrap.dedent(
            """
            def work(settings):
                return settings

            def plain(x):
                return x

            def hand_back(settings):
                from pkg import a
                from tests.benchmarks.test_config_path import Holder
                return a.receive(Holder(settings))

            def peek(box):
                return box.size
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root, importlib.import_module("pkg.a")
    for name in ("pkg", "pkg.a", "pkg.b"):
        sys.modules.pop(name, None)


def test_the_trace_counts_each_call_site_that_hands_the_settings_to_another_module(toy_package):
    root, a = toy_package
    tracer = ConfigTracer(root, Settings)
    tracer.trace(lambda: a.start(Settings()))
    edges = list(tracer.edges)
    assert [(e.caller, e.callee, e.function) for e in edges] == [
        ("(outside)", "pkg.a", "start"),
        ("pkg.a", "pkg.b", "work"),  # two call sites, one function: two edges, one line each
        ("pkg.a", "pkg.b", "work"),
        ("pkg.a", "pkg.b", "hand_back"),
        ("pkg.b", "pkg.a", "receive"),  # a Holder of the settings carries them
        ("pkg.a", "pkg.a", "inner"),
        ("pkg.a", "pkg.a", "Box.__init__"),
        ("pkg.a", "pkg.b", "peek"),
        ("pkg.b", "pkg.a", "Box.size"),
    ]
    assert [e.function for e in edges if e.reads] == ["Box.size"]
    summary = summarise(edges)
    assert summary.modules == ["pkg.a", "pkg.b"]
    assert summary.entries == {"pkg.a": 3, "pkg.b": 4} and summary.reads == {"pkg.a": 1}
    assert summary.reentries == 5  # 7 entries into 2 modules


def test_module_names_and_what_carries_a_configuration(tmp_path: Path):
    root = tmp_path / "app"
    assert module_name(str(root / "training" / "train.py"), root) == "app.training.train"
    assert module_name(str(root / "training" / "__init__.py"), root) == "app.training"
    assert module_name(str(tmp_path / "elsewhere.py"), root) is None
    assert carries(Settings(), Settings) and carries(Holder(Settings()), Settings)
    assert not carries(1, Settings) and not carries(Holder(None), Settings)


def test_summary_of_no_edges_is_empty():
    summary = summarise([Edge("x", "f:1", "x", "g")])
    assert summary.modules == ["x"] and not summary.entries and summary.reentries == 0


@pytest.mark.slow  # a whole run, traced
@pytest.mark.export_files  # the whole export, model card included, as a user's run writes it
def test_a_run_s_configuration_reaches_at_most_25_modules_none_entered_more_than_5_times(tiny_config):
    """The bounds the configuration's path was redesigned to (benchmarks/README.md, "The
    configuration's path"), held on a tiny run of the train command, which takes a path close to
    the demo's (the benchmark traces the demo itself)."""
    from app.commands import main as photoclf
    from benchmarks.config_path import _run

    cfg = tiny_config
    argv = ["train", "--data", cfg.data, "--out", cfg.out, "--backbone", cfg.backbone, "--weights", "none",
            "--image-size", "64", "--epochs-finetune", "1", "--set", "epochs_head=1", "--set", "batch_size=8",
            "--set", "max_steps_per_epoch=2", "--set", "unfreeze=blocks:2"]  # fmt: skip
    tracer = ConfigTracer()
    tracer.trace(lambda: _run(photoclf, argv))
    summary = summarise(list(tracer.edges))
    assert "app.training.train" in summary.modules and "app.export.run_export" in summary.modules  # a whole run
    assert len(summary.modules) <= 25, summary.modules
    assert max(summary.entries.values()) <= 5, summary.entries
