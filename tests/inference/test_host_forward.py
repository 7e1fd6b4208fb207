"""A frozen pass runs on the fastest runtime that gives TensorFlow's answers, and on TensorFlow
whenever another runtime is absent, disagrees or would not pay."""

from __future__ import annotations

import sys
import time

import keras
import numpy as np
import pytest

from app.errors import UserError
from app.export.file_runners import host_precisions
from app.inference import host_forward
from app.inference.host_forward import MIN_ROWS, TRIAL_BATCHES, HostForward, expected_precision

SHAPE = (24, 24, 3)


@pytest.fixture(scope="module")
def model() -> keras.Model:
    """A small convolutional backbone with a pooled output and an inner activation."""
    keras.utils.set_random_seed(0)
    images = keras.Input(SHAPE)
    inner = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(keras.layers.Rescaling(1 / 255)(images))
    pooled = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(16, 3, activation="relu")(inner))
    return keras.Model(images, {"features": pooled, "activations": inner})


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (8, *SHAPE)).astype(np.float32)


def _reference(model: keras.Model, images: np.ndarray) -> dict[str, np.ndarray]:
    return {name: np.asarray(value) for name, value in model(images, training=False).items()}


def test_tensorflow_runtime_gives_the_model_s_own_outputs(model, images):
    forward = HostForward(lambda x: model(x, training=False), SHAPE, "tensorflow", rows=10**6)
    outputs = forward(images)
    for name, value in _reference(model, images).items():
        np.testing.assert_allclose(outputs[name], value, rtol=1e-6, atol=1e-6)
    assert (forward.choice.runtime, forward.choice.precision) == ("tensorflow", "float32")
    assert forward.choice.why == "forward_runtime = tensorflow"


def test_a_single_output_comes_back_as_an_array(model, images):
    forward = HostForward(lambda x: model(x, training=False)["features"], SHAPE, "openvino")
    outputs = forward(images)
    assert isinstance(outputs, np.ndarray) and outputs.shape == (8, 16)
    np.testing.assert_allclose(outputs, _reference(model, images)["features"], rtol=0.02, atol=0.02)


def test_openvino_runs_the_pass_with_tensorflow_s_answers_and_says_how_close(model, images, monkeypatch):
    monkeypatch.setattr(host_forward, "openvino_precisions", lambda: ("float32",))
    forward = HostForward(lambda x: model(x, training=False), SHAPE, "openvino")
    outputs = forward(images)
    assert (forward.choice.runtime, forward.choice.precision) == ("openvino", "float32")
    for name, value in _reference(model, images).items():
        np.testing.assert_allclose(outputs[name], value, rtol=1e-4, atol=1e-5)
    tried = {c.name: c for c in forward.choice.tried}
    assert tried["openvino float32"].cosine_lowest > 0.9999 and tried["openvino float32"].passed
    assert tried["tensorflow float32"].ms_per_row > 0 and tried["openvino float32"].ms_per_row > 0
    assert "cosine mean" in forward.choice.why and "first batch of 8 photos" in forward.choice.why
    again = forward(images[:3])  # later batches, any size, on the runtime chosen
    np.testing.assert_allclose(again["features"], outputs["features"][:3], rtol=1e-5, atol=1e-6)


def _bfloat16_fastest(model, monkeypatch) -> HostForward:
    """`auto` on a host said to run bfloat16, which times fastest."""
    monkeypatch.setattr(host_forward, "openvino_precisions", lambda: ("float32", "bfloat16"))
    measured = iter([5.0, 3.0, 1.0])  # TensorFlow, OpenVINO float32, OpenVINO bfloat16
    monkeypatch.setattr(host_forward, "_ms_per_row", lambda run, probe: next(measured))
    return HostForward(lambda x: model(x, training=False), SHAPE, "auto", rows=MIN_ROWS, bfloat16=True)


def test_a_pass_that_does_not_allow_bfloat16_never_tries_it(model, images, monkeypatch):
    """The passes whose rows train or judge a model (the default): float32 only, on any host."""
    monkeypatch.setattr(host_forward, "openvino_precisions", lambda: ("float32", "bfloat16"))
    measured = iter([5.0, 3.0])  # TensorFlow, OpenVINO float32: nothing else is timed
    monkeypatch.setattr(host_forward, "_ms_per_row", lambda run, probe: next(measured))
    forward = HostForward(lambda x: model(x, training=False), SHAPE, "auto", rows=MIN_ROWS)
    outputs = forward(images)
    assert [c.name for c in forward.choice.tried] == ["tensorflow float32", "openvino float32"]
    assert (forward.choice.name, forward.choice.exact) == ("openvino float32", "openvino float32")
    np.testing.assert_allclose(outputs["features"], _reference(model, images)["features"], rtol=1e-4, atol=1e-5)


