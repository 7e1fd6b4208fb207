"""The server's middleware, outermost first: every request counted, timed and logged; errors
answered as TF Serving answers them (a JSON {"error": ...}); a body declared over the limit refused
before any of it is read."""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web

from app.serving.app_state import INSTANCES, LIMITS, METRICS
from app.serving.batcher import InferenceError
from app.serving.bodies import too_large
from app.serving.connections import LINGER_SECONDS
from app.serving.metrics import log_access
from app.serving.tf_json import ApiError


def _endpoint(request: web.Request) -> str:
    """A bounded label for the metrics: the route's kind, never the raw path."""
    path = request.path
    for suffix in (":predict", ":classify", "/metadata", "/ui"):
        if path.endswith(suffix):
            return suffix.strip(":/")
    if path == "/":
        return "ui"
    if path.startswith("/monitoring/"):
        return "metrics"
    return "status" if path.startswith("/v1/models/") else "other"


@web.middleware
async def observed(request: web.Request, handler):
    """Outermost: counts, times and logs every request, whatever its answer."""
    start = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    finally:
        seconds = time.perf_counter() - start
        request.app[METRICS].observe_request(_endpoint(request), status, seconds)
        log_access(request.method, request.path, status, request.get(INSTANCES, 0), seconds)


@web.middleware
async def declared_size_first(request: web.Request, handler):
    """A body whose Content-Length is over the limit is refused before any of it is read: reading
    it to find out cost the server its memory in the soak (benchmarks/README.md, "Soak")."""
    limit = request.app[LIMITS].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, too_large(limit, request.content_length))
    return await handler(request)


async def _answer_then_linger(request: web.Request, response: web.StreamResponse) -> None:
    """A lingering close, as web servers do it (and as a refused connection gets it): the
    answer, then our half of the connection closed (FIN), then the rest of the late body read and
    dropped for at most LINGER_SECONDS. Closed at once, the socket would answer the client's next
    bytes with a reset, which can reach the client before it has read the answer and discard it
    there. Short, so a trickling client holds its connection hardly longer than before."""
    await response.prepare(request)
    await response.write_eof()
    transport = request.transport
    if transport is None or transport.is_closing() or not transport.can_write_eof():
        return
    transport.write_eof()
    deadline = time.monotonic() + min(LINGER_SECONDS, request.app[LIMITS].client_timeout_s)
    with contextlib.suppress(TimeoutError, ConnectionError):
        while not request.content.is_eof() and (left := deadline - time.monotonic()) > 0:
            if not await asyncio.wait_for(request.content.readany(), left):
                break


@web.middleware
async def errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as err:
        response = web.json_response({"error": str(err)}, status=err.status, headers=err.headers)
        if err.status == 408:  # the rest of a late body must not be read as the next request
            response.force_close()
            await _answer_then_linger(request, response)
        return response
    except InferenceError as err:
        return web.json_response({"error": str(err)}, status=400)
    except web.HTTPRequestEntityTooLarge:
        return web.json_response({"error": too_large(request.app[LIMITS].max_body_bytes)}, status=413)
    except web.HTTPException as err:
        if err.status >= 400:
            return web.json_response({"error": err.reason}, status=err.status)
        raise
