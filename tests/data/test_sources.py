"""scan_source: layouts, the stratified split, and every bad SRC caught before anything is written."""

from __future__ import annotations

import io
import re
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from app.data.sources import scan_source
from app.errors import UserError


def _jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, format="JPEG")
    return out.getvalue()


def _make_tree(root: Path, layout: dict[str, int]) -> Path:
    """layout: {"class" or "split/class": number of images}."""
    for folder, n in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / folder / f"{i:03d}.jpg").write_bytes(_jpeg())
    return root


def _counts(source) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for image in source.images:
        out.setdefault(image.split, Counter())[image.class_name] += 1
    return out


def test_split_is_stratified_and_seeded(tmp_path: Path):
    src = _make_tree(tmp_path, {"a": 100, "b": 40})
    source = scan_source(src, val_fraction=0.1, test_fraction=0.2, seed=3)
    # b's val fraction would be 4: it gets the floor of 5 photos an evaluation split takes of a class
    assert _counts(source) == {"train": Counter(a=70, b=27), "val": Counter(a=10, b=5), "test": Counter(a=20, b=8)}
    assert source.classes == ["a", "b"]
    again = scan_source(src, val_fraction=0.1, test_fraction=0.2, seed=3)
    other = scan_source(src, val_fraction=0.1, test_fraction=0.2, seed=4)
    assert again.images == source.images
    assert {i.relpath for i in other.images if i.split == "val"} != {
        i.relpath for i in source.images if i.split == "val"
    }


def _splits_of(source) -> dict[str, str]:
    return {image.relpath: image.split for image in source.images}


def test_photos_added_to_a_class_leave_the_earlier_ones_in_their_splits(tmp_path: Path):
    """The photos a model trained on must stay out of the val and test splits of the same folder
    grown and converted again (its --init-from run would be scored on them). With 8 more photos
    in a class of 80, then 32 more: 2 and then none of the earlier training photos join val or
    test, where a shuffle of the whole class sent 9 of the 18 and 15 of the 24 there."""
    src = _make_tree(tmp_path / "photos", {"a": 80, "b": 30})
    before = _splits_of(scan_source(src, seed=0))
    trained_on = {path for path, split in before.items() if split == "train"}
    for added, joined in ((8, 2), (40, 0)):
        for i in range(added):
            (src / "a" / f"new{i:03d}.jpg").write_bytes(_jpeg())
        after = _splits_of(scan_source(src, seed=0))
        evaluated = {path for path, split in after.items() if split != "train"}
        assert len(evaluated) == (18 if added == 8 else 24) + 10  # a's val and test, and b's
        assert len(trained_on & evaluated) == joined
        assert all(after[path] == split for path, split in before.items() if path.startswith("b/"))
        moved_out = {p for p, split in before.items() if split != "train" and after[p] == "train"}
        assert len(moved_out) <= added  # only a new photo that hashes lower pushes one out


def test_the_split_does_not_depend_on_where_the_folder_is(tmp_path: Path):
    first = _splits_of(scan_source(_make_tree(tmp_path / "here", {"a": 30, "b": 30})))
    moved = _splits_of(scan_source(_make_tree(tmp_path / "else" / "where", {"a": 30, "b": 30})))
    assert moved == first


def test_what_macos_and_windows_leave_in_a_folder_is_neither_a_class_nor_a_photo(tmp_path: Path):
    src = _make_tree(tmp_path, {"a": 12, "b": 12, "__MACOSX/a": 0})
    (src / "__MACOSX" / "a" / "._000.jpg").write_bytes(b"\x00\x05\x16\x07")
    (src / "a" / "Thumbs.db").write_bytes(b"x")
    (src / "b" / "desktop.ini").write_bytes(b"[.ShellClassInfo]")
    source = scan_source(src)
    assert source.classes == ["a", "b"] and source.skipped == []
    assert len(source.images) == 24


def test_a_small_class_gives_each_evaluation_split_five_photos_where_it_can_spare_them(tmp_path: Path):
    """The README's fractions on 25 photos a class left 2 in val: a split whose accuracy moves by
    8 points a photo. A class keeps at least half of its photos for training."""
    src = _make_tree(tmp_path, {"a": 25, "b": 8, "c": 100})
    source = scan_source(src, val_fraction=0.1, test_fraction=0.1, seed=0)
    counts = _counts(source)
    assert counts == {
        "train": Counter(a=15, b=4, c=80),
        "val": Counter(a=5, b=2, c=10),
        "test": Counter(a=5, b=2, c=10),
    }
    only_val = _counts(scan_source(src, val_fraction=0.1, test_fraction=0.0, seed=0))
    assert only_val == {"train": Counter(a=20, b=6, c=90), "val": Counter(a=5, b=2, c=10)}


