"""The server's middleware, outermost first: every request counted, timed and logged; errors
answered as TF Serving answers them (a JSON {"error": ...}); a body declared over the limit refused
before any of it is read."""

from __future__ import annotations

import time

from aiohttp import web

from app.serving.app_state import INSTANCES, LIMITS, METRICS
from app.serving.batcher import InferenceError
from app.serving.bodies import too_large
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
        raise ApiError(413, too_large(limit))
    return await handler(request)


@web.middleware
async def errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as err:
        response = web.json_response({"error": str(err)}, status=err.status, headers=err.headers)
        if err.status == 408:  # the rest of a late body must not be read as the next request
            response.force_close()
        return response
    except InferenceError as err:
        return web.json_response({"error": str(err)}, status=400)
    except web.HTTPRequestEntityTooLarge:
        return web.json_response({"error": too_large(request.app[LIMITS].max_body_bytes)}, status=413)
    except web.HTTPException as err:
        if err.status >= 400:
            return web.json_response({"error": err.reason}, status=err.status)
        raise
