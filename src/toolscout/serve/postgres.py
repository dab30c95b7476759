"""The shared PostgreSQL index as the service's catalog: `toolscout serve --store postgresql://...`.

- The database is the catalog. There is no directory, journal or snapshot: every process serving the
  same DSN and table serves the same catalog, and a write is durable and visible to every replica once
  its transaction commits (before the write is acknowledged).
- Tenants. Every statement is scoped to one tenant: a tenant's catalog never sees, counts, gets, lists
  or overwrites another tenant's tools, and tool ids, names and versions are per tenant.
- Per-process state is the encoder and, per tenant, a name index (queries that name a tool rank it
  first). The index records the catalog version it reflects. Every search reads the tenant's version
  in the same statement (the same snapshot) as its ranking, and when that version is newer the index
  is brought up to it from the change log (only the changed ids) before the hits are built: a search
  is never answered from a name index older than the catalog it ranked. `name_count` (naming tools
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
from typing import Any, Sequence

from ..conversation import focus
from ..encoders.fast import fast_queries_for, fast_query_kind, task_encoder
from ..errors import Conflict, InvalidRequest, NotFound
from ..feedback import FeedbackEvent, LearnResult, Usage
from ..hits import Hit, HitPolicy, NameIndex, assemble_hits
from ..intents import IntentMerge
from ..postgres import encode_rows
from ..results import Filter
from ..retrievers.dense import encoder_for, vector_hash
from ..store import pg_feedback
from ..store.pg_config import IndexConfig
from ..store.pgvector import NeedVectors, PgRow, PgSpec, PgStoreError, PgVectorStore, StoredRow
from ..tool import TextView, Tool, tool_text
from .catalog import Authorize, Visible, WriteResult
from .errors import ServiceError

WRITE_ATTEMPTS = 3


class PostgresCatalog:
    """Every tenant's catalog in one PostgreSQL index table. Open with `PostgresCatalog.open(spec)`."""

    kind = "postgresql"
    versions_are_local = False  # other replicas write too: a version read is a round trip

    def __init__(self, store: PgVectorStore, encoder: Any, config: IndexConfig, *, max_stale_s: float = 1.0,
                 fast_queries: bool | str = False):
        self.store = store
        self.encoder = encoder  # tool vectors and feedback
        kind = fast_query_kind(fast_queries)  # a fast tier: tasks through a table or student distilled from it
        self.query_encoder = fast_queries_for(encoder, kind) if kind else encoder
        self.config = config
        self.view = TextView.from_dict(config.view)
        self.intents = IntentMerge.from_dict(config.intents)
        self.max_stale_s = max_stale_s
        self.failed: str | None = None  # the database keeps every write: nothing here disables writes
        self._tenants: dict[str, PostgresTenant] = {}
        self._tenants_lock = threading.Lock()

    @classmethod
    def open(cls, spec: str | PgSpec, *, encoder: Any = None, max_stale_s: float = 1.0,
             fast_queries: bool | str = False) -> "PostgresCatalog":
        """Connect to the index table of `spec` (migrating its schema if needed) and load the encoder its
        configuration names (`fast_queries`: a fast tier for tasks, `encoders/fast.py`)."""
        store = PgVectorStore.from_spec(spec)
        try:
            config = IndexConfig.from_dict(store.database.config())
            encoder = encoder if encoder is not None else encoder_for(config.model, backend=config.encoding)
            if encoder.dim != store.dim:
                raise PgStoreError(f"the encoder {config.model!r} gives {encoder.dim}-dimensional vectors but index "
                                   f"table {store.table!r} holds {store.dim}-dimensional ones")
            return cls(store, encoder, config, max_stale_s=max_stale_s, fast_queries=fast_queries)
        except BaseException:
            store.close()
            raise

    def tenant(self, name: str | None) -> "PostgresTenant":
        name = name or self.store.tenant
        state = self._tenants.get(name)
        if state is None:
            with self._tenants_lock:
                state = self._tenants.get(name)
                if state is None:
                    store = self.store if name == self.store.tenant else self.store.for_tenant(name)
                    state = self._tenants[name] = PostgresTenant(self, store)
        return state

    def describe(self) -> str:
        return str(self.store.spec)

    def check_retraining(self, method: str, **options: Any) -> None:
        raise Conflict("heavier learning (--train) works on a pipeline directory: the PostgreSQL store keeps "
                       "one encoder per index table. Export the feedback, train with `toolscout train`, and "
                       "index the catalog into a new table with the trained model")

    def retrain(self, method: str, workdir: Any = None, **options: Any) -> Any:
        self.check_retraining(method, **options)

    def set_feedback_cap(self, cap: int) -> None:
        if cap < 1:
            raise InvalidRequest(f"the feedback cap must be at least 1, got {cap}")
        config = self.store.database.config()
        self.store.database.set_config({**config, "feedback_cap": int(cap)})  # every replica's next feedback
        self.config = IndexConfig.from_dict({**config, "feedback_cap": int(cap)})

    def compact(self) -> bool:
        """Nothing to compact: the database holds every write."""
        return False

    def stats(self) -> dict[str, Any]:
        return {"store": str(self.store.spec), "search": self.config.search, "retriever": "pgvector",
                "fast_queries": self.query_encoder is not self.encoder,
                "task_encoders": [task_encoder(self.encoder, self.query_encoder)]}

    def close(self, compact: bool = True) -> None:
        self.store.close()