def test_the_summary_warns_of_an_evaluation_split_with_few_photos_a_class():
    from app.data.summary import few_photos_warning

    counts = {"train": {"a": 20, "b": 20}, "val": {"a": 5, "b": 2}, "test": {"a": 5, "b": 5}}
    (warning,) = few_photos_warning(counts, ["a", "b"])
    assert warning.startswith("WARNING: val holds fewer than 5 photos of b (2): on 7 photos one photo moves")
    assert few_photos_warning({"val": {"a": 5, "b": 6}}, ["a", "b"]) == []


def test_presplit_folders_are_kept_as_given(tmp_path: Path):
    src = _make_tree(tmp_path, {"train/a": 5, "train/b": 6, "val/a": 2, "val/b": 1})
    source = scan_source(src, val_fraction=0.5)
    assert source.layout == "presplit"
    assert _counts(source) == {"train": Counter(a=5, b=6), "val": Counter(a=2, b=1)}
    assert all(i.relpath.startswith(i.split + "/") for i in source.images)


def test_manifest_with_and_without_split(tmp_path: Path):
    _make_tree(tmp_path / "img", {"x": 4})
    rows = [f"img/x/{i:03d}.jpg" for i in range(4)]
    (tmp_path / "m.csv").write_text(
        "path,label,split\n"
        + "".join(f"{p},{'cat' if i % 2 else 'dog'},{'train' if i < 2 else 'val'}\n" for i, p in enumerate(rows))
    )
    source = scan_source(tmp_path / "m.csv")
    assert source.layout == "manifest"
    assert _counts(source) == {"train": Counter(cat=1, dog=1), "val": Counter(cat=1, dog=1)}
    (tmp_path / "n.csv").write_text(
        "path,label\n" + "".join(f"{p},{'cat' if i % 2 else 'dog'}\n" for i, p in enumerate(rows))
    )
    assert _counts(scan_source(tmp_path / "n.csv", val_fraction=0, test_fraction=0)) == {"train": Counter(cat=2, dog=2)}


def test_hidden_and_zero_byte_files(tmp_path: Path):
    src = _make_tree(tmp_path, {"a": 3, "b": 3})
    (src / "a" / ".DS_Store").write_bytes(b"junk")
    (src / ".hidden_class").mkdir()
    (src / "b" / "empty.jpg").write_bytes(b"")
    source = scan_source(src, val_fraction=0, test_fraction=0)
    assert source.classes == ["a", "b"] and len(source.images) == 6
    assert source.skipped == [{"path": "b/empty.jpg", "reason": "zero-byte file"}]


def test_a_broken_link_is_listed_as_skipped_not_dropped_silently(tmp_path: Path):
    src = _make_tree(tmp_path / "src", {"a": 3, "b": 3})
    (src / "b" / "moved.jpg").symlink_to(tmp_path / "gone.jpg")
    (src / "a" / "linked.jpg").symlink_to(src / "a" / "000.jpg")  # a link that resolves is a photo like any other
    source = scan_source(src, val_fraction=0, test_fraction=0)
    assert len(source.images) == 7
    assert source.skipped == [{"path": "b/moved.jpg", "reason": "broken link (its target is missing)"}]


@pytest.mark.parametrize(
    "layout,kwargs,message",
    [
        ({}, {}, "empty"),
        ({"only": 5}, {}, "at least 2"),
        ({"a": 5, "b": 0}, {}, r"b: class folder holds no usable files \(add photos, or move it out\)$"),
        ({"a": 5, "b\tc": 5}, {}, "b\tc: a class folder's name becomes the model's label, and this one is not"),
        ({"a": 20, "b": 3}, {"val_fraction": 0.1, "test_fraction": 0.0}, "class 'b' gets no images in split 'val'"),
        ({"train/a": 2, "test/a": 2}, {}, "needs both train/ and val/"),
        ({"a": 5, "b": 5}, {"val_fraction": 0.6, "test_fraction": 0.5}, "must leave images for training"),
    ],
)
def test_bad_sources_fail_with_clear_message(tmp_path: Path, layout, kwargs, message):
    src = _make_tree(tmp_path / "src", layout)
    src.mkdir(exist_ok=True)
    with pytest.raises(UserError, match=message):
        scan_source(src, **kwargs)


