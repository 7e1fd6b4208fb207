"""Slow, greedy and oversized clients, over real sockets: a client trickling its headers or its
body is cut off after the client timeout, one connection too many is answered 503, a body over
the limit is refused without the server keeping its memory, and a normal client is served all
the while."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

import pytest
from aiohttp import ClientSession, web

from app.net import free_port
from app.serving.batcher import Batcher
from app.serving.connections import bounded_runner
from app.serving.rest import Limits, make_app
from tests.serving.test_overload import GatedRuntime, OneModelStore, jpeg

CLIENT_TIMEOUT = 1.0


def run_server(tmp_path: Path, scenario, max_connections: int = 8, max_body_bytes: int = 8 * 2**20) -> None:
    """`scenario(port)` against the app behind a bounded runner on a real port (the model answers at once)."""
    runtime = GatedRuntime()
    runtime.gate.set()
    limits = Limits(client_timeout_s=CLIENT_TIMEOUT, max_body_bytes=max_body_bytes)
    app = make_app(OneModelStore(runtime, tmp_path), Batcher(4, 0, 64), limits)

    async def main() -> None:
        runner = bounded_runner(app, max_connections, CLIENT_TIMEOUT)
        await runner.setup()
        port = free_port("127.0.0.1")
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            await scenario(port)
        finally:
            await runner.cleanup()

    asyncio.run(main())


async def classify_ok(port: int) -> int:
    async with ClientSession() as session:
        url = f"http://127.0.0.1:{port}/v1/models/pets:classify"
        async with session.post(url, data=jpeg(), headers={"Content-Type": "image/jpeg"}) as resp:
            assert (await resp.json())["predictions"][0]["label"] == "dog"
            return resp.status


def classify_head(content_length: int) -> bytes:
    """A :classify request's headers, its body yet to come."""
    return (
        b"POST /v1/models/pets:classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
        b"Content-Length: %d\r\n\r\n" % content_length
    )


async def trickle(writer: asyncio.StreamWriter, data: bytes, seconds_per_byte: float) -> float:
    """Send `data` a byte at a time; → seconds until the server stopped taking it (or all was sent)."""
    start = time.monotonic()
    try:
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(seconds_per_byte)
    except ConnectionError:
        pass
    return time.monotonic() - start


def test_headers_sent_a_byte_at_a_time_are_cut_off_while_a_normal_client_is_served(tmp_path: Path):
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        headers = b"GET /v1/models/pets HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
        slow = asyncio.create_task(trickle(writer, headers, 0.05))  # would take 10 s
        await asyncio.sleep(0.2)
        assert await classify_ok(port) == 200  # served while the slow client trickles
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, nothing answered
        assert await slow < 5 * CLIENT_TIMEOUT  # cut off, not allowed the 10 s it wanted
        writer.close()

    run_server(tmp_path, scenario)


def test_a_body_sent_a_byte_at_a_time_gets_408_and_its_connection_closed(tmp_path: Path):
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(classify_head(content_length=400))
        slow = asyncio.create_task(trickle(writer, b"x" * 400, 0.05))  # would take 20 s
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in answer
        assert b"did not arrive within 1 s" in await reader.read()  # the JSON body, then EOF
        slow.cancel()
        for _ in range(3):  # a lingering close: the server still takes (and drops) the late bytes, no reset
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.close()
        assert await classify_ok(port) == 200

    run_server(tmp_path, scenario)


def test_one_connection_past_the_limit_gets_503_and_a_freed_place_is_used_again(tmp_path: Path):
    async def scenario(port: int) -> None:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/models/pets HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer
        assert b"too many open connections" in answer
        writer.close()
        held[0][1].close()  # one leaves; its place is free for the next client
        await asyncio.sleep(0.2)
        assert await classify_ok(port) == 200

    run_server(tmp_path, scenario, max_connections=3)


def test_a_burst_of_connections_is_held_to_the_limit(tmp_path: Path):
    """asyncio accepts a burst before any connection is 'made': the count must start at accept."""

    async def scenario(port: int) -> None:
        opened = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(12)))
        for _, writer in opened:
            writer.write(b"GET /v1/models/pets HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answers = [await asyncio.wait_for(reader.read(), 10) for reader, _ in opened]
        codes = sorted(a.split(b" ")[1].decode() for a in answers)
        assert codes == ["200"] * 4 + ["503"] * 8
        for _, writer in opened:
            writer.close()

    run_server(tmp_path, scenario, max_connections=4)


def test_a_body_declared_over_the_limit_is_refused_before_any_of_it_is_sent(tmp_path: Path):
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(classify_head(content_length=10**9))  # and not one byte of the gigabyte
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert answer.startswith(b"HTTP/1.1 413 ")
        said = await asyncio.wait_for(reader.read(300), 5)  # the sizes, and the flag that raises the limit
        expected = b"request body too large: 953.7 MB, "
        expected += b"over this server's 1,000 bytes limit (photoclf serve --max-body-mb)"
        assert expected in said
        writer.close()

    run_server(tmp_path, scenario, max_body_bytes=1000)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def test_chunked_bodies_over_the_limit_get_413_and_leave_no_memory_behind(tmp_path: Path):
    """No Content-Length to refuse them by: each is read up to the limit. The chunks read so far
    were held by the exception's reference cycle until a full collection: 100 bodies of 6 MB over
    a 4 MB limit kept ~400 MB alive."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to read the process's memory")
    blob = bytes(2**20)

    async def scenario(port: int) -> None:
        url = f"http://127.0.0.1:{port}/v1/models/pets:classify"
        async with ClientSession() as session:

            async def oversized() -> int:
                async def six_megabytes():
                    for _ in range(6):
                        yield blob

                async with session.post(url, data=six_megabytes(), headers={"Content-Type": "image/jpeg"}) as resp:
                    await resp.read()
                    return resp.status

            before = rss_mb()
            gc.disable()  # as in a server whose full collections are rare: nothing may wait for one
            try:
                statuses = [await oversized() for _ in range(100)]
            finally:
                gc.enable()
            grown = rss_mb() - before
        assert statuses == [413] * 100
        assert grown < 100, f"the process grew by {grown:.0f} MB"
        assert await classify_ok(port) == 200

    run_server(tmp_path, scenario, max_body_bytes=4 * 2**20)


def test_the_server_hands_freed_memory_back_while_it_runs_and_stops_with_it(tmp_path: Path, monkeypatch):
    from app.serving import rest

    calls = []
    monkeypatch.setattr(rest, "RELEASE_SECONDS", 0.01)
    monkeypatch.setattr(rest, "release_free_memory", lambda: calls.append(time.monotonic()) or True)

    async def scenario(port: int) -> None:
        await asyncio.sleep(0.3)
        assert len(calls) >= 5

    run_server(tmp_path, scenario)
    stopped = len(calls)
    time.sleep(0.1)
    assert len(calls) == stopped


def test_on_glibc_freed_memory_is_handed_back():
    import platform

    from app.serving.memory import release_free_memory

    assert release_free_memory() is (platform.libc_ver()[0] == "glibc")
