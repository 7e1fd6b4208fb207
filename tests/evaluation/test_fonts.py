"""Class names are folder names in any script: the figures say once which characters no installed
font draws, where matplotlib warned of every glyph at every figure."""

from __future__ import annotations

import logging
import warnings

import matplotlib
import numpy as np
from matplotlib.font_manager import FontEntry

from app.evaluation import fonts
from app.evaluation.figures import confusion_matrix_figure, figure_png


def test_characters_no_font_draws_are_said_once_and_matplotlib_warns_of_none(monkeypatch, caplog):
    monkeypatch.setitem(matplotlib.rcParams, "font.family", ["DejaVu Sans"])  # no fallback font, on any host
    monkeypatch.setattr(fonts, "_said", set())
    classes = ["日本", "crème brûlée", "Tea Cup"]
    with caplog.at_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("error")  # a glyph warning would fail the test
        figure_png(confusion_matrix_figure(np.eye(3, dtype=int), classes))
        figure_png(confusion_matrix_figure(np.eye(3, dtype=int), classes))
    said = [r.getMessage() for r in caplog.records if r.name == fonts.__name__]
    assert len(said) == 1 and said[0].startswith("figures: no installed font draws 日本, so those class names")


def test_fallback_fonts_join_dejavu_only_where_installed(monkeypatch):
    installed = [FontEntry(name="DejaVu Sans"), FontEntry(name="Noto Sans CJK JP")]
    monkeypatch.setattr(fonts.font_manager.fontManager, "ttflist", installed)
    monkeypatch.setitem(matplotlib.rcParams, "font.family", ["sans-serif"])
    fonts.use_fallback_fonts()
    assert matplotlib.rcParams["font.family"] == ["DejaVu Sans", "Noto Sans CJK JP"]
