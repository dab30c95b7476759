"""Every tool definition the gateway has seen, fingerprinted: what changed since, and what is approved.

An upstream can change a tool's description or schema after an agent's operator first saw it (a "rug
pull": the same name, new instructions). The gateway fingerprints each tool when it first sees it, from
what an agent reads of it (name, title, description, input and output schemas, method and path, tags,
which carry MCP's annotation hints), and records every later change with the fields it touched. The first
definition seen is trusted; with `pin`, a tool whose definition differs from the one approved is held out
of search and calls until `approve` (`toolscout gateway approve`) accepts its present definition.

Two files in the gateway's index directory, each written atomically: `gateway-definitions.json` (written
by the gateway only) and `gateway-approvals.json` (written by `approve`, under a file lock, from the CLI or
the running gateway). The gateway rereads the approvals when the file changes, so an approval made from
another process takes effect at the next search or call.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from ..errors import NotFound, ToolScoutError
from ..tool import Tool

DEFINITIONS_FILE = "gateway-definitions.json"
APPROVALS_FILE = "gateway-approvals.json"
FIELDS = ("name", "title", "description", "parameters", "returns", "method", "path", "tags")
MAX_CHANGES_KEPT = 50


def fingerprint(tool: Tool) -> dict[str, str]:
    """A digest of each field an agent reads of `tool`, and of them all ("*")."""
    fields = {name: _digest(getattr(tool, name)) for name in FIELDS}
    fields["*"] = _digest(fields)
    return fields


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class DefinitionLedger:
    """See the module doc. Safe from several threads."""

    def __init__(self, folder: Path, *, pin: bool = False):
        self.folder, self.pin = Path(folder), pin
        self._lock = threading.Lock()
        self._tools: dict[str, dict[str, Any]] = _read(self.folder / DEFINITIONS_FILE).get("tools", {})
        self._approved: dict[str, str] = {}
        self._approvals_stamp: tuple[int, int] | None = None
        self._held: frozenset[str] | None = None  # held_ids, until definitions or approvals change
        self._reload_approvals()

    # what the gateway sees ----------------------------------------------------------------------
    def observe(self, tools: Iterable[Tool]) -> list[str]:
        """Record the definitions in a listing; returns the ids whose definition changed since last seen."""
        now, changed, new = time.time(), [], 0
        with self._lock:
            for tool in tools:
                fields = fingerprint(tool)
                entry = self._tools.get(tool.id)
                if entry is None:
                    self._tools[tool.id] = {"first_seen": now, "first": fields["*"], "fields": fields, "changes": []}
                    new += 1
                    continue
                if entry["fields"]["*"] == fields["*"]:
                    continue
                touched = [name for name in FIELDS if entry["fields"].get(name) != fields[name]]
                entry["changes"] = (entry["changes"] + [{"at": now, "from": entry["fields"]["*"], "to": fields["*"],
                                                         "fields": touched}])[-MAX_CHANGES_KEPT:]
                entry["fields"] = fields
                changed.append(tool.id)
            if changed or new:
                self._held = None
                _write(self.folder / DEFINITIONS_FILE, {"tools": self._tools})
        return changed

    def held(self, tool_id: str) -> bool:
        """Whether `tool_id` is held out of search and calls: pinning is on and its definition is not the
        approved one."""
        if not self.pin:
            return False
        self._reload_approvals()
        entry = self._tools.get(tool_id)
        return entry is not None and entry["fields"]["*"] != self._approved_digest(tool_id, entry)

    def held_ids(self) -> frozenset[str]:
        """Every id `held` says is held (kept between changes: searches ask for it each time)."""
        if not self.pin:
            return frozenset()
        self._reload_approvals()
        with self._lock:
            if self._held is None:
                self._held = frozenset(tid for tid, entry in self._tools.items()
                                       if entry["fields"]["*"] != self._approved_digest(tid, entry))
            return self._held

    def describe(self, tool_id: str) -> dict[str, Any] | None:
        """What `/tools/{id}` shows: the fingerprint, when first seen, its changes, whether it is held."""
        entry = self._tools.get(tool_id)
        if entry is None:
            return None
        self._reload_approvals()
        approved = self._approved_digest(tool_id, entry)
        return {"digest": entry["fields"]["*"], "first_seen": entry["first_seen"],
                "changed": entry["fields"]["*"] != entry["first"], "approved": entry["fields"]["*"] == approved,
                "held": self.pin and entry["fields"]["*"] != approved, "changes": entry["changes"][-10:]}

    def _approved_digest(self, tool_id: str, entry: dict[str, Any]) -> str:
        return self._approved.get(tool_id, entry["first"])

    # approvals ---------------------------------------------------------------------------------
    def pending(self) -> list[str]:
        """Ids whose present definition is not the approved one (what `approve` with no ids accepts)."""
        self._reload_approvals()
        return sorted(tid for tid, entry in self._tools.items()
                      if entry["fields"]["*"] != self._approved_digest(tid, entry))

    def approve(self, ids: Sequence[str] | None = None) -> list[str]:
        """Accept the present definition of `ids` (None: of every tool whose definition changed); returns
        the ids approved. NotFound names an id the gateway has never seen."""
        unknown = [tid for tid in ids or () if tid not in self._tools]
        if unknown:
            raise NotFound(f"no tool with id {unknown[0]!r} has been seen by the gateway of {self.folder}")
        chosen = list(ids) if ids else self.pending()
        with _file_lock(self.folder / (APPROVALS_FILE + ".lock")):
            approved = _read(self.folder / APPROVALS_FILE).get("approved", {})
            for tid in chosen:
                approved[tid] = self._tools[tid]["fields"]["*"]
            _write(self.folder / APPROVALS_FILE, {"approved": approved})
        self._reload_approvals(force=True)
        return chosen

    def _reload_approvals(self, force: bool = False) -> None:
        path = self.folder / APPROVALS_FILE
        try:
            stat = path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._approvals_stamp and not force:
            return
        self._approved = _read(path).get("approved", {}) if stamp is not None else {}
        self._approvals_stamp, self._held = stamp, None


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        raise ToolScoutError(f"{path}: cannot read the gateway's definition records: {exc}; move the file "
                             "aside to start them afresh") from None
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict[str, Any]) -> None:
    """Write beside, then rename: a crash leaves the previous file whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, ensure_ascii=False, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
