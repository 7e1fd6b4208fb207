"""The server's doors: at most N connections at once, and no client may take forever to talk.

A slow client (headers or body sent a byte at a time) costs a file descriptor and a parser for as
long as it keeps trickling; enough of them starve everyone else. Two bounds fix that:

- time: a connection must deliver a whole request's headers within `client_timeout` of opening
  (or of its previous answer), else it is closed (aiohttp's keep-alive timer, which trickled bytes
  do not reset); a body must arrive within the same time, else 408 (`app.serving.bodies`).
- count: past `max_connections` open connections a new one is answered 503 with Retry-After and
  closed (after LINGER_SECONDS for at most MAX_REFUSING at once, at once past them), so file
  descriptors stay under max_connections + MAX_REFUSING whatever clients do.

`serve` runs the app until SIGINT/SIGTERM, then stops accepting, answers the requests in
flight and returns (what `web.run_app` does, with the bounded runner).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial

from aiohttp import web

REFUSED_BODY = json.dumps({"error": "too many open connections; retry shortly"}).encode()
REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: " + str(len(REFUSED_BODY)).encode() + b"\r\n\r\n" + REFUSED_BODY
)
LINGER_SECONDS = 1.0  # read what a refused client still sends, so closing does not reset its connection
MAX_REFUSING = 32  # refused connections lingering at once: descriptors stay under max_connections + this


class _Refused(asyncio.Protocol):
    """One connection too many: a 503, then close once the client has had a moment to read it.
    At most MAX_REFUSING linger at once; past them a refused connection is closed at once (a
    flood of them would otherwise hold a descriptor each for LINGER_SECONDS)."""

    def __init__(self, runner: BoundedRunner) -> None:
        self.runner = runner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(REFUSED)
        transport.write_eof()
        if self.runner.refusing >= MAX_REFUSING:
            transport.close()
            return
        self.runner.refusing += 1
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self._close, transport)

    def _close(self, transport: asyncio.BaseTransport) -> None:
        self.runner.refusing -= 1
        transport.close()

    def data_received(self, data: bytes) -> None:
        pass  # discarded: the answer is already sent

    def eof_received(self) -> bool:
        return False  # the client is done too: close now


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted from its creation to its loss. (asyncio
    creates a burst of accepted connections' protocols before any is told it is connected, so
    the server's own list of connections would let a burst through.)"""

    def __init__(self, inner: asyncio.Protocol, runner: BoundedRunner) -> None:
        self.inner, self.runner = inner, runner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.runner.open_connections -= 1
        self.inner.connection_lost(exc)


class BoundedRunner(web.AppRunner):
    """An AppRunner whose sites hand at most `max_connections` connections to the app at once."""

    def __init__(self, app: web.Application, max_connections: int, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self.max_connections = max_connections
        self.open_connections = 0
        self.refused = 0
        self.refusing = 0  # refused connections still lingering

    @property
    def server(self) -> Callable[[], asyncio.Protocol] | None:
        inner = super().server
        return None if inner is None else partial(self._protocol_for_new_connection, inner)

    def _protocol_for_new_connection(self, inner: web.Server) -> asyncio.Protocol:
        if self.open_connections >= self.max_connections:
            self.refused += 1
            return _Refused(self)
        self.open_connections += 1
        return _Counted(inner(), self)


def bounded_runner(app: web.Application, max_connections: int, client_timeout: float, **kwargs) -> BoundedRunner:
    """Idle and header time are aiohttp's keep-alive timer; after an early answer (408, 413) the
    rest of a body is read and dropped for at most the same time (aiohttp's lingering time)."""
    return BoundedRunner(
        app,
        max_connections,
        access_log=None,
        keepalive_timeout=client_timeout,
        lingering_time=min(client_timeout, 10.0),
        **kwargs,
    )


def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    max_connections: int,
    client_timeout: float,
    on_started: Callable[[], None] = lambda: None,
) -> None:
    """Serve until SIGINT or SIGTERM; then stop accepting and answer the requests in flight."""
    runner = bounded_runner(app, max_connections, client_timeout, handle_signals=True)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, host, port).start())
        on_started()
        loop.run_forever()
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
