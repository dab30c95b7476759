"""The shared PostgreSQL index as the service's storage: `toolscout serve --store postgresql://...`.

- The database is the catalog. There is no directory, journal or snapshot: every process serving the
  same DSN and table serves the same catalog, and a write is durable and visible to every replica once
  its transaction commits (before the write is acknowledged).
- Every replica ranks with the library's own pipeline (`pg_replica.Replica`): the pipeline the index table
  records (`toolscout.spec`: first stage, fusion, request splitting, reranker, fast tier), built by the
  library's factory from the tenant's rows (the dense vectors the database holds) and kept current
  through the change log. Every search reads the tenant's version first, and a replica behind it takes
  in the changed rows before it ranks: a search never ranks a catalog older than the one it read, and
  one replica's write changes every replica's very next search.
- Tenants. Every statement is scoped to one tenant: a tenant's catalog never sees, counts, gets, lists
  or overwrites another tenant's tools, and tool ids, names and versions are per tenant.

Writes re-embed a tool only when its text view changed (content hash), outside the transaction; the
transaction then locks the rows, re-checks them (another replica may have written meanwhile) and
writes. Feedback is scored by this process's replica before it is recorded (as the library scores it), and
recorded with its requests' vectors (`store/pg_feedback.py`); every replica's learned channel is built from
those rows, so replicas rank as one pipeline would.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

from ..encoders.fast import fast_queries_for, fast_query_kind
from ..errors import InvalidRequest, NotFound
from ..feedback import FeedbackEvent, LearnResult
from ..learning import teaching_events
from ..pg_pipeline import check_servable, table_spec
from ..pipeline import ToolScout
from ..postgres import as_stored, encode_rows
from ..retrievers.base import task_encoders
from ..retrievers.dense import encoder_for, vector_hash
from ..spec import PipelineSpec, differences
from ..store import pg_feedback
from ..store.pg_config import IndexConfig
from ..store.pg_catalog import PgCatalog, StoredRow, stored_tool
from ..store.pgvector import NeedVectors, PgRow, PgSpec, PgStoreError
from ..tool import TextView, Tool, tool_text
from .errors import ServiceError
from .pg_replica import Replica
from .storage import Authorize, Visible, WriteResult

WRITE_ATTEMPTS = 3
logger = logging.getLogger(__name__)


class PgStorage:
    """Every tenant's catalog in one PostgreSQL index table. Open with `PgStorage.open(spec)`."""

    kind = "postgresql"
    versions_are_local = False  # other replicas write too: a version read is a round trip

    def __init__(self, pg_catalog: PgCatalog, encoder: Any, config: IndexConfig, *, max_stale_s: float = 1.0,
                 fast_queries: bool | str | None = None):
        self.pg_catalog = pg_catalog  # the spec's tenant; every tenant's catalog shares its connection pool
        self.encoder = encoder  # tool vectors and feedback
        self.fast_queries = fast_queries  # how tasks are encoded here (None: as the table's pipeline says)
        tier = table_spec(config).fast_queries if fast_queries is None else fast_query_kind(fast_queries)
        if tier:
            fast_queries_for(encoder, tier)  # refused now, with its reason, rather than at a search
        self.tier = tier
        self.config = config
        self.view = TextView.from_dict(config.view)
        self.max_stale_s = max_stale_s
        self.failed: str | None = None  # the database keeps every write: nothing here disables writes
        self._tenants: dict[str, PgTenantStorage] = {}
        self._tenants_lock = threading.Lock()
        self._told_restart: str | None = None  # the last pipeline change logged (`_restart_needed`)
        self._told_for: dict[str, Any] | None = None  # the configuration row that note was worked out from
        self._told_lock = threading.Lock()

    def check_answering(self) -> None:
        self.pg_catalog.database.check_answering()

    @classmethod
    def open(cls, spec: str | PgSpec, *, encoder: Any = None, max_stale_s: float = 1.0,
             fast_queries: bool | str | None = None) -> "PgStorage":
        """Connect to the index table of `spec` (migrating its schema if needed) and load the encoder its
        configuration names (`fast_queries`: how tasks are encoded, `encoders/fast.py`: None as the table's
        pipeline says, False the encoder itself, "table" or "student" that fast tier). A pipeline this
        process cannot build (a reranker's model directory is not here) is refused now, naming it."""
        pg_catalog = PgCatalog.from_spec(spec)
        try:
            config = IndexConfig.from_dict(pg_catalog.database.config())
            check_servable(table_spec(config), f"index table {pg_catalog.table!r}'s pipeline here")
            encoder = encoder if encoder is not None else encoder_for(config.model, backend=config.encoding)
            if encoder.dim != pg_catalog.dim:
                raise PgStoreError(f"the encoder {config.model!r} gives {encoder.dim}-dimensional vectors but index "
                                   f"table {pg_catalog.table!r} holds {pg_catalog.dim}-dimensional ones")
            return cls(pg_catalog, encoder, config, max_stale_s=max_stale_s, fast_queries=fast_queries)
        except BaseException:
            pg_catalog.close()
            raise

    def tenant(self, name: str | None) -> "PgTenantStorage":
        name = name or self.pg_catalog.tenant
        state = self._tenants.get(name)
        if state is None:
            with self._tenants_lock:
                state = self._tenants.get(name)
                if state is None:
                    own = self.pg_catalog if name == self.pg_catalog.tenant else self.pg_catalog.for_tenant(name)
                    state = self._tenants[name] = PgTenantStorage(self, own)
        return state

    def describe(self) -> str:
        return str(self.pg_catalog.spec)

    def set_feedback_cap(self, cap: int) -> None:
        if cap < 1:
            raise InvalidRequest(f"the feedback cap must be at least 1, got {cap}")
        config = self.pg_catalog.database.config()
        self.pg_catalog.database.set_config({**config, "feedback_cap": int(cap)})  # every replica's next feedback
        self.config = IndexConfig.from_dict({**config, "feedback_cap": int(cap)})

    def stats(self) -> dict[str, Any]:
        replica = self.tenant(None).replica
        scout = replica.scout
        return {"store": str(self.pg_catalog.spec), "search": self.config.search,
                "retriever": scout.retriever.name if scout is not None else self.config.search,
                "dense_search": "in memory" if replica.in_memory else "pgvector HNSW",
                "fast_queries": bool(self.tier),
                "task_encoders": task_encoders(scout.retriever) if scout is not None else [self.encoder.name],
                "restart_needed": self._restart_needed()}

    def _restart_needed(self) -> str | None:
        """Why this replica should be restarted: the table records another pipeline than the one this replica
        built when it started (`toolscout migrate --store DSN --search ...`), and it builds no other until it
        restarts. None when they are the same. Logged once for each change noticed; worked out again only when
        the configuration row changed (/health is polled, by several probes at once)."""
        stored = self.pg_catalog.database.config()
        with self._told_lock:
            if stored == self._told_for:
                return self._told_restart
        note = _pipeline_change(table_spec(IndexConfig.from_dict(stored)), table_spec(self.config))
        if note is not None:
            note = (f"index table {self.pg_catalog.table!r} now serves another pipeline than this replica started "
                    f"with ({note}): this replica ranks with its own until it is restarted")
        with self._told_lock:  # one line per change
            new, self._told_restart, self._told_for = note is not None and note != self._told_restart, note, stored
        if new:
            logger.warning("%s", note)
        return note

    def close(self, compact: bool = True) -> None:
        self.pg_catalog.close()


