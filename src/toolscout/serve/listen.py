"""Running an ASGI app under uvicorn, for `toolscout serve` and `toolscout gateway`: the command says it is
serving once uvicorn is listening, so a port in use fails first, instead of after a line saying "serving ...
at http://HOST:PORT". uvicorn binds the port as it always does (every address the host resolves to; IPv6 only
for an IPv6 host); the same binds are tried first (`check_listen`), so that a port in use or an address the
host lacks is a toolscout error naming the flag (the command exits 1) rather than uvicorn's raw
"[Errno 98] address already in use". (Should another process take the port between the two, uvicorn's own
error still stops the command, with exit status 3.)"""

from __future__ import annotations

import errno
import socket
import sys
from typing import Any

from ..errors import ToolScoutError


class CannotListen(ToolScoutError):
    """The server cannot listen where it was told to (`--host`, `--port`)."""


def check_listen(host: str, port: int) -> None:
    """Bind, and let go, every address uvicorn will listen on for `host`:`port` (asyncio's binds: SO_REUSEADDR,
    IPv6 only for IPv6); CannotListen naming `--port` or `--host` when one cannot be bound."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CannotListen(f"--host {host}: cannot listen there: {exc.strerror}") from None
    for family, kind, proto, _name, address in dict.fromkeys(found):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise CannotListen(_cannot_bind(host, port, exc)) from None


def _cannot_bind(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use (another server listens there): stop it, or choose "
                "another port with --port")
    if exc.errno == errno.EACCES:
        return f"--port {port}: not allowed to listen on it here ({exc.strerror}): choose a port above 1023"
    return f"cannot listen on {host} port {port}: {exc.strerror}; check --host and --port"


def run_server(app: Any, host: str, port: int, log_level: str, announce: str, graceful_s: float,
               server_class: Any = None) -> None:
    """Serve `app` until uvicorn stops, printing `announce` (to stderr) once it listens; `server_class`: a
    `uvicorn.Server` subclass (the gateway's shuts its calls down first on a signal)."""
    import uvicorn

    check_listen(host, port)

    class Announcing(server_class or uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)  # exits 3 when it cannot listen
            if not self.should_exit:
                print(announce, file=sys.stderr, flush=True)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=graceful_s)
    try:
        Announcing(config).run()
    except KeyboardInterrupt:  # Ctrl-C, re-raised after uvicorn's graceful stop: a normal end, as uvicorn.run has it
        pass
