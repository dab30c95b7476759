"""The one service core behind the HTTP API and the MCP server.

`ToolService.open(DIR)` loads a pipeline directory (written by `toolscout index` or `ToolScout.save`),
replays the journal of writes acknowledged since its last snapshot, and then answers searches and
catalog reads while accepting tool upserts and deletes.

Concurrency: searches and reads run in parallel (the pipeline's shared lock); a write is applied under
the pipeline's exclusive lock, so a search sees the catalog before or after a write, never half of one.
Writers queue on one mutex, which also orders the journal. Single-query searches that arrive while
others are being answered are coalesced (`SearchBatcher`): queries with the same options go through the
encoder and the vector scan together, which is what lets two cores serve many concurrent clients.

Durability: a write is appended to `DIR/journal.log` and fsync'd *before* it is applied and
acknowledged (see `journal.py`); only the changed tools are re-embedded (`ToolScout.add`). When the
journal grows past `compact_every` records or `compact_bytes`, and at `close`, the whole pipeline is
saved atomically (`ToolScout.save`, searches keep running, writers wait) with the journal position in
its config, and the journal starts afresh. On `open`, the journal's net effect (last write per id wins)
is applied in one batch, so a long journal replays in one re-embedding pass.

Permissions: every call takes a `Principal`. A principal restricted to some namespaces never sees,
gets, lists or writes a tool outside them (a tool with no namespace counts as namespace "").
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..artifacts import POINTER
from ..errors import ToolScoutError
from ..pipeline import Hit, ToolScout
from ..results import Filter
from ..tool import Tool
from .journal import Journal

LOCK_FILE = "serve.lock"
_UNSET: Any = object()


class ServiceError(ToolScoutError):
    """The service cannot do what was asked in its present state (closed, failed, directory busy)."""


class ServiceUnavailable(ServiceError):
    """Writes are refused: an earlier write could not be recorded; restart the server."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: `namespaces` None means every namespace; `write` allows upserts and deletes.
    `tenant`: whose catalog the caller works on (None: the service's default); only the PostgreSQL
    service (`pg_service.py`) holds several tenants' catalogs."""

    name: str = "anonymous"
    namespaces: frozenset[str] | None = None
    write: bool = False
    tenant: str | None = None

    def sees(self, tool: Tool) -> bool:
        return self.namespaces is None or (tool.namespace or "") in self.namespaces

    @property
    def filter(self) -> Filter | None:
        return Filter.make(namespaces=self.namespaces)


ADMIN = Principal("admin", None, True)


@dataclass
class WriteResult:
    """What one write did. `seq` is the journal position after it (the catalog version)."""

    seq: int
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.seq, "created": self.created, "updated": self.updated,
                "unchanged": self.unchanged, "deleted": self.deleted}


def request_tools(tools: Iterable[Tool]) -> list[Tool]:
    """The tools of one write request, checked: Tool objects only, no id twice."""
    tools = list(tools)
    seen: set[str] = set()
    for tool in tools:
        if not isinstance(tool, Tool):
            raise TypeError(f"expected Tool objects, got {type(tool).__name__}")
        if tool.id in seen:
            raise ValueError(f"duplicate tool id {tool.id!r} in one request")
        seen.add(tool.id)
    return tools


def tool_row(tool: Tool) -> dict[str, Any]:
    """A Tool as a JSON object for the journal (a non-JSON `raw` is kept as its repr, as `save` does)."""
    from ..pipeline import _tool_row

    return _tool_row(tool)


