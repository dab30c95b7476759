"""A vector store in PostgreSQL with pgvector: one shared index for many processes, tenants and filtered
hybrid search. Selected by a store spec that is a libpq URI:

    postgresql://USER@HOST:5432/DB?sslmode=require&tenant=acme&table=toolscout_tools

`tenant` (default "default") and `table` (default "toolscout_tools") are toolscout's own parameters and are
removed before connecting; everything else is libpq's. Passwords are never written anywhere: a saved
config records the DSN without its password, and libpq finds it at connect time in the DSN given then,
in PGPASSWORD or in ~/.pgpass.

What is stored, per tenant and tool id: the namespace, the tool's text view and its content hash, the
Tool itself as JSON (`doc`), its dense vector and a tsvector generated from the text (see `pg_schema`).
Scores are inner products (`<#>` negated), the same numbers as the local stores give.

- Every statement names the store's tenant: a store object sees one tenant's rows and nothing else;
  each tenant's rows live in their own partition with its own HNSW graph.
- Search is one round trip for a batch of queries (a LATERAL join over the query vectors). The HNSW
  graph answers by default (`hnsw.ef_search` = `ef_search`); `exact=True` disables index scans and
  scans the rows, for parity checks. A namespace or id filter is applied by the database; when the
  graph, filtered afterwards, yields fewer than k rows and more exist, the query is re-run exactly.
- `lexical_search` ranks by PostgreSQL full-text search (ts_rank over an OR of the query's words);
  `hybrid_search` fuses dense and lexical top-`depth` lists by reciprocal rank inside one SQL statement,
  both lists under the same tenant / namespace / id filter.
- Writes are transactions: the tenant's version row is bumped (and locked: writers to one tenant queue),
  rows are upserted / deleted, the changed ids are logged under the new version and a NOTIFY is sent on
  channel `toolscout`; all of it commits or none of it does. `replace=True` swaps in a whole catalog:
  a new partition is built and indexed beside the live one, then swapped in by one short transaction.
- A store made by `make_store(spec, dim)` is a *new* index for its tenant, as a local store is: it reads
  as empty, and its first write replaces the tenant's catalog (atomically). `load_store` and the
  constructor attach to what the database holds.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from ..errors import InvalidRequest, MissingDependency, ToolScoutError
from ..feedback import FeedbackEvent, LearnResult, Usage
from ..results import Filter, Results
from . import pg_feedback
from . import pg_schema as schema
from .base import checked_vectors

SCHEMES = ("postgresql://", "postgres://")
KIND = "pgvector"
OWN_PARAMS = ("tenant", "table")
NOTIFY_CHANNEL = "toolscout"
CHANGES_KEPT = 1000  # change-log entries kept per tenant; a reader further behind reloads everything
MAX_EF_SEARCH = 1000  # pgvector's limit
REPLACE_LOCK = 0x746F6F6C73637270


def is_postgres_spec(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith(SCHEMES)


class PgStoreError(ToolScoutError):
    """The PostgreSQL store cannot do what was asked (bad spec, unreachable server, mismatched index)."""


class NeedVectors(Exception):
    """Raised inside a write when rows must be (re-)embedded first; the write is rolled back."""

    def __init__(self, ids: Sequence[str]):
        super().__init__(f"need vectors for {len(ids)} tool(s)")
        self.ids = list(ids)


# ----------------------------------------------------------------------------------------- spec

@dataclass(frozen=True)
class PgSpec:
    """A parsed store spec: the libpq DSN plus toolscout's tenant and table."""

    dsn: str
    tenant: str = "default"
    table: str = schema.DEFAULT_TABLE

    @classmethod
    def parse(cls, spec: str, *, tenant: str | None = None, table: str | None = None) -> "PgSpec":
        if not is_postgres_spec(spec):
            raise PgStoreError(f"not a PostgreSQL store spec: {redact(spec)!r} (expected postgresql://...)")
        parts = urlsplit(spec)
        kept, own = [], {}
        for pair in filter(None, parts.query.split("&")):
            key, _, value = pair.partition("=")
            if key in OWN_PARAMS:
                from urllib.parse import unquote

                own[key] = unquote(value)
            else:
                kept.append(pair)
        dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(kept), parts.fragment))
        tenant = tenant if tenant is not None else own.get("tenant", "default")
        table = table if table is not None else own.get("table", schema.DEFAULT_TABLE)
        check_tenant(tenant)
        return cls(dsn, tenant, schema.check_table_name(table))

    def to_string(self, *, password: bool = False) -> str:
        """The spec as a string; without the password unless asked (what configs and logs record)."""
        from urllib.parse import quote

        dsn = self.dsn if password else redact(self.dsn)
        params = [f"tenant={quote(self.tenant, safe='')}"] if self.tenant != "default" else []
        if self.table != schema.DEFAULT_TABLE:
            params.append(f"table={self.table}")
        if not params:
            return dsn
        return dsn + ("&" if "?" in dsn else "?") + "&".join(params)

    def __str__(self) -> str:
        return self.to_string()


def check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not tenant or len(tenant) > 200:
        raise ValueError(f"invalid tenant {tenant!r}: a non-empty string of at most 200 characters")
    return tenant


