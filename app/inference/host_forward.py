"""Forward passes that train nothing, on the runtime this host runs fastest with the same answers.

The frozen backbone's passes (phase 1's features, the activations at phase 2's cut, a split's
pooled features for the backbone probe and "none of these") change no weight, so they need not
run through TensorFlow. OpenVINO converts the same tf.function and compiles it for this CPU in
float32. A caller whose rows only compare photos with each other (the audit's embeddings) may also
allow bfloat16 where the CPU has bfloat16 instructions (OpenVINO reports "BF16"); rows that train
or judge a model are float32: on the suite, training on bfloat16 rows that passed the gate below
still cost test accuracy (benchmarks/README.md, "Runtimes").

`auto` decides on the first batch of the pass, the run's own photos: every candidate is run on it
beside TensorFlow (the parity gate: each output's cosine similarity per row, mean and lowest),
those that pass are timed on it, and the fastest is used. Where that is not TensorFlow, the pass
itself settles it: the next batches run on each of the two in turn (TRIAL_BATCHES each), timed
from one batch to the next, so that the input pipeline's work is counted (a runtime that is
faster alone can be slower beside tf.data's decoding, on the same cores), and the faster goes on.
The log says which and why, and `HostForward.choice` keeps the figures for metrics.json.
TensorFlow stays the fallback: OpenVINO not installed, a GPU visible (OpenVINO's CPU plugin would
leave it idle), a pass too small for converting to pay, or no candidate passing. Measured
speeds: benchmarks/README.md, "Runtimes".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import tensorflow as tf

from app.errors import UserError
from app.export.file_runners import compile_for_cpu, host_precisions

RUNTIMES = ("auto", "tensorflow", "openvino")
MIN_ROWS = 1024  # auto keeps TensorFlow below this: converting costs as much as a few hundred rows' passes
TRIAL_BATCHES = 6  # auto's trial in the pass: batches on each of the two contenders ...
TRIAL_SETTLE = 2  # ... of which the first of each are not timed: the input pipeline's buffer adjusts
COSINE_MEAN = 0.995  # the parity gate: every output's mean cosine similarity to TensorFlow's on the probe ...
COSINE_LOWEST = 0.98  # ... and its lowest row's
EXACT_COSINE = 0.9999  # a float32 runtime's lowest row, to run the exact passes: the same arithmetic, reordered
log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class Candidate:
    """One way to run the pass, as tried on the probe batch."""

    runtime: str  # tensorflow | openvino
    precision: str  # float32 | bfloat16
    ms_per_row: float | None = None
    cosine_mean: float | None = None  # the lowest over the outputs; None for TensorFlow itself
    cosine_lowest: float | None = None
    passed: bool = True

    @property
    def name(self) -> str:
        return f"{self.runtime} {self.precision}"


@dataclass(frozen=True)
class Choice:
    runtime: str
    precision: str
    why: str
    tried: tuple[Candidate, ...] = field(default=())
    exact: str = "tensorflow float32"  # what runs the exact passes: the fastest float32 candidate

    @property
    def name(self) -> str:
        return f"{self.runtime} {self.precision}"

    def as_dict(self) -> dict:
        return {"runtime": self.runtime, "precision": self.precision, "exact": self.exact, "why": self.why,
                "tried": [asdict(c) for c in self.tried]}  # fmt: skip


def openvino_precisions() -> tuple[str, ...]:
    """The precisions OpenVINO can run fast on this host's CPU; () without OpenVINO or with a GPU."""
    return () if tf.config.list_physical_devices("GPU") else host_precisions()


def expected_precision(runtime: str, rows: int) -> str:
    """The precision a pass of `rows` rows that allows bfloat16 will most likely run in, before any
    photo is seen: the audit keys its embeddings by it."""
    if runtime == "tensorflow" or (runtime == "auto" and rows < MIN_ROWS):
        return "float32"
    return "bfloat16" if "bfloat16" in openvino_precisions() else "float32"