def test_a_class_folder_whose_name_is_not_utf8_is_refused_naming_it(tmp_path: Path):
    """Its name becomes a label, which must be text; convert ended in UnicodeEncodeError mid-write."""
    import os

    src = _make_tree(tmp_path / "src", {"a": 5, "b": 5})
    try:
        (src / "b").rename(os.fsdecode(bytes(src) + b"/caf\xe9"))
    except OSError:
        pytest.skip("this file system takes UTF-8 names only")
    with pytest.raises(UserError, match=r"caf\udce9: a class folder's name becomes the model's label"):
        scan_source(src)


def test_missing_src(tmp_path: Path):
    with pytest.raises(UserError, match="no such file or folder"):
        scan_source(tmp_path / "nope")


def test_manifest_may_carry_review_columns_and_keep_false_leaves_a_row_out(tmp_path: Path):
    for name in ("a.jpg", "b.jpg", "c.jpg", "d.jpg", "e.jpg"):
        Image.new("RGB", (40, 40), (10, 20, 30)).save(tmp_path / name)
    manifest = tmp_path / "reviewed.csv"
    manifest.write_text(
        "path,label,split,finding,keep\n"
        "a.jpg,cat,train,,true\nb.jpg,dog,train,,1\ne.jpg,cat,val,leak of b.jpg,false\n"
        "c.jpg,dog,val,,yes\nd.jpg,cat,val,,\n"
    )
    source = scan_source(manifest)
    assert [(i.path.name, i.class_name, i.split) for i in source.images] == [
        ("a.jpg", "cat", "train"),
        ("b.jpg", "dog", "train"),
        ("d.jpg", "cat", "val"),
        ("c.jpg", "dog", "val"),
    ]
    assert source.skipped == [{"path": "e.jpg", "reason": "keep = false in the manifest"}]
    manifest.write_text("label,path\ncat,a.jpg\n")
    with pytest.raises(UserError, match="header 'path,label'"):
        scan_source(manifest)


def test_a_spreadsheets_manifest_reads_like_any_other(tmp_path: Path):
    """Saved by a spreadsheet: UTF-8 with a byte-order mark, CRLF line ends, quoted cells; labels
    that are not plain ASCII (or look like markup) are data like any other."""
    _make_tree(tmp_path / "img", {"x": 4})
    labels = ["Çiçek, wild", "<img src=x onerror=alert(1)>"]
    rows = "".join(f'img/x/{i:03d}.jpg,"{labels[i % 2]}"\r\n' for i in range(4))
    (tmp_path / "excel.csv").write_bytes(("\ufeffpath,label\r\n" + rows).encode("utf-8"))
    (tmp_path / "plain.csv").write_text("path,label\n" + rows.replace("\r\n", "\n"), encoding="utf-8")
    excel, plain = scan_source(tmp_path / "excel.csv", 0.5), scan_source(tmp_path / "plain.csv", 0.5)
    assert excel.classes == sorted(labels)
    assert [(i.path, i.class_name, i.split) for i in excel.images] == [
        (i.path, i.class_name, i.split) for i in plain.images
    ]


def test_a_manifest_saved_with_semicolons_is_refused_saying_so(tmp_path: Path):
    """A spreadsheet in many locales saves CSV with semicolons: the header names the separator."""
    _make_tree(tmp_path / "img", {"x": 2})
    (tmp_path / "m.csv").write_text("path;label\nimg/x/000.jpg;cat\nimg/x/001.jpg;dog\n")
    with pytest.raises(UserError, match="header 'path,label'.*separated by ';': save it with commas$"):
        scan_source(tmp_path / "m.csv")
    (tmp_path / "other.csv").write_text("file,class\nimg/x/000.jpg,cat\n")
    with pytest.raises(UserError, match=r"\(more columns may follow\), not 'file,class'$"):  # no separator to blame
        scan_source(tmp_path / "other.csv")