def redact(dsn: str) -> str:
    """`dsn` without a password (in the user-info part or as a `password=` parameter)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparsable DSN>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}@{hosts}"
    query = "&".join(p for p in parts.query.split("&") if p and not p.startswith("password="))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# ------------------------------------------------------------------------------------- database

def _require_psycopg():
    try:
        import pgvector.psycopg  # noqa: F401
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(exc.name or "psycopg", "the PostgreSQL store", extra="postgres") from None


class PgDatabase:
    """A connection pool on one database whose index table `table` is migrated to the latest schema.
    Shared by the stores of every tenant of that table (`PgVectorStore.for_tenant`). Opens lazily.

    `dim`: the vector dimension; None reads it from the database (the table must exist then)."""

    def __init__(self, dsn: str, table: str = schema.DEFAULT_TABLE, dim: int | None = None, *,
                 ef_search: int = 100, pool_size: int = 8, timeout: float = 30.0):
        self.dsn = dsn
        self.table = schema.check_table_name(table)
        self._dim = None if dim is None else int(dim)
        self.ef_search = min(int(ef_search), MAX_EF_SEARCH)
        self.pool_size = pool_size
        self.timeout = timeout
        self.migrated: list[int] = []  # migrations this object applied when it opened
        self._pool = None
        self._lock = threading.Lock()
        self._partitions: set[str] = set()  # tenants whose partition is known to exist

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._open()
        return self._dim

    def _open(self):
        if self._pool is not None:
            return self._pool
        with self._lock:
            if self._pool is None:
                _require_psycopg()
                import psycopg
                from psycopg_pool import ConnectionPool

                try:
                    with psycopg.connect(self.dsn, autocommit=True, connect_timeout=int(self.timeout)) as conn:
                        self._prepare(conn)
                except psycopg.OperationalError as exc:
                    raise PgStoreError(f"cannot connect to {redact(self.dsn)}: {str(exc).strip()}") from None
                self._pool = ConnectionPool(self.dsn, min_size=1, max_size=self.pool_size, timeout=self.timeout,
                                            kwargs={"autocommit": True}, configure=self._configure, open=True,
                                            name=f"toolscout-{self.table}")
        return self._pool

    def _prepare(self, conn) -> None:
        """Migrate the schema (creating the table needs the dimension) and check the dimension."""
        stored = schema.table_dim(conn, self.table)
        if stored is None and self._dim is None:
            raise PgStoreError(f"{redact(self.dsn)}: no index table {self.table!r} yet; index a catalog into it first "
                               "(toolscout index CATALOG --out DIR --store postgresql://...)")
        self.migrated = schema.migrate(conn, self.table, self._dim or stored)
        stored = schema.table_dim(conn, self.table)
        if self._dim is not None and stored != self._dim:
            raise PgStoreError(f"index table {self.table!r} holds {stored}-dimensional vectors, not {self._dim}: "
                               "use another table (?table=NAME in the store spec) for this encoder")
        self._dim = stored

    def _configure(self, conn) -> None:
        import psycopg.types
        from pgvector.psycopg.vector import register_vector_info

        register_vector_info(conn, psycopg.types.TypeInfo.fetch(conn, "vector"))
        conn.execute(f"SET hnsw.ef_search = {self.ef_search}")

    @contextlib.contextmanager
    def connection(self):
        """A pooled autocommit connection. A NUL character in what a request sends (a tool id, a
        namespace) is the caller's error, not the store's: it becomes InvalidRequest (writes name the
        field first, `refuse_nul`)."""
        import psycopg

        with self._open().connection() as conn:
            try:
                yield conn
            except psycopg.DataError as exc:
                if "NUL (0x00)" not in str(exc):
                    raise
                raise InvalidRequest("the request holds a NUL character (U+0000), which PostgreSQL cannot store "
                                     "or compare; remove it") from exc

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    # index configuration (encoder, text view, search mode), one per table ----------------------
    def config(self) -> dict[str, Any]:
        with self.connection() as conn:
            row = conn.execute("SELECT config FROM toolscout_indexes WHERE tbl = %s", [self.table]).fetchone()
        return dict(row[0]) if row else {}

    def set_config(self, config: dict[str, Any], conn=None) -> None:
        from psycopg.types.json import Jsonb

        def run(c):
            c.execute("UPDATE toolscout_indexes SET config = %s, updated_at = now() WHERE tbl = %s",
                      [Jsonb(config), self.table])

        if conn is not None:
            return run(conn)
        with self.connection() as c:
            run(c)

    def tenants(self) -> dict[str, int]:
        """Every tenant with a version row, and its version (for operators: not exposed to tenants)."""
        with self.connection() as conn:
            rows = conn.execute("SELECT tenant, version FROM toolscout_versions WHERE tbl = %s ORDER BY tenant",
                                [self.table]).fetchall()
        return dict(rows)

    # partitions ---------------------------------------------------------------------------
    def ensure_partition(self, conn, tenant: str) -> None:
        """Create and attach `tenant`'s partition if it does not exist (its own short transaction; ATTACH
        takes a lock that lets searches and other tenants' writes go on)."""
        if tenant in self._partitions:
            return
        name = schema.partition_name(self.table, tenant)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"toolscout.partition.{name}"])
            if conn.execute("SELECT to_regclass(%s)", [name]).fetchone()[0] is None:
                for statement in schema.partition_ddl(self.table, name, self.dim, tenant):
                    conn.execute(statement)
                conn.execute(schema.attach_sql(self.table, name, tenant))
        self._partitions.add(tenant)

    def forget_partition(self, tenant: str) -> None:
        self._partitions.discard(tenant)