class ToolService:
    """Search and edit one pipeline directory, safely from many threads. See the module doc."""

    def __init__(self, scout: ToolScout, folder: str | os.PathLike, *, journal: Journal,
                 seq: int = 0, min_score: float | None = None, always_include: Sequence[str] = (),
                 compact_every: int = 10_000, compact_bytes: int = 64 << 20, lock_fd: int | None = None,
                 batch_workers: int = 2):
        self.scout = scout
        self.folder = Path(folder)
        self.journal = journal
        self.seq = seq
        self.min_score = min_score
        self.always_include = tuple(always_include)
        self.compact_every = compact_every
        self.compact_bytes = compact_bytes
        self.started_at = time.time()
        self.compactions = 0
        self.last_compaction_s: float | None = None
        self.failed: str | None = None  # set when a write could not be recorded; writes are refused
        self._writer = threading.Lock()
        self._compactor: threading.Thread | None = None
        self._lock_fd = lock_fd
        self._closed = False
        self._names = Counter(t.name for t in scout.tools)
        self._batcher = SearchBatcher(self._search_many, batch_workers) if batch_workers > 0 else None

    # lifecycle -----------------------------------------------------------------------------
    @classmethod
    def open(cls, folder: str | os.PathLike, *, fsync: bool = True, **options: Any) -> "ToolService":
        """Load `folder`, take its lock (one server per directory) and replay its journal."""
        folder = Path(folder)
        if not (folder / POINTER).is_file():
            raise ServiceError(f"{folder}: not a pipeline directory written by `toolscout index` or ToolScout.save "
                               f"(no {POINTER} file); index a catalog into it first")
        lock_fd = _lock_directory(folder)
        try:
            scout = ToolScout.load(folder)
            journal = Journal(folder, fsync=fsync)
            seq = int(scout.saved_config.get("journal_seq", 0))
            seq = _replay(scout, journal, seq)
            return cls(scout, folder, journal=journal, seq=seq, lock_fd=lock_fd, **options)
        except BaseException:
            os.close(lock_fd)
            raise

    def close(self, compact: bool = True) -> None:
        """Save a snapshot if the journal holds writes (unless `compact=False`), then release the directory."""
        if self._closed:
            return
        compactor = self._compactor
        if compactor is not None:
            compactor.join()
        if compact and self.failed is None:
            self.compact()
        if self._batcher is not None:
            self._batcher.close()
        with self._writer:
            self._closed = True
            self.journal.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def __enter__(self) -> "ToolService":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # reads ---------------------------------------------------------------------------------
    def search(self, query: str | Sequence[str], k: int = 5, *, principal: Principal = ADMIN,
               namespaces: Iterable[str] | None = None, ids: Iterable[str] | None = None,
               exclude_ids: Iterable[str] = (), min_score: float | None = _UNSET,
               always_include: Iterable[str] = (), match_names: bool = True) -> list[Hit] | list[list[Hit]]:
        """`ToolScout.search` within what `principal` may see. `min_score` defaults to the service's
        abstention threshold (pass None for none); `always_include` adds to the service's list."""
        options = self._options(k, principal, namespaces, ids, exclude_ids, min_score, always_include, match_names)
        if isinstance(query, str) and self._batcher is not None and not self._closed:
            if not query.strip():
                raise ValueError("each query must be a non-empty string")
            return self._batcher.submit(options, query)
        return self._search_many(options, query)

    def search_future(self, query: str, k: int = 5, *, principal: Principal = ADMIN,
                      namespaces: Iterable[str] | None = None, ids: Iterable[str] | None = None,
                      exclude_ids: Iterable[str] = (), min_score: float | None = _UNSET,
                      always_include: Iterable[str] = (), match_names: bool = True) -> Future | None:
        """`search` of one query without blocking: a Future of its hits, answered in a batch with other
        callers' concurrent queries (what the HTTP API's event loop awaits). None when this service does
        not batch searches (then call `search`, in a thread)."""
        if self._batcher is None or self._closed:
            return None
        if not isinstance(query, str) or not query.strip():
            raise ValueError("each query must be a non-empty string")
        options = self._options(k, principal, namespaces, ids, exclude_ids, min_score, always_include, match_names)
        return self._batcher.submit_future(options, query)

    def _options(self, k, principal, namespaces, ids, exclude_ids, min_score, always_include, match_names) -> tuple:
        flt = search_filter(principal, namespaces, ids, exclude_ids)
        threshold = self.min_score if min_score is _UNSET else min_score
        return (k, flt, threshold, self.always_include + tuple(always_include), bool(match_names))

    def _search_many(self, options: tuple, queries: str | Sequence[str]) -> list[Hit] | list[list[Hit]]:
        k, flt, threshold, always, match_names = options
        return self.scout.search(queries, k, filter=flt, min_score=threshold, always_include=always,
                                 match_names=match_names)

    def get(self, tool_id: str, principal: Principal = ADMIN) -> Tool:
        """The tool with this id; KeyError if there is none *that principal may see*."""
        tool = self.scout._tools.get(tool_id)  # one dict read: atomic
        if tool is None or not principal.sees(tool):
            raise KeyError(f"no tool with id {tool_id!r}")
        return tool

    def list(self, principal: Principal = ADMIN, namespace: str | None = None, offset: int = 0,
             limit: int = 100) -> tuple[int, list[Tool]]:
        """(number of visible tools matching, one page of them) in catalog order."""
        tools = [t for t in self.scout.tools if principal.sees(t)
                 and (namespace is None or (t.namespace or "") == namespace)]
        return len(tools), tools[offset:offset + limit]

    def namespaces(self, principal: Principal = ADMIN) -> dict[str, int]:
        counts = Counter((t.namespace or "") for t in self.scout.tools if principal.sees(t))
        return dict(sorted(counts.items()))

    @property
    def tools(self) -> list[Tool]:
        """Every tool in the catalog (whatever the principal: filter with `Principal.sees`)."""
        return self.scout.tools

    def name_is_shared(self, name: str, principal: Principal = ADMIN) -> bool:
        """True when more than one tool in the catalog has this name (agents need a qualified one)."""
        return self._names.get(name, 0) > 1

    def version(self, principal: Principal = ADMIN) -> int:
        """The catalog version (the journal position) the caller's next read sees."""
        return self.seq

    def __len__(self) -> int:
        return len(self.scout)

    # writes --------------------------------------------------------------------------------
    def upsert(self, tools: Iterable[Tool], principal: Principal = ADMIN) -> WriteResult:
        """Insert or replace tools by id; durable when this returns. Unchanged tools cost nothing."""
        tools = request_tools(tools)
        self._check_can_write(principal)
        with self._writer:
            self._check_open()
            result = WriteResult(self.seq)
            changed, before = [], {}
            for tool in tools:
                old = self.scout._tools.get(tool.id)
                if not principal.sees(tool) or (old is not None and not principal.sees(old)):
                    raise PermissionError(f"tool {tool.id!r}: namespace {tool.namespace!r} is outside what this "
                                          "token may write")
                if old is not None and old == tool and old.raw == tool.raw:
                    result.unchanged.append(tool.id)
                    continue
                (result.created if old is None else result.updated).append(tool.id)
                changed.append(tool)
                before[tool.id] = old
            if not changed:
                return result
            record = {"seq": self.seq + 1, "op": "upsert", "tools": [tool_row(t) for t in changed]}
            self._record(record)
            try:
                self.scout.add(changed)
            except BaseException:
                self._abort(record["seq"])
                self.seq = record["seq"]  # the number is spent: the next write must not reuse it
                raise
            self.seq = result.seq = record["seq"]
            for tool in changed:
                old = before[tool.id]
                if old is not None:
                    self._names[old.name] -= 1
                self._names[tool.name] += 1
        self._maybe_compact()
        return result

    def delete(self, ids: Iterable[str], principal: Principal = ADMIN) -> WriteResult:
        """Remove tools by id; KeyError (naming them) if any is unknown or not visible, and then nothing
        is removed. Durable when this returns."""
        ids = list(dict.fromkeys(ids))
        self._check_can_write(principal)
        with self._writer:
            self._check_open()
            tools = [self.scout._tools.get(i) for i in ids]
            unknown = [i for i, t in zip(ids, tools) if t is None or not principal.sees(t)]
            if unknown:
                raise KeyError(f"no tool with id {unknown[0]!r}" if len(unknown) == 1
                               else f"no tools with ids {unknown[:5]}")
            result = WriteResult(self.seq, deleted=ids)
            if not ids:
                return result
            record = {"seq": self.seq + 1, "op": "delete", "ids": ids}
            self._record(record)
            try:
                self.scout.remove(ids)
            except BaseException:
                self._abort(record["seq"])
                self.seq = record["seq"]
                raise
            self.seq = result.seq = record["seq"]
            for tool in tools:
                self._names[tool.name] -= 1
        self._maybe_compact()
        return result

    def compact(self) -> bool:
        """Save a full snapshot and empty the journal (searches go on; writes wait). False if nothing to do."""
        with self._writer:
            if self._closed or self.journal.records == 0:
                return False
            start = time.perf_counter()
            self.scout.save(self.folder, extra_config={"journal_seq": self.seq})
            self.journal.reset(self.seq)
            self.compactions += 1
            self.last_compaction_s = time.perf_counter() - start
            return True

    # internals -----------------------------------------------------------------------------
    def _check_can_write(self, principal: Principal) -> None:
        if not principal.write:
            raise PermissionError("this token may not change the catalog")

    def _check_open(self) -> None:
        if self._closed:
            raise ServiceError("the service is closed")
        if self.failed is not None:
            raise ServiceUnavailable(f"writes are disabled: {self.failed}; restart the server")

    def _record(self, record: dict[str, Any]) -> None:
        try:
            self.journal.append(record)
        except OSError as exc:  # nothing applied, nothing acknowledged; the file may hold a torn tail
            self.failed = f"could not append to {self.journal.path}: {exc}"
            raise ServiceUnavailable(self.failed) from exc

    def _abort(self, seq: int) -> None:
        """A journalled write failed to apply: record that it must be skipped on replay."""
        try:
            self.journal.append({"seq": seq, "op": "abort"})
        except OSError as exc:
            self.failed = f"write {seq} failed and its abort could not be journalled: {exc}"

    def _maybe_compact(self) -> None:
        if self.journal.records < self.compact_every and self.journal.bytes < self.compact_bytes:
            return
        with self._writer:
            running = self._compactor is not None and self._compactor.is_alive()
            if running or self._closed:
                return
            self._compactor = threading.Thread(target=self._compact_in_background, name="toolscout-compact",
                                               daemon=True)
            self._compactor.start()

    def _compact_in_background(self) -> None:
        try:
            self.compact()
        except Exception as exc:  # the journal still holds every write; the next trigger retries
            import logging

            logging.getLogger(__name__).error("compaction of %s failed: %s", self.folder, exc)

    def stats(self) -> dict[str, Any]:
        return {"tools": len(self.scout), "version": self.seq, "retriever": self.scout.retriever.name,
                "journal_records": self.journal.records, "journal_bytes": self.journal.bytes,
                "compactions": self.compactions, "last_compaction_s": self.last_compaction_s,
                "uptime_s": round(time.time() - self.started_at, 3), "min_score": self.min_score,
                "writes": "failed: " + self.failed if self.failed else "ok",
                "search_batches": self._batcher.batches if self._batcher else None,
                "batched_queries": self._batcher.queries if self._batcher else None}