class PostgresTenant:
    """One tenant of a `PostgresCatalog`: its store handle and its name index (see the module doc)."""

    def __init__(self, catalog: PostgresCatalog, store: PgVectorStore):
        self.catalog = catalog
        self.store = store
        self.names: NameIndex | None = None
        self.slim: dict[str, Tool] = {}  # id -> a Tool with the fields the name index reads
        self.counts: Counter = Counter()  # name -> tools with that name
        self.indexed_version = -1  # the catalog version the name index reflects
        self.seen = -1  # the newest version a search or write of this process saw
        self.checked_at = 0.0
        self.lock = threading.Lock()

    # reads ---------------------------------------------------------------------------------
    def search(self, queries: Sequence[str], filter: Filter | None, policy: HitPolicy) -> list[list[Hit]]:
        ranking = _Ranking(self, filter)
        intents = self.catalog.intents
        texts = [focus(q)[0] for q in queries]  # a long task: the part search reads (conversation.focus)
        results = intents.search(texts, policy.k, ranking) if intents else ranking(texts, policy.k)
        self.seen = max(self.seen, ranking.version)
        named = self._named(queries, filter, ranking.version) if policy.match_names else [[] for _ in queries]
        return [assemble_hits(q, ids, scores, named[i], policy,
                              _RowSource(self, text, ranking.docs, ranking.vectors[text], filter))
                for i, (q, text, (ids, scores)) in enumerate(zip(queries, texts, results))]

    def _named(self, queries: Sequence[str], filter: Filter | None, version: int) -> list[list[str]]:
        self._refresh(version)
        with self.lock:  # a refresh for another request may be changing the index
            return [[tid for tid in self.names.lookup(q)
                     if filter is None or filter.allows(tid, self.slim[tid].namespace)] for q in queries]

    def get(self, tool_id: str) -> Tool | None:
        doc = self.store.docs([tool_id]).get(tool_id)
        return None if doc is None else Tool.from_dict(doc)

    def page(self, namespace: str | None, namespaces: frozenset[str] | None, offset: int,
             limit: int) -> tuple[int, list[Tool]]:
        total, docs = self.store.page(namespace, namespaces, offset, limit)
        return total, [Tool.from_dict(d) for d in docs if d is not None]

    def namespace_counts(self, namespaces: frozenset[str] | None) -> dict[str, int]:
        return self.store.namespace_counts(namespaces)

    def name_count(self, name: str) -> int:
        if self.names is None or time.monotonic() - self.checked_at > self.catalog.max_stale_s:
            self._refresh()
        return self.counts.get(name, 0)

    def version(self) -> int:
        """The tenant's catalog version as of the last search or write this process made for it."""
        if self.seen < 0:
            self.seen = max(self.seen, self.store.version())
        return self.seen

    def current_version(self) -> int:
        """Read from the database: another replica may have written since this one last looked."""
        version = self.store.version()
        self.seen = max(self.seen, version)
        return version

    def __len__(self) -> int:
        return len(self.store)

    def _refresh(self, seen: int | None = None) -> None:
        """Bring the name index up to version `seen` (None: up to the current version)."""
        if seen is not None and self.indexed_version >= seen:
            return
        with self.lock:
            if seen is not None and self.indexed_version >= seen:
                return
            current, changed = (0, None) if self.names is None else self.store.changes_since(self.indexed_version)
            if self.names is None or changed is None:
                current = self.store.version()  # read before the rows: the index may be newer, never older
                self.names, self.slim, self.counts = NameIndex(), {}, Counter()
                changed, rows = None, self.store.name_rows()
            else:
                rows = self.store.name_rows(changed) if changed else []
            self._apply_name_rows(changed or (), rows)
            self.indexed_version = max(self.indexed_version, current)
            self.checked_at = time.monotonic()

    def _apply_name_rows(self, changed: Sequence[str], rows: list) -> None:
        for tool_id in changed:
            old = self.slim.pop(tool_id, None)
            if old is not None:
                self.names.remove(old)
                self.counts[old.name] -= 1
        for tool_id, name, title, namespace in rows:
            tool = Tool(tool_id, name, "", namespace=namespace or None, title=title)
            self.slim[tool_id] = tool
            self.names.add(tool)
            self.counts[name] += 1

    # feedback ------------------------------------------------------------------------------
    def learn(self, events: Sequence[FeedbackEvent]) -> LearnResult:
        """Embed the requests (outside any transaction), then record and fold them in one transaction."""
        usages = list(dict.fromkeys(Usage(t, e.source, e.query) for e in events if e.teaches for t in e.tool_ids))
        vectors = self.catalog.encoder.encode_queries([u.query for u in usages]) if usages else []
        result, version = self.store.learn(events, dict(zip(usages, vectors)))
        self.seen = max(self.seen, version)
        return result

    def forget(self, source: str) -> list[str]:
        touched, version = self.store.forget(source)
        self.seen = max(self.seen, version)
        return touched

    def namespaces_of(self, ids: Sequence[str]) -> dict[str, str | None]:
        return {tid: doc.get("namespace") for tid, doc in self.store.docs(list(ids)).items() if doc is not None}

    def feedback_of(self, tool_id: str) -> dict[str, int]:
        return pg_feedback.summary(self.store, tool_id)

    def feedback_totals(self) -> dict[str, Any]:
        return pg_feedback.totals(self.store)

    # writes --------------------------------------------------------------------------------
    def upsert(self, tools: Sequence[Tool], authorize: Authorize) -> WriteResult:
        """Insert or replace tools by id; committed when this returns. Vectors are made outside the
        transaction; if another replica changed a text meanwhile, that tool is embedded and the write retried."""
        view, weight = self.catalog.view, self.catalog.config.summary_weight
        texts = {t.id: tool_text(t, view) for t in tools}
        hashes = {t.id: vector_hash(t, view, texts[t.id], weight) for t in tools}
        stored = self.store.hashes(list(texts))
        vectors = self._encode([t for t in tools if stored.get(t.id) != hashes[t.id]], texts)
        for _attempt in range(WRITE_ATTEMPTS):
            result = WriteResult(0)
            rows = [PgRow(t.id, t.namespace, vectors.get(t.id), texts[t.id], hashes[t.id], t.to_record()) for t in tools]
            try:
                outcome = self.store.write(rows, inspect=_UpsertCheck(tools, authorize, result))
            except NeedVectors as exc:  # another replica changed a text meanwhile: embed it and retry
                by_id = {t.id: t for t in tools}
                vectors.update(self._encode([by_id[i] for i in exc.ids if i not in vectors], texts))
                continue
            result.seq = self.seen = max(self.seen, outcome.version)
            return result
        raise ServiceError("the tools kept changing under this write; retry")

    def delete(self, ids: Sequence[str], visible: Visible) -> WriteResult:
        if not ids:
            return WriteResult(self.version())

        def inspect(current: dict[str, StoredRow], rows, delete):
            unknown = [i for i in ids if i not in current or not visible(current[i].namespace or None)]
            if unknown:
                raise NotFound(f"no tool with id {unknown[0]!r}" if len(unknown) == 1
                               else f"no tools with ids {unknown[:5]}")
            return [], list(ids)

        outcome = self.store.write((), list(ids), inspect=inspect)
        self.seen = max(self.seen, outcome.version)
        gone = set(outcome.deleted)
        return WriteResult(outcome.version, deleted=[i for i in ids if i in gone])  # in the request's order

    def _encode(self, tools: list[Tool], texts: dict[str, str]) -> dict:
        """id -> vector, made as the table's other vectors were (its summary weight)."""
        return encode_rows(self.catalog.encoder, tools, self.catalog.view, texts, self.catalog.config.summary_weight)


