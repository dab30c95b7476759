"""Running an ASGI app under uvicorn, for `toolscout serve` and `toolscout gateway`: the port is bound before
the command says it is serving, so a port in use fails first (uvicorn logs why and the command exits 3),
instead of after a line saying "serving ... at http://HOST:PORT"."""

from __future__ import annotations

import sys
from typing import Any


def run_server(app: Any, host: str, port: int, log_level: str, announce: str, graceful_s: float,
               server_class: Any = None) -> None:
    """Bind `host:port`, print `announce` (to stderr), then serve `app` until uvicorn stops; `server_class`:
    a `uvicorn.Server` subclass (the gateway's shuts its calls down first on a signal)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=graceful_s)
    sock = config.bind_socket()
    try:
        print(announce, file=sys.stderr, flush=True)
        (server_class or uvicorn.Server)(config).run(sockets=[sock])
    finally:
        sock.close()
