"""Network helpers shared by the servers, their benchmarks and tests."""

from __future__ import annotations

import socket


def free_port(host: str = "") -> int:
    """A TCP port nobody listens on right now (the OS picks it; "" checks every interface)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_bindable(host: str, port: int, named: str = "") -> None:
    """A UserError naming the address when a server could not listen there (in use, not this
    machine's, a privileged port), said before the seconds a server spends loading its model.
    `named`: the flags as the command took them (default `--host HOST --port PORT`)."""
    from app.errors import UserError

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server binds
            s.bind((host, port))
    except OSError as err:
        raise UserError(f"{named or f'--host {host} --port {port}'}: cannot listen there ({err.strerror})") from None
