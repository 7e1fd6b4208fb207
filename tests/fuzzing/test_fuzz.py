"""The fuzz targets (fuzz/): each takes its own seeds, the runner reports what libFuzzer finds,
and every input the targets found is a regression test here (the server's is in
tests/serving/test_server.py, the header reader's in tests/data/test_image_header.py)."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.data.convert import ImageRejected, convert_image
from app.data.pipeline import load_dataset_info
from app.data.sources import scan_source
from app.errors import UserError
from app.run_dir import RunDir, check_run_state
from fuzz.child import _saving_crashes
from fuzz.run import _read_report
from fuzz.targets import SCRATCH_ENV, TARGETS, image_seeds

pytestmark = pytest.mark.start_first  # its tests take over a minute in all

REPO = Path(__file__).resolve().parents[2]

# Found by python -m fuzz convert: Pillow's frame count of this cut-short GIF raised IndexError.
TRUNCATED_GIF = base64.b64decode(
    "R0lGODdhGAAQAAsLCwsLCwsjJCUiIyQhIiMgISIfICEeHyAdHh8cHR4bHB0aHxwZGhsYGRoXGBkWFxgVFhcUFRYTFBUSExQR"
    "MhMQERIPEDoRDg8QDQ4PDA0hDgsMDQoCAAAAAAAAAAAAAAAAAAAILAAAAAAYABAAAAAAAAAAAAAAAF5fXF1eW1xdWltcWVpb"
    "WFlaV1hZVldYVVZXVFVW+gABU1RVUkBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBUUVJTUFFST1BRTk9QTU5PTE1OS0xqTUpL"
    "TElKS0hJSkdISUZHDxARDg8QDQ4PDA0OCwwAAA0vCwwJCgsICQoHCAkGB0Y0N2EYCAUGBwQFBgMEBQIDBAECAwABKissKSor"
    "KCkqJ9jW2dYoIiYnJCUmIyQlIiMkISIjCwwJCgsICQoHCAkGBwgF"
)

# Found by python -m fuzz convert: junk before a marker; Pillow decodes it, TensorFlow does not.
JUNK_BEFORE_MARKER = base64.b64decode(
    "/9j/AAEA/9sAQwAIBgYy/9sAYwEJCQn/////////MjIyAQkyMjIvMjIyMgAJPQAAAABkMjIpMv/CABEIABAAGAMBAAgBAQAB"
    "ESEt/9n/2P8AAQD/2wBDAAgGBjL/2wBjAQkJCf////////8yMjIBCT0A////MjIyMs/Pz8/PzzIyzzIyMjIyMjIyLzIyMjIy"
    "MjJyZDIyKTL/wgARCAAQABgDASIAAhEBAxEAD//EAB0QAQACAgMBAQAAAAAAAAAAAAERISEAYTJRgfD/2gAIAQEAAREhLf/Z"
)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_target_takes_its_own_seeds(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(SCRATCH_ENV, str(tmp_path))  # the targets' files go here, not to a folder left in /tmp
    run = TARGETS[name].make()
    for seed in TARGETS[name].seeds():
        run(seed)  # a seed that raised would be a crash before any fuzzing


def test_list_names_every_target_and_a_wrong_name_is_one_line():
    listed = subprocess.run([sys.executable, "-m", "fuzz", "--list"], cwd=REPO, capture_output=True, text=True)
    assert listed.returncode == 0 and [line.split()[0] for line in listed.stdout.splitlines()] == list(TARGETS)
    wrong = subprocess.run([sys.executable, "-m", "fuzz", "nope"], cwd=REPO, capture_output=True, text=True)
    assert wrong.returncode == 2 and "TARGET: expected one of image_header" in wrong.stderr.splitlines()[-1]


def test_an_input_that_raises_is_saved_before_libfuzzer_sees_it(tmp_path: Path):
    def broken(data: bytes) -> None:
        raise KeyError(data)

    with pytest.raises(KeyError):
        _saving_crashes(broken, str(tmp_path))(b"boom")
    (saved,) = tmp_path.iterdir()
    assert saved.name.startswith("crash-") and saved.read_bytes() == b"boom"


def test_the_report_counts_what_libfuzzer_said(tmp_path: Path):
    log = "READY rss 640 MB\n#512\tpulse cov: 3 rss: 650Mb\n=== Uncaught Python exception: ===\nKeyError: 'x'\n"
    found = tmp_path / "crash-abc"
    report = _read_report("manifest", 9, log, {found})
    assert (report.executions, report.start_rss_mb, report.peak_rss_mb) == (512, 640, 650)
    assert report.found == {"crash": [found]} and report.first_error == "KeyError: 'x'"
    assert "1 crashes, 0 hangs, 0 memory blow-ups" in report.summary() and report.failed
    clean = _read_report("manifest", 9, "READY rss 640 MB\nstat::number_of_executed_units: 2048\n", set())
    assert not clean.failed and clean.executions == 2048 and "FAILED" not in clean.summary()


@pytest.mark.parametrize(
    ("log", "returncode", "why"),
    [
        ("Traceback ...\nFileExistsError: [Errno 17] File exists: 'scratch/run'\n", 1, "set-up failed"),
        ("READY rss 640 MB\nstat::number_of_executed_units: 0\n", 0, "no input was executed"),
        (
            "READY rss 640 MB\n#4096\tpulse cov: 3 rss: 650Mb\n",
            -9,
            "the fuzzing process exited with code -9 and saved no input",
        ),
    ],
)
def test_a_run_that_tested_nothing_or_died_fails_and_says_why(log: str, returncode: int, why: str):
    report = _read_report("run_files", 4, log, set(), returncode)
    assert report.failed and not any(report.found.values())
    assert f"FAILED: {why}" in report.summary()
    if "READY" not in log:  # the reason is the log's last line, not a blank
        assert report.first_error == "FileExistsError: [Errno 17] File exists: 'scratch/run'"


def test_a_gif_pillow_cannot_count_the_frames_of_is_skipped_with_a_reason():
    assert TRUNCATED_GIF.startswith(b"GIF87a")
    with pytest.raises(ImageRejected, match="^undecodable: index out of range$"):
        convert_image(TRUNCATED_GIF, max_side=64)
    assert convert_image(image_seeds()[4]).reencoded  # the same format, whole, converts


def test_a_jpeg_only_pillow_can_decode_is_stored_re_encoded_not_byte_for_byte():
    import tensorflow as tf

    converted = convert_image(JUNK_BEFORE_MARKER, max_side=64)
    assert converted.reencoded and (converted.height, converted.width) == (16, 24)
    assert tuple(tf.io.decode_jpeg(converted.jpeg, channels=3).shape) == (16, 24, 3)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_jpeg(JUNK_BEFORE_MARKER, channels=3)  # what the pipeline would have met
    assert not convert_image(image_seeds()[0]).reencoded  # a sound JPEG is still kept as it is


def _photos(folder: Path) -> None:
    for name, data in (("a.jpg", image_seeds()[0]), ("b.png", image_seeds()[2])):
        (folder / name).write_bytes(data)


def test_a_manifest_that_is_not_utf8_is_one_line_naming_it(tmp_path: Path):
    _photos(tmp_path)
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(b"path,label\na.jpg,cat\nb.png,\xc6dog\n")  # found: a Latin-1 byte
    with pytest.raises(UserError, match=r"m.csv:3: not UTF-8 text \(save the manifest as UTF-8 CSV\)$"):
        scan_source(manifest)


def test_a_manifest_path_no_file_can_have_is_skipped_like_a_missing_one(tmp_path: Path):
    _photos(tmp_path)
    for name in ("c.jpg", "d.png"):  # one row a photo
        (tmp_path / name).write_bytes((tmp_path / f"{'a.jpg' if name == 'c.jpg' else 'b.png'}").read_bytes())
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label\na.jpg,cat\nb.png,dog\nc.jpg,dog\nb.p\x00ng,cat\nd.png,cat\n")  # found: a NUL
    source = scan_source(manifest, 0.4)
    assert source.skipped == [{"path": "b.p\x00ng", "reason": "no such file (line 5 of the manifest)"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"schema_version": 1, "classes": ["a", "b"], "cunots": {}, "shards": {}}', "no 'counts'"),  # found
        ('{"schema_version": 1, "classes": "ab", "counts": {}, "shards": {}}', "'classes' is not what"),
        ('{"schema_version": 1, "classes": [], "counts": {"train": {"a": true}}, "shards": {}}', "'counts' is not"),
        ("[1, 2]", "expected a JSON object, found list"),
        ('{"schema_version": 1, "classes": ', "not valid JSON"),
    ],
)
def test_a_damaged_dataset_json_is_one_line_naming_it(tmp_path: Path, text: str, message: str):
    (tmp_path / "dataset.json").write_text(text)
    with pytest.raises(UserError, match=re.escape(message)) as err:
        load_dataset_info(tmp_path)
    assert str(err.value).startswith(str(tmp_path / "dataset.json"))


def test_damaged_run_files_are_one_line_naming_them(tmp_path: Path):
    run = RunDir(tmp_path)
    run.state.write_bytes(b'{"num_class\x00es": 3}')  # found: a control character inside a string
    with pytest.raises(UserError, match=r"state.json: not valid JSON \(Invalid control character"):
        check_run_state(run, {"num_classes": 3})
    run.config.write_text('"just a string"')
    with pytest.raises(UserError, match=r"config.json: expected a JSON object, found str$"):
        run.read_config()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_each_target_fuzzes_clean_for_a_few_seconds(name: str, tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "fuzz", name, "--seconds", "5", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = (tmp_path / name / "last-run.log").read_text(errors="replace")
    assert done.returncode == 0, done.stdout + log[-3000:]
    executions = int(re.search(r": ([\d,]+) executions", done.stdout).group(1).replace(",", ""))
    assert executions > 0 and "0 crashes, 0 hangs, 0 memory blow-ups" in done.stdout


@pytest.mark.slow
def test_a_second_run_in_the_same_out_fuzzes_again_and_a_broken_set_up_fails(tmp_path: Path):
    def fuzz() -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "fuzz", "run_files", "--seconds", "2", "--out", str(tmp_path)]
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)

    for _ in range(2):  # the second found the first's scratch folder and died at set-up, "0 crashes", exit 0
        done = fuzz()
        assert done.returncode == 0 and not done.stdout.startswith("run_files: 0 executions"), done.stdout
    scratch = tmp_path / "run_files" / "scratch"
    shutil.rmtree(scratch)
    scratch.write_text("a file where the target's scratch folder goes")
    broken = fuzz()
    assert broken.returncode == 1 and "FAILED: set-up failed before fuzzing" in broken.stdout, broken.stdout