class HostForward:
    """`fn` (a float32 batch, e.g. images 0..255 [N, H, W, 3] → a tensor or a dict of tensors) as
    a host call on numpy batches, on the runtime chosen at its first batch. `rows`: how many rows
    the pass will run (auto keeps TensorFlow for small passes). `bfloat16`: the calls may run in
    bfloat16 where the host has it; a call with `exact` still runs in float32 (TensorFlow or
    OpenVINO's float32, whichever was faster)."""

    def __init__(
        self, fn: Callable, input_shape: tuple[int, ...], runtime: str = "auto", rows: int = 0, bfloat16: bool = False
    ) -> None:
        if runtime not in RUNTIMES:
            raise UserError(f"forward_runtime: {runtime!r} is not one of {', '.join(RUNTIMES)}")
        if runtime == "openvino" and not openvino_precisions():
            raise UserError("forward_runtime = openvino: " + _no_openvino())
        signature = [tf.TensorSpec([None, *input_shape], tf.float32)]
        self._tf = tf.function(fn, input_signature=signature, autograph=False)
        self.runtime, self.rows, self.bfloat16 = runtime, rows, bfloat16
        self.choice: Choice | None = None
        self._run: Callable[[np.ndarray], Outputs] | None = None
        self._exact_run: Callable[[np.ndarray], Outputs] | None = None
        self._single = False  # fn returns one tensor, not a dict
        self._trial: PassTrial | None = None

    def __call__(self, images: np.ndarray, exact: bool = False) -> np.ndarray | Outputs:
        images = np.ascontiguousarray(images, np.float32)
        if self._run is None:
            self._decide(images)
        if self._trial is not None and not exact:
            outputs = self._trial.run(images)
            if self._trial.done:
                self._settle()
        else:
            outputs = (self._exact_run if exact else self._run)(images)
            if self._trial is not None:
                self._trial.paused()
        return outputs["output"] if self._single else outputs

    def _settle(self) -> None:
        """The trial's winner runs the rest of the pass."""
        trial, self._trial = self._trial, None
        name, self._run, figures = trial.winner()
        c = self.choice
        runtime, precision = name.split()
        why = f"{c.why}; in the pass, input pipeline included: {figures}"
        self.choice = Choice(runtime, precision, why, c.tried, c.exact)
        log.info("forward passes: %s (%s)", name, why)

    def _tensorflow(self, images: np.ndarray) -> Outputs:
        outputs = self._tf(tf.constant(images))
        if isinstance(outputs, dict):
            return {name: value.numpy().astype(np.float32, copy=False) for name, value in outputs.items()}
        self._single = True
        return {"output": outputs.numpy().astype(np.float32, copy=False)}

    def _decide(self, probe: np.ndarray) -> None:
        precisions = tuple(p for p in openvino_precisions() if self.bfloat16 or p == "float32")
        reason = keeps_tensorflow(self.runtime, self.rows, precisions)
        if reason:
            self.choice, self._run, self._exact_run = Choice("tensorflow", "float32", reason), *[self._tensorflow] * 2
        else:
            self.choice, self._run, self._exact_run = self._measured(probe, precisions)
            if self.runtime == "auto" and self.choice.runtime != "tensorflow":
                self._trial = PassTrial({self.choice.name: self._run, "tensorflow float32": self._tensorflow})
        c = self.choice
        exact = "" if c.exact == f"{c.runtime} {c.precision}" else f"; float32 passes: {c.exact}"
        log.info("forward passes: %s %s%s (%s)", c.runtime, c.precision, exact, c.why)

    def _measured(self, probe: np.ndarray, precisions: tuple[str, ...]) -> tuple[Choice, Callable, Callable]:
        reference = self._tensorflow(probe)  # traces; the timed call below does not
        runs = {("tensorflow", "float32"): self._tensorflow}
        tried = [Candidate("tensorflow", "float32", _ms_per_row(self._tensorflow, probe))]
        model = _converted(self._tf)
        for precision in precisions:
            run = _compiled(model, precision, self._single)
            outputs = run(probe)
            similar = [_cosines(outputs[name], reference[name]) for name in reference]
            mean, lowest = min(float(c.mean()) for c in similar), min(float(c.min()) for c in similar)
            passed = mean >= COSINE_MEAN and lowest >= COSINE_LOWEST
            ms = _ms_per_row(run, probe) if passed else None
            tried.append(Candidate("openvino", precision, ms, round(mean, 5), round(lowest, 5), passed))
            runs["openvino", precision] = run
        exact = min((c for c in tried if c.precision == "float32" and (c.cosine_lowest or 1.0) >= EXACT_COSINE),
                    key=lambda c: c.ms_per_row)  # fmt: skip
        usable = [c for c in tried if c.passed and (self.runtime == "auto" or c.runtime == "openvino")]
        if not usable:
            why = "no OpenVINO precision agreed with TensorFlow on the first batch: " + _said(tried)
            return Choice("tensorflow", "float32", why, tuple(tried)), self._tensorflow, self._tensorflow
        best = min(usable, key=lambda c: c.ms_per_row)
        why = f"fastest agreeing on the first batch of {len(probe)} photos: " + _said(tried)
        choice = Choice(best.runtime, best.precision, why, tuple(tried), exact.name)
        return choice, runs[best.runtime, best.precision], runs[exact.runtime, exact.precision]


