"""Every tool definition the gateway has seen, fingerprinted: what changed since, and what is approved.

An upstream can change a tool's description or schema after an agent's operator first saw it (a "rug
pull": the same name, new instructions). The gateway fingerprints each tool when it first sees it, from
what an agent reads of it (name, title, description, input and output schemas, method and path, tags,
which carry MCP's annotation hints), and records every later change with the fields it touched. The first
definition seen is trusted; with `pin`, a tool whose definition differs from the one approved is held out
of search and calls until `approve` (`toolscout gateway approve`) accepts its present definition.

Where the records live (`DefinitionRecords`): two files in the gateway's index directory (`FolderRecords`),
each written atomically under a file lock: `gateway-definitions.json` and `gateway-approvals.json` (written by
`approve`, from the CLI or the running gateway); or, for gateway replicas on PostgreSQL, rows every replica
shares (`SharedRecords`, over `store/pg_gateway.py`), where replicas that see the same change record it once.
The ledger rereads what changed when it changed, so an approval made from another process (or replica) takes
effect at the next search or call.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from ..artifacts import file_lock
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


class DefinitionRecords(Protocol):
    """Where a ledger's records live. `where` names it in messages; `changes(since)` is (a stamp, id -> record
    changed since the stamp `since`, id -> approved digest changed since), or None when nothing changed (cheap:
    the ledger asks at every search); `observe` applies `merged` to the records of the fingerprints seen and
    returns the ids whose definition changed; `approve` records approved digests."""

    where: str

    def changes(self, since: Any) -> tuple[Any, dict[str, dict[str, Any]], dict[str, str]] | None: ...

    def observe(self, seen: dict[str, dict[str, str]], now: float) -> list[str]: ...

    def approve(self, digests: dict[str, str]) -> None: ...


def merged(entry: dict[str, Any] | None, fields: dict[str, str], now: float) -> dict[str, Any] | None:
    """The record of a tool after a listing showed it with the fingerprint `fields` (None: unchanged)."""
    if entry is None:
        return {"first_seen": now, "first": fields["*"], "fields": fields, "changes": []}
    if entry["fields"]["*"] == fields["*"]:
        return None
    touched = [name for name in FIELDS if entry["fields"].get(name) != fields[name]]
    change = {"at": now, "from": entry["fields"]["*"], "to": fields["*"], "fields": touched}
    return {**entry, "fields": fields, "changes": (list(entry["changes"]) + [change])[-MAX_CHANGES_KEPT:]}


class DefinitionLedger:
    """See the module doc. `records`: where they live (a folder: its `FolderRecords`). Safe from several threads."""

    def __init__(self, records: DefinitionRecords | Path | str, *, pin: bool = False, approve_with: str = ""):
        self.records = FolderRecords(Path(records)) if isinstance(records, (Path, str)) else records
        self.pin = pin
        self.approve_with = approve_with  # the `gateway approve` options that reach these records (`approve_command`)
        self._lock = threading.Lock()
        self._tools: dict[str, dict[str, Any]] = {}
        self._approved: dict[str, str] = {}
        self._stamp: Any = None
        self._held: frozenset[str] | None = None  # held_ids, until definitions or approvals change
        self._refresh()

    def approve_command(self, *ids: str) -> str:
        """The command an operator runs to approve `ids` here (every held tool, with none)."""
        return " ".join(["toolscout gateway approve", *ids, *([self.approve_with] if self.approve_with else [])])

    def _refresh(self) -> None:
        """Take in what changed in the records since last read."""
        with self._lock:
            news = self.records.changes(self._stamp)
            if news is None:
                return
            self._stamp, tools, approved = news
            self._tools.update(tools)
            self._approved.update(approved)
            self._held = None

    # what the gateway sees ----------------------------------------------------------------------
    def observe(self, tools: Iterable[Tool]) -> list[str]:
        """Record the definitions in a listing; returns the ids whose definition changed since last seen."""
        changed = self.records.observe({tool.id: fingerprint(tool) for tool in tools}, time.time())
        self._refresh()
        return changed

    def held(self, tool_id: str) -> bool:
        """Whether `tool_id` is held out of search and calls: pinning is on and its definition is not the
        approved one."""
        if not self.pin:
            return False
        self._refresh()
        entry = self._tools.get(tool_id)
        return entry is not None and entry["fields"]["*"] != self._approved_digest(tool_id, entry)

    def held_ids(self) -> frozenset[str]:
        """Every id `held` says is held (kept between changes: searches ask for it each time)."""
        if not self.pin:
            return frozenset()
        self._refresh()
        with self._lock:
            if self._held is None:
                self._held = frozenset(tid for tid, entry in self._tools.items()
                                       if entry["fields"]["*"] != self._approved_digest(tid, entry))
            return self._held

    def describe(self, tool_id: str) -> dict[str, Any] | None:
        """What `/tools/{id}` shows: the fingerprint, when first seen, its changes, whether it is held."""
        self._refresh()
        entry = self._tools.get(tool_id)
        if entry is None:
            return None
        approved = self._approved_digest(tool_id, entry)
        return {"digest": entry["fields"]["*"], "first_seen": entry["first_seen"],
                "changed": entry["fields"]["*"] != entry["first"], "approved": entry["fields"]["*"] == approved,
                "held": self.pin and entry["fields"]["*"] != approved, "changes": entry["changes"][-10:]}

    def _approved_digest(self, tool_id: str, entry: dict[str, Any]) -> str:
        return self._approved.get(tool_id) or entry["first"]

    # approvals ---------------------------------------------------------------------------------
    def pending(self) -> list[str]:
        """Ids whose present definition is not the approved one (what `approve` with no ids accepts)."""
        self._refresh()
        return sorted(tid for tid, entry in self._tools.items()
                      if entry["fields"]["*"] != self._approved_digest(tid, entry))

    def approve(self, ids: Sequence[str] | None = None) -> list[str]:
        """Accept the present definition of `ids` (None: of every tool whose definition changed); returns
        the ids approved. NotFound names an id the gateway has never seen."""
        self._refresh()
        unknown = [tid for tid in ids or () if tid not in self._tools]
        if unknown:
            raise NotFound(f"no tool with id {unknown[0]!r} has been seen by {self.records.where}")
        chosen = list(ids) if ids else self.pending()
        self.records.approve({tid: self._tools[tid]["fields"]["*"] for tid in chosen})
        self._refresh()
        return chosen


class FolderRecords:
    """The records as two JSON files in a gateway's index directory, each changed under a file lock (so several
    processes may observe and approve), written beside and renamed; reread when a file changes."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.where = f"the gateway of {self.folder}"

    def changes(self, since: Any) -> tuple[Any, dict[str, dict[str, Any]], dict[str, str]] | None:
        stamp = (_stamp(self.folder / DEFINITIONS_FILE), _stamp(self.folder / APPROVALS_FILE))
        if stamp == since:
            return None
        return (stamp, _read(self.folder / DEFINITIONS_FILE).get("tools", {}),
                _read(self.folder / APPROVALS_FILE).get("approved", {}))

    def observe(self, seen: dict[str, dict[str, str]], now: float) -> list[str]:
        with file_lock(self.folder / (DEFINITIONS_FILE + ".lock")):
            tools = _read(self.folder / DEFINITIONS_FILE).get("tools", {})
            updates = {tid: entry for tid, fields in seen.items() if (entry := merged(tools.get(tid), fields, now))}
            if updates:
                _write(self.folder / DEFINITIONS_FILE, {"tools": {**tools, **updates}})
        return [tid for tid in updates if tid in tools]

    def approve(self, digests: dict[str, str]) -> None:
        with file_lock(self.folder / (APPROVALS_FILE + ".lock")):
            approved = _read(self.folder / APPROVALS_FILE).get("approved", {})
            _write(self.folder / APPROVALS_FILE, {"approved": {**approved, **digests}})


class SharedRecords:
    """The records in the PostgreSQL tables gateway replicas share (`store/pg_gateway.PgGatewayState`)."""

    def __init__(self, state: Any):
        self.state = state
        self.where = f"the gateways of tenant {state.tenant!r} of index table {state.table!r}"

    def changes(self, since: Any) -> tuple[Any, dict[str, dict[str, Any]], dict[str, str]] | None:
        stamp, records = self.state.definitions_since(since or 0)
        if not records:
            return None
        tools = {tid: {k: r[k] for k in ("first_seen", "first", "fields", "changes")} for tid, r in records.items()}
        return stamp, tools, {tid: r["approved"] for tid, r in records.items() if r["approved"]}

    def observe(self, seen: dict[str, dict[str, str]], now: float) -> list[str]:
        return self.state.observe(seen, lambda entry, fields: merged(entry, fields, now))

    def approve(self, digests: dict[str, str]) -> None:
        self.state.approve(digests)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


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
