"""JSON from outside (request bodies, the review page's answers, dataset.json, a run's files),
parsed within explicit limits on its shape, checked before the parser builds anything.

Python's decoder recurses once per nesting level: a body of a few kilobytes of `[` exhausts the
interpreter's recursion limit (a RecursionError, which a server answered with a 500), and a
body within the byte limit can still hold millions of values. So, before `json.loads`: the
nesting depth and the count of values are measured on the bytes (strings blanked out, then a
running count of the brackets), and a document over either limit is refused, naming the limit.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

MAX_DEPTH = 32  # a TF Serving body of image tensors nests 6 deep
MAX_VALUES = 2**21  # scalars, lists and objects together


class JsonRejected(ValueError):
    """Not JSON, or JSON over a limit: the message says which, in one line."""


@dataclass(frozen=True)
class JsonLimits:
    max_bytes: int
    max_depth: int = MAX_DEPTH
    max_values: int = MAX_VALUES


# A string, escapes included; an unterminated one runs to the end (one match, never a rescan).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def measure(data: bytes) -> tuple[int, int]:
    """(nesting depth, an upper bound on the number of values) of a JSON text, strings blanked."""
    blank = _STRING.sub(b'""', data)
    brackets = np.frombuffer(blank.translate(None, _NOT_BRACKETS), np.uint8)
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    depth = int(np.cumsum(steps).max(initial=0))
    values = int((steps > 0).sum()) + blank.count(b",") + blank.count(b":") + 1
    return depth, values


def loads(data: bytes | str, limits: JsonLimits) -> object:
    """The parsed document, or JsonRejected naming what is wrong with it or which limit it passes."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) > limits.max_bytes:
        raise JsonRejected(f"larger than {limits.max_bytes} bytes")
    depth, values = measure(raw)
    if depth > limits.max_depth:
        raise JsonRejected(f"nested deeper than {limits.max_depth} levels")
    if values > limits.max_values:
        raise JsonRejected(f"more than {limits.max_values} values")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise JsonRejected(f"not valid JSON ({err})") from None
    except RecursionError:  # only where the byte scan misreads the text (UTF-16 or -32): still no 500
        raise JsonRejected(f"nested deeper than {limits.max_depth} levels") from None