def search_filter(principal: Principal, namespaces: Iterable[str] | None = None, ids: Iterable[str] | None = None,
                  exclude_ids: Iterable[str] = ()) -> Filter | None:
    """The filter of one search: the request's conditions within the principal's namespaces."""
    flt = Filter.make(namespaces=principal.namespaces, ids=ids, exclude_ids=exclude_ids)
    if namespaces is not None:  # folded into the filter: an intersection with the principal's
        allowed = frozenset(namespaces)
        flt = Filter(allowed if flt is None or flt.namespaces is None else allowed & flt.namespaces,
                     None if flt is None else flt.ids, frozenset() if flt is None else flt.exclude_ids)
    return flt


class SearchBatcher:
    """Answers single-query searches in batches: a worker takes every request queued so far, groups
    them by their options (k, filter, threshold, ...) and answers each group with one batched search:
    one encoder call (the ONNX encoder splits a batch of mixed lengths into runs where padding costs
    least), one matrix product. There is no waiting window: at low load a batch is one request (no
    added latency); under load, requests that arrive while a batch is computed form the next one.
    Two workers by default. One worker makes bigger batches (on 2 busy cores with 8 clients: mean batch
    4.0 against 2.2, and 6% less CPU per request), but it leaves cores idle while it runs the
    single-threaded parts of a batch (the matrix product, building hits): on 2 idle cores with 8 clients
    and 20k tools it served 99.9 req/s with the server at 1.59 cores, and two workers served 110.8 req/s
    at 1.90 cores (`benchmarks/loadtest.py --batch-workers 1|2`). A failing batch is retried
    query by query, so one bad request cannot fail the others."""

    def __init__(self, search_many: Any, workers: int = 2, max_batch: int = 32):
        self._search_many = search_many
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.batches = 0
        self.queries = 0
        self._threads = [threading.Thread(target=self._work, name=f"toolscout-search-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, options: tuple, query: str) -> list[Hit]:
        return self.submit_future(options, query).result()

    def submit_future(self, options: tuple, query: str) -> Future:
        """A Future of the query's hits. Cancelling it before a worker takes it drops the query."""
        future: Future = Future()
        self._queue.put((options, query, future))
        return future

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=30)

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            items = [first]
            while len(items) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:  # closing: finish this batch, then stop
                    self._queue.put(None)
                    break
                items.append(item)
            groups: dict[tuple, list] = {}
            for options, query, future in items:
                if future.set_running_or_notify_cancel():  # False: cancelled (its client went away)
                    groups.setdefault(options, []).append((query, future))
            for options, group in groups.items():
                self._answer(options, group)

    def _answer(self, options: tuple, group: list) -> None:
        self.batches += 1
        self.queries += len(group)
        try:
            results = self._search_many(options, [query for query, _future in group])
        except Exception as exc:
            if len(group) == 1:
                group[0][1].set_exception(exc)
            else:
                for item in group:
                    self._answer(options, [item])
            return
        for (_query, future), hits in zip(group, results):
            future.set_result(hits)


def _lock_directory(folder: Path) -> int:
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ServiceError(f"{folder}: another toolscout server is serving this directory "
                           f"(it holds {folder / LOCK_FILE}); stop it first") from None
    return fd


def _replay(scout: ToolScout, journal: Journal, snapshot_seq: int) -> int:
    """Apply the journal's records newer than the snapshot; return the last sequence number."""
    records = list(journal.replay())
    aborted = {r["seq"] for r in records if r.get("op") == "abort"}
    seq = snapshot_seq
    final: dict[str, Tool | None] = {}  # id -> its last written state (None: deleted)
    for record in records:
        op = record.get("op")
        seq = max(seq, record["seq"])
        if op in ("base", "abort") or record["seq"] <= snapshot_seq or record["seq"] in aborted:
            continue
        if op == "upsert":
            for row in record["tools"]:
                tool = Tool.from_dict(row)
                final[tool.id] = tool
        elif op == "delete":
            for tool_id in record["ids"]:
                final[tool_id] = None
        else:
            raise ToolScoutError(f"{journal.path}: unknown journal record type {op!r} (written by a newer toolscout?)")
    upserts = [t for t in final.values() if t is not None]
    deletes = [i for i, t in final.items() if t is None and i in scout]
    if upserts:
        scout.add(upserts)
    if deletes:
        scout.remove(deletes)
    return seq
