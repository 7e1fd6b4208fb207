"""TF Serving's REST JSON, as clients write and read it: the row ("instances") and columnar
("inputs") request forms decoded into arrays that fit a signature's inputs, the outputs encoded
back, and a signature's tensors described for /metadata. Anything that does not fit is an
`ApiError` with the 4xx status TF Serving gives; the routes (rest.py) answer with it.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np
import tensorflow as tf


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers or {}


def signature_inputs(model, name: str) -> dict[str, tf.TensorSpec]:
    signatures = model.signatures
    if name not in signatures:
        raise ApiError(
            400, f'Serving signature name: "{name}" not found in signature def (have: {", ".join(sorted(signatures))})'
        )
    return signatures[name][0]


def _value(spec: tf.TensorSpec, value, where: str):
    if spec.dtype == tf.string:
        if value is None:  # JSON null: a missing category (a missing number becomes NaN in _array)
            return b""
        if isinstance(value, dict):
            if set(value) != {"b64"} or not isinstance(value["b64"], str):
                raise ApiError(400, f'{where}: expected {{"b64": "..."}}')
            try:
                return base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, ValueError):
                raise ApiError(400, f"{where}: invalid base64") from None
        if isinstance(value, str):
            return value.encode()
        raise ApiError(400, f'{where}: expected a string or {{"b64": ...}}')
    return value


def _array(spec: tf.TensorSpec, values: list, name: str) -> np.ndarray:
    if spec.dtype == tf.string:
        return np.array([_value(spec, v, f"{name}[{i}]") for i, v in enumerate(values)], dtype=object)
    try:
        with np.errstate(over="raise", invalid="raise"):  # 1e300 as float32 is not inf, 2**31 as int32 not negative
            array = np.asarray(values, dtype=spec.dtype.as_numpy_dtype)
    except (TypeError, ValueError, OverflowError, FloatingPointError):
        raise ApiError(400, f"{name}: expected numbers of type {spec.dtype.name}, within its range") from None
    if not spec.shape.is_compatible_with(array.shape):
        raise ApiError(400, f"{name}: shape {list(array.shape)} does not match {spec.shape}")
    return array


def parse_predict(
    body: dict, specs: dict[str, tf.TensorSpec], max_instances: int
) -> tuple[dict[str, np.ndarray], bool]:
    """→ (inputs by name, row format?) from TF Serving's row ("instances") or columnar ("inputs") form."""
    if ("instances" in body) == ("inputs" in body):
        raise ApiError(400, 'Request must have exactly one of "instances" (row format) or "inputs" (columnar format)')
    names = sorted(specs)
    if "instances" in body:
        rows = body["instances"]
        if not isinstance(rows, list) or not rows:
            raise ApiError(400, '"instances" must be a non-empty list')
        if len(names) == 1:
            columns = {names[0]: [r[names[0]] if isinstance(r, dict) and names[0] in r else r for r in rows]}
        else:
            if not all(isinstance(r, dict) and set(r) == set(names) for r in rows):
                raise ApiError(400, f"each instance must be an object with exactly the inputs {names}")
            columns = {n: [r[n] for r in rows] for n in names}
    else:
        inputs = body["inputs"]
        columns = (
            inputs
            if isinstance(inputs, dict) and set(inputs) <= set(names) and inputs
            else {names[0]: inputs}
            if len(names) == 1
            else None
        )
        if (
            columns is None
            or set(columns) != set(names)
            or not all(isinstance(v, list) and v for v in columns.values())
        ):
            raise ApiError(400, f'"inputs" must give a non-empty list for each of {names}')
    counts = {len(v) for v in columns.values()}
    if len(counts) != 1:
        raise ApiError(400, "all inputs must have the same number of instances")
    if counts.pop() > max_instances:
        raise ApiError(400, f"too many instances: at most {max_instances} per request")
    return {n: _array(specs[n], columns[n], n) for n in names}, "instances" in body


def _jsonable(array: np.ndarray) -> list:
    if array.dtype == object:
        return [_jsonable(a) if isinstance(a, np.ndarray) else a.decode("utf-8", "replace") for a in array]
    return array.tolist()


def format_predict(outputs: dict[str, np.ndarray], rows: bool) -> dict:
    if not rows:
        return {"outputs": {k: _jsonable(v) for k, v in outputs.items()}}
    n = len(next(iter(outputs.values())))
    if len(outputs) == 1:
        return {"predictions": _jsonable(next(iter(outputs.values())))}
    return {"predictions": [{k: _jsonable(v[i : i + 1])[0] for k, v in outputs.items()} for i in range(n)]}


def tensor_info(spec: tf.TensorSpec) -> dict:
    dims = [{"size": str(-1 if d is None else d), "name": ""} for d in spec.shape]
    return {
        "dtype": f"DT_{spec.dtype.name.upper()}",
        "tensor_shape": {"dim": dims, "unknown_rank": False},
        "name": spec.name or "",
    }
