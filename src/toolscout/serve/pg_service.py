"""The service core on the shared PostgreSQL store: what `toolscout serve --store postgresql://...` runs.

`PgToolService` answers the same calls as `ToolService` (search, get, list, namespaces, upsert, delete,
stats, close), so the HTTP API and the MCP server run on either. What differs:

- The database is the catalog. There is no directory, journal or snapshot: every process serving the
  same DSN and table serves the same catalog, and a write is durable and visible to every replica once
  its transaction commits (before the write is acknowledged).
- Tenants. A call works on its principal's tenant (from its token; else the store spec's tenant, the
  service default). Every statement is scoped to that tenant: a caller never sees, counts, gets, lists
  or overwrites another tenant's tools, and tool ids, names and versions are per tenant.
- Per-process state is the encoder and, per tenant, a name index (queries that name a tool rank it
  first). The index records the catalog version it reflects. Every search reads the tenant's version
  in the same statement (the same snapshot) as its ranking, and when that version is newer the index
  is brought up to it from the change log (only the changed ids) before the hits are built: a search
  is never answered from a name index older than the catalog it ranked. `name_is_shared` (naming tools
  for agents) re-checks the version when its index is older than `max_stale_s` seconds. Replicas also
  receive a NOTIFY on channel `toolscout` for every write, for anything else that wants to listen.

Writes re-embed a tool only when its text view changed (content hash), outside the transaction; the
transaction then locks the rows, re-checks them (another replica may have written meanwhile) and
writes. Reranking is not supported on this store yet.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..pipeline import Hit, NameIndex
from ..results import Filter
from ..retrievers.dense import vector_hash
from ..store.pg_catalog import IndexConfig, encode_rows, tool_doc
from ..store.pgvector import NeedVectors, PgSpec, PgStoreError, PgVectorStore, StoredRow
from ..tool import TextView, Tool, tool_text
from .service import ADMIN, Principal, SearchBatcher, ServiceError, WriteResult, request_tools, search_filter

_UNSET: Any = object()
WRITE_ATTEMPTS = 3


@dataclass
class _Tenant:
    """One tenant's store handle and name index (rebuilt from the change log as the catalog moves)."""

    store: PgVectorStore
    names: NameIndex | None = None
    slim: dict[str, Tool] = field(default_factory=dict)  # id -> Tool with the fields the name index reads
    counts: Counter = field(default_factory=Counter)  # name -> tools with that name
    version: int = -1  # the catalog version the name index reflects
    seen: int = -1  # the newest version a search or write of this process saw
    checked_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class PgToolService:
    """Search and edit the tool catalogs of one PostgreSQL index table, from many threads and many
    processes. See the module doc. Open with `PgToolService.open("postgresql://...")`."""

    def __init__(self, store: PgVectorStore, encoder: Any, config: IndexConfig, *, min_score: float | None = None,
                 always_include: Sequence[str] = (), batch_workers: int = 2, max_stale_s: float = 1.0):
        self.store = store
        self.encoder = encoder
        self.config = config
        self.view = TextView.from_dict(config.view)
        self.search_mode = config.search
        self.min_score = min_score
        self.always_include = tuple(always_include)
        self.max_stale_s = max_stale_s
        self.default_tenant = store.tenant
        self.failed: str | None = None  # the HTTP layer's health check reads it; the database keeps writes
        self.started_at = time.time()
        self._tenants: dict[str, _Tenant] = {}
        self._tenants_lock = threading.Lock()
        self._closed = False
        self._batcher = SearchBatcher(self._search_many, batch_workers) if batch_workers > 0 else None

    @classmethod
    def open(cls, spec: str | PgSpec, *, encoder: Any = None, **options: Any) -> "PgToolService":
        """Connect to the index table of `spec` (migrating its schema if needed) and load the encoder its
        configuration names."""
        store = PgVectorStore.from_spec(spec)
        try:
            config = IndexConfig.from_dict(store.database.config())
            if encoder is None:
                from ..retrievers.dense import encoder_for

                encoder = encoder_for(config.model)
            if encoder.dim != store.dim:
                raise PgStoreError(f"the encoder {config.model!r} gives {encoder.dim}-dimensional vectors but index "
                                   f"table {store.table!r} holds {store.dim}-dimensional ones")
            return cls(store, encoder, config, **options)
        except BaseException:
            store.close()
            raise

    def close(self, compact: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if self._batcher is not None:
            self._batcher.close()
        self.store.close()

    def __enter__(self) -> "PgToolService":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # tenants -------------------------------------------------------------------------------
    def _tenant(self, principal: Principal) -> _Tenant:
        name = principal.tenant or self.default_tenant
        state = self._tenants.get(name)
        if state is None:
            with self._tenants_lock:
                state = self._tenants.get(name)
                if state is None:
                    store = self.store if name == self.default_tenant else self.store.for_tenant(name)
                    state = self._tenants[name] = _Tenant(store)
        return state

    def _refresh(self, state: _Tenant, seen: int | None = None) -> None:
        """Bring the tenant's name index up to version `seen` (None: up to the current version)."""
        if seen is not None and state.version >= seen:
            return
        with state.lock:
            if seen is not None and state.version >= seen:
                return
            current, changed = (0, None) if state.names is None else state.store.changes_since(state.version)
            if state.names is None or changed is None:
                current = state.store.version()  # read before the rows: the index may be newer, never older
                state.names, state.slim, state.counts = NameIndex(), {}, Counter()
                changed, rows = None, state.store.name_rows()
            else:
                rows = state.store.name_rows(changed) if changed else []
            for tool_id in changed or ():
                old = state.slim.pop(tool_id, None)
                if old is not None:
                    state.names.remove(old)
                    state.counts[old.name] -= 1
            for tool_id, name, title, namespace in rows:
                tool = Tool(tool_id, name, "", namespace=namespace or None, title=title)
                state.slim[tool_id] = tool
                state.names.add(tool)
                state.counts[name] += 1
            state.version = max(state.version, current)
            state.checked_at = time.monotonic()

    # reads ---------------------------------------------------------------------------------
    @property
    def seq(self) -> int:
        return self.version()

    def version(self, principal: Principal = ADMIN) -> int:
        """The tenant's catalog version as of the last search or write this process made for it."""
        state = self._tenant(principal)
        if state.seen < 0:
            state.seen = max(state.seen, state.store.version())
        return state.seen

    def search(self, query: str | Sequence[str], k: int = 5, *, principal: Principal = ADMIN,
               namespaces: Iterable[str] | None = None, ids: Iterable[str] | None = None,
               exclude_ids: Iterable[str] = (), min_score: float | None = _UNSET,
               always_include: Iterable[str] = (), match_names: bool = True) -> list[Hit] | list[list[Hit]]:
        """The best tools for `query` in the caller's tenant, within what the caller may see."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        flt = search_filter(principal, namespaces, ids, exclude_ids)
        threshold = self.min_score if min_score is _UNSET else min_score
        tenant = principal.tenant or self.default_tenant
        options = (tenant, k, flt, threshold, self.always_include + tuple(always_include), bool(match_names))
        if isinstance(query, str) and self._batcher is not None and not self._closed:
            if not query.strip():
                raise ValueError("each query must be a non-empty string")
            return self._batcher.submit(options, query)
        return self._search_many(options, query)

    def _search_many(self, options: tuple, query: str | Sequence[str]) -> list[Hit] | list[list[Hit]]:
        tenant, k, flt, threshold, always, match_names = options
        single = isinstance(query, str)
        queries = [query] if single else list(query)
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise ValueError("each query must be a non-empty string")
        state = self._tenant(Principal(tenant=tenant))
        vectors = self.encoder.encode_queries(queries)
        texts = queries if self.search_mode != "dense" else None
        outcome = state.store.query(vectors, texts, k, flt, mode=self.search_mode, docs=True)
        state.seen = max(state.seen, outcome.version)
        if match_names:
            self._refresh(state, outcome.version)
        named = [[] for _ in queries]
        if match_names and state.names is not None:
            with state.lock:  # a refresh for another request may be changing the index
                named = [[tid for tid in state.names.lookup(q)
                          if flt is None or flt.allows(tid, state.slim[tid].namespace)] for q in queries]
        hits = []
        for i, (q, (ids, scores)) in enumerate(zip(queries, outcome.results)):
            hits.append(self._hits(state, q, vectors[i], ids, scores, outcome.docs, k, threshold,
                                   list(dict.fromkeys(always)), named[i][:k], flt))
        return hits[0] if single else hits

    def _hits(self, state: _Tenant, query: str, vector, ids, scores, docs: dict, k: int, min_score: float | None,
              always: list[str], named: list[str], flt: Filter | None) -> list[Hit]:
        """As `ToolScout._hits`: name matches first, the threshold, then always_include. `named`: the
        ids the query names, already within the filter."""
        retrieved = {tid: float(s) for tid, s in zip(ids, scores)}
        abstain = min_score is not None and (not len(scores) or float(scores[0]) < min_score)
        wanted = [tid for tid in dict.fromkeys(named + always) if tid not in retrieved]
        extra = self._score_extra(state, query, vector, wanted, flt) if wanted else {}
        out = [(tid, retrieved.get(tid, extra.get(tid, (0.0, None))[0]), "name") for tid in named
               if tid in retrieved or tid in extra]
        if not abstain:
            taken = {tid for tid, _s, _m in out}
            out += [(tid, s, "retrieval") for tid, s in retrieved.items() if tid not in taken][: k - len(out)]
        taken = {tid for tid, _s, _m in out}
        for tid in always:
            if tid in taken or (tid not in retrieved and tid not in extra):
                continue
            out.append((tid, retrieved.get(tid, extra.get(tid, (0.0, None))[0]), "always"))
            taken.add(tid)
        hits = []
        for rank, (tid, score, match) in enumerate(out, 1):
            doc = docs.get(tid) or extra.get(tid, (0.0, None))[1]
            if doc is not None:
                hits.append(Hit(Tool.from_dict(doc), score, rank, match))
        return [Hit(h.tool, h.score, rank, h.match) for rank, h in enumerate(hits, 1)]

    def _score_extra(self, state: _Tenant, query: str, vector, wanted: list[str],
                     flt: Filter | None) -> dict[str, tuple[float, dict]]:
        """(score, doc) of tools the ranking did not return (named or always included), under `flt`."""
        ids = frozenset(wanted) if flt is None or flt.ids is None else frozenset(wanted) & flt.ids
        only = Filter(flt.namespaces if flt else None, ids, flt.exclude_ids if flt else frozenset())
        texts = [query] if self.search_mode != "dense" else None
        outcome = state.store.query(vector[None, :], texts, len(wanted), only, mode=self.search_mode, docs=True)
        found_ids, scores = outcome.results[0]
        return {tid: (float(s), outcome.docs[tid]) for tid, s in zip(found_ids, scores)}

    def get(self, tool_id: str, principal: Principal = ADMIN) -> Tool:
        """The tool with this id in the caller's tenant; KeyError if there is none the caller may see."""
        doc = self._tenant(principal).store.docs([tool_id]).get(tool_id)
        tool = None if doc is None else Tool.from_dict(doc)
        if tool is None or not principal.sees(tool):
            raise KeyError(f"no tool with id {tool_id!r}")
        return tool

    def list(self, principal: Principal = ADMIN, namespace: str | None = None, offset: int = 0,
             limit: int = 100) -> tuple[int, list[Tool]]:
        """(number of visible tools matching, one page of them) ordered by id."""
        total, docs = self._tenant(principal).store.page(namespace, principal.namespaces, offset, limit)
        return total, [Tool.from_dict(d) for d in docs if d is not None]

    def namespaces(self, principal: Principal = ADMIN) -> dict[str, int]:
        return self._tenant(principal).store.namespace_counts(principal.namespaces)

    @property
    def tools(self) -> list[Tool]:
        """Every tool of the default tenant."""
        return [Tool.from_dict(d) for d in self.store.docs().values() if d is not None]

    def name_is_shared(self, name: str, principal: Principal = ADMIN) -> bool:
        state = self._tenant(principal)
        if state.names is None or time.monotonic() - state.checked_at > self.max_stale_s:
            self._refresh(state)
        return state.counts.get(name, 0) > 1

    def __len__(self) -> int:
        return len(self.store)

    # writes --------------------------------------------------------------------------------
    def upsert(self, tools: Iterable[Tool], principal: Principal = ADMIN) -> WriteResult:
        """Insert or replace tools by id in the caller's tenant; committed when this returns."""
        tools = request_tools(tools)
        self._check_can_write(principal)
        state = self._tenant(principal)
        texts = {t.id: tool_text(t, self.view) for t in tools}
        hashes = {t.id: vector_hash(t, self.view, texts[t.id], self.config.summary_weight) for t in tools}
        stored = state.store.hashes(list(texts))
        by_id = {t.id: t for t in tools}
        vectors = self._encode([by_id[i] for i in by_id if stored.get(i) != hashes[i]], texts)
        for _attempt in range(WRITE_ATTEMPTS):
            result = WriteResult(0)

            def inspect(current: dict[str, StoredRow], rows, delete):
                result.created, result.updated, result.unchanged = [], [], []
                out = []
                for tool, row in zip(tools, rows):
                    old = current.get(tool.id)
                    self._check_may_write(principal, tool, old)
                    if old is not None and old.doc is not None and _same(Tool.from_dict(old.doc), tool):
                        result.unchanged.append(tool.id)
                        continue
                    (result.created if old is None else result.updated).append(tool.id)
                    if old is not None and old.content_hash == row.content_hash:
                        row.vector = None  # same text: keep the stored vector
                    elif row.vector is None:
                        raise NeedVectors([tool.id])
                    out.append(row)
                return out, []

            rows = [_row(t, vectors.get(t.id), texts[t.id], hashes[t.id]) for t in tools]
            try:
                outcome = state.store.write(rows, inspect=inspect)
            except NeedVectors as exc:  # another replica changed a text meanwhile: embed it and retry
                vectors.update(self._encode([by_id[i] for i in exc.ids if i not in vectors], texts))
                continue
            result.seq = state.seen = max(state.seen, outcome.version)
            return result
        raise ServiceError("the tools kept changing under this write; retry")

    def delete(self, ids: Iterable[str], principal: Principal = ADMIN) -> WriteResult:
        """Remove tools by id from the caller's tenant; KeyError (naming them) if any is unknown or not
        visible, and then nothing is removed."""
        ids = list(dict.fromkeys(ids))
        self._check_can_write(principal)
        state = self._tenant(principal)
        if not ids:
            return WriteResult(self.version(principal))

        def inspect(current: dict[str, StoredRow], rows, delete):
            unknown = [i for i in ids if i not in current or not _visible(principal, current[i].namespace)]
            if unknown:
                raise KeyError(f"no tool with id {unknown[0]!r}" if len(unknown) == 1
                               else f"no tools with ids {unknown[:5]}")
            return [], ids

        outcome = state.store.write((), ids, inspect=inspect)
        state.seen = max(state.seen, outcome.version)
        return WriteResult(outcome.version, deleted=outcome.deleted)

    def compact(self) -> bool:
        """Nothing to compact: the database holds every write."""
        return False

    # internals -----------------------------------------------------------------------------
    def _encode(self, tools: list[Tool], texts: dict[str, str]) -> dict:
        """id -> vector, made as the table's other vectors were (its summary weight)."""
        return encode_rows(self.encoder, tools, self.view, texts, self.config.summary_weight)

    def _check_can_write(self, principal: Principal) -> None:
        if not principal.write:
            raise PermissionError("this token may not change the catalog")
        if self._closed:
            raise ServiceError("the service is closed")

    @staticmethod
    def _check_may_write(principal: Principal, tool: Tool, old: StoredRow | None) -> None:
        if not principal.sees(tool) or (old is not None and not _visible(principal, old.namespace)):
            raise PermissionError(f"tool {tool.id!r}: namespace {tool.namespace!r} is outside what this "
                                  "token may write")

    def stats(self) -> dict[str, Any]:
        return {"tools": len(self.store), "version": self.store.version(), "store": str(self.store.spec),
                "search": self.search_mode, "retriever": "pgvector", "journal_records": 0, "journal_bytes": 0,
                "compactions": 0, "last_compaction_s": None, "uptime_s": round(time.time() - self.started_at, 3),
                "min_score": self.min_score, "writes": "ok",
                "search_batches": self._batcher.batches if self._batcher else None,
                "batched_queries": self._batcher.queries if self._batcher else None}


def _visible(principal: Principal, namespace: str | None) -> bool:
    return principal.namespaces is None or (namespace or "") in principal.namespaces


def _same(old: Tool, new: Tool) -> bool:
    return old == new and old.raw == new.raw


def _row(tool: Tool, vector, text: str, digest: str):
    from ..store.pgvector import PgRow

    return PgRow(tool.id, tool.namespace, vector, text, digest, tool_doc(tool))
