"""The review page and its small JSON API, on this machine only by default.

    GET  /                  the page (page.html)
    GET  /api/state         classes, counts, the manifest's path
    GET  /api/batch?size=N  the next N photos to ask about, in the queue's order
    GET  /api/photo/ID      a queued photo, at most PAGE_SIDE a side (only queued photos, by number: no paths)
    POST /api/answer        {"id": ID, "label": CLASS} or {"id": ID, "action": "skip" | "not_any_class"}
    POST /api/undo          takes back the last answer or skip of this session: {"id": ID, counts...}

A photo answered or skipped is not handed out again while the server runs; answers go to the
manifest at once (answers.py), so stopping the server loses nothing.
"""

from __future__ import annotations

import asyncio
import io
import mimetypes
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from aiohttp import web
from PIL import Image

from app import safe_json
from app.data.convert import open_any
from app.data.display import open_photo
from app.errors import UserError
from app.review.answers import Answers
from app.review.queue import Queue
from app.safe_json import JsonLimits, JsonRejected

ACTIONS = ("skip", "not_any_class")
MAX_BATCH = 100
MAX_ANSWER_BYTES = 64 * 1024  # an answer is an id and a label or an action: a flat object
PAGE_SIDE = 1024  # pixels a side of the largest photo the page is sent
BROWSER_FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP")  # as Pillow names them


@dataclass
class Review:
    queue: Queue
    answers: Answers
    root: Path  # photos are shown by their path relative to this folder
    done: set[int] = field(default_factory=set)  # answered or skipped since the server started
    answered: int = 0
    skipped: int = 0
    next_steps: list[str] = field(default_factory=list)  # the commands that convert and retrain, shown when done
    history: list[tuple[int, str]] = field(default_factory=list)  # (photo, "answer" | "skip"), for undo

    def remaining(self) -> int:
        return len(self.queue.candidates) - len(self.done)

    def counts(self) -> dict:
        return {"remaining": self.remaining(), "answered": self.answered, "skipped": self.skipped}


REVIEW = web.AppKey("review", Review)


def _shown_path(review: Review, path: Path) -> str:
    try:
        return str(path.relative_to(review.root))
    except ValueError:
        return str(path)


async def page(request: web.Request) -> web.Response:
    html = resources.files("app.review").joinpath("page.html").read_text()
    return web.Response(text=html, content_type="text/html")


async def state(request: web.Request) -> web.Response:
    review = request.app[REVIEW]
    return web.json_response(
        {
            "classes": review.queue.classes,
            "manifest": str(review.answers.path),
            "total": len(review.queue.candidates),
            "unreadable": len(review.queue.failed),
            "next_steps": review.next_steps,
            **review.counts(),
        }
    )


async def batch(request: web.Request) -> web.Response:
    review = request.app[REVIEW]
    try:
        size = int(request.query.get("size", "12"))
    except ValueError:
        raise web.HTTPBadRequest(reason="size must be a whole number") from None
    if not 1 <= size <= MAX_BATCH:
        raise web.HTTPBadRequest(reason=f"size must be 1 to {MAX_BATCH}")
    photos = []
    for i, candidate in enumerate(review.queue.candidates):
        if len(photos) == size:
            break
        if i not in review.done:
            photos.append(
                {
                    "id": i,
                    "name": _shown_path(review, candidate.path),
                    "guesses": [{"label": label, "score": score} for label, score in candidate.guesses],
                    "unknown": candidate.unknown,
                    "priority": round(candidate.priority, 4),
                }
            )
    return web.json_response({"photos": photos, **review.counts()})