class PassTrial:
    """Two ways to run the pass, TRIAL_BATCHES batches each in turn, each batch timed from the end
    of the one before (what the pass waits for its input included); the winner is the lower median
    time per row, its first TRIAL_SETTLE batches not counted."""

    def __init__(self, contenders: dict[str, Callable[[np.ndarray], Outputs]]) -> None:
        self._contenders = contenders
        self._order = [name for name in contenders for _ in range(TRIAL_BATCHES)]
        self._times: dict[str, list[float]] = {name: [] for name in contenders}
        self._last_end: float | None = None
        self._step = 0

    @property
    def done(self) -> bool:
        return self._step >= len(self._order)

    def run(self, images: np.ndarray) -> Outputs:
        name = self._order[self._step]
        outputs = self._contenders[name](images)
        end = time.perf_counter()
        if self._last_end is not None and self._step % TRIAL_BATCHES >= TRIAL_SETTLE:
            self._times[name].append((end - self._last_end) / len(images))
        self._last_end, self._step = end, self._step + 1
        return outputs

    def paused(self) -> None:
        """Another call came between two of the trial's: the next batch's time starts now."""
        self._last_end = time.perf_counter()

    def winner(self) -> tuple[str, Callable[[np.ndarray], Outputs], str]:
        medians = {name: float(np.median(t)) * 1000 for name, t in self._times.items() if t}
        best = min(medians, key=medians.get) if medians else next(iter(self._contenders))
        figures = ", ".join(f"{name} {ms:.2f} ms/row" for name, ms in medians.items())
        return best, self._contenders[best], figures


def keeps_tensorflow(runtime: str, rows: int, precisions: tuple[str, ...]) -> str:
    """Why the pass runs on TensorFlow without trying anything else, or "" when it tries."""
    if runtime == "tensorflow":
        return "forward_runtime = tensorflow"
    if not precisions:
        return _no_openvino()
    if runtime == "auto" and rows < MIN_ROWS:
        return f"{rows} rows: too few for converting to OpenVINO to pay (auto tries it from {MIN_ROWS})"
    return ""


def _no_openvino() -> str:
    if tf.config.list_physical_devices("GPU"):
        return "a GPU is visible to TensorFlow, and OpenVINO would run on the CPU"
    return "the openvino package is not installed (pip install openvino)"


def _converted(tf_function):
    import openvino

    return openvino.convert_model(tf_function)


def _compiled(model, precision: str, single: bool) -> Callable[[np.ndarray], Outputs]:
    """The model compiled for this CPU (`compile_for_cpu`), as a call on numpy batches."""
    compiled = compile_for_cpu(model, precision)
    names = ["output"] if single else [output.get_any_name() for output in compiled.outputs]
    request = compiled.create_infer_request()

    def run(images: np.ndarray) -> Outputs:
        results = request.infer(images)
        return {name: np.array(results[output], np.float32) for name, output in zip(names, compiled.outputs)}

    return run


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row; rows that are zero in both count as equal."""
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.where(norms > 0, (a * b).sum(1) / np.maximum(norms, 1e-30), 1.0)


def _ms_per_row(run: Callable[[np.ndarray], Outputs], probe: np.ndarray) -> float:
    """The faster of two timed calls (each run has had its first, untimed call on the probe)."""
    times = []
    for _ in range(2):
        start = time.perf_counter()
        run(probe)
        times.append(time.perf_counter() - start)
    return round(min(times) * 1000 / len(probe), 3)


def _said(tried: list[Candidate]) -> str:
    parts = []
    for c in tried:
        speed = f"{c.ms_per_row:.2f} ms/row" if c.ms_per_row is not None else "not timed"
        parity = "" if c.cosine_mean is None else f", cosine mean {c.cosine_mean:.4f} lowest {c.cosine_lowest:.4f}"
        parts.append(f"{c.name} {speed}{parity}{'' if c.passed else ' (failed the parity gate)'}")
    return "; ".join(parts)
