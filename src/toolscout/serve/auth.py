"""Bearer tokens for the HTTP API and the MCP endpoint.

- No token configured: reads and writes are open (a local development server).
- `--token T` (or TOOLSCOUT_TOKEN, read by the CLI): T may read and write everything; writes without
  a token are refused (401). Reads stay open unless `--require-read-token`.
- `--tokens FILE`: per-token permissions, JSON
  `{"tokens": [{"token": "...", "name": "team-a", "namespaces": ["github", "jira"], "write": false,
  "feedback": true, "source": "agent-7"}]}`.
  `namespaces` (omitted or null: all) restricts everything the token sees and writes; `""` stands for
  tools with no namespace. `feedback` lets a read-only token post tool-use feedback (a write token may
  anyway); it posts as feedback source `source` (default: its name). With the PostgreSQL store
  (`--store postgresql://...`) an entry may name a `"tenant"`: that token works on that tenant's
  catalog only (default: the store's default tenant).

Anonymous readers (when reads are open) see every namespace: use `--require-read-token` when the
namespace restrictions must hold for everyone. Tokens are kept as SHA-256 digests only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ToolScoutError
from .service import ADMIN, Principal

ANONYMOUS = Principal("anonymous", None, False)


class AuthError(ToolScoutError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass
class AuthConfig:
    principals: dict[str, Principal] = field(default_factory=dict)  # sha256(token) -> principal
    require_read_token: bool = False

    @classmethod
    def build(cls, token: str | None = None, tokens_file: str | Path | None = None,
              require_read_token: bool = False) -> "AuthConfig":
        principals: dict[str, Principal] = {}
        if token:
            principals[_digest(token)] = ADMIN
        if tokens_file:
            principals.update(read_tokens_file(tokens_file))
        if require_read_token and not principals:
            raise ToolScoutError("--require-read-token needs --token or --tokens")
        return cls(principals, require_read_token)

    @property
    def enabled(self) -> bool:
        return bool(self.principals)

    @property
    def tenants(self) -> set[str]:
        """The tenants tokens are bound to (only the PostgreSQL store serves several)."""
        return {p.tenant for p in self.principals.values() if p.tenant is not None}

    def authenticate(self, authorization: str | None, *, write: bool, feedback: bool = False) -> Principal:
        """The caller's principal, or AuthError 401 (no or unknown token) / 403 (may not write, or may
        not post feedback when `feedback`)."""
        if not authorization:
            if not self.enabled:
                return ADMIN
            if write or feedback or self.require_read_token:
                raise AuthError(401, "this request needs a bearer token (Authorization: Bearer TOKEN)")
            return ANONYMOUS
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError(401, "malformed Authorization header; expected 'Bearer TOKEN'")
        principal = self.principals.get(_digest(token.strip()))
        if principal is None:
            raise AuthError(401, "invalid bearer token")
        if write and not principal.write:
            raise AuthError(403, f"token {principal.name!r} may read but not change the catalog")
        if feedback and not (principal.write or principal.feedback):
            raise AuthError(403, f"token {principal.name!r} may not post tool-use feedback")
        return principal


def read_tokens_file(path: str | Path) -> dict[str, Principal]:
    path = Path(path)
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ToolScoutError(f"{path}: tokens file not found") from None
    except json.JSONDecodeError as exc:
        raise ToolScoutError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    entries = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ToolScoutError(f'{path}: expected {{"tokens": [{{"token": ..., "namespaces": [...], "write": false}}]}}')
    out: dict[str, Principal] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: tokens[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str) or len(entry["token"]) < 8:
            raise ToolScoutError(f"{where}: needs a 'token' string of at least 8 characters")
        unknown = set(entry) - {"token", "name", "namespaces", "write", "tenant", "feedback", "source"}
        if unknown:
            raise ToolScoutError(f"{where}: unknown field(s) {sorted(unknown)}")
        namespaces = entry.get("namespaces")
        if namespaces is not None and (not isinstance(namespaces, list)
                                       or not all(isinstance(n, str) for n in namespaces)):
            raise ToolScoutError(f"{where}: 'namespaces' must be a list of strings or null")
        tenant = entry.get("tenant")
        if tenant is not None and (not isinstance(tenant, str) or not tenant or len(tenant) > 200):
            raise ToolScoutError(f"{where}: 'tenant' must be a non-empty string of at most 200 characters")
        source = entry.get("source")
        if source is not None and (not isinstance(source, str) or not source or len(source) > 200):
            raise ToolScoutError(f"{where}: 'source' must be a non-empty string of at most 200 characters")
        digest = _digest(entry["token"])
        if digest in out:
            raise ToolScoutError(f"{where}: the same token appears twice")
        out[digest] = Principal(str(entry.get("name") or f"token{i}"),
                                None if namespaces is None else frozenset(namespaces), bool(entry.get("write")),
                                tenant, bool(entry.get("feedback")), source)
    return out
