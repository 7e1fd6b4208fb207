"""Which photo files a command was pointed at, from a list of paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.data.photo_lists import list_inputs


def test_a_list_s_paths_are_read_from_its_folder_from_home_or_as_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "paths.txt").write_text(f"# new photos\nhere.jpg\n~/shots/a.jpg\n{tmp_path / 'abs.jpg'}\n")
    (lists / "paths.csv").write_text("label,path\ncat,~/shots/b.jpg\ndog,~no_such_user_9/c.jpg\n")
    assert list_inputs(str(lists / "paths.txt")) == [
        lists / "here.jpg",
        tmp_path / "home/shots/a.jpg",
        tmp_path / "abs.jpg",
    ]
    assert list_inputs(str(lists / "paths.csv")) == [tmp_path / "home/shots/b.jpg", lists / "~no_such_user_9/c.jpg"]
    (lists / "excel.csv").write_text("path,label\r\nhere.jpg,cat\r\n", encoding="utf-8-sig")  # a spreadsheet's
    assert list_inputs(str(lists / "excel.csv")) == [lists / "here.jpg"]  # its byte-order mark is not a path's
