"""Request bodies read within the server's limits: the byte limit checked as chunks arrive, a
deadline for the whole body (408), JSON within safe_json's limits on its shape, and an image as
the raw body or a multipart file."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import web

from app import safe_json
from app.safe_json import JsonLimits, JsonRejected
from app.serving import multipart
from app.serving.app_state import LIMITS
from app.serving.tf_json import ApiError

T = TypeVar("T")


def too_large(limit: int, size: int | None = None) -> str:
    """Names the flag: a phone's full-size photo can be over the default, and the one who can
    raise the limit reads the server's answers."""
    declared = "" if size is None else f": {_size(size)}"
    return f"request body too large{declared}, over this server's {_size(limit)} limit (photoclf serve --max-body-mb)"


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 2**20 else f"{round(n / 2**20, 1):g} MB"


async def _in_client_time(request: web.Request, read: Awaitable[T]) -> T:
    """A body sent slower than the client timeout allows is a 408: a client trickling bytes
    must not hold a connection and a handler for as long as it likes."""
    seconds = request.app[LIMITS].client_timeout_s
    try:
        return await asyncio.wait_for(read, seconds)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {seconds:g} s") from None


async def _body(request: web.Request) -> bytes:
    """The body, refused (413) as soon as it passes the limit. Kept as a list of the chunks that
    arrived, not grown in one buffer as aiohttp's request.read() does: in the soak, large bodies
    sent chunked (no Content-Length to refuse them by) grew the server that way."""
    limit, chunks, size = request.app[LIMITS].max_body_bytes, [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            chunks.clear()  # now: the exception below lives in a reference cycle until a full collection
            raise ApiError(413, too_large(limit))
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(request: web.Request) -> dict:
    """The body as a JSON object, within the byte limit and safe_json's limits on its shape."""
    data = await _in_client_time(request, _body(request))
    try:
        body = safe_json.loads(data, JsonLimits(max_bytes=request.app[LIMITS].max_body_bytes))
    except JsonRejected as err:
        raise ApiError(400, f"malformed JSON body: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the JSON body must be an object")
    return body


async def _uploaded_file(request: web.Request) -> bytes:
    """The one file of a multipart body, read whole within the byte limit, then parsed within
    app.serving.multipart's limits: any malformed or over-limit body is the client's fault, a 400."""
    body = await _body(request)
    try:
        return multipart.the_file(body, request.headers.get("Content-Type", ""))
    except multipart.MultipartRejected as err:
        raise ApiError(400, f"malformed multipart body: {err}") from None


async def image_body(request: web.Request) -> bytes:
    """The image as the raw body (any image/* type) or as a multipart file field."""
    if request.content_type.startswith("multipart/"):
        data = await _in_client_time(request, _uploaded_file(request))
    else:
        data = await _in_client_time(request, _body(request))
    if not data:
        raise ApiError(400, "empty body: send the image bytes, or a multipart upload")
    return data
