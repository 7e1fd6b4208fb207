"""Server-side batching: concurrent requests for the same model and signature share one call.

A batch is whatever queued while the model was busy, up to `max_batch` instances (a bigger
request runs alone): under load batches form by themselves, and an idle server answers a lone
request at once. `max_wait_ms` > 0 also holds a batch back that long for company, trading
latency for bigger batches. At most `max_queue` instances wait: beyond that `submit` raises
Overloaded at once (HTTP 503) instead of letting memory and latency grow without bound. A
request whose caller stopped waiting (its deadline passed) is dropped before it runs. If a
merged batch fails (an undecodable image), each request is retried alone, so one client's bad
image never fails another client's request; a failing
request is then probed instance by instance to name the bad one.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from app.serving.store import LoadedModel


class InferenceError(Exception):
    """A request the model rejected (HTTP 400)."""


class Overloaded(Exception):
    """The queue is full (HTTP 503 with Retry-After)."""


@dataclass
class Job:
    model: LoadedModel
    signature: str
    inputs: dict[str, np.ndarray]  # every array has the same first dimension
    future: asyncio.Future = field(default=None)

    @property
    def size(self) -> int:
        return len(next(iter(self.inputs.values())))


def _run(model: LoadedModel, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return model.runtime.run(signature, inputs)


def _first_line(err: Exception) -> str:
    """The error's own words for a client: TensorFlow's graph location ("[[...]]" lines, the
    "{{function_node ...}}" prefix) left out."""
    message = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", getattr(err, "message", str(err)))
    lines = [line.strip() for line in message.splitlines() if line.strip() and not line.strip().startswith("[[")]
    return lines[-1] if lines else type(err).__name__


class Batcher:
    def __init__(
        self,
        max_batch: int = 32,
        max_wait_ms: float = 0.0,
        max_queue: int = 128,
        on_batch: Callable[[int], None] = lambda size: None,
    ) -> None:
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self.on_batch = on_batch  # called with each model call's size (the metrics' histogram)
        self.waiting = 0  # instances queued, not yet taken for a model call
        self._queue: asyncio.Queue[Job] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="inference")  # TF parallelises inside
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        self._executor.shutdown(wait=True)

    async def submit(self, model: LoadedModel, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Raises Overloaded when the queue is full. Cancelling the caller (a deadline) cancels
        the job: dropped if it has not started, its result discarded if it has."""
        job = Job(model, signature, inputs, asyncio.get_running_loop().create_future())
        if self.waiting + job.size > self.max_queue and self.waiting > 0:
            raise Overloaded(f"{self.waiting} instances are waiting (limit {self.max_queue}); retry shortly")
        self.waiting += job.size
        self._queue.put_nowait(job)
        return await job.future

    async def _next_job(self, timeout: float | None = None) -> Job:
        job = await (asyncio.wait_for(self._queue.get(), timeout) if timeout is not None else self._queue.get())
        self.waiting -= job.size
        return job

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self._next_job()]
            while not self._queue.empty() and sum(j.size for j in jobs) < self.max_batch:
                jobs.append(await self._next_job())  # what queued while the model was busy: no wait
            deadline = loop.time() + self.max_wait
            while sum(j.size for j in jobs) < self.max_batch and (timeout := deadline - loop.time()) > 0:
                try:
                    jobs.append(await self._next_job(timeout))
                except TimeoutError:
                    break
            groups: dict[tuple, list[Job]] = {}
            for job in (j for j in jobs if not j.future.done()):  # a cancelled caller's job is dropped
                groups.setdefault((id(job.model), job.signature), []).append(job)
            for group in groups.values():
                await loop.run_in_executor(self._executor, self._run_group, group)

    def _run_group(self, jobs: list[Job]) -> None:
        model, signature = jobs[0].model, jobs[0].signature
        try:
            merged = {k: np.concatenate([j.inputs[k] for j in jobs]) for k in jobs[0].inputs}
            self.on_batch(len(next(iter(merged.values()))))
            outputs = _run(model, signature, merged)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as err:
            if len(jobs) > 1:
                for job in jobs:
                    self._run_group([job])
                return
            self._resolve(jobs[0], error=self._locate(jobs[0], err))
            return
        start = 0
        for job in jobs:
            self._resolve(job, result={k: v[start : start + job.size] for k, v in outputs.items()})
            start += job.size

    def _locate(self, job: Job, err: Exception) -> InferenceError:
        """Name the first bad instance of a failed request (one extra call per instance)."""
        if job.size > 1:
            for i in range(job.size):
                try:
                    _run(job.model, job.signature, {k: v[i : i + 1] for k, v in job.inputs.items()})
                except (tf.errors.InvalidArgumentError, ValueError, TypeError) as one:
                    return InferenceError(f"instance {i}: {_first_line(one)}")
        return InferenceError(f"instance 0: {_first_line(err)}" if job.size == 1 else _first_line(err))

    @staticmethod
    def _resolve(job: Job, result: dict | None = None, error: Exception | None = None) -> None:
        def settle() -> None:
            if job.future.done():
                return
            job.future.set_exception(error) if error else job.future.set_result(result)

        job.future.get_loop().call_soon_threadsafe(settle)
