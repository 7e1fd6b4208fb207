"""The readers of files a user hands over (a CSV manifest, dataset.json, a run's state and
config, an image's header), given inputs built by structure: each reads what it can or says why
in one line (UserError, ImageRejected), whatever the shape; every limit holds at the limit and
refuses one past it."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.data import manifest as manifest_csv
from app.data.image_header import ImageRejected, check_size, max_pixels, read_header
from app.data.manifest import ManifestLimits
from app.data.sources import scan_source
from app.errors import UserError
from app.storage import read_json_object
from fuzz.targets import SCRATCH_ENV, TARGETS, image_seeds
from tests.structures import BUDGETS, JSON_VALUES, budget, nested

# Cells a spreadsheet or a hostile user may put in a manifest: separators, quotes, line breaks,
# NUL, a byte-order mark, a home folder's ~, lengths at and past the cell limit.
HOSTILE_CELLS = st.one_of(
    st.sampled_from(["a.jpg", "b.png", "cat", "dog", "train", "val", "test", "", "true", "false", "3.5", "nan"]),
    st.text(alphabet=st.sampled_from(list(',"\n\r\x00\ufeff|;/ .ab\\~')), max_size=8),
    st.sampled_from([4096, 4097]).map(lambda n: "a" * n),
)


@st.composite
def manifests(draw) -> bytes:
    columns = draw(st.integers(1, 7))
    header = draw(st.sampled_from([["path", "label"], ["path", "label", "split"], ["path", "label", "split", "keep"]]))
    header = (header + ["age", "site", "x"])[: max(columns, len(header))]
    rows = draw(st.lists(st.lists(HOSTILE_CELLS, min_size=1, max_size=columns + 1), max_size=12))
    return "\n".join(",".join(row) for row in [header, *rows]).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("examples", BUDGETS)
def test_any_manifest_is_read_or_refused_in_one_line(examples: int, tmp_path: Path, monkeypatch):
    monkeypatch.setenv(SCRATCH_ENV, str(tmp_path))
    run = TARGETS["manifest"].make()  # asserts: a UserError, or a source whose photos all exist

    @budget(examples)
    @given(st.integers(0, 3), manifests())
    def check(flags: int, manifest: bytes) -> None:
        run(bytes([flags]) + manifest)

    check()


@pytest.mark.parametrize("examples", BUDGETS)
def test_any_json_in_a_run_file_is_read_or_refused_in_one_line(examples: int, tmp_path: Path, monkeypatch):
    monkeypatch.setenv(SCRATCH_ENV, str(tmp_path))
    run = TARGETS["run_files"].make()  # dataset.json, state.json, config.json: a UserError at worst

    @budget(examples)
    @given(st.integers(0, 2), JSON_VALUES.map(json.dumps) | nested(max_depth=2000).map(lambda d: d[0]))
    def check(which: int, text: str) -> None:
        run(bytes([which]) + text.encode())

    check()


def test_a_run_file_nested_past_the_limit_is_one_line_naming_it(tmp_path: Path):
    path = tmp_path / "state.json"
    path.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")  # was a RecursionError
    with pytest.raises(UserError, match=r"state.json: nested deeper than 32 levels$"):
        read_json_object(path)


def _photos_and_manifest(folder: Path, rows: list[list[str]]) -> Path:
    for name, data in (("a.jpg", image_seeds()[0]), ("b.png", image_seeds()[2]), ("c.jpg", image_seeds()[0]),
                       ("d.png", image_seeds()[2])):  # fmt: skip
        (folder / name).write_bytes(data)
    manifest = folder / "m.csv"
    with manifest.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    return manifest


def test_each_manifest_limit_holds_at_the_limit_and_refuses_one_past_it(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(manifest_csv, "MANIFEST_LIMITS", ManifestLimits(rows=5, columns=4, cell_chars=12))
    header = ["path", "label", "split", "keep"]
    rows = [["a.jpg", "cat", "train", ""], ["b.png", "dog", "train", ""], ["c.jpg", "cat", "val", ""]]
    at_limit = _photos_and_manifest(tmp_path, [header, *rows, ["d.png", "dog", "val", "true".ljust(12)]])
    assert len(scan_source(at_limit).images) == 4  # 5 rows, the header included; a 12-character cell
    for bad, message in [
        ([header, *rows, *rows], r"m.csv:6: more than 5 rows; split the manifest"),
        ([header, [*rows[0][:3], "", "x"]], r"m.csv:2: 5 columns \(at most 4\)"),
        ([header, ["b.png", "dog", "val", "true".ljust(13)]], r"m.csv:2: a cell of 13 characters \(at most 12\)"),
    ]:
        with pytest.raises(UserError, match=message):
            scan_source(_photos_and_manifest(tmp_path, bad))


def test_a_cell_past_the_csv_readers_own_limit_names_its_line(tmp_path: Path):
    manifest = _photos_and_manifest(tmp_path, [["path", "label"], ["a.jpg", "cat"]])
    manifest.write_text(manifest.read_text() + 'b.png,"' + "d" * 200_000 + '"\n')
    with pytest.raises(UserError, match=r"m.csv:3: not a readable CSV \(field larger than field limit"):
        scan_source(manifest)


def _png(width: int, height: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", width, height) + bytes(40)


def _bmp(width: int, height: int) -> bytes:
    """A 24-bit BITMAPINFOHEADER file's header: the kind TensorFlow's decoder reads."""
    return b"BM" + bytes(12) + struct.pack("<IiiHHI", 40, width, height, 1, 24, 0) + bytes(40)


def _gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + bytes(3) + b";" + bytes(40)


def _signed(side: int) -> int:
    return side - 2**32 if side >= 2**31 else side


SIDES = st.one_of(st.sampled_from([0, 1, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1]), st.integers(0, 2**32 - 1))


@pytest.mark.parametrize("examples", BUDGETS)
def test_header_sizes_at_the_edges_of_their_types_never_pass_as_small(examples: int):
    @budget(examples)
    @given(st.sampled_from(["png", "bmp", "gif"]), SIDES, SIDES)
    def check(kind: str, width: int, height: int) -> None:
        if kind == "png":
            data, (w, h) = _png(width, height), (width, height)
        elif kind == "bmp":  # signed 32-bit sides, as the decoder reads them; a negative height is top-down
            data = _bmp(*(v - 2**32 if v >= 2**31 else v for v in (width, height)))
            w, h = (
                max(width - 2**32 if width >= 2**31 else width, 0),
                abs(height - 2**32 if height >= 2**31 else height),
            )
        else:
            data, (w, h) = _gif(width % 2**16, height % 2**16), (width % 2**16, height % 2**16)
        size = read_header(data)
        assert size.pixels >= min(w * h, 2**63 - 1)  # never below the header's own area
        if w * h > max_pixels(40.0):
            with pytest.raises(ImageRejected, match="the limit is 40 megapixels"):
                check_size(data, 40.0)

    check()


def test_the_pixel_limit_holds_at_the_limit_and_refuses_one_past_it():
    limit = max_pixels(1.0)
    assert check_size(_png(limit, 1), 1.0).pixels == limit
    with pytest.raises(ImageRejected, match="the limit is 1 megapixels") as refused:
        check_size(_png(limit + 1, 1), 1.0)
    assert refused.value.status == 413


def test_a_path_cell_naming_a_home_folder_with_a_nul_byte_is_a_missing_file_not_a_crash(tmp_path: Path):
    """ "~a\0b" made the home-folder lookup raise ValueError (found by `python -m fuzz manifest`)."""
    photos = _photos_and_manifest(tmp_path, [["path", "label"], ["~a\x00b", "cat"], ["a.jpg", "cat"]])
    skipped: list[dict[str, str]] = []
    by_split, _, _ = manifest_csv.read_manifest(photos, skipped, lambda path: True)
    assert [p.name for p in by_split[""]["cat"]] == ["a.jpg"]
    assert skipped == [{"path": "~a\x00b", "reason": "no such file (line 2 of the manifest)"}]