# ---------------------------------------------------------------------------------------- rows

@dataclass
class PgRow:
    """One tool row to write. `vector` None keeps the stored vector (the row must exist, with the same
    `content_hash`; else the write raises NeedVectors). `doc` is the Tool as JSON."""

    id: str
    namespace: str | None = None
    vector: np.ndarray | None = None
    text: str = ""
    content_hash: str = ""
    doc: dict | None = None


def refuse_nul(value: Any, what: str, path: str = "") -> None:
    """PostgreSQL text and jsonb cannot hold U+0000: refuse it up front, naming where it is, rather than
    fail inside the transaction (the pipeline directory stores it; no tool text needs it)."""
    if isinstance(value, str):
        if "\x00" in value:
            field = f", field {path}" if path else ""
            raise InvalidRequest(f"{what}{field}: PostgreSQL cannot store the NUL character (U+0000); remove it")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            refuse_nul(key, what, f"{path}.{key}".lstrip(".") + " (its name)")
            refuse_nul(item, what, f"{path}.{key}".lstrip("."))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            refuse_nul(item, what, f"{path}[{i}]")


@dataclass(frozen=True)
class StoredRow:
    """A row as the database holds it, read (and locked) inside a write transaction."""

    id: str
    namespace: str
    content_hash: str
    doc: dict | None


@dataclass
class WriteOutcome:
    version: int
    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


@dataclass
class QueryOutcome:
    """Results of a batch of queries, the docs of the returned ids (when asked for), and the tenant's
    catalog version the search saw (read in the same statement, so in the same snapshot)."""

    results: Results
    docs: dict[str, dict]
    version: int


# An `inspect` callback of `write`: sees the stored rows of every id the write names (locked), and
# returns the (rows, delete ids) to actually write; it may raise to roll the write back.
Inspect = Callable[[dict[str, StoredRow], list[PgRow], list[str]], tuple[list[PgRow], list[str]]]


class _NothingToWrite(Exception):
    pass


# --------------------------------------------------------------------------------------- store

