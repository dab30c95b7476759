"""One tenant's catalog in a PostgreSQL index, around its vectors: the tools' rows and documents as the
service and the replicas read them, the tenant's version and change log, writes of whole tools (checked
under lock), whole-catalog replaces, and tool-use feedback (`pg_feedback`). The vectors themselves are a
`PgVectorStore` (`PgCatalog.vectors`, store/pgvector.py), which this builds on. It sits in the store layer
because `toolscout.postgres` (indexing, migrating) writes catalogs as the servers do.

- `write(rows, delete)`: one transaction (the version bumped first, the ids logged last, see `PgTenantRows`).
  An `inspect` callback sees the stored rows under lock and decides what is written; a row without a
  vector keeps the stored one when its content hash is unchanged, else the write raises NeedVectors.
- `write(rows, replace=True)`: the tenant's whole catalog. A new partition is built and indexed beside
  the live one (invisible until attached), then swapped in by one short transaction; a write landing in
  between makes the swap retry. Readers see the old catalog until the swap commits.
- `NewPgIndex`: the store `make_store(spec, dim)` gives, a new index whose first write is such a replace.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..feedback import FeedbackEvent, LearnResult, Scored
from ..results import Filter, Results
from ..tool import Tool
from . import pg_feedback
from . import pg_schema as schema
from .pg_deadline import bounded_for
from .base import checked_vectors
from .pgvector import (NeedVectors, NothingToWrite, PgRow, PgSpec, PgStoreError, PgTenantRows, PgVectorStore, as_array,
                       as_jsonb, checked_vector, doc_of, refuse_nul)

REPLACE_LOCK = 0x746F6F6C73637270  # advisory lock held by a swap: one swap at a time in the database


@dataclass(frozen=True)
class StoredRow:
    """A row as the database holds it, read (and locked) inside a write transaction."""

    id: str
    namespace: str
    content_hash: str
    doc: dict | None


def stored_tool(tool_id: str, namespace: str | None, doc: dict | None) -> Tool:
    """The Tool a row holds (a row written without its document: a stand-in with its namespace)."""
    return Tool.from_record(doc) if doc is not None else Tool(tool_id, tool_id, namespace=namespace or None)


@dataclass
class WriteOutcome:
    version: int
    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)  # a replace: the tools the new catalog left out
    taught_kept: int = 0  # a replace: taught (tool, request) rows of the tools it kept,
    taught_dropped: int = 0  # and of those it left out (gone with them)


# An `inspect` callback of `write`: sees the stored rows of every id the write names (locked), and
# returns the (rows, delete ids) to actually write; it may raise to roll the write back.
Inspect = Callable[[dict[str, StoredRow], list[PgRow], list[str]], tuple[list[PgRow], list[str]]]


class _CatalogMoved(Exception):
    """Another write committed while a replace was building its partition."""


class PgCatalog(PgTenantRows):
    """The catalog of one tenant of one index table, around `vectors` (its PgVectorStore, sharing its
    database and tenant). See the module doc."""

    def __init__(self, vectors: PgVectorStore):
        super().__init__(vectors.database, vectors.tenant)
        self.vectors = vectors

    @classmethod
    def from_spec(cls, spec: str | PgSpec, dim: int | None = None, **options: Any) -> "PgCatalog":
        """The catalog of the spec's tenant; `options` are its vector store's (`PgVectorStore`)."""
        return cls(PgVectorStore.from_spec(spec, dim, **options))

    @classmethod
    def of(cls, target: "PgCatalog | PgVectorStore") -> "PgCatalog":
        """`target` if it is a catalog, else the catalog around the vector store `target`."""
        return target if isinstance(target, PgCatalog) else cls(target)

    def for_tenant(self, tenant: str) -> "PgCatalog":
        """The catalog of `tenant`, sharing this one's connection pool."""
        return PgCatalog(self.vectors.for_tenant(tenant))

    def __repr__(self) -> str:
        return f"PgCatalog({self.spec})"

    @property
    def before_commit(self) -> Callable[[], None] | None:
        """One fault-injection point for the catalog's writes and its vector store's (`PgTenantRows`)."""
        return self.vectors.before_commit

    @before_commit.setter
    def before_commit(self, hook: Callable[[], None] | None) -> None:
        self.vectors.before_commit = hook

    def missing_catalog(self, tenants: Mapping[str, int] | None = None) -> str | None:
        """None when the tenant has a catalog (`tenants`, else read: `PgDatabase.tenants`); else that it has none
        and which tenants the table has: a mistyped ?tenant= reads as an empty catalog otherwise (searches
        abstain, reports show zeros)."""
        tenants = self.database.tenants() if tenants is None else tenants
        if self.tenant in tenants:
            return None
        return (f"tenant {self.tenant!r} has no catalog in index table {self.table!r} (the table's tenants: "
                f"{', '.join(map(repr, tenants)) or 'none'})")

    def require_catalog(self, command: str) -> None:
        """Refuse `command` on a tenant that has no catalog: what it reads would be zeros and what it writes would
        create the tenant (a typo's) as a side effect."""
        note = self.missing_catalog()
        if note is not None:
            raise PgStoreError(f"{note}, so `toolscout {command}` has nothing to work on: check ?tenant= in the store "
                               f"spec, or index a catalog into this tenant first (toolscout index CATALOG --out DIR "
                               f"--store '{self.spec}')")

    # versions and the change log ---------------------------------------------------------------
    def version(self) -> int:
        """The tenant's catalog version: bumped by every committed write (0 before the first)."""
        with self.database.connection() as conn:
            return self._version(conn)

    def changes_since(self, version: int) -> tuple[int, list[str] | None]:
        """(current version, ids written or deleted after `version`); None instead of ids when the log no
        longer reaches back that far or a whole-catalog replace happened (reload everything)."""
        with self.database.connection() as conn:
            current = self._version(conn)
            if current == version:
                return current, []
            rows = conn.execute("SELECT version, ids FROM toolscout_changes WHERE tbl = %s AND tenant = %s "
                                "AND version > %s ORDER BY version", [self.table, self.tenant, version]).fetchall()
        versions = [v for v, _ids in rows]
        if current < version or versions != list(range(version + 1, version + 1 + len(versions))) \
                or (versions and versions[-1] != current) or any(ids is None for _v, ids in rows):
            return current, None
        return current, sorted({i for _v, ids in rows for i in ids})

    # rows and documents ------------------------------------------------------------------------
    def hashes(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        """id -> content hash, for `ids` (unknown ones left out) or for every row of the tenant."""
        where, params, bounded = self._ids_clause(ids)
        with self.database.connection(bounded=bounded) as conn:
            rows = conn.execute(self._sql(f"SELECT id, content_hash FROM {{t}} WHERE {where}"), params)
            return dict(rows.fetchall())

    def replica_rows(self, ids: Iterable[str] | None = None, vectors: bool = True) -> list[tuple]:
        """(id, namespace, content_hash, doc, embedding or None, joined_at) of `ids` (unknown ones left out)
        or of every row, in catalog order (the order tools joined it): what a replica's in-process pipeline
        is built from (`serve/pg_replica.py`)."""
        where, params, bounded = self._ids_clause(ids)
        column = "embedding" if vectors else "NULL"
        with self.database.connection(bounded=bounded) as conn:
            rows = conn.execute(self._sql(f"SELECT id, namespace, content_hash, doc, {column}, joined_at FROM {{t}} "
                                          f"WHERE {where} ORDER BY seq, id"), params).fetchall()
        return [(tid, ns or None, h, doc_of(doc), None if vec is None else as_array(vec), float(joined))
                for tid, ns, h, doc, vec, joined in rows]

    def _ids_clause(self, ids: Iterable[str] | None) -> tuple[str, list, bool]:
        """(WHERE clause, its parameters, whether the answer timeout bounds reading its rows: a whole catalog
        is not bounded) for the rows of `ids`, or of every tool when None."""
        if ids is None:
            return "tenant = %s", [self.tenant], bounded_for(None)
        ids = list(ids)
        return "tenant = %s AND id = ANY(%s)", [self.tenant, ids], bounded_for(len(ids))

    def docs(self, ids: Iterable[str] | None = None) -> dict[str, dict]:
        """id -> stored Tool JSON, for `ids` (unknown ones are left out) or for every row."""
        where, params, bounded = self._ids_clause(ids)
        with self.database.connection(bounded=bounded) as conn:
            rows = conn.execute(self._sql(f"SELECT id, doc FROM {{t}} WHERE {where} ORDER BY id"), params)
            return {tid: doc_of(doc) for tid, doc in rows.fetchall()}

    def page(self, namespace: str | None = None, namespaces: Iterable[str] | None = None, offset: int = 0,
             limit: int = 100) -> tuple[int, list[dict]]:
        """(rows matching, one page of their docs ordered by id): within `namespaces` when given
        (None = all), and in `namespace` when given."""
        where, params = ["tenant = %s"], [self.tenant]
        if namespaces is not None:
            where.append("namespace = ANY(%s)")
            params.append(sorted(namespaces))
        if namespace is not None:
            where.append("namespace = %s")
            params.append(namespace)
        clause = " AND ".join(where)
        with self.database.connection() as conn:
            total = conn.execute(self._sql(f"SELECT count(*) FROM {{t}} WHERE {clause}"), params).fetchone()[0]
            rows = conn.execute(self._sql(f"SELECT doc FROM {{t}} WHERE {clause} ORDER BY id OFFSET %s LIMIT %s"),
                                [*params, offset, limit]).fetchall()
        return int(total), [doc_of(r[0]) for r in rows]

    def namespace_counts(self, namespaces: Iterable[str] | None = None) -> dict[str, int]:
        where, params = "tenant = %s", [self.tenant]
        if namespaces is not None:
            where += " AND namespace = ANY(%s)"
            params.append(sorted(namespaces))
        with self.database.connection() as conn:
            rows = conn.execute(self._sql(f"SELECT namespace, count(*) FROM {{t}} WHERE {where} "
                                          "GROUP BY namespace ORDER BY namespace"), params).fetchall()
        return {ns: int(n) for ns, n in rows}

    # writes ---------------------------------------------------------------------------------------
    def write(self, rows: Sequence[PgRow] = (), delete: Sequence[str] = (), *, replace: bool = False,
              inspect: Inspect | None = None, config: dict[str, Any] | None = None) -> WriteOutcome:
        """Upsert `rows` and delete `delete` in one transaction; or, with `replace`, make `rows` the
        tenant's whole catalog (rows without a vector keep the stored one). `inspect` (not with replace)
        sees the stored rows under lock and decides what is written. `config` (with replace) is recorded
        as the index table's configuration in the same transaction."""
        rows = list(rows)
        if len({r.id for r in rows}) != len(rows):
            raise ValueError("write: duplicate ids in one call")
        for row in rows:
            refuse_nul({"id": row.id, "namespace": row.namespace, **(row.doc or {})}, f"tool {row.id!r}")
        if replace:
            if delete or inspect is not None:
                raise ValueError("replace=True writes a whole catalog: no delete ids or inspect callback")
            return self._replace(rows, config)
        delete = list(dict.fromkeys(delete))
        return self.database.writing(self.tenant, lambda conn: self._write(conn, rows, delete, inspect),
                                     inserts=bool(rows))

    def _write(self, conn, rows: list[PgRow], delete: list[str], inspect: Inspect | None) -> WriteOutcome:
        try:
            with conn.transaction():
                version = self._bump(conn)  # locks the tenant's version row: writers queue here
                stored = self._lock_rows(conn, [r.id for r in rows] + delete)
                if inspect is not None:
                    rows, delete = inspect(stored, rows, delete)
                if not rows and not delete:
                    raise NothingToWrite
                keep = [r for r in rows if r.vector is None]
                stale = [r.id for r in keep if r.id not in stored or stored[r.id].content_hash != r.content_hash]
                if stale:
                    raise NeedVectors(stale)
                self._update_docs(conn, keep)
                deleted = self._put_rows(conn, [r for r in rows if r.vector is not None], delete)
                if not rows and not deleted:
                    raise NothingToWrite
                self._log(conn, version, [r.id for r in rows] + deleted)
                return WriteOutcome(version, [r.id for r in rows], deleted)
        except NothingToWrite:  # rolled back: no version spent
            return WriteOutcome(self._version(conn))

    def _lock_rows(self, conn, ids: list[str]) -> dict[str, StoredRow]:
        """The stored rows of `ids`, locked until the transaction ends (in id order: no deadlocks)."""
        return {tid: StoredRow(tid, ns, content_hash, doc_of(doc)) for tid, ns, content_hash, doc in conn.execute(
            self._sql("SELECT id, namespace, content_hash, doc FROM {t} WHERE tenant = %s AND id = ANY(%s) "
                      "ORDER BY id FOR UPDATE"), [self.tenant, ids]).fetchall()}

    def _update_docs(self, conn, rows: list[PgRow]) -> None:
        """New namespace and document for rows whose text, and so vector, stays."""
        if rows:
            with conn.cursor() as cur:
                cur.executemany(self._sql("UPDATE {t} SET namespace = %s, doc = %s, updated_at = now() "
                                          "WHERE tenant = %s AND id = %s"),
                                [(r.namespace or "", as_jsonb(r.doc), self.tenant, r.id) for r in rows])

    def _replace(self, rows: list[PgRow], config: dict[str, Any] | None, attempts: int = 3) -> WriteOutcome:
        """Build the tenant's new partition beside the live one (committed, not attached: invisible), then
        swap it in with one short transaction. A write that lands in between makes the swap retry."""
        canonical = schema.partition_name(self.table, self.tenant)
        with self.database.connection(bounded=False) as conn:
            # one replace per tenant at a time (session lock: released if this process dies)
            conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [f"toolscout.replace.{canonical}"])
            try:
                for _attempt in range(attempts):
                    seen, staging, left_out = self._build_partition(conn, rows)
                    try:
                        return self._swap(conn, staging, seen, [r.id for r in rows], left_out, config)
                    except _CatalogMoved:
                        conn.execute(self._sql("DROP TABLE IF EXISTS {s}", s=staging))
            finally:
                conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [f"toolscout.replace.{canonical}"])
        raise PgStoreError(f"tenant {self.tenant!r}: the catalog kept changing while it was being replaced "
                           f"({attempts} attempts); retry when writes are quieter")

    def _build_partition(self, conn, rows: list[PgRow]) -> tuple[int, str, list[str]]:
        """A new partition-to-be holding `rows` (rows without a vector take the live row's, when its content
        hash is the same), indexed; (the version it was built from, its name, the live ids it leaves out: the
        swap happens only if no write came after that version)."""
        canonical = schema.partition_name(self.table, self.tenant)
        staging = f"{canonical}_{secrets.token_hex(3)}"
        self._drop_orphans(conn, canonical)
        with conn.transaction():
            conn.execute("SET LOCAL maintenance_work_mem = '256MB'")
            seen = self._version(conn)
            for statement in schema.partition_ddl(self.table, staging, self.dim, self.tenant, indexes=False):
                conn.execute(statement)
            self._load_incoming(conn, rows)
            live = conn.execute("SELECT to_regclass(%s)", [canonical]).fetchone()[0] is not None
            self._fill_partition(conn, staging, live)
            left_out = self._left_out(conn, canonical, staging) if live else []
            for statement in schema.partition_indexes(self.table, staging):
                conn.execute(statement)
            conn.execute(f"ANALYZE {staging}")
        return seen, staging, left_out

    def _load_incoming(self, conn, rows: list[PgRow]) -> None:
        """`rows` into a temporary table (dropped at commit), by binary COPY: the fastest bulk load."""
        conn.execute("CREATE TEMP TABLE toolscout_incoming (pos integer, id text, namespace text, text text, "
                     f"content_hash text, doc jsonb, embedding vector({self.dim})) ON COMMIT DROP")
        with conn.cursor() as cur:
            with cur.copy("COPY toolscout_incoming FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(["int4", "text", "text", "text", "text", "jsonb", "vector"])
                for pos, r in enumerate(rows):
                    copy.write_row([pos, r.id, r.namespace or "", r.text, r.content_hash, as_jsonb(r.doc),
                                    None if r.vector is None else checked_vector(r.vector, self.dim)])

    def _fill_partition(self, conn, staging: str, live: bool) -> None:
        """The incoming rows into `staging`, in their order; a row without a vector keeps the live row's
        vector. A tool the live catalog holds keeps when it joined and how many feedback events named it
        (its taught requests stay too, `pg_feedback.after_replace`), changed or not; a tool new to the catalog
        starts at none. NeedVectors when a row without a vector has no live row of the same content hash."""
        from psycopg import sql

        canonical = schema.partition_name(self.table, self.tenant)
        old = self._sql("LEFT JOIN {p} o ON o.id = i.id", p=canonical) if live else self._sql(
            "LEFT JOIN (SELECT NULL::text AS id, NULL::text AS text, NULL::text AS content_hash, "
            f"NULL::vector({self.dim}) AS embedding, NULL::double precision AS joined_at, "
            "NULL::integer AS reported) o ON false")
        joined = time.time() if live else 0.0  # a first catalog was there before any learning
        conn.execute(sql.SQL(
            "INSERT INTO {s} (tenant, id, namespace, text, content_hash, doc, embedding, joined_at, reported) "
            "SELECT %s, i.id, i.namespace, CASE WHEN i.embedding IS NULL THEN o.text ELSE i.text END, "
            "CASE WHEN i.embedding IS NULL THEN o.content_hash ELSE i.content_hash END, i.doc, "
            "coalesce(i.embedding, o.embedding), coalesce(o.joined_at, %s), coalesce(o.reported, 0) "
            "FROM toolscout_incoming i {old} "
            "WHERE i.embedding IS NOT NULL OR o.content_hash = i.content_hash ORDER BY i.pos").format(
                s=sql.Identifier(staging), old=old), [self.tenant, joined])
        missing = conn.execute(sql.SQL(
            "SELECT i.id FROM toolscout_incoming i LEFT JOIN {s} n ON n.id = i.id WHERE n.id IS NULL "
            "ORDER BY i.id").format(s=sql.Identifier(staging))).fetchall()
        if missing:
            raise NeedVectors([r[0] for r in missing])

    def _swap(self, conn, staging: str, seen: int, ids: list[str], left_out: list[str],
              config: dict[str, Any] | None) -> WriteOutcome:
        canonical = schema.partition_name(self.table, self.tenant)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [REPLACE_LOCK])
            version = self._bump(conn)
            if version != seen + 1:
                raise _CatalogMoved
            conn.execute(self._sql("DROP TABLE IF EXISTS {p}", p=canonical))
            conn.execute(schema.attach_sql(self.table, staging, self.tenant))
            conn.execute(self._sql("ALTER TABLE {s} RENAME TO {p}", s=staging, p=canonical))
            if config is not None:
                self.database.set_config(config, conn)
            kept, dropped = pg_feedback.after_replace(self, conn)  # the feedback of tools that are gone goes too
            self._log(conn, version, None)
        self.database.remember_partition(self.tenant)
        return WriteOutcome(version, written=ids, deleted=left_out, taught_kept=kept, taught_dropped=dropped)

    def _left_out(self, conn, canonical: str, staging: str) -> list[str]:
        """The ids of the live partition that the new one, `staging`, does not hold."""
        return [r[0] for r in conn.execute(self._sql(
            "SELECT o.id FROM {p} o WHERE NOT EXISTS (SELECT 1 FROM {s} n WHERE n.id = o.id) ORDER BY o.id",
            p=canonical, s=staging)).fetchall()]

    def _drop_orphans(self, conn, canonical: str) -> None:
        """Drop staging tables left by a replace that died before its swap (never attached)."""
        rows = conn.execute("SELECT c.relname FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE %s "
                            "AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)",
                            [canonical.replace("_", r"\_") + r"\_%"]).fetchall()
        for (name,) in rows:
            conn.execute(self._sql("DROP TABLE IF EXISTS {s}", s=name))

    # feedback -------------------------------------------------------------------------------------
    def learn(self, events: Sequence[FeedbackEvent], keys: Mapping[str, str],
              untaught: Mapping[tuple[str, str], int | None], vectors: Mapping[str, np.ndarray],
              scored: Sequence[Scored]) -> tuple[LearnResult, int]:
        """Record tool-use feedback, its requests' vectors and its scores in one write transaction
        (`store/pg_feedback.py`); (what it did, the version after it)."""
        for i, event in enumerate(events):
            refuse_nul({"query": event.query, "source": event.source, "tool_ids": event.tool_ids},
                       f"feedback event {i}")
        return self._feedback_write(lambda conn: pg_feedback.learn(self, conn, events, keys, untaught, vectors, scored),
                                    lambda result: sorted({u.tool_id for u in result.learned}),
                                    bounded=bounded_for(len(events)))

    def forget(self, source: str) -> tuple[list[str] | None, int]:
        """Take back everything feedback from `source` taught, in one write transaction; a source with no
        feedback stored is no write (None, and the version stays)."""
        with self.database.connection() as conn:
            if not pg_feedback.holds(self, conn, source):
                return None, self._version(conn)
        return self._feedback_write(lambda conn: pg_feedback.forget(self, conn, source), list, bounded=False)

    def rollback(self, before: float, dry_run: bool = False) -> tuple[list[tuple[str, float]], int]:
        """Take back everything taught at or after `before`, in one write transaction: the (source, time) of
        each pair taken back. `dry_run`, or nothing stored from then on: no write (the version stays)."""
        with self.database.connection() as conn:
            if dry_run or not pg_feedback.holds_since(self, conn, before):
                return pg_feedback.pairs_since(self, conn, before), self._version(conn)
        return self._feedback_write(lambda conn: pg_feedback.rollback(self, conn, before), lambda _n: [],
                                    bounded=False)

    def set_learning(self, settings: dict) -> tuple[dict, int]:
        """Record the tenant's learning settings, in one write transaction."""
        return self._feedback_write(lambda conn: pg_feedback.bump_epoch(self, conn, settings) or settings,
                                    lambda _s: [])

    def _feedback_write(self, change, changed_ids, *, bounded: bool = True):
        """`change(conn)` in a write transaction that bumps the tenant's version and logs `changed_ids(outcome)`;
        `bounded`: whether the answer timeout bounds it (taking back a whole source or a period is not)."""
        with self.database.connection(bounded=bounded) as conn, conn.transaction():
            version = self._bump(conn)  # writers of this tenant queue here
            outcome = change(conn)
            self._log(conn, version, changed_ids(outcome))
        return outcome, version


