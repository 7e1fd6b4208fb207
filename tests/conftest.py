"""Shared fixtures: a small synthetic image folder and its TFRecords, built once per session."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

import app  # noqa: F401  before any test module imports TensorFlow: its allocator setting (app/__init__.py)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Hypothesis keeps caches in ./.hypothesis by default: no test writes inside the repository.
if "HYPOTHESIS_STORAGE_DIRECTORY" not in os.environ:  # one per session (its workers inherit it), removed at exit
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = tempfile.mkdtemp(prefix="photoclf-hypothesis-")
    atexit.register(shutil.rmtree, os.environ["HYPOTHESIS_STORAGE_DIRECTORY"], ignore_errors=True)

TEST_WORKERS = 2
TINY_BACKBONE = "tiny_cnn"  # registered below, in every test process


def _register_tiny_backbone() -> None:
    """A 4-block CNN shaped like the real backbones where the code cares (named blocks, BatchNorm,
    a residual add inside a block, stride-2 stages): the tests of phases, caches, export and
    serving check mechanics, and tracing MobileNetV2's 155 layers would take most of their time.
    Real transfer learning is tested on MobileNetV2."""
    import keras

    from app.models.backbones import SCALE_MINUS1_1, register_backbone

    def build(input_shape: tuple[int, int, int], weights: str | None) -> keras.Model:
        if weights is not None:
            raise ValueError(f"{TINY_BACKBONE} has no pretrained weights")  # how Keras refuses a download
        layers = keras.layers
        images = keras.Input(input_shape)
        x = layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False, name="stem_conv")(images)
        x = layers.ReLU(name="stem_relu")(layers.BatchNormalization(name="stem_bn")(x))
        for block, (channels, stride) in enumerate([(8, 1), (16, 2), (16, 1), (24, 2)], start=1):
            y = layers.Conv2D(channels, 3, strides=stride, padding="same", use_bias=False, name=f"block_{block}_conv")(
                x
            )
            y = layers.ReLU(name=f"block_{block}_relu")(layers.BatchNormalization(name=f"block_{block}_bn")(y))
            x = layers.Add(name=f"block_{block}_add")([x, y]) if x.shape[-1] == channels and stride == 1 else y
        return keras.Model(images, x, name=TINY_BACKBONE)

    register_backbone(TINY_BACKBONE, default_size=64, normalization=SCALE_MINUS1_1, block_pattern=r"^(block_\d+)_")(
        build
    )


_register_tiny_backbone()

ROOT = Path(__file__).resolve().parents[1]
_WITH_TINY_BACKBONE = """
import runpy, sys
sys.path.insert(0, {tests!r})
import conftest  # registers the tests' tiny backbone in this process too
sys.argv = sys.argv[1:]
if sys.argv[0] == "photoclf":
    from app.commands import main
    main()
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def with_tiny_backbone(command: str, *args: str) -> list[str]:
    """`python scripts/COMMAND ARGS` (or `photoclf ARGS` for "photoclf") as a user runs it, in a
    process that also knows the tiny backbone: for tests of what a command does as a process (a
    kill, a resume, a server, several workers), where MobileNetV2's 155 layers only add minutes."""
    code = _WITH_TINY_BACKBONE.format(tests=str(ROOT / "tests"))
    return [sys.executable, "-c", code, command if command == "photoclf" else str(ROOT / "scripts" / command), *args]


@pytest.fixture(scope="session", autouse=True)
def session_feature_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session fixtures' feature store (the runs they train): not the user's cache."""
    root = tmp_path_factory.mktemp("session-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PHOTOCLF_CACHE_DIR", str(root))
        yield root


@pytest.fixture(autouse=True)
def private_feature_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own feature store (feature_store = auto reads $PHOTOCLF_CACHE_DIR): nothing is
    written to the user's cache, and no test finds another's features."""
    root = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("PHOTOCLF_CACHE_DIR", str(root))
    return root


def stored_weight_shapes(weights_file: Path) -> list[tuple[int, ...]]:
    """The shape of every array a Keras .weights.h5 file holds (what it stores, not what it names)."""
    import h5py

    shapes: list[tuple[int, ...]] = []
    with h5py.File(weights_file) as f:
        f.visititems(lambda name, item: shapes.append(item.shape) if isinstance(item, h5py.Dataset) else None)
    return shapes


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Two worker processes for either tier, even on 2 cores: much of a test's time is
    single-threaded (graph tracing, file writing, a server waiting on its clients), so two take
    about a third off. No test's promise depends on having the cores to itself: the load tests
    count answers, not milliseconds."""
    return TEST_WORKERS


@pytest.hookimpl(trylast=True)  # after pytest-randomly has shuffled the modules
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked start_first go to the workers before the others (in pytest-randomly's order
    among themselves), with xdist's own reordering off (pyproject's addopts): a module runs whole
    on one worker, and one of several minutes handed out last would keep the other worker idle."""
    first = {item.path for item in items if item.get_closest_marker("start_first")}
    items.sort(key=lambda item: item.path not in first)


@pytest.fixture(scope="session")
def demo_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from app.data.demo import generate_demo_images

    return generate_demo_images(tmp_path_factory.mktemp("demo") / "images", per_class=12, seed=0)