class PgVectorStore:
    """The store contract (`store/base.py`) on PostgreSQL + pgvector, for one tenant of one index table.
    See the module doc. `before_commit` (a callable or None) runs inside every write transaction just
    before it commits: a fault-injection point for crash tests."""

    kind = KIND

    def __init__(self, dsn: str, dim: int | None = None, *, tenant: str = "default",
                 table: str = schema.DEFAULT_TABLE, ef_search: int = 100, exact: bool = False,
                 fresh: bool = False, pool_size: int = 8, database: PgDatabase | None = None):
        self.database = database or PgDatabase(dsn, table, dim, ef_search=ef_search, pool_size=pool_size)
        self.tenant = check_tenant(tenant)
        self.exact = exact
        self.ef_search = min(int(ef_search), MAX_EF_SEARCH)
        self._fresh = fresh
        self.before_commit: Callable[[], None] | None = None

    @classmethod
    def from_spec(cls, spec: str | PgSpec, dim: int | None = None, **options: Any) -> "PgVectorStore":
        spec = spec if isinstance(spec, PgSpec) else PgSpec.parse(spec)
        return cls(spec.dsn, dim, tenant=spec.tenant, table=spec.table, **options)

    def for_tenant(self, tenant: str) -> "PgVectorStore":
        """A store on `tenant`'s rows sharing this one's connection pool."""
        store = PgVectorStore(self.database.dsn, tenant=tenant, ef_search=self.ef_search, exact=self.exact,
                              database=self.database)
        return store

    @property
    def spec(self) -> PgSpec:
        return PgSpec(self.database.dsn, self.tenant, self.database.table)

    @property
    def dim(self) -> int:
        return self.database.dim

    @property
    def table(self) -> str:
        return self.database.table

    def close(self) -> None:
        self.database.close()

    def __repr__(self) -> str:
        return f"PgVectorStore({self.spec}, exact={self.exact})"

    # reads --------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._fresh:
            return 0
        with self.database.connection() as conn:
            return conn.execute(self._sql("SELECT count(*) FROM {t} WHERE tenant = %s"), [self.tenant]).fetchone()[0]

    def version(self) -> int:
        """The tenant's catalog version: bumped by every committed write (0 before the first)."""
        with self.database.connection() as conn:
            return self._version(conn)

    def _version(self, conn) -> int:
        row = conn.execute("SELECT version FROM toolscout_versions WHERE tbl = %s AND tenant = %s",
                           [self.table, self.tenant]).fetchone()
        return 0 if row is None else int(row[0])

    def get(self, ids: Sequence[str]) -> np.ndarray:
        if self._fresh:
            if ids:
                raise KeyError(ids[0])
            return np.zeros((0, self.dim), dtype=np.float32)
        with self.database.connection() as conn:
            rows = conn.execute(self._sql("SELECT id, embedding FROM {t} WHERE tenant = %s AND id = ANY(%s)"),
                                [self.tenant, list(ids)]).fetchall()
        found = {tid: _to_numpy(vec) for tid, vec in rows}
        missing = [t for t in ids if t not in found]
        if missing:
            raise KeyError(missing[0])
        return np.stack([found[t] for t in ids]) if ids else np.zeros((0, self.dim), dtype=np.float32)

    def hashes(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        """id -> content hash, for `ids` (unknown ones left out) or for every row of the tenant."""
        if self._fresh:
            return {}
        where, params = self._ids_clause(ids)
        with self.database.connection() as conn:
            rows = conn.execute(self._sql(f"SELECT id, content_hash FROM {{t}} WHERE {where}"), params)
            return dict(rows.fetchall())

    def name_rows(self, ids: Iterable[str] | None = None) -> list[tuple[str, str, str | None, str]]:
        """(id, name, title, namespace) for `ids` (unknown ones left out) or every row: what a name index needs."""
        where, params = self._ids_clause(ids)
        with self.database.connection() as conn:
            return conn.execute(self._sql(f"SELECT id, coalesce(doc->>'name', id), doc->>'title', namespace "
                                          f"FROM {{t}} WHERE {where}"), params).fetchall()

    def replica_rows(self, ids: Iterable[str] | None = None, vectors: bool = True) -> list[tuple]:
        """(id, namespace, content_hash, doc, embedding or None) of `ids` (unknown ones left out) or of every
        row, in catalog order (the order tools joined it): what a replica's in-process pipeline is built
        from (`serve/pg_replica.py`)."""
        where, params = self._ids_clause(ids)
        column = "embedding" if vectors else "NULL"
        with self.database.connection() as conn:
            rows = conn.execute(self._sql(f"SELECT id, namespace, content_hash, doc, {column} FROM {{t}} "
                                          f"WHERE {where} ORDER BY seq, id"), params).fetchall()
        return [(tid, ns or None, h, doc, None if vec is None else _to_numpy(vec)) for tid, ns, h, doc, vec in rows]

    def _ids_clause(self, ids: Iterable[str] | None) -> tuple[str, list]:
        if ids is None:
            return "tenant = %s", [self.tenant]
        return "tenant = %s AND id = ANY(%s)", [self.tenant, list(ids)]

    def docs(self, ids: Iterable[str] | None = None) -> dict[str, dict]:
        """id -> stored Tool JSON, for `ids` (unknown ones are left out) or for every row."""
        with self.database.connection() as conn:
            if ids is None:
                rows = conn.execute(self._sql("SELECT id, doc FROM {t} WHERE tenant = %s ORDER BY id"), [self.tenant])
            else:
                rows = conn.execute(self._sql("SELECT id, doc FROM {t} WHERE tenant = %s AND id = ANY(%s)"),
                                    [self.tenant, list(ids)])
            return {tid: doc for tid, doc in rows.fetchall()}

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
        return int(total), [r[0] for r in rows]

    def namespace_counts(self, namespaces: Iterable[str] | None = None) -> dict[str, int]:
        where, params = "tenant = %s", [self.tenant]
        if namespaces is not None:
            where += " AND namespace = ANY(%s)"
            params.append(sorted(namespaces))
        with self.database.connection() as conn:
            rows = conn.execute(self._sql(f"SELECT namespace, count(*) FROM {{t}} WHERE {where} "
                                          "GROUP BY namespace ORDER BY namespace"), params).fetchall()
        return {ns: int(n) for ns, n in rows}

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

    # search -------------------------------------------------------------------------------
    def search(self, vectors: np.ndarray, k: int, filter: Filter | None = None) -> Results:
        return self.query(vectors, None, k, filter, mode="dense").results

    def lexical_search(self, texts: Sequence[str], k: int, filter: Filter | None = None) -> Results:
        return self.query(None, texts, k, filter, mode="lexical").results

    def hybrid_search(self, vectors: np.ndarray, texts: Sequence[str], k: int, filter: Filter | None = None, *,
                      depth: int = 100, rrf_k: int = 60) -> Results:
        return self.query(vectors, texts, k, filter, mode="hybrid", depth=depth, rrf_k=rrf_k).results

    def query(self, vectors: np.ndarray | None, texts: Sequence[str] | None, k: int, filter: Filter | None = None,
              *, mode: str = "dense", docs: bool = False, depth: int = 100, rrf_k: int = 60) -> QueryOutcome:
        """Search a batch of queries in one statement. `mode`: dense (vectors), lexical (texts) or hybrid
        (both, RRF). `docs`: also return the stored Tool JSON of every returned id."""
        if mode not in ("dense", "lexical", "hybrid"):
            raise ValueError(f"unknown search mode {mode!r}; use dense, lexical or hybrid")
        if vectors is not None:
            vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
            if vectors.shape[1] != self.dim:
                raise ValueError(f"expected query vectors of dimension {self.dim}, got {vectors.shape[1]}")
        n = len(vectors) if vectors is not None else len(texts)
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if self._fresh or _allows_nothing(filter):
            return QueryOutcome(Results.empty(n), {}, 0)
        params: dict[str, Any] = {"tenant": self.tenant, "tbl": self.table, "k": int(k), "depth": max(int(depth), k),
                                  "rrf_k": int(rrf_k), "cfg": schema.TEXT_SEARCH_CONFIG}
        where = _filter_sql(filter, params)
        if vectors is not None:
            params["vecs"] = list(vectors)
        if texts is not None:
            params["tqs"] = [or_query(t) for t in texts]
        statement = self._sql(_search_sql(mode, where, docs))
        exact = self.exact or (k > MAX_EF_SEARCH and mode != "lexical")
        ef = max(self.ef_search, k, params["depth"] if mode == "hybrid" else 0)
        rows, version = self._run_search(statement, params, exact, ef)
        per_query = _group(rows, n)
        if mode == "dense" and not exact:  # a graph walk filtered afterwards (or through rows deleted but not
            # yet vacuumed) may come back short: redo those queries exactly (cheap when few rows qualify)
            short = [q for q in range(n) if len(per_query[q][0]) < k]
            if short:
                params["vecs"] = [vectors[q] for q in short]
                redo = _group(self._run_search(statement, params, True, ef)[0], len(short))
                for q, got in zip(short, redo):
                    if len(got[0]) > len(per_query[q][0]):
                        per_query[q] = got
        found_docs: dict[str, dict] = {}
        for ids, _scores, q_docs in per_query:
            found_docs.update(zip(ids, q_docs))
        results = Results(tuple(np.asarray(ids, dtype=object) for ids, _s, _d in per_query),
                          tuple(np.asarray(s, dtype=np.float32) for _i, s, _d in per_query))
        return QueryOutcome(results, found_docs if docs else {}, version)

    def _run_search(self, statement, params: dict, exact: bool, ef: int) -> tuple[list, int]:
        with self.database.connection() as conn:
            if exact or ef != self.database.ef_search:  # a setting for this query only: SET LOCAL in a
                with conn.pipeline(), conn.transaction():  # transaction, sent with the query in one go
                    if exact:
                        conn.execute("SET LOCAL enable_indexscan = off")
                    else:
                        conn.execute(f"SET LOCAL hnsw.ef_search = {min(int(ef), MAX_EF_SEARCH)}")
                    rows = conn.execute(statement, params).fetchall()
            else:
                rows = conn.execute(statement, params).fetchall()
        version = 0
        out = []
        for row in rows:
            if row[0] == 0:  # the version row
                version = int(row[2])
            else:
                out.append(row)
        return out, version

    # writes -------------------------------------------------------------------------------
    def upsert(self, ids: Sequence[str], vectors: np.ndarray, namespaces: Sequence[str | None] | None = None, *,
               texts: Sequence[str] | None = None, hashes: Sequence[str] | None = None,
               docs: Sequence[dict | None] | None = None) -> int:
        """Insert or replace rows (one transaction); returns the tenant's new version. A store made by
        `make_store` replaces the tenant's whole catalog with its first write."""
        vectors = checked_vectors(ids, vectors, self.dim, "upsert")
        n = len(ids)
        namespaces = list(namespaces) if namespaces is not None else [None] * n
        texts = list(texts) if texts is not None else [""] * n
        hashes = list(hashes) if hashes is not None else [""] * n
        docs = list(docs) if docs is not None else [None] * n
        rows = [PgRow(i, ns, vec, text, h, doc)
                for i, ns, vec, text, h, doc in zip(ids, namespaces, vectors, texts, hashes, docs)]
        if self._fresh:
            outcome = self.write(rows, replace=True)
            self._fresh = False
            return outcome.version
        return self.write(rows).version

    def delete(self, ids: Sequence[str]) -> None:
        if self._fresh or not ids:
            return
        self.write((), list(ids))

    def update_vectors(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Replace the embeddings of stored rows (namespace, text, content hash and doc stay) in one write
        transaction that bumps the tenant's version and logs the ids; KeyError, and nothing written,
        when an id is not stored."""
        vectors = checked_vectors(ids, vectors, self.dim, "update_vectors")
        if not len(ids):
            return
        if self._fresh:  # a new index reads as empty until its first write
            raise KeyError(ids[0])
        with self.database.connection() as conn, conn.transaction():
            version = self._bump(conn)  # locks the tenant's version row: writers queue here
            stored = {r[0] for r in conn.execute(
                self._sql("SELECT id FROM {t} WHERE tenant = %s AND id = ANY(%s) FOR UPDATE"),
                [self.tenant, list(ids)]).fetchall()}
            missing = [t for t in ids if t not in stored]
            if missing:
                raise KeyError(missing[0])  # leaving the transaction by an exception rolls it back
            with conn.cursor() as cur:
                cur.executemany(self._sql("UPDATE {t} SET embedding = %s, updated_at = now() "
                                          "WHERE tenant = %s AND id = %s"),
                                [(_vector(v, self.dim), self.tenant, tid) for tid, v in zip(ids, vectors)])
            self._log(conn, version, list(ids))
            if self.before_commit is not None:
                self.before_commit()

    # feedback -----------------------------------------------------------------------------
    def learn(self, events: Sequence[FeedbackEvent], vectors: Mapping[Usage, np.ndarray]) -> tuple[LearnResult, int]:
        """Record tool-use feedback and fold it into the vectors and words of the tools it teaches, in one
        write transaction (`store/pg_feedback.py`); (what it did, the version after it)."""
        for i, event in enumerate(events):
            refuse_nul({"query": event.query, "source": event.source, "tool_ids": event.tool_ids},
                       f"feedback event {i}")
        return self._feedback_write(lambda conn: pg_feedback.learn(self, conn, events, vectors),
                                    lambda result: sorted({u.tool_id for u in result.learned}))

    def forget(self, source: str) -> tuple[list[str], int]:
        """Take back everything feedback from `source` taught, in one write transaction."""
        return self._feedback_write(lambda conn: pg_feedback.forget(self, conn, source), list)

    def _feedback_write(self, change, changed_ids):
        if self._fresh:
            raise PgStoreError("this index is new: write its catalog before feedback")
        with self.database.connection() as conn, conn.transaction():
            version = self._bump(conn)  # writers of this tenant queue here
            outcome = change(conn)
            self._log(conn, version, changed_ids(outcome))
            if self.before_commit is not None:
                self.before_commit()
        return outcome, version

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
        import psycopg

        with self.database.connection() as conn:
            for attempt in range(2):
                self.database.ensure_partition(conn, self.tenant)
                try:
                    return self._write(conn, rows, list(dict.fromkeys(delete)), inspect)
                except _NothingToWrite:
                    return WriteOutcome(self._version(conn))
                except psycopg.errors.CheckViolation as exc:  # the partition went away (tenant dropped elsewhere)
                    if attempt or "no partition" not in str(exc):
                        raise
                    self.database.forget_partition(self.tenant)
        raise AssertionError("unreachable")

    def _write(self, conn, rows: list[PgRow], delete: list[str], inspect: Inspect | None) -> WriteOutcome:
        from psycopg.types.json import Jsonb

        with conn.transaction():
            version = self._bump(conn)  # locks the tenant's version row: writers queue here
            names = [r.id for r in rows] + delete
            stored = {r[0]: StoredRow(*r) for r in conn.execute(
                self._sql("SELECT id, namespace, content_hash, doc FROM {t} WHERE tenant = %s AND id = ANY(%s) "
                          "ORDER BY id FOR UPDATE"), [self.tenant, names]).fetchall()}
            if inspect is not None:
                rows, delete = inspect(stored, rows, delete)
            if not rows and not delete:
                raise _NothingToWrite
            keep = [r for r in rows if r.vector is None]
            stale = [r.id for r in keep if r.id not in stored or stored[r.id].content_hash != r.content_hash]
            if stale:
                raise NeedVectors(stale)
            full = [r for r in rows if r.vector is not None]
            with conn.cursor() as cur:
                if full:
                    cur.executemany(self._sql(
                        "INSERT INTO {t} (tenant, id, namespace, text, content_hash, doc, embedding) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, id) DO UPDATE SET "
                        "namespace = EXCLUDED.namespace, text = EXCLUDED.text, content_hash = EXCLUDED.content_hash, "
                        "doc = EXCLUDED.doc, embedding = EXCLUDED.embedding, base_embedding = NULL, "
                        "updated_at = now()"),
                        [(self.tenant, r.id, r.namespace or "", r.text, r.content_hash, _jsonb(r.doc, Jsonb),
                          _vector(r.vector, self.dim)) for r in full])
                if keep:
                    cur.executemany(self._sql("UPDATE {t} SET namespace = %s, doc = %s, updated_at = now() "
                                              "WHERE tenant = %s AND id = %s"),
                                    [(r.namespace or "", _jsonb(r.doc, Jsonb), self.tenant, r.id) for r in keep])
            deleted = []
            if delete:
                deleted = [r[0] for r in conn.execute(
                    self._sql("DELETE FROM {t} WHERE tenant = %s AND id = ANY(%s) RETURNING id"),
                    [self.tenant, delete]).fetchall()]
                if not rows and not deleted:
                    raise _NothingToWrite
            pg_feedback.drop_tools(self, conn, deleted)  # a deleted tool's feedback goes with it
            # an edited tool keeps its feedback: its new vector is its own, blended again
            pg_feedback.reblend(self, conn, [r.id for r in full if r.id in set(pg_feedback.taught_ids(self, conn))])
            self._log(conn, version, [r.id for r in rows] + deleted)
            if self.before_commit is not None:
                self.before_commit()
        return WriteOutcome(version, [r.id for r in rows], deleted)

    def _replace(self, rows: list[PgRow], config: dict[str, Any] | None, attempts: int = 3) -> WriteOutcome:
        """Build the tenant's new partition beside the live one (committed, not attached: invisible), then
        swap it in with one short transaction. A write that lands in between makes the swap retry."""
        canonical = schema.partition_name(self.table, self.tenant)
        with self.database.connection() as conn:
            # one replace per tenant at a time (session lock: released if this process dies)
            conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [f"toolscout.replace.{canonical}"])
            try:
                for _attempt in range(attempts):
                    seen, staging = self._build_partition(conn, rows)
                    try:
                        return self._swap(conn, staging, seen, [r.id for r in rows], config)
                    except _CatalogMoved:
                        conn.execute(self._sql("DROP TABLE IF EXISTS {s}", s=staging))
            finally:
                conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [f"toolscout.replace.{canonical}"])
        raise PgStoreError(f"tenant {self.tenant!r}: the catalog kept changing while it was being replaced "
                           f"({attempts} attempts); retry when writes are quieter")

    def _build_partition(self, conn, rows: list[PgRow]) -> tuple[int, str]:
        from psycopg.types.json import Jsonb

        canonical = schema.partition_name(self.table, self.tenant)
        staging = f"{canonical}_{secrets.token_hex(3)}"
        self._drop_orphans(conn, canonical)
        with conn.transaction():
            conn.execute("SET LOCAL maintenance_work_mem = '256MB'")
            seen = self._version(conn)
            for statement in schema.partition_ddl(self.table, staging, self.dim, self.tenant, indexes=False):
                conn.execute(statement)
            conn.execute("CREATE TEMP TABLE toolscout_incoming (pos integer, id text, namespace text, text text, "
                         f"content_hash text, doc jsonb, embedding vector({self.dim})) ON COMMIT DROP")
            with conn.cursor() as cur:
                with cur.copy("COPY toolscout_incoming FROM STDIN WITH (FORMAT BINARY)") as copy:
                    copy.set_types(["int4", "text", "text", "text", "text", "jsonb", "vector"])
                    for pos, r in enumerate(rows):
                        copy.write_row([pos, r.id, r.namespace or "", r.text, r.content_hash, _jsonb(r.doc, Jsonb),
                                        None if r.vector is None else _vector(r.vector, self.dim)])
            live = conn.execute("SELECT to_regclass(%s)", [canonical]).fetchone()[0] is not None
            old = self._sql("LEFT JOIN {p} o ON o.id = i.id", p=canonical) if live else self._sql(
                "LEFT JOIN (SELECT NULL::text AS id, NULL::text AS text, NULL::text AS content_hash, "
                f"NULL::vector({self.dim}) AS embedding, NULL::vector({self.dim}) AS base_embedding) o ON false")
            from psycopg import sql

            conn.execute(sql.SQL(
                "INSERT INTO {s} (tenant, id, namespace, text, content_hash, doc, embedding) "
                "SELECT %s, i.id, i.namespace, CASE WHEN i.embedding IS NULL THEN o.text ELSE i.text END, "
                "CASE WHEN i.embedding IS NULL THEN o.content_hash ELSE i.content_hash END, i.doc, "
                "coalesce(i.embedding, o.base_embedding, o.embedding) FROM toolscout_incoming i {old} "
                "WHERE i.embedding IS NOT NULL OR o.content_hash = i.content_hash ORDER BY i.pos").format(
                    s=sql.Identifier(staging), old=old), [self.tenant])
            missing = conn.execute(sql.SQL(
                "SELECT i.id FROM toolscout_incoming i LEFT JOIN {s} n ON n.id = i.id WHERE n.id IS NULL "
                "ORDER BY i.id").format(s=sql.Identifier(staging))).fetchall()
            if missing:
                raise NeedVectors([r[0] for r in missing])
            for statement in schema.partition_indexes(self.table, staging):
                conn.execute(statement)
            conn.execute(f"ANALYZE {staging}")
        return seen, staging

    def _swap(self, conn, staging: str, seen: int, ids: list[str], config: dict[str, Any] | None) -> WriteOutcome:
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
            pg_feedback.after_replace(self, conn)  # the new rows hold own vectors: blend the taught again
            self._log(conn, version, None)
            if self.before_commit is not None:
                self.before_commit()
        self.database._partitions.add(self.tenant)
        return WriteOutcome(version, written=ids)

    def _drop_orphans(self, conn, canonical: str) -> None:
        """Drop staging tables left by a replace that died before its swap (never attached)."""
        rows = conn.execute("SELECT c.relname FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE %s "
                            "AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)",
                            [canonical.replace("_", r"\_") + r"\_%"]).fetchall()
        for (name,) in rows:
            conn.execute(self._sql("DROP TABLE IF EXISTS {s}", s=name))

    def _bump(self, conn) -> int:
        return int(conn.execute(
            "INSERT INTO toolscout_versions AS v (tbl, tenant, version) VALUES (%s, %s, 1) "
            "ON CONFLICT (tbl, tenant) DO UPDATE SET version = v.version + 1 RETURNING version",
            [self.table, self.tenant]).fetchone()[0])

    def _log(self, conn, version: int, ids: list[str] | None) -> None:
        """Record which ids `version` changed (None: all), prune old entries, tell listeners."""
        conn.execute("INSERT INTO toolscout_changes (tbl, tenant, version, ids) VALUES (%s, %s, %s, %s)",
                     [self.table, self.tenant, version, ids])
        conn.execute("DELETE FROM toolscout_changes WHERE tbl = %s AND tenant = %s AND version <= %s",
                     [self.table, self.tenant, version - CHANGES_KEPT])
        payload = json.dumps({"table": self.table, "tenant": self.tenant, "version": version})
        conn.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, payload])

    # persistence --------------------------------------------------------------------------
    def save(self, folder: Path) -> dict:
        """Nothing to copy: the rows are in the database. Returns the config `load` reconnects with
        (the DSN without its password)."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        return {"store": self.kind, "dim": self.dim, "dsn": redact(self.database.dsn), "tenant": self.tenant,
                "table": self.table, "ef_search": self.ef_search, "exact": self.exact}

    @classmethod
    def load(cls, folder: Path | None, config: dict) -> "PgVectorStore":
        return cls(config["dsn"], config.get("dim"), tenant=config.get("tenant", "default"),
                   table=config.get("table", schema.DEFAULT_TABLE), ef_search=config.get("ef_search", 100),
                   exact=config.get("exact", False))

    # helpers ------------------------------------------------------------------------------
    def _sql(self, text: str, **identifiers: str):
        from psycopg import sql

        return sql.SQL(text).format(t=sql.Identifier(self.table),
                                    **{k: sql.Identifier(v) for k, v in identifiers.items()})


class _CatalogMoved(Exception):
    """Another write committed while a replace was building its partition."""


# ----------------------------------------------------------------------------------- SQL pieces
# Python's format fills {where} and the doc parts; "{{t}}" becomes {t}, the table, filled by psycopg.
# Each statement first yields one row (ord 0) holding the tenant's version, read in the same snapshot.

_VERSION_ROW = ("SELECT 0::bigint AS ord, NULL::text AS id, coalesce(max(version), 0)::float8 AS score{docnull} "
                "FROM toolscout_versions WHERE tbl = %(tbl)s AND tenant = %(tenant)s UNION ALL ")

# The query texts become tsqueries once per query (a MATERIALIZED CTE), not once per row scanned.
_QUERIES_TSQ = ("WITH q AS MATERIALIZED (SELECT ord, {vec}to_tsquery(%(cfg)s::regconfig, tq) AS tsq "
                "FROM unnest({arrays}) WITH ORDINALITY AS u({cols}ord)) ")

_SEARCH_SQL = {
    "dense": _VERSION_ROW + (
        "SELECT q.ord, t.id, t.score{doc} FROM unnest(%(vecs)b::vector[]) WITH ORDINALITY AS q(vec, ord) "
        "CROSS JOIN LATERAL (SELECT id, doc, (embedding <#> q.vec) * -1 AS score FROM {{t}} "
        "WHERE {where} ORDER BY embedding <#> q.vec LIMIT %(k)s) t"),
    "lexical": _QUERIES_TSQ.format(vec="", arrays="%(tqs)s::text[]", cols="tq, ") + _VERSION_ROW + (
        "SELECT q.ord, t.id, t.score{doc} FROM q "
        "CROSS JOIN LATERAL (SELECT id, doc, ts_rank(tsv, q.tsq, 1)::float8 AS score "
        "FROM {{t}} WHERE {where} AND tsv @@ q.tsq ORDER BY score DESC, id LIMIT %(k)s) t"),
    "hybrid": _QUERIES_TSQ.format(vec="vec, ", arrays="%(vecs)b::vector[], %(tqs)s::text[]", cols="vec, tq, ")
    + _VERSION_ROW + (
        "SELECT q.ord, f.id, f.score{doc} FROM q "
        "CROSS JOIN LATERAL (SELECT u.id, sum(1.0 / (%(rrf_k)s + u.r))::float8 AS score FROM ("
        " SELECT d.id, row_number() OVER (ORDER BY d.dist, d.id) AS r FROM ("
        "  SELECT id, embedding <#> q.vec AS dist FROM {{t}} WHERE {where} "
        "  ORDER BY embedding <#> q.vec LIMIT %(depth)s) d"
        " UNION ALL"
        " SELECT l.id, row_number() OVER (ORDER BY l.rank DESC, l.id) AS r FROM ("
        "  SELECT id, ts_rank(tsv, q.tsq, 1) AS rank FROM {{t}} "
        "  WHERE {where} AND tsv @@ q.tsq "
        "  ORDER BY rank DESC, id LIMIT %(depth)s) l"
        ") u GROUP BY u.id ORDER BY score DESC, u.id LIMIT %(k)s) f{docjoin}"),
}


def _search_sql(mode: str, where: str, docs: bool) -> str:
    hybrid_docs = docs and mode == "hybrid"
    return _SEARCH_SQL[mode].format(
        where=where, doc=", t.doc" if docs else "", docnull=", NULL::jsonb AS doc" if docs else "",
        # a value, not part of the template: its {t} arrives as written, for psycopg to fill
        docjoin=" LEFT JOIN {t} t ON t.tenant = %(tenant)s AND t.id = f.id" if hybrid_docs else "",
    ) + " ORDER BY 1, 3 DESC, 2"


def _filter_sql(flt: Filter | None, params: dict[str, Any]) -> str:
    """The WHERE clause of one tenant under `flt` (values go into `params`)."""
    parts = ["tenant = %(tenant)s"]
    if flt is not None:
        if flt.namespaces is not None:
            parts.append("namespace = ANY(%(namespaces)s)")
            params["namespaces"] = sorted(flt.namespaces)
        if flt.ids is not None:
            parts.append("id = ANY(%(ids)s)")
            params["ids"] = sorted(flt.ids)
        if flt.exclude_ids:
            parts.append("NOT (id = ANY(%(exclude_ids)s))")
            params["exclude_ids"] = sorted(flt.exclude_ids)
    return " AND ".join(parts)


def _allows_nothing(flt: Filter | None) -> bool:
    return flt is not None and ((flt.namespaces is not None and not flt.namespaces)
                                or (flt.ids is not None and not (flt.ids - flt.exclude_ids)))


_WORD = re.compile(r"[^\W_]+")
MAX_QUERY_WORDS = 32  # long dialogues: the first 32 distinct words


def or_query(text: str) -> str:
    """A to_tsquery input matching any of the words of `text` (BM25-like OR semantics, where
    websearch_to_tsquery would demand all of them). Only letters and digits reach the parser."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(text or "")))[:MAX_QUERY_WORDS]
    return " | ".join(words)


def _group(rows: list, n: int) -> list[tuple[list[str], list[float], list[dict | None]]]:
    out: list[tuple[list[str], list[float], list]] = [([], [], []) for _ in range(n)]
    for row in rows:
        ids, scores, docs = out[int(row[0]) - 1]
        ids.append(row[1])
        scores.append(float(row[2]))
        docs.append(row[3] if len(row) > 3 else None)
    return out


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value.astype(np.float32, copy=False)
    return np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)


def _vector(vector: np.ndarray, dim: int) -> np.ndarray:
    vector = np.asarray(vector, dtype=np.float32)
    if vector.shape != (dim,):
        raise ValueError(f"expected a vector of dimension {dim}, got shape {vector.shape}")
    return vector


def _jsonb(doc: dict | None, wrapper):
    return None if doc is None else wrapper(doc)