class NewPgIndex(PgVectorStore):
    """The store `make_store(spec, dim)` gives: a new index for its tenant, as a local store is. It reads as
    empty until its first write, which replaces the tenant's whole catalog (`PgCatalog.write(replace=True)`,
    atomically); from then on it is the tenant's store. Meanwhile other readers see the stored catalog."""

    def __init__(self, *args: Any, **options: Any):
        super().__init__(*args, **options)
        self.is_new = True

    def __len__(self) -> int:
        return 0 if self.is_new else super().__len__()

    def get(self, ids: Sequence[str]) -> np.ndarray:
        if not self.is_new:
            return super().get(ids)
        if len(ids):
            raise KeyError(ids[0])
        return np.zeros((0, self.dim), dtype=np.float32)

    def search(self, vectors: np.ndarray, k: int, filter: Filter | None = None) -> Results:
        if not self.is_new:
            return super().search(vectors, k, filter)
        return Results.empty(len(self._queries(vectors, k)))

    def upsert(self, ids: Sequence[str], vectors: np.ndarray, namespaces: Sequence[str | None] | None = None) -> None:
        if not self.is_new:
            return super().upsert(ids, vectors, namespaces)
        PgCatalog(self).write(self._rows(ids, vectors, namespaces), replace=True)
        self.is_new = False

    def delete(self, ids: Sequence[str]) -> None:
        if not self.is_new:
            super().delete(ids)

    def update_vectors(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        if not self.is_new:
            return super().update_vectors(ids, vectors)
        checked_vectors(ids, vectors, self.dim, "update_vectors")
        if len(ids):
            raise KeyError(ids[0])  # nothing is stored yet