@pytest.fixture(scope="session")
def demo_records(demo_images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards per split, so interleave and per-worker sharding have something to do."""
    from app.data.writer import write_tfrecords

    out = tmp_path_factory.mktemp("records")
    write_tfrecords(demo_images, out, val_fraction=0.25, test_fraction=0.25, num_shards=2, workers=1)
    return out


def _shared_path(variable: str, what: str, hint: str) -> Path:
    """The file or folder $`variable` names; the test skips, saying why, where it is not there."""
    path = os.environ.get(variable)
    if not path or not Path(path).exists():
        pytest.skip(f"no {what}: {hint}")
    return Path(path)


SHARED_WEIGHTS_HINT = "set PHOTOCLF_WEIGHTS to ../shared/weights/mobilenet_v2_1.0_no_top.weights.h5 (.ci/run does)"
LITE0_WEIGHTS_HINT = (
    "set PHOTOCLF_LITE0_WEIGHTS to ../shared/weights/efficientnet_lite0_imagenet_torch_state.npz (.ci/run does)"
)
SHARED_DATA_HINT = "set PHOTOCLF_SHARED_DATA to ../shared/data (.ci/run does)"


@pytest.fixture(scope="session")
def pretrained_weights() -> Path:
    """The real pretrained MobileNetV2 backbone; tests that need it skip, saying why, without it."""
    return _shared_path("PHOTOCLF_WEIGHTS", "pretrained weights file", SHARED_WEIGHTS_HINT)


@pytest.fixture(scope="session")
def lite0_weights() -> Path:
    """The real EfficientNet-Lite0 ImageNet weights (.npz); tests that need them skip, saying why, without them."""
    return _shared_path("PHOTOCLF_LITE0_WEIGHTS", "EfficientNet-Lite0 weights file", LITE0_WEIGHTS_HINT)


@pytest.fixture(scope="session")
def shared_photos() -> Path:
    """The shared real photo sets, read (never copied) by the few tests that check a real photo."""
    return _shared_path("PHOTOCLF_SHARED_DATA", "shared photo sets", SHARED_DATA_HINT)


def _export_the_savedmodel_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs export the SavedModel without the files beside it (LiteRT, OpenVINO, ONNX, each with
    its parity check, and the model card): most of a tiny run's time, and what the tests of those
    files (marked export_files, and tests/export) check."""
    from app.export import run_export

    skipped = {"missing": "not written: a tiny_config test's run (mark it export_files for these files)"}
    monkeypatch.setattr(run_export, "_files_beside", lambda *_: {"litert": {}, "openvino": skipped, "onnx": skipped})


@contextlib.contextmanager
def savedmodel_only() -> Iterator[None]:
    """Within the block, runs export as tiny_config's do: the SavedModel only."""
    with pytest.MonkeyPatch.context() as patch:
        _export_the_savedmodel_only(patch)
        yield


@pytest.fixture
def tiny_config(demo_records: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    """A fast config: the random-init tiny backbone at 64px, 2 steps per epoch; phase 2 on phase 1's
    views (a random backbone never saturates, so `auto` would pick images: tests/training/test_plan.py).
    Its runs export the SavedModel only, unless the test is marked export_files."""
    from app.config import TrainConfig

    monkeypatch.delenv("PHOTOCLF_WEIGHTS", raising=False)
    if not request.node.get_closest_marker("export_files"):
        _export_the_savedmodel_only(monkeypatch)
    return TrainConfig(
        data=str(demo_records),
        out=str(tmp_path / "run"),
        backbone=TINY_BACKBONE,
        weights="none",
        image_size=64,
        batch_size=8,
        epochs_head=1,
        epochs_finetune=1,
        max_steps_per_epoch=2,
        early_stopping_patience=5,
        phase2_mode="views",
        unfreeze="blocks:2",  # the tiny backbone has few blocks: its top 2, cut at block_2_relu
    )


@pytest.fixture(scope="session")
def trained_run(demo_records: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny finished run named "shapes" (the random-init tiny backbone at 64 px), exported as version 1;
    one epoch of each phase (phase 2 on phase 1's views, as tiny_config)."""
    from app.config import TrainConfig
    from app.training.train import train

    run = tmp_path_factory.mktemp("export") / "shapes"
    cfg = TrainConfig(
        data=str(demo_records),
        out=str(run),
        backbone=TINY_BACKBONE,
        weights="none",
        image_size=64,
        batch_size=8,
        epochs_head=1,
        epochs_finetune=1,
        max_steps_per_epoch=2,
        phase2_mode="views",
    )
    # Its 12 val photos are too few for a real run to fit a temperature: fitted anyway, so the
    # tests of a calibrated export have one (tests/training/test_calibration.py tests the rule).
    with mock.patch("app.training.calibration.MIN_CALIBRATION_PHOTOS", 1):
        train(cfg)
    return run


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser(tmp_path_factory: pytest.TempPathFactory):
    """Headless Chromium through selenium; skipped, saying why, where it is not installed (failed
    under PHOTOCLF_REQUIRE_BROWSER, as in CI, where a skip would hide a missing check). Its temp
    folder is the test's: Chromium leaves a folder for its singleton socket in $TMPDIR."""
    if not (CHROMIUM and DRIVER):
        missing = "no Chromium/chromedriver installed (Debian: apt-get install chromium chromium-driver)"
        if os.environ.get("PHOTOCLF_REQUIRE_BROWSER"):
            pytest.fail(missing)  # CI installs them: there a skip would hide a missing check
        pytest.skip(missing)
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is a dev dependency: pip install -e '.[dev]'"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    scratch = {"TMPDIR": str(tmp_path_factory.mktemp("chromium"))}
    service = webdriver.ChromeService(executable_path=DRIVER, env={**os.environ, **scratch})
    driver = webdriver.Chrome(service=service, options=options)
    yield driver
    driver.quit()
