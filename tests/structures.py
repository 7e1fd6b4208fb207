"""Hypothesis strategies that build hostile inputs by their structure (what random byte mutation
rarely reaches: a thousand levels of nesting, many parts, cells at a limit, numbers at the edges
of their type), and the budgets the two tiers run them with."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# The fast tier tries a few dozen inputs per property; the slow tier, thousands.
BUDGETS = [pytest.param(40, id="fast"), pytest.param(1500, id="slow", marks=pytest.mark.slow)]


def budget(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,  # TensorFlow's first call in a process is slow; time is not the property
        derandomize=examples < 100,  # the fast tier tries the same inputs on every machine
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        database=None,  # nothing written inside the repository
    )


# Numbers at the edges of the types a parser converts them to.
EDGE_NUMBERS = st.sampled_from(
    [0, -0.0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**400, 1e308, -1e308, 5e-324, 3.5e38]
)
NUMBERS = st.one_of(EDGE_NUMBERS, st.integers(), st.floats(allow_nan=False, allow_infinity=False))
# Strings that look like structure to a careless scanner: brackets, quotes, escapes, controls.
TRICKY_TEXT = st.text(alphabet=st.sampled_from(list('[]{}",:\\\n\r\t\x00 ab/é€\u2028')), max_size=12)
KEYS = TRICKY_TEXT | st.sampled_from(["instances", "inputs", "b64", "image_bytes"])
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TRICKY_TEXT)

JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(TRICKY_TEXT | st.sampled_from(["instances", "inputs"]), children, max_size=5),
    ),
    max_leaves=30,
)


@st.composite
def nested(draw, max_depth: int = 200) -> tuple[str, int]:
    """(JSON text, its depth): nested through lists and objects as text (json.dumps recurses)."""
    depth = draw(st.integers(0, max_depth))
    pattern = draw(st.lists(st.sampled_from(["list", "object"]), min_size=1, max_size=8))
    kinds = [pattern[i % len(pattern)] for i in range(depth)]  # drawn short, repeated: cheap to generate
    opening = "".join("[" if kind == "list" else '{"k": ' for kind in kinds)
    closing = "".join("]" if kind == "list" else "}" for kind in reversed(kinds))
    return opening + json.dumps(draw(SCALARS)) + closing, depth


def depth_of(value: object) -> int:
    """Nesting depth as safe_json counts it: a scalar is 0, [] is 1, [[]] is 2."""
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


# Header names and values for multipart parts: the usual ones, controls, very long ones.
HEADER_NAMES = st.sampled_from(["Content-Disposition", "Content-Type", "Content-Transfer-Encoding", "X-A", "", " "])
HEADER_VALUES = st.one_of(
    st.sampled_from(
        [
            'form-data; name="file"; filename="a.jpg"',
            'form-data; name="field"',
            "form-data; filename*=UTF-8''%C3%A9.jpg",
            "image/jpeg",
            "multipart/mixed; boundary=inner",
            "base64",
            "binary",
        ]
    ),
    st.text(max_size=30),
    st.integers(8000, 9000).map(lambda n: "v" * n),
)