def _candidate_id(review: Review, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(review.queue.candidates):
        raise web.HTTPNotFound(reason=f"no queued photo {value!r}")
    return value


async def photo(request: web.Request) -> web.StreamResponse:
    review = request.app[REVIEW]
    try:
        index = _candidate_id(review, int(request.match_info["id"]))
    except ValueError:
        raise web.HTTPNotFound(reason="no such photo") from None
    path = review.queue.candidates[index].path
    try:
        data = path.read_bytes()
    except OSError as err:
        raise web.HTTPGone(reason=f"{path.name}: {err.strerror or err}") from None
    body, content_type = await asyncio.get_running_loop().run_in_executor(None, for_the_page, data, path.name)
    return web.Response(body=body, content_type=content_type, headers={"X-Content-Type-Options": "nosniff"})


def for_the_page(data: bytes, name: str) -> tuple[bytes, str]:
    """A photo as the page shows it: one over PAGE_SIDE pixels a side shrunk to a JPEG of that size
    (a phone's photo is sent as a tenth of its bytes), as is one a browser may not show (TIFF,
    HEIC); a smaller one in a format every browser shows, as it is."""
    try:
        with open_any(data) as opened:
            as_it_is = max(opened.size) <= PAGE_SIDE and opened.format in BROWSER_FORMATS
        if not as_it_is:
            out = io.BytesIO()
            Image.fromarray(open_photo(data, PAGE_SIDE)).save(out, format="JPEG", quality=85)
            return out.getvalue(), "image/jpeg"
    except Exception:  # a photo Pillow does not read (TensorFlow did): the browser gets it as it is
        pass
    return data, mimetypes.guess_type(name)[0] or "application/octet-stream"


async def answer(request: web.Request) -> web.Response:
    review = request.app[REVIEW]
    try:
        body = safe_json.loads(await request.read(), JsonLimits(max_bytes=MAX_ANSWER_BYTES, max_depth=1, max_values=16))
    except JsonRejected as err:
        raise web.HTTPBadRequest(reason=f"the body must be a small JSON object: {err}") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(reason="the body must be a JSON object")
    index = _candidate_id(review, body.get("id"))
    label, action = body.get("label"), body.get("action")
    if (label is None) == (action is None):
        raise web.HTTPBadRequest(reason='give either "label" or "action"')
    if label is not None and label not in review.queue.classes:
        raise web.HTTPBadRequest(reason=f"label {label!r} is not one of the model's classes")
    if action is not None and action not in ACTIONS:
        raise web.HTTPBadRequest(reason=f"action must be one of {ACTIONS}")
    if index in review.done:
        raise web.HTTPConflict(reason=f"photo {index} is already answered")
    if action == "skip":
        review.skipped += 1
        review.history.append((index, "skip"))
    else:
        try:
            review.answers.record(review.queue.candidates[index].path, label)
        except UserError as err:  # the disk is full: the manifest is as it was, the photo stays queued
            raise web.HTTPInsufficientStorage(reason=str(err)) from None
        review.answered += 1
        review.history.append((index, "answer"))
    review.done.add(index)
    return web.json_response(review.counts())


async def undo(request: web.Request) -> web.Response:
    """The last answer or skip of this session taken back (its manifest row removed): the photo
    is queued again."""
    review = request.app[REVIEW]
    if not review.history:
        raise web.HTTPConflict(reason="nothing to undo in this session")
    index, kind = review.history[-1]
    if kind == "answer":
        try:
            review.answers.remove_last(review.queue.candidates[index].path)
        except UserError as err:
            raise web.HTTPConflict(reason=str(err)) from None
        review.answered -= 1
    else:
        review.skipped -= 1
    review.history.pop()
    review.done.discard(index)
    return web.json_response({"id": index, **review.counts()})


@web.middleware
async def errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        return web.json_response({"error": err.reason}, status=err.status)


def make_app(review: Review) -> web.Application:
    app = web.Application(middlewares=[errors_as_json], client_max_size=MAX_ANSWER_BYTES)
    app[REVIEW] = review
    app.router.add_get("/", page)
    app.router.add_get("/api/state", state)
    app.router.add_get("/api/batch", batch)
    app.router.add_get("/api/photo/{id}", photo)
    app.router.add_post("/api/answer", answer)
    app.router.add_post("/api/undo", undo)
    return app