class _Ranking:
    """`search(texts, k) -> Results` in one statement per call (what `IntentMerge.search` calls), keeping
    what the statement returned besides the ranking: the tools' documents, the query vectors and the
    catalog version it saw."""

    def __init__(self, tenant: PostgresTenant, filter: Filter | None):
        self.tenant, self.filter = tenant, filter
        self.docs: dict[str, dict] = {}
        self.vectors: dict[str, Any] = {}
        self.version = -1

    def __call__(self, texts: list[str], k: int):
        catalog = self.tenant.catalog
        vectors = catalog.query_encoder.encode_queries(texts)
        lexical = texts if catalog.config.search != "dense" else None
        outcome = self.tenant.store.query(vectors, lexical, k, self.filter, mode=catalog.config.search, docs=True)
        self.docs.update(outcome.docs)
        self.vectors.update(zip(texts, vectors))
        self.version = max(self.version, outcome.version)
        return outcome.results


class _UpsertCheck:
    """The `inspect` step of an upsert, run inside the write transaction on the locked stored rows: it
    authorizes each tool against what it replaces, skips unchanged tools, and keeps stored vectors whose
    text is unchanged."""

    def __init__(self, tools: Sequence[Tool], authorize: Authorize, result: WriteResult):
        self.tools, self.authorize, self.result = tools, authorize, result

    def __call__(self, current: dict[str, StoredRow], rows: list[PgRow], delete) -> tuple[list[PgRow], list]:
        result = self.result
        result.created, result.updated, result.unchanged = [], [], []
        out = []
        for tool, row in zip(self.tools, rows):
            stored = current.get(tool.id)
            old = None if stored is None else _stored_tool(stored)
            self.authorize(tool, old)
            if tool.same_as(old):
                result.unchanged.append(tool.id)
                continue
            (result.created if stored is None else result.updated).append(tool.id)
            if stored is not None and stored.content_hash == row.content_hash:
                row.vector = None  # same text: keep the stored vector
            elif row.vector is None:
                raise NeedVectors([tool.id])
            out.append(row)
        return out, []