def test_a_spreadsheets_capitalised_header_reads_as_the_lower_case_one(tmp_path: Path):
    """'Path,Label,Split,Keep' as a spreadsheet writes it reads as 'path,label,split,keep'."""
    _make_tree(tmp_path / "img", {"x": 5})
    rows = [
        "000.jpg,cat,train,yes",
        "001.jpg,dog,train,yes",
        "002.jpg,cat,val,yes",
        "003.jpg,dog,val,",
        "004.jpg,cat,train,no",
    ]
    (tmp_path / "m.csv").write_text(" Path ,LABEL,Split,Keep\n" + "".join(f"img/x/{row}\n" for row in rows))
    source = scan_source(tmp_path / "m.csv")
    assert [(i.path.name, i.class_name, i.split) for i in source.images] == [
        ("000.jpg", "cat", "train"),
        ("001.jpg", "dog", "train"),
        ("002.jpg", "cat", "val"),
        ("003.jpg", "dog", "val"),
    ]
    assert source.skipped == [{"path": "img/x/004.jpg", "reason": "keep = no in the manifest"}]


def test_labels_that_differ_only_in_case_are_two_classes_and_said_so(tmp_path: Path):
    """'A' and 'a' may be two letters; 'Tulip' and 'tulip' are most often one class typed twice.
    Kept apart, and named wherever they surface: a class left without val photos, the summary."""
    from app.data.sources import case_twins
    from app.data.summary import format_summary

    _make_tree(tmp_path / "img", {"x": 12})
    labels = ["tulip"] * 5 + ["Tulip"] + ["rose"] * 6
    (tmp_path / "m.csv").write_text("path,label\n" + "".join(f"img/x/{i:03d}.jpg,{n}\n" for i, n in enumerate(labels)))
    with pytest.raises(UserError, match="class 'Tulip' gets no images in split 'val'.*'Tulip' and 'tulip' differ only"):
        scan_source(tmp_path / "m.csv", 0.3)
    assert scan_source(tmp_path / "m.csv", 0.0, 0.0).classes == ["Tulip", "rose", "tulip"]
    assert case_twins(["a", "A", "b", "B", "c", "Ä", "ä"]) == [["A", "a"], ["B", "b"], ["Ä", "ä"]]
    meta = {"classes": ["Tulip", "rose", "tulip"], "counts": {"train": {"Tulip": 1, "rose": 6, "tulip": 5}},
            "shards": {"train": ["s"]}, "bytes": 0, "reencoded": 0, "skipped": []}  # fmt: skip
    (warning,) = [line for line in format_summary(meta, "out").splitlines() if "case" in line]
    assert warning.startswith("WARNING: 'Tulip' and 'tulip' differ only in case, so they are separate classes")


def test_a_manifest_row_whose_file_is_missing_is_skipped_and_listed(tmp_path: Path):
    _make_tree(tmp_path / "img", {"x": 4})
    (tmp_path / "m.csv").write_text(
        "path,label,split\n"
        "img/x/000.jpg,cat,train\nimg/x/001.jpg,dog,train\ngone.jpg,dog,train\n"
        "img/x/002.jpg,cat,val\nimg/x/003.jpg,dog,val\n"
    )
    source = scan_source(tmp_path / "m.csv")
    assert len(source.images) == 4
    assert source.skipped == [{"path": "gone.jpg", "reason": "no such file (line 4 of the manifest)"}]


def test_a_manifest_whose_rows_all_name_missing_files_says_where_relative_paths_are_read(tmp_path: Path):
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "m.csv").write_text("path,label\nimg/x/000.jpg,cat\nimg/x/001.jpg,dog\n")
    with pytest.raises(UserError, match=re.escape(
        "m.csv: no row names a file that exists (2 missing, the first 'img/x/000.jpg'); a relative path is read"
        f" from the manifest's folder, {(tmp_path / 'lists').resolve()}"
    )):  # fmt: skip
        scan_source(tmp_path / "lists" / "m.csv")


def test_a_manifest_path_may_start_at_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _make_tree(tmp_path / "img", {"x": 4})
    (tmp_path / "lists").mkdir()
    rows = "".join(f"~/img/x/00{i}.jpg,{'cat' if i % 2 else 'dog'},{'train' if i < 2 else 'val'}\n" for i in range(4))
    (tmp_path / "lists" / "m.csv").write_text(f"path,label,split\n{rows}~no_such_user_9/a.jpg,cat,train\n")
    source = scan_source(tmp_path / "lists" / "m.csv")  # an unknown user's ~ stays a name: a missing file
    assert len(source.images) == 4 and source.skipped[0]["path"] == "~no_such_user_9/a.jpg"


