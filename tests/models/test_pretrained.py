"""`--weights auto`: $PHOTOCLF_WEIGHTS when set (before any download), else ImageNet when it can
be had, else random init, warned."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
from keras.src.utils import file_utils

from app.errors import UserError
from app.models.backbones import get_backbone
from app.models.pretrained import WEIGHTS_ENV, load_pretrained_backbone

SIZE = 96  # the smallest size with ImageNet weights for MobileNetV2


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every download fails, as Keras' own does without a network."""

    def no_network(fname, origin=None, **kwargs):
        raise Exception(f"URL fetch failure on {origin}: no network (test)")

    monkeypatch.setattr(file_utils, "get_file", no_network)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The `weights` argument of every MobileNetV2 that gets built."""
    calls: list[str | None] = []
    build = keras.applications.MobileNetV2

    def counted(*args, **kwargs):
        calls.append(kwargs.get("weights"))
        return build(*args, **kwargs)

    monkeypatch.setattr(keras.applications, "MobileNetV2", counted)
    return calls


def _weights_file(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    model = keras.applications.MobileNetV2(input_shape=(SIZE, SIZE, 3), include_top=False, weights=None)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype(w.dtype) for w in model.get_weights()])
    path = tmp_path / "mobilenet_v2.weights.h5"
    model.save_weights(str(path))
    return path, model.get_weights()


def test_auto_loads_the_configured_file_before_trying_any_download(
    offline, builds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path, expected = _weights_file(tmp_path)
    builds.clear()
    monkeypatch.setenv(WEIGHTS_ENV, str(path))
    loaded = load_pretrained_backbone(get_backbone("mobilenet_v2"), SIZE, "auto")
    assert builds == [None]  # one model, built without asking Keras for ImageNet (no "Downloading data from")
    assert loaded.weights_used == f"{path} (from ${WEIGHTS_ENV})" and loaded.warning is None
    for got, want in zip(loaded.model.get_weights(), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_configured_file_that_is_missing_or_does_not_fit_is_an_error_naming_the_variable(
    offline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    path = tmp_path / "other.weights.h5"
    other.save_weights(str(path))
    monkeypatch.setenv(WEIGHTS_ENV, str(path))
    own = "; give mobilenet_v2 its own file with --weights PATH$"  # the way out, in each error
    with pytest.raises(UserError, match=rf"^\${WEIGHTS_ENV}: {path} does not fit mobilenet_v2: .*{own}"):
        load_pretrained_backbone(get_backbone("mobilenet_v2"), SIZE, "auto")
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path / "missing.weights.h5"))
    with pytest.raises(UserError, match=rf"^\${WEIGHTS_ENV}: no such file {tmp_path / 'missing.weights.h5'}{own}"):
        load_pretrained_backbone(get_backbone("mobilenet_v2"), SIZE, "auto")
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path))
    with pytest.raises(UserError, match=rf"^\${WEIGHTS_ENV}: {tmp_path} is a folder, not a weights file{own}"):
        load_pretrained_backbone(get_backbone("mobilenet_v2"), SIZE, "auto")
    with pytest.raises(UserError, match="its own file with --backbones mobilenet_v2@PATH$"):  # compare-backbones'
        load_pretrained_backbone(
            get_backbone("mobilenet_v2"), SIZE, "auto", "--backbones x", "--backbones mobilenet_v2@PATH"
        )
    with pytest.raises(UserError, match=r"^--image-size 7 is too small for mobilenet_v2 \(minimum 32\)$"):
        load_pretrained_backbone(get_backbone("mobilenet_v2"), 7, "auto")  # no file fixes a size: no way out offered


def test_another_backbones_weights_file_names_the_backbone_it_is_for(tmp_path: Path):
    lite = tmp_path / "efficientnet_lite0_imagenet.npz"
    lite.write_bytes(b"PK")  # its suffix is what is read first
    with pytest.raises(UserError, match=r"is not a .h5 or .weights.h5 file; a .npz file is for --backbone efficient"):
        load_pretrained_backbone(get_backbone("mobilenet_v2"), SIZE, str(lite))  # --backbone left at its default
    (tmp_path / "notes.txt").write_text("no weights")
    with pytest.raises(UserError, match=r"^--weights: .*notes.txt is not a .h5 or .weights.h5 file$"):
        load_pretrained_backbone(get_backbone("mobilenet_v2"), SIZE, str(tmp_path / "notes.txt"))


def test_offline_auto_without_a_file_starts_from_random_weights_and_says_why(
    offline, builds, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    loaded = load_pretrained_backbone(get_backbone("mobilenet_v2"), SIZE, "auto")
    assert builds == ["imagenet", None]
    assert loaded.weights_used.startswith("none") and loaded.warning.startswith("NO PRETRAINED WEIGHTS")
    assert "no network (test)" in loaded.warning and f"${WEIGHTS_ENV} is not set" in loaded.warning
