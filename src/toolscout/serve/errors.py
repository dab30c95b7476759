"""The service's own error types (mapped to 503 by the HTTP API)."""

from __future__ import annotations

from ..errors import ToolScoutError


class ServiceError(ToolScoutError):
    """The service cannot do what was asked in its present state (closed, directory busy, storage refusing)."""


class DirectoryHeld(ServiceError):
    """Another server serves the directory (it holds its serve lock): a change goes through that server."""


class ServiceUnavailable(ServiceError):
    """Writes are refused: an earlier write could not be recorded; restart the server."""
