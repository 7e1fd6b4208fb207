"""safe_json: JSON from outside parsed within limits on its shape, checked before parsing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import safe_json
from app.safe_json import MAX_DEPTH, MAX_VALUES, JsonLimits, JsonRejected
from tests.structures import BUDGETS, JSON_VALUES, budget, depth_of, nested

LIMITS = JsonLimits(max_bytes=2**20)


@pytest.mark.parametrize("examples", BUDGETS)
def test_any_json_value_within_the_limits_reads_back_as_it_was_written(examples: int):
    @budget(examples)
    @given(JSON_VALUES)
    def check(value: object) -> None:
        text = json.dumps(value)
        depth, values = safe_json.measure(text.encode())
        assert depth == depth_of(value) and values >= 1
        assert safe_json.loads(text, LIMITS) == value

    check()


@pytest.mark.parametrize("examples", BUDGETS)
def test_nesting_past_the_limit_is_refused_by_name_never_a_recursion_error(examples: int):
    @budget(examples)
    @given(nested(max_depth=3000))
    def check(document: tuple[str, int]) -> None:
        text, depth = document
        if depth <= MAX_DEPTH:
            assert safe_json.loads(text, LIMITS) == json.loads(text)
        else:
            with pytest.raises(JsonRejected, match=f"^nested deeper than {MAX_DEPTH} levels$"):
                safe_json.loads(text, LIMITS)

    check()


@pytest.mark.parametrize("examples", BUDGETS)
def test_any_bytes_parse_or_are_refused_in_one_line(examples: int):
    @budget(examples)
    @given(st.binary(max_size=200) | st.text(alphabet='[]{}",:\\0123456789.e-tfnul ', max_size=200).map(str.encode))
    def check(data: bytes) -> None:
        try:
            safe_json.loads(data, LIMITS)
        except JsonRejected as err:
            assert "\n" not in str(err)

    check()


def test_each_limit_holds_at_the_limit_and_refuses_one_past_it():
    assert safe_json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH, LIMITS) is not None
    with pytest.raises(JsonRejected, match="nested deeper than 32 levels"):
        safe_json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), LIMITS)
    big = JsonLimits(max_bytes=2**23)
    at_limit = "[" + "0," * (MAX_VALUES - 2) + "0]"  # the list and its MAX_VALUES - 1 items
    assert len(safe_json.loads(at_limit, big)) == MAX_VALUES - 1
    with pytest.raises(JsonRejected, match=f"more than {MAX_VALUES} values"):
        safe_json.loads("[" + "0," * (MAX_VALUES - 1) + "0]", big)
    assert safe_json.loads(b'"12345678"', JsonLimits(max_bytes=10)) == "12345678"
    with pytest.raises(JsonRejected, match="larger than 10 bytes"):
        safe_json.loads(b'"123456789"', JsonLimits(max_bytes=10))


def test_brackets_and_quotes_inside_strings_are_not_structure():
    text = json.dumps({"a": "[[[{{{" * 100, "b": ['\\"]]]', "\\\\"], "c": '"' * 50})
    assert safe_json.measure(text.encode())[0] == 2 and safe_json.loads(text, LIMITS)["a"].startswith("[[[")
    # An unterminated string runs to the end: measured in one pass, then refused by the parser.
    with pytest.raises(JsonRejected, match="not valid JSON"):
        safe_json.loads(b'["abc' + b"\\\\\\" * 100_000, LIMITS)


def test_a_text_in_utf16_whose_bytes_the_scan_misreads_is_still_refused_in_one_line():
    deep = ("[" * 5000 + "]" * 5000).encode("utf-16")
    with pytest.raises(JsonRejected, match="nested deeper than 32 levels"):
        safe_json.loads(deep, LIMITS)
    assert safe_json.loads('{"a": [1, "\u2200"]}'.encode("utf-16"), LIMITS) == {"a": [1, "\u2200"]}