def _stored_tool(stored: StoredRow) -> Tool:
    """The Tool a stored row holds (a row written without its document: a stand-in with its namespace)."""
    if stored.doc is not None:
        return Tool.from_dict(stored.doc)
    return Tool(stored.id, stored.id, namespace=stored.namespace or None)


class _RowSource:
    """`HitSource` for one query of a PostgreSQL search: tools from the documents the search returned;
    tools it did not return (named or always included) are read and scored under the same filter."""

    def __init__(self, tenant: PostgresTenant, query: str, docs: dict[str, dict], vector, filter: Filter | None):
        self.tenant, self.query, self.docs, self.vector, self.filter = tenant, query, docs, vector, filter
        self._extra: dict[str, tuple[float, dict]] = {}

    def tools(self, ids: Sequence[str]) -> dict[str, Tool]:
        missing = [tid for tid in ids if tid not in self.docs]
        if missing:
            self._extra = self._read(missing)
        docs = {**self.docs, **{tid: doc for tid, (_s, doc) in self._extra.items()}}
        return {tid: Tool.from_dict(docs[tid]) for tid in ids if docs.get(tid) is not None}

    def scores(self, query: str, ids: Sequence[str]) -> dict[str, float]:
        return {tid: self._extra[tid][0] for tid in ids if tid in self._extra}

    def _read(self, wanted: list[str]) -> dict[str, tuple[float, dict]]:
        flt = self.filter
        ids = frozenset(wanted) if flt is None or flt.ids is None else frozenset(wanted) & flt.ids
        only = Filter(flt.namespaces if flt else None, ids, flt.exclude_ids if flt else frozenset())
        mode = self.tenant.catalog.config.search
        texts = [self.query] if mode != "dense" else None
        outcome = self.tenant.store.query(self.vector[None, :], texts, len(wanted), only, mode=mode, docs=True)
        found_ids, scores = outcome.results[0]
        return {tid: (float(s), outcome.docs[tid]) for tid, s in zip(found_ids, scores)}