def _pipeline_change(there: PipelineSpec, here: PipelineSpec) -> str | None:
    """How two pipelines differ, in brief: their first stages when those differ, else the paths of the settings
    that do (their values can be whole retriever trees); None when they are the same. Compared as the table
    stores them: JSON, where a spec built in this process may hold tuples for lists."""
    changed = [line.partition(":")[0] for line in differences(as_stored(there.to_dict()), as_stored(here.to_dict()))]
    if not changed:
        return None
    if there.retriever["name"] != here.retriever["name"]:
        return f"first stage {there.retriever['name']!r} there, {here.retriever['name']!r} here"
    return f"settings that differ: {', '.join(changed[:6])}{', ...' if len(changed) > 6 else ''}"


class PgTenantStorage:
    """One tenant of a `PgStorage`: its catalog in the database and its replica (see the module doc)."""

    def __init__(self, storage: PgStorage, pg_catalog: PgCatalog):
        self.storage = storage  # what the table's tenants share: its encoder, configuration and text view
        self.pg_catalog = pg_catalog
        self.replica = Replica(pg_catalog, storage.encoder, storage.config, storage.fast_queries)
        self.seen = -1  # the newest version a search or write of this process saw
        self.checked_at = 0.0

    # reads: the service reads the pipeline itself ---------------------------------------------
    def pipeline(self, fresh: bool = True) -> ToolScout:
        """The replica's pipeline, brought up to the database's version now (`fresh`, or when this process
        last read it over `max_stale_s` ago), else to the newest version this process has seen."""
        if fresh or time.monotonic() - self.checked_at > self.storage.max_stale_s:
            self.checked_at = time.monotonic()
            return self.replica.catch_up(self.current_version())
        return self.replica.catch_up(max(self.seen, 0))

    def held(self) -> ToolScout | None:
        return self.replica.scout

    def version(self) -> int:
        """The tenant's catalog version as of the last search or write this process made for it."""
        if self.seen < 0:
            self.seen = max(self.seen, self.pg_catalog.version())
        return self.seen

    def current_version(self) -> int:
        """Read from the database: another replica may have written since this one last looked."""
        version = self.pg_catalog.version()
        self.seen = max(self.seen, version)
        return version

    # feedback ------------------------------------------------------------------------------
    def learn(self, events: Sequence[FeedbackEvent]) -> LearnResult:
        """Score the events with this replica's pipeline and embed their requests (outside any transaction),
        then record them in one transaction; every replica learns them from the rows."""
        now = time.time()
        events = [e.at(now) for e in events]
        pipeline = self.pipeline()
        teaching = teaching_events(events)
        queries = list(dict.fromkeys(e.query for e in teaching))
        ranks = pipeline.score(queries)
        channel, before = pipeline.learning, pipeline.learning.memory.tools
        records = pipeline.score_records(teaching, ranks, before)
        keys = {q: channel.key(q) for q in queries}
        result, version = self.pg_catalog.learn(events, keys, {k: r[1] for k, r in ranks.items()},
                                                channel.prepare(queries), records)
        self.seen = max(self.seen, version)
        return result

    def forget(self, source: str) -> list[str] | None:
        touched, version = self.pg_catalog.forget(source)
        self.seen = max(self.seen, version)
        return touched

    def rollback(self, before: float, dry_run: bool = False) -> list[tuple[str, float]]:
        removed, version = self.pg_catalog.rollback(before, dry_run)
        self.seen = max(self.seen, version)
        return removed

    def set_learning(self, weights: dict[str, float | None], freeze: bool | None) -> dict[str, Any]:
        settings = self.pipeline().learning.settings.updated(weights, freeze)
        stored, version = self.pg_catalog.set_learning(settings.to_dict())
        self.seen = max(self.seen, version)
        return stored

    def feedback_of(self, tool_id: str) -> dict[str, int]:
        return pg_feedback.summary(self.pg_catalog, tool_id)

    def learned_of(self, tool_ids: Sequence[str]) -> dict[str, int]:
        return pg_feedback.learned_of(self.pg_catalog, tool_ids)

    def feedback_totals(self) -> dict[str, Any]:
        return pg_feedback.totals(self.pg_catalog)

    # writes --------------------------------------------------------------------------------
    def upsert(self, tools: Sequence[Tool], authorize: Authorize) -> WriteResult:
        """Insert or replace tools by id; committed when this returns. Vectors are made outside the
        transaction; if another replica changed a text meanwhile, that tool is embedded and the write retried."""
        view, weight = self.storage.view, self.storage.config.summary_weight
        texts = {t.id: tool_text(t, view) for t in tools}
        hashes = {t.id: vector_hash(t, view, texts[t.id], weight) for t in tools}
        stored = self.pg_catalog.hashes(list(texts))
        vectors = self._encode([t for t in tools if stored.get(t.id) != hashes[t.id]], texts)
        for _attempt in range(WRITE_ATTEMPTS):
            result = WriteResult(0)
            rows = [PgRow(t.id, t.namespace, vectors.get(t.id), texts[t.id], hashes[t.id], t.to_record()) for t in tools]
            try:
                outcome = self.pg_catalog.write(rows, inspect=_UpsertCheck(tools, authorize, result))
            except NeedVectors as exc:  # another replica changed a text meanwhile: embed it and retry
                by_id = {t.id: t for t in tools}
                vectors.update(self._encode([by_id[i] for i in exc.ids if i not in vectors], texts))
                continue
            result.seq, self.seen = outcome.version, max(self.seen, outcome.version)  # this write's own version
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

        outcome = self.pg_catalog.write((), list(ids), inspect=inspect)
        self.seen = max(self.seen, outcome.version)
        gone = set(outcome.deleted)
        return WriteResult(outcome.version, deleted=[i for i in ids if i in gone])  # in the request's order

    def _encode(self, tools: list[Tool], texts: dict[str, str]) -> dict:
        """id -> vector, made as the table's other vectors were (its summary weight)."""
        return encode_rows(self.storage.encoder, tools, self.storage.view, texts, self.storage.config.summary_weight)


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
            old = None if stored is None else stored_tool(stored.id, stored.namespace, stored.doc)
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


