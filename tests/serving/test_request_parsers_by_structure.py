"""The server's parsers of untrusted bodies, given inputs built by structure: every body answers
with its result or a documented 4xx, never a 500 (the same properties the fuzz targets check,
fuzz/targets.py, reached by shape rather than by byte mutation)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from app.serving import multipart
from app.serving.multipart import MAX_HEADER_LINE, MAX_PART_HEADERS, MAX_PARTS, MultipartRejected
from app.serving.tf_json import ApiError, parse_predict
from fuzz.targets import BOUNDARY, TARGETS
from tests.structures import BUDGETS, EDGE_NUMBERS, HEADER_NAMES, HEADER_VALUES, JSON_VALUES, budget, nested

BODIES = st.one_of(
    JSON_VALUES.map(lambda v: {"instances": v}),
    JSON_VALUES.map(lambda v: {"inputs": v}),
    st.dictionaries(st.sampled_from(["instances", "inputs", "signature_name"]), JSON_VALUES, max_size=3),
    JSON_VALUES,
)


@pytest.mark.parametrize("examples", BUDGETS)
def test_predict_answers_any_json_body_or_a_4xx(examples: int):
    run = TARGETS["rest_predict"].make()  # asserts that only a 4xx or a well-formed input came back

    @budget(examples)
    @given(st.integers(0, 2), BODIES | nested(max_depth=300).map(lambda d: json.loads(d[0]) if d[1] < 500 else 0))
    def check(model: int, body: object) -> None:
        run(bytes([model]) + json.dumps(body).encode())

    check()


@pytest.mark.parametrize("examples", BUDGETS)
def test_numbers_at_the_edges_of_an_input_type_are_a_400_or_that_type(examples: int):
    specs = {"x": tf.TensorSpec([None], tf.int32)}

    @budget(examples)
    @given(st.lists(EDGE_NUMBERS, min_size=1, max_size=4))
    def check(numbers: list) -> None:
        try:
            inputs, _ = parse_predict({"instances": numbers}, specs, max_instances=8)
        except ApiError as err:
            assert err.status == 400 and "expected numbers of type int32, within its range" in str(err)
            return
        assert inputs["x"].dtype == np.int32 and inputs["x"].tolist() == [int(n) for n in numbers]

    check()


@st.composite
def multipart_bodies(draw) -> bytes:
    """Bodies of many parts, each with its own headers (many, long, odd), some with a file."""
    parts = []
    for _ in range(draw(st.integers(0, MAX_PARTS + 4))):
        headers = draw(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=MAX_PART_HEADERS + 2))
        head = "".join(f"{name}: {value}\r\n" for name, value in headers)
        parts.append(f"--{BOUNDARY}\r\n{head}\r\n".encode("utf-8", "surrogatepass") + draw(st.binary(max_size=40)))
    ending = draw(st.sampled_from([f"--{BOUNDARY}--\r\n", "", f"--{BOUNDARY}", "junk"])).encode()
    return draw(st.sampled_from([b"", b"preamble\r\n"])) + b"\r\n".join(parts) + b"\r\n" + ending


@pytest.mark.parametrize("examples", BUDGETS)
def test_classify_answers_any_multipart_body_or_a_4xx(examples: int):
    run = TARGETS["rest_classify"].make()

    @budget(examples)
    @given(multipart_bodies())
    def check(body: bytes) -> None:
        run(b"\x01" + body)  # as multipart/form-data with the fuzz targets' boundary

    check()


@pytest.mark.parametrize("examples", BUDGETS)
def test_the_file_part_is_found_exactly_among_other_parts(examples: int):
    @budget(examples)
    @given(
        st.integers(0, MAX_PARTS - 1),
        st.binary(min_size=1, max_size=200),
        st.text("abcXYZ09'()+_,-./:=?", min_size=1, max_size=70),
    )
    def check(before: int, content: bytes, boundary: str) -> None:
        field = f'--{boundary}\r\nContent-Disposition: form-data; name="f"\r\n\r\nvalue\r\n'.encode()
        file = f'--{boundary}\r\nContent-Disposition: form-data; name="i"; filename="a.jpg"\r\n\r\n'.encode()
        body = field * before + file + content + f"\r\n--{boundary}--\r\n".encode()
        if f"\r\n--{boundary}".encode() in b"\r\n" + content:
            return  # a sender never picks a boundary that occurs in its content (RFC 2046)
        assert multipart.the_file(body, f'multipart/form-data; boundary="{boundary}"') == content

    check()


def _form(parts: int, headers: int = 1, line: int = 40) -> bytes:
    padding = "X-Pad: " + "p" * (line - len("X-Pad: "))
    head = "\r\n".join([padding] * (headers - 1) + ['Content-Disposition: form-data; name="i"; filename="a"'])
    part = f"--b\r\n{head}\r\n\r\nDATA\r\n".encode()
    field = b'--b\r\nContent-Disposition: form-data; name="f"\r\n\r\nv\r\n'
    return field * (parts - 1) + part + b"--b--\r\n"


def test_each_multipart_limit_holds_at_the_limit_and_refuses_one_past_it():
    read = lambda body, boundary="b": multipart.the_file(body, f"multipart/form-data; boundary={boundary}")  # noqa: E731
    assert read(_form(MAX_PARTS)) == read(_form(1, MAX_PART_HEADERS)) == read(_form(1, 2, MAX_HEADER_LINE)) == b"DATA"
    for body, message in [
        (_form(MAX_PARTS + 1), f"no file in the first {MAX_PARTS} parts"),
        (_form(1, MAX_PART_HEADERS + 1), f"more than {MAX_PART_HEADERS} header lines"),
        (_form(1, 2, MAX_HEADER_LINE + 1), f"longer than {MAX_HEADER_LINE} bytes"),
    ]:
        with pytest.raises(MultipartRejected, match=message):
            read(body)
    assert read(_form(1).replace(b"--b", b"--" + b"b" * 70), "b" * 70) == b"DATA"
    with pytest.raises(MultipartRejected, match="boundary of 1 to 70 characters"):
        read(_form(1).replace(b"--b", b"--" + b"b" * 71), "b" * 71)


@pytest.mark.parametrize(
    ("value", "dtype"), [(2**31, tf.int32), (-(2**31) - 1, tf.int32), (1e300, tf.float32), (10**400, tf.float32)]
)
def test_a_number_outside_its_inputs_type_is_a_400_not_a_500_or_inf(value, dtype):
    """Found by the property test above: 2**31 as int32 raised OverflowError (a 500), 10**400 as
    float32 too, and 1e300 became inf without a word."""
    with pytest.raises(ApiError, match=f"expected numbers of type {dtype.name}, within its range") as err:
        parse_predict({"instances": [value]}, {"x": tf.TensorSpec([None], dtype)}, max_instances=8)
    assert err.value.status == 400


def test_a_multipart_upload_of_two_files_is_refused_not_answered_for_the_first():
    """curl -F image=@a.jpg -F image=@b.jpg got one answer, the first photo's, with no word of the second."""
    part = 'Content-Disposition: form-data; name="image"; filename="{}"\r\n\r\n{}\r\n'
    one = (
        f"--b\r\n{part.format('a.jpg', 'A')}--b\r\n" + 'Content-Disposition: form-data; name="f"\r\n\r\nv\r\n--b--\r\n'
    )
    two = f"--b\r\n{part.format('a.jpg', 'A')}--b\r\n{part.format('b.jpg', 'B')}--b--\r\n"
    assert multipart.the_file(one.encode(), "multipart/form-data; boundary=b") == b"A"  # a field beside it is fine
    with pytest.raises(MultipartRejected, match="^the upload holds more than one file: send one a request"):
        multipart.the_file(two.encode(), "multipart/form-data; boundary=b")


def test_a_multipart_part_that_is_itself_multipart_is_skipped_not_a_500():
    """aiohttp's reader handed it back as a MultipartReader, which has no filename: AttributeError, a 500."""
    body = (
        b"--outer\r\nContent-Type: multipart/mixed; boundary=inner\r\n\r\n--inner\r\n"
        b'Content-Disposition: form-data; name="a"\r\n\r\nx\r\n--inner--\r\n'
        b'--outer\r\nContent-Disposition: form-data; name="f"; filename="a.jpg"\r\n\r\nJPEG\r\n--outer--\r\n'
    )
    assert multipart.the_file(body, "multipart/form-data; boundary=outer") == b"JPEG"
    with pytest.raises(MultipartRejected, match="the upload holds no file"):
        multipart.the_file(
            body.split(b"--outer\r\nContent-Disposition")[0] + b"--outer--\r\n", "multipart/mixed; boundary=outer"
        )
