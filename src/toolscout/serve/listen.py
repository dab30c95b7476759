"""Running an ASGI app under uvicorn, for `toolscout serve` and `toolscout gateway`: the command says it is
serving once uvicorn is listening, so a port in use fails first (uvicorn logs why and the command exits 3),
instead of after a line saying "serving ... at http://HOST:PORT". uvicorn binds the port as it always does
(every address the host resolves to; IPv6 only for an IPv6 host)."""

from __future__ import annotations

import sys
from typing import Any


def run_server(app: Any, host: str, port: int, log_level: str, announce: str, graceful_s: float,
               server_class: Any = None) -> None:
    """Serve `app` until uvicorn stops, printing `announce` (to stderr) once it listens; `server_class`: a
    `uvicorn.Server` subclass (the gateway's shuts its calls down first on a signal)."""
    import uvicorn

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
