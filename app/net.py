"""Network helpers shared by the servers, their benchmarks and tests."""

from __future__ import annotations

import socket


def free_port(host: str = "") -> int:
    """A TCP port nobody listens on right now (the OS picks it; "" checks every interface)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
