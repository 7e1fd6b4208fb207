"""The plain-text tables the commands print line up in a terminal, whatever script a class is named in."""

from __future__ import annotations

import unicodedata

from app.table import display_width, format_table


def test_columns_line_up_for_wide_and_combining_characters():
    decomposed = unicodedata.normalize("NFD", "crème")  # a file system may hand back e + a combining accent
    rows = [["class", "train"], ["日本", "7"], [decomposed, "6"], ["Tea Cup", "12"]]
    lines = format_table(rows).splitlines()
    assert lines == ["class    train", "-------  -----", "日本         7", f"{decomposed}        6", "Tea Cup     12"]
    assert {display_width(line) for line in lines} == {14}
    assert display_width("日本") == 4 and display_width(decomposed) == 5 and len(decomposed) == 6
