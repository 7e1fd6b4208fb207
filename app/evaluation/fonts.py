"""Fonts for figures whose labels are class names, which are folder names in any script. An
installed font with the glyphs DejaVu Sans lacks joins it (matplotlib falls back glyph by glyph),
and text no installed font draws is said once, with the fix, where matplotlib warned per glyph."""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Iterator

import matplotlib
from matplotlib import font_manager, ft2font
from matplotlib.text import Text

log = logging.getLogger(__name__)

# Fonts that cover what DejaVu Sans does not (CJK, Thai, Devanagari...), on Linux, macOS and Windows.
FALLBACK_FONTS = (
    "Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK KR", "Source Han Sans",
    "WenQuanYi Zen Hei", "Droid Sans Fallback", "IPAGothic", "Noto Sans Thai", "Noto Sans Devanagari",
    "Hiragino Sans", "PingFang SC", "Apple SD Gothic Neo", "Microsoft YaHei", "Yu Gothic", "Malgun Gothic",
    "Nirmala UI", "Leelawadee UI", "Arial Unicode MS",
)  # fmt: skip
_said: set[str] = set()


def use_fallback_fonts() -> None:
    installed = {font.name for font in font_manager.fontManager.ttflist}
    matplotlib.rcParams["font.family"] = ["DejaVu Sans", *(name for name in FALLBACK_FONTS if name in installed)]


@functools.cache
def _characters_of(font_path: str) -> frozenset[int]:
    return frozenset(ft2font.FT2Font(font_path).get_charmap())


def _drawable(character: str) -> bool:
    fonts = [font_manager.findfont(name, fallback_to_default=False) for name in matplotlib.rcParams["font.family"]]
    return any(ord(character) in _characters_of(path) for path in fonts)


@contextlib.contextmanager
def drawing(fig) -> Iterator[None]:
    """Around drawing `fig`: its missing glyphs said once (`say_missing_glyphs`), not warned of."""
    say_missing_glyphs(fig)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        yield


def say_missing_glyphs(fig) -> None:
    """One log line for the characters of `fig`'s text that no font in use draws (shown as boxes)."""
    characters = {c for text in fig.findobj(Text) for c in text.get_text() if ord(c) > 127 and not c.isspace()}
    missing = sorted(c for c in characters - _said if not _drawable(c))
    if missing:
        _said.update(missing)
        log.warning(
            "figures: no installed font draws %s, so those class names show boxes; install a font that has them"
            " (Debian/Ubuntu: fonts-noto-cjk for Chinese, Japanese and Korean)",
            "".join(missing),
        )
