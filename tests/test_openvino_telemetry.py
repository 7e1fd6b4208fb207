"""A photoclf process converts models with OpenVINO without its usage telemetry: nothing is sent,
and no background process is forked that could hang the command at exit (app/__init__.py)."""

from __future__ import annotations

import threading

import pytest
import tensorflow as tf

openvino = pytest.importorskip("openvino", reason="the openvino package is not installed")


def test_openvino_s_converter_uses_its_no_telemetry_stub():
    from openvino.tools.ovc import telemetry_utils

    assert telemetry_utils.tm.__name__ == "openvino.tools.ovc.telemetry_stub"


def test_converting_a_model_starts_no_sender_threads():
    before = {t.ident for t in threading.enumerate()}
    double = tf.function(lambda x: x * 2.0, input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    openvino.convert_model(double)
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert started == []