def test_a_photo_listed_twice_is_kept_once_and_one_listed_as_two_classes_or_splits_is_refused(tmp_path: Path):
    _make_tree(tmp_path / "img", {"x": 4})
    rows = "img/x/000.jpg,cat,train\nimg/x/001.jpg,dog,train\nimg/x/002.jpg,cat,val\nimg/x/003.jpg,dog,val\n"
    (tmp_path / "m.csv").write_text(f"path,label,split\n{rows}./img/x/001.jpg,dog,train\n")
    source = scan_source(tmp_path / "m.csv")
    assert len(source.images) == 4
    assert source.skipped == [{"path": "./img/x/001.jpg", "reason": "listed again (line 3), kept once"}]
    for again, said in (("cat,train", "'dog' in train and here as 'cat' in train"),
                        ("dog,test", "'dog' in train and here as 'dog' in test")):  # fmt: skip
        (tmp_path / "m.csv").write_text(f"path,label,split\n{rows}img/x/001.jpg,{again}\n")
        with pytest.raises(UserError, match=re.escape(f"m.csv:6: img/x/001.jpg was listed at line 3 as {said};")):
            scan_source(tmp_path / "m.csv")


def test_a_label_with_a_line_break_is_refused_naming_its_line(tmp_path: Path):
    _make_tree(tmp_path / "img", {"x": 2})
    (tmp_path / "m.csv").write_text('path,label\nimg/x/000.jpg,cat\nimg/x/001.jpg,"two\nlines"\n')
    with pytest.raises(UserError, match=r"m.csv:3: label 'two\\nlines' holds a line break; a label is one line"):
        scan_source(tmp_path / "m.csv")


def test_a_folder_without_class_folders_is_refused_saying_what_it_holds(tmp_path: Path):
    photos = _make_tree(tmp_path, {"ramen": 3}) / "ramen"
    with pytest.raises(UserError, match=re.escape(f"{photos}: 3 file(s) but no class folders; put each class's")):
        scan_source(photos)  # one class's photos, given as if they were the classes
    records = tmp_path / "records"
    records.mkdir()
    (records / "dataset.json").write_text("{}")
    with pytest.raises(UserError, match=f"^{re.escape(str(records))}: a TFRecord folder .* photoclf train --data"):
        scan_source(records)  # converted already
    (tmp_path / "nothing").mkdir()
    with pytest.raises(UserError, match="nothing: empty; expected one subfolder per class"):
        scan_source(tmp_path / "nothing")


def test_a_split_that_leaves_val_empty_is_refused_before_anything_is_written(tmp_path: Path):
    """3 photos a class at the default fraction give val nothing, and photoclf train refuses data
    without val photos: said here, not after the shards were written."""
    src = _make_tree(tmp_path / "src", {"a": 3, "b": 3})
    with pytest.raises(UserError, match=r"no photo goes to val \(the largest class has 3: too few at --val-fraction"):
        scan_source(src)
    assert _counts(scan_source(src, val_fraction=0.34))["val"] == Counter(a=1, b=1)  # a larger fraction spares one
    assert not _counts(scan_source(src, val_fraction=0.0, test_fraction=0.0)).get("val")  # no val, as asked


def test_the_summary_warns_of_data_without_val_photos():
    from app.data.summary import format_summary

    meta = {"counts": {"train": {"a": 3, "b": 3}}, "classes": ["a", "b"], "shards": {"train": ["t"]}, "bytes": 0,
            "reencoded": 0, "skipped": []}  # fmt: skip
    assert "WARNING: no val photos: photoclf train will refuse this data" in format_summary(meta, "out")


def test_photos_in_a_linked_folder_are_read_and_a_link_looping_back_is_passed_over(tmp_path: Path):
    """A class folder holding a link to more photos of it: passed over before, without a word."""
    src = _make_tree(tmp_path / "src", {"a": 8, "b": 8})
    more = _make_tree(tmp_path / "elsewhere", {"b_2019": 4}) / "b_2019"
    (src / "b" / "2019").symlink_to(more, target_is_directory=True)
    (src / "b" / "loop").symlink_to(src, target_is_directory=True)  # its walk would reach a's photos as b's
    (src / "b" / "self").symlink_to(src / "b", target_is_directory=True)  # and b's own twice
    source = scan_source(src, val_fraction=0.25, test_fraction=0.0)
    assert {name: sum(c[name] for c in _counts(source).values()) for name in ("a", "b")} == {"a": 8, "b": 12}
    assert sorted(i.relpath for i in source.images if "2019" in i.relpath) == [f"b/2019/{i:03d}.jpg" for i in range(4)]