def test_exact_calls_run_in_float32_when_bfloat16_is_the_fastest(model, images, monkeypatch):
    forward = _bfloat16_fastest(model, monkeypatch)
    forward(images)
    exact = forward(images, exact=True)
    assert (forward.choice.precision, forward.choice.exact) == ("bfloat16", "openvino float32")
    np.testing.assert_allclose(exact["features"], _reference(model, images)["features"], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(
    "bfloat16" not in host_precisions(),
    reason="this CPU has no bfloat16: OpenVINO runs the bfloat16 hint in float32, so the two agree exactly",
)
def test_fast_calls_in_bfloat16_stray_further_from_tensorflow_than_exact_ones(model, images, monkeypatch):
    forward = _bfloat16_fastest(model, monkeypatch)
    fast, exact = forward(images), forward(images, exact=True)
    reference = _reference(model, images)["features"]
    assert np.abs(fast["features"] - reference).max() > np.abs(exact["features"] - reference).max()


def test_auto_takes_the_fastest_runtime_measured_on_the_first_batch(model, images, monkeypatch):
    monkeypatch.setattr(host_forward, "openvino_precisions", lambda: ("float32",))
    for timings, expected in (([5.0, 1.0], "openvino"), ([1.0, 5.0], "tensorflow")):
        measured = iter(timings)  # TensorFlow is timed first, then each OpenVINO precision
        monkeypatch.setattr(host_forward, "_ms_per_row", lambda run, probe, measured=measured: next(measured))
        forward = HostForward(lambda x: model(x, training=False), SHAPE, "auto", rows=MIN_ROWS)
        forward(images)
        assert forward.choice.runtime == expected
        assert [c.ms_per_row for c in forward.choice.tried] == timings


def test_auto_keeps_tensorflow_for_a_pass_too_small_to_pay(model, images, monkeypatch):
    monkeypatch.setattr(host_forward, "_converted", lambda fn: pytest.fail("converted a small pass"))
    forward = HostForward(lambda x: model(x, training=False), SHAPE, "auto", rows=MIN_ROWS - 1)
    forward(images)
    assert forward.choice.runtime == "tensorflow"
    assert f"{MIN_ROWS - 1} rows: too few" in forward.choice.why
    assert expected_precision("auto", MIN_ROWS - 1) == "float32"


@pytest.mark.parametrize("runtime", ["auto", "openvino"])
def test_a_runtime_that_disagrees_with_tensorflow_is_not_used(model, images, monkeypatch, runtime):
    monkeypatch.setattr(host_forward, "openvino_precisions", lambda: ("float32", "bfloat16"))
    wrong = lambda m, precision, single: lambda x: {k: -v for k, v in _reference(model, x).items()}  # noqa: E731
    monkeypatch.setattr(host_forward, "_compiled", wrong)
    forward = HostForward(lambda x: model(x, training=False), SHAPE, runtime, rows=MIN_ROWS, bfloat16=True)
    outputs = forward(images)
    assert forward.choice.runtime == "tensorflow"
    assert "failed the parity gate" in forward.choice.why
    assert [c.passed for c in forward.choice.tried] == [True, False, False]
    np.testing.assert_allclose(outputs["features"], _reference(model, images)["features"], rtol=1e-6)


def test_without_openvino_auto_falls_back_and_asking_for_it_is_an_error(model, images, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    forward = HostForward(lambda x: model(x, training=False), SHAPE, "auto", rows=MIN_ROWS)
    forward(images)
    assert forward.choice.runtime == "tensorflow" and "not installed" in forward.choice.why
    assert expected_precision("auto", MIN_ROWS) == "float32"
    with pytest.raises(UserError, match="forward_runtime = openvino: the openvino package is not installed"):
        HostForward(lambda x: model(x, training=False), SHAPE, "openvino")
    with pytest.raises(UserError, match="forward_runtime: 'onnx' is not one of auto, tensorflow, openvino"):
        HostForward(lambda x: model(x, training=False), SHAPE, "onnx")


def test_the_expected_precision_follows_the_host(monkeypatch):
    monkeypatch.setattr(host_forward, "openvino_precisions", lambda: ("float32", "bfloat16"))
    assert expected_precision("auto", MIN_ROWS) == "bfloat16"
    assert expected_precision("openvino", 1) == "bfloat16"
    assert expected_precision("tensorflow", 10**6) == "float32"
    monkeypatch.setattr(host_forward, "openvino_precisions", lambda: ("float32",))
    assert expected_precision("auto", MIN_ROWS) == "float32"


def _slowed(run, seconds: float = 0.03):
    def slow(images):
        time.sleep(seconds)
        return run(images)

    return slow


@pytest.mark.parametrize("slower", ["openvino", "tensorflow"])
def test_in_the_pass_the_faster_of_the_two_goes_on_input_pipeline_included(model, images, monkeypatch, slower):
    """Faster alone on the first batch is not enough: the pass's next batches, timed one to the
    next, decide."""
    monkeypatch.setattr(host_forward, "openvino_precisions", lambda: ("float32", "bfloat16"))
    measured = iter([5.0, 3.0, 1.0])  # alone: OpenVINO bfloat16 the fastest
    monkeypatch.setattr(host_forward, "_ms_per_row", lambda run, probe: next(measured))
    compiled = host_forward._compiled
    if slower == "openvino":
        monkeypatch.setattr(host_forward, "_compiled", lambda *args: _slowed(compiled(*args)))
    forward = HostForward(lambda x: model(x, training=False), SHAPE, "auto", rows=MIN_ROWS, bfloat16=True)
    if slower == "tensorflow":
        forward._tensorflow = _slowed(forward._tensorflow)
    for _ in range(2 * TRIAL_BATCHES):
        assert forward.choice is None or "in the pass" not in forward.choice.why
        forward(images)
        forward(images, exact=True)  # val and test batches between: not part of the trial
    winner = "tensorflow float32" if slower == "openvino" else "openvino bfloat16"
    assert (
        forward.choice.name == winner
        and "in the pass, input pipeline included: openvino bfloat16" in forward.choice.why
    )
    assert forward.choice.exact == "openvino float32"
