"""Serving: one service core (`ToolService`) over a directory or PostgreSQL catalog, an HTTP API
(`create_app`) and an MCP server.

    from toolscout.serve import ToolService, create_app
    service = ToolService.open("my-index")          # loads the snapshot, replays the journal
    app = create_app(service)                        # ASGI: uvicorn.run(app)

Everything loads on first use, so `toolscout --help` stays light.
"""

__all__ = ["ToolService", "Principal", "ADMIN", "WriteResult", "ServiceError", "ServiceUnavailable", "create_app"]


def __getattr__(name):
    if name in ("ToolService", "Principal", "ADMIN", "WriteResult", "ServiceError", "ServiceUnavailable"):
        from . import service

        return getattr(service, name)
    if name == "create_app":
        from .http import create_app

        return create_app
    raise AttributeError(f"module 'toolscout.serve' has no attribute {name!r}")
