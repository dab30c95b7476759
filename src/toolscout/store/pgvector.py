"""A vector store in PostgreSQL with pgvector: one shared index for many processes and tenants. Selected
by a store spec that is a libpq URI:

    postgresql://USER@HOST:5432/DB?sslmode=require&tenant=acme&table=toolscout_tools

`tenant` (default "default"), `table` (default "toolscout_tools") and `answer_timeout` (seconds a block of
database work may go unanswered before its connection is cut, default 30) are toolscout's own parameters and
are removed before connecting; everything else is libpq's. Passwords are never written anywhere: a saved
config records the DSN without its password, and libpq finds it at connect time in the DSN given then,
in PGPASSWORD or in ~/.pgpass.

This module holds what every user of the database shares: the spec (`PgSpec`), the connection pool on a
migrated index table (`PgDatabase`), one tenant's rows and the write transaction they are changed in
(`PgTenantRows`), and `PgVectorStore`: the store contract (`store/base.py`) over one tenant's rows, which
`DenseRetriever` uses as it uses the numpy store. The tenant's catalog around the vectors (documents,
versions and change log, whole-catalog replaces, feedback) is `PgCatalog` (`store/pg_catalog.py`).

What is stored, per tenant and tool id: the namespace, the tool's text view and its content hash, the
Tool itself as JSON (`doc`), its dense vector (and a tsvector of its text, which nothing ranks by since
replicas rank with the library's pipeline; see `pg_schema`). Scores are inner products (`<#>` negated),
the same numbers as the local stores give.

- Every statement names the tenant: a store object sees one tenant's rows and nothing else; each
  tenant's rows live in their own partition with its own HNSW graph.
- Search is one round trip for a batch of queries (a LATERAL join over the query vectors). The HNSW
  graph answers by default (`hnsw.ef_search` = `ef_search`); `exact=True` disables index scans and
  scans the rows, for parity checks. A namespace or id filter is applied by the database; when the
  graph, filtered afterwards, yields fewer than k rows and more exist, the query is re-run exactly.
- Writes are transactions: the tenant's version row is bumped (and locked: writers to one tenant queue),
  rows are upserted / deleted, the changed ids are logged under the new version and a NOTIFY is sent on
  channel `toolscout`; all of it commits or none of it does.
- `make_store(spec, dim)` gives a *new* index for its tenant, as a local store is (`pg_catalog.NewPgIndex`):
  it reads as empty, and its first write replaces the tenant's catalog (atomically). `load_store` and
  `PgVectorStore.from_spec` attach to what the database holds.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar
from urllib.parse import urlsplit

import numpy as np

from ..errors import InvalidRequest, MissingDependency, ToolScoutError, Unavailable
from ..results import Filter, Results
from . import pg_feedback
from . import pg_schema as schema
from .base import as_array, checked_vectors
from .pg_deadline import DEADLINES
from .pg_outage import Outage

SCHEMES = ("postgresql://", "postgres://")
KIND = "pgvector"
OWN_PARAMS = ("tenant", "table", "answer_timeout")
NOTIFY_CHANNEL = "toolscout"
CHANGES_KEPT = 1000  # change-log entries kept per tenant; a reader further behind reloads everything
MAX_EF_SEARCH = 1000  # pgvector's limit
POOL_WAIT_S = 5.0  # the longest a request waits for a connection: a database that is down fails fast (503)
# the longest a statement waits for a lock another session holds (a migration, an operator's LOCK TABLE): the
# same bound, so a request never hangs on one; PostgreSQL cancels the statement, and the request is a 503
LOCK_WAIT_S = POOL_WAIT_S
# the pool's reconnection backoff doubles without bound, so after a long outage the database could be back for
# a minute before the next attempt: each round of attempts gives up after this, and the next request starts one
RECONNECT_S = 10.0
# the longest a block of database work waits for answers before its connection is cut (`pg_deadline`): a
# database that stopped without closing its sockets hung requests for good. Generous: a request's statements
# take milliseconds, and a lock wait is LOCK_WAIT_S at most; whole-catalog writes are not bounded by it
ANSWER_WAIT_S = 30.0
T = TypeVar("T")


def is_postgres_spec(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith(SCHEMES)


class PgStoreError(ToolScoutError):
    """The PostgreSQL store cannot do what was asked (bad spec, unreachable server, mismatched index)."""


class NeedVectors(Exception):
    """Raised inside a write when rows must be (re-)embedded first; the write is rolled back."""

    def __init__(self, ids: Sequence[str]):
        super().__init__(f"need vectors for {len(ids)} tool(s)")
        self.ids = list(ids)


class NothingToWrite(Exception):
    """Raised inside a write transaction that would change nothing: it rolls back, spending no version."""


# ----------------------------------------------------------------------------------------- spec

@dataclass(frozen=True)
class PgSpec:
    """A parsed store spec: the libpq DSN plus toolscout's tenant, table and answer timeout."""

    dsn: str
    tenant: str = "default"
    table: str = schema.DEFAULT_TABLE
    answer_timeout: float = ANSWER_WAIT_S

    @classmethod
    def parse(cls, spec: str, *, tenant: str | None = None, table: str | None = None) -> "PgSpec":
        if not is_postgres_spec(spec):
            raise PgStoreError(f"not a PostgreSQL store spec: {redact(spec)!r} (expected postgresql://...)")
        parts = urlsplit(spec)
        kept, own = _split_own_params(parts.query)
        dsn = _unsplit(parts.scheme, parts.netloc, parts.path, "&".join(kept), parts.fragment)
        _check_conninfo(dsn)
        tenant = tenant if tenant is not None else own.get("tenant", "default")
        table = table if table is not None else own.get("table", schema.DEFAULT_TABLE)
        check_tenant(tenant)
        return cls(dsn, tenant, schema.check_table_name(table), _answer_timeout(own.get("answer_timeout")))

    def to_string(self, *, password: bool = False) -> str:
        """The spec as a string; without the password unless asked (what configs and logs record)."""
        from urllib.parse import quote

        dsn = self.dsn if password else redact(self.dsn)
        params = [f"tenant={quote(self.tenant, safe='')}"] if self.tenant != "default" else []
        if self.table != schema.DEFAULT_TABLE:
            params.append(f"table={self.table}")
        if self.answer_timeout != ANSWER_WAIT_S:
            params.append(f"answer_timeout={self.answer_timeout:g}")
        if not params:
            return dsn
        return dsn + ("&" if "?" in dsn else "?") + "&".join(params)

    def __str__(self) -> str:
        return self.to_string()


def _split_own_params(query: str) -> tuple[list[str], dict[str, str]]:
    """The query's libpq pairs (as given) and toolscout's own parameters (decoded). A parameter given twice is
    refused: taking either value could point a whole-catalog write at the wrong tenant, table or database (a
    DSN from a config with `&tenant=...` or `&dbname=...` appended to it)."""
    from urllib.parse import unquote

    kept, given = [], {}
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        given.setdefault(key, []).append(unquote(value))
        if key not in OWN_PARAMS:
            kept.append(pair)
    for key, values in given.items():
        if len(values) > 1:
            shown = "" if _secret(key) else f" ({', '.join(map(repr, values))})"
            raise PgStoreError(f"the store spec gives {key!r} {len(values)} times{shown}: give it once")
    return kept, {key: values[0] for key, values in given.items() if key in OWN_PARAMS}


def _answer_timeout(value: str | None) -> float:
    if value is None:
        return ANSWER_WAIT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise PgStoreError(f"answer_timeout={value!r} in the store spec: give the seconds a database may take to "
                           f"answer, a positive number (default {ANSWER_WAIT_S:g})")
    return seconds


def check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not tenant or len(tenant) > 200:
        raise ValueError(f"invalid tenant {tenant!r}: a non-empty string of at most 200 characters")
    return tenant


def _check_conninfo(dsn: str) -> None:
    """A DSN libpq would refuse (a misspelt parameter: `sslmod=`) is refused here, naming it, before any
    command has started; without psycopg installed, opening the store says what to install instead."""
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return
    try:
        conninfo_to_dict(dsn)
    except ProgrammingError as exc:
        raise PgStoreError(f"{redact(dsn)}: {str(exc).strip()} (libpq's connection parameters: host, port, dbname, "
                           f"user, password, sslmode, ...; toolscout's own: {', '.join(sorted(OWN_PARAMS))})") from None


# libpq's keyword/value form (`host=db password='a b'`): a secret setting, its value quoted or not
_KEYWORD_SECRET = re.compile(r"""(?:^|\s)(?:ssl)?password\s*=\s*(?:'(?:[^'\\]|\\.)*'|\S*)""")


def redact(dsn: str) -> str:
    """`dsn` without a password (in the user-info part or as a `password=` parameter). Every message that shows a
    store spec shows it through here, a mistyped one too (`pgsql://u:pw@h/db`, or libpq's `key=value` form)."""
    if "://" not in dsn:  # libpq's keyword form, or no DSN at all (`faiss:HNSW32`)
        return _KEYWORD_SECRET.sub("", dsn).strip()
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparsable DSN>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}@{hosts}"
    query = "&".join(p for p in parts.query.split("&") if p and not _secret(p.partition("=")[0]))
    return _unsplit(parts.scheme, netloc, parts.path, query, parts.fragment)


def _secret(key: str) -> bool:
    """A connection parameter whose value is a secret: `password`, and libpq's `sslpassword` (a client key's)."""
    return key in ("password", "sslpassword")


def _unsplit(scheme: str, netloc: str, path: str, query: str, fragment: str) -> str:
    """urlunsplit, keeping the '//' of an empty host (postgresql:///db, a local socket), which it drops."""
    return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "") + (f"#{fragment}" if fragment else "")


# ------------------------------------------------------------------------------------- database

def _require_psycopg():
    try:
        import pgvector.psycopg  # noqa: F401
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(exc.name or "psycopg", "the PostgreSQL store", extra="postgres") from None


def _first_line(exc: BaseException) -> str:
    """An error's message without the statement excerpt PostgreSQL adds below it."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _retryable(exc: BaseException) -> bool:
    """SQLSTATE class 40 (transaction rollback: deadlock, serialization failure) or 55P03 (lock not
    available): PostgreSQL asks for the transaction to be tried again."""
    state = getattr(exc, "sqlstate", None) or ""
    return state.startswith("40") or state == "55P03"


def _whole(seconds: float) -> int:
    """libpq's connect_timeout: whole seconds, at least 2 (it reads 1 as 2, and 0 as no limit)."""
    return max(2, round(seconds))


def _server_gone_errors() -> tuple[type[BaseException], ...]:
    """The errors of a database that shut down or is starting, whatever the connection's state says."""
    from psycopg import errors

    return (errors.AdminShutdown, errors.CrashShutdown, errors.CannotConnectNow)


class PgDatabase:
    """A connection pool on one database whose index table `table` is migrated to the latest schema.
    Shared by the stores of every tenant of that table (`PgVectorStore.for_tenant`). Opens lazily.

    `dim`: the vector dimension; None reads it from the database (the table must exist then). `timeout`: the
    longest connecting, or a block of work on a connection, may wait for the database's answers."""

    def __init__(self, dsn: str, table: str = schema.DEFAULT_TABLE, dim: int | None = None, *,
                 ef_search: int = 100, pool_size: int = 8, timeout: float = ANSWER_WAIT_S,
                 lock_wait: float = LOCK_WAIT_S):
        self.dsn = dsn
        self.lock_wait = lock_wait
        self.table = schema.check_table_name(table)
        self._dim = None if dim is None else int(dim)
        self.ef_search = min(int(ef_search), MAX_EF_SEARCH)
        self.pool_size = pool_size
        self.timeout = timeout
        self.pool_wait = min(timeout, POOL_WAIT_S)  # the longest a request waits for a pooled connection
        self.migrated: list[int] = []  # migrations this object applied when it opened
        self._pool = None
        self._lock = threading.Lock()
        self._partitions: set[str] = set()  # tenants whose partition is known to exist
        # when each pooled connection was made, and when the pool last replaced every connection (`_check`)
        self._made_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._replaced_at = float("-inf")
        self._replace_lock = threading.Lock()
        # logs an outage once, and keeps the pool's warning per reconnection attempt out of the log; the pool's
        # name is this object's own, so two pools on one table in one process are told apart
        self.outage = Outage(redact(dsn), f"toolscout-{self.table}-{id(self):x}")

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
                    with psycopg.connect(self.dsn, autocommit=True, connect_timeout=_whole(self.timeout)) as conn:
                        self._prepare(conn)
                except psycopg.OperationalError as exc:
                    raise PgStoreError(f"cannot connect to {redact(self.dsn)}: {str(exc).strip()}") from None
                # each connection is checked as it is taken (one that a database restart closed is replaced,
                # not handed to a request), and a request waits POOL_WAIT_S at most for one
                self.outage.watch()
                self._pool = ConnectionPool(self.dsn, min_size=1, max_size=self.pool_size,
                                            timeout=self.pool_wait, configure=self._configure, check=self._check,
                                            kwargs={"autocommit": True, "connect_timeout": _whole(self.timeout)},
                                            reconnect_timeout=RECONNECT_S, open=True,
                                            name=self.outage.pool_name)
        return self._pool

    def _prepare(self, conn) -> None:
        """Migrate the schema (creating the table needs the dimension) and check the dimension."""
        stored = schema.table_dim(conn, self.table)
        if stored is None and self._dim is None:
            schema.check_not_foreign(conn, self.table)
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
        conn.execute(f"SET lock_timeout = {max(1, int(self.lock_wait * 1000))}")  # milliseconds
        self._made_at[conn] = time.monotonic()
        self.outage.up()  # every new connection of the pool is configured here: it connects

    def _check(self, conn) -> None:
        """The pool's check of a connection it hands out, bounded as a request's wait for one is. A dead one
        means the database restarted (or stopped, or froze): the pool's other idle connections, made before
        it, are dead too. psycopg_pool would check them one by one, pausing longer after each failed check,
        so a request that met a grown pool of dead connections spent its POOL_WAIT_S on a few of them and was
        a 503 though the database was back: they are all replaced at once instead, and the request waits for
        the first new connection. A connection that passes says the database answers (`Outage.up`), which a
        probe reads (`check_answering`) even when no new connection was needed to learn it."""
        from psycopg_pool import ConnectionPool

        try:
            with DEADLINES.watching(conn, self.pool_wait):
                ConnectionPool.check_connection(conn)
        except Exception:
            self._replace_connections_made_before(conn)
            raise
        self.outage.up()

    def _replace_connections_made_before(self, dead) -> None:
        """Replace the pool's connections (the idle ones now, those in use as they come back: `drain`), unless
        the pool has done so since `dead` was made: requests meeting dead connections at once replace them once."""
        with self._replace_lock:
            if self._made_at.get(dead, float("-inf")) < self._replaced_at:
                return
            self._replaced_at = time.monotonic()
            self._pool.drain()

    @contextlib.contextmanager
    def connection(self, *, bounded: bool = True):
        """A pooled autocommit connection. A NUL character in what a request sends (a tool id, a
        namespace) is the caller's error, not the store's: it becomes InvalidRequest (writes name the
        field first, `refuse_nul`). A database that does not answer (down, restarting, out of connections,
        or, while `bounded`, the block not done within `timeout` seconds: its connection is cut) is
        Unavailable, naming it: the request may succeed later. `bounded=False` is for work whose length grows
        with the data (`pg_deadline.bounded_for`)."""
        import psycopg
        from psycopg_pool import PoolTimeout

        conn = watch = None
        try:
            with self._open().connection() as conn, \
                    DEADLINES.watching(conn, self.timeout if bounded else None) as watch:
                try:
                    yield conn
                except psycopg.DataError as exc:
                    if "NUL (0x00)" not in str(exc) and not isinstance(exc, psycopg.errors.UntranslatableCharacter):
                        raise
                    raise InvalidRequest("the request holds a NUL character (U+0000), which PostgreSQL cannot "
                                         "store or compare; remove it") from exc
        except PoolTimeout as exc:
            cause = self.outage.cause  # why the pool's last attempt to connect failed, while none succeeds
            why = f"it does not answer ({cause})" if cause else "it does not answer, or every connection is busy"
            raise Unavailable(f"no connection to the PostgreSQL database {redact(self.dsn)} within "
                              f"{self.pool_wait:g} s: {why}") from exc
        except psycopg.OperationalError as exc:
            if _retryable(exc):  # a deadlock, a serialization failure, a lock not granted: it may succeed again
                raise Unavailable(f"the PostgreSQL database {redact(self.dsn)} rolled the request back "
                                  f"({_first_line(exc)}); retry it") from exc
            if watch is not None and watch.cut:
                raise Unavailable(f"the PostgreSQL database {redact(self.dsn)} did not answer within "
                                  f"{self.timeout:g} s (answer_timeout in the store spec): its connection was "
                                  "closed") from exc
            if conn is not None and not conn.broken and not isinstance(exc, _server_gone_errors()):
                raise  # the statement's own failure (a statement timeout, a value too large): a bug or a limit
            raise Unavailable(f"the PostgreSQL database {redact(self.dsn)} is not answering: "
                              f"{_first_line(exc)}") from exc

    def check_answering(self) -> None:
        """Unavailable at once, with psycopg's reason, when the pool cannot connect (its last attempt failed)
        and a connection tried now fails too: a probe (/health) gets its 503 within its own timeout, not after
        the POOL_WAIT_S a request waits for a connection. One connection attempt per call: for probes, not for
        every request, which would storm a database refusing connections. Otherwise returns, and the caller
        waits on the pool as usual (that wait is what has the pool try to connect again)."""
        import psycopg

        if self.outage.since is None:
            return
        try:
            psycopg.connect(self.dsn, autocommit=True, connect_timeout=_whole(1)).close()  # libpq: 2 s at least
        except psycopg.OperationalError as exc:
            raise Unavailable(f"the PostgreSQL database {redact(self.dsn)} is not answering: "
                              f"{_first_line(exc)}") from exc

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
                self.outage.unwatch()

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
        """Every tenant that has a catalog in this table, and its version (for operators: not exposed to tenants).
        A catalog is its own partition, made by indexing one or by writing tools; learning settings and feedback
        bump a version row but make none, so a tenant that only has those has no catalog."""
        with self.connection() as conn:
            rows = conn.execute("SELECT tenant, version FROM toolscout_versions WHERE tbl = %s ORDER BY tenant",
                                [self.table]).fetchall()
            partitions = {schema.partition_name(self.table, tenant): tenant for tenant, _version in rows}
            attached = {partitions[name] for (name,) in conn.execute(
                "SELECT name FROM unnest(%s::text[]) AS name WHERE to_regclass(name) IS NOT NULL",
                [list(partitions)]).fetchall()}
        return {tenant: version for tenant, version in rows if tenant in attached}

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

    def remember_partition(self, tenant: str) -> None:
        """`tenant`'s partition exists now (a whole-catalog replace has just attached it)."""
        self._partitions.add(tenant)

    def writing(self, tenant: str, write: Callable[[Any], T], inserts: bool = True) -> T:
        """`write(conn)`, a write transaction of `tenant`, on a connection where the tenant's partition
        exists; run once more if the partition went away meanwhile (the tenant dropped elsewhere). A write
        that only deletes (`inserts=False`) makes no partition: a tenant with none has nothing to delete,
        and a mistyped tenant must not become a catalog."""
        import psycopg

        with self.connection(bounded=False) as conn:
            for attempt in range(2):
                if inserts:
                    self.ensure_partition(conn, tenant)
                try:
                    return write(conn)
                except psycopg.errors.CheckViolation as exc:
                    if attempt or "no partition" not in str(exc):
                        raise
                    self.forget_partition(tenant)
        raise AssertionError("unreachable")


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


# -------------------------------------------------------------------------------------- tenant

class PgTenantRows:
    """One tenant's rows in one index table: what the tenant's vector store (`PgVectorStore`) and its
    catalog (`pg_catalog.PgCatalog`) share. Every statement names the tenant. Every write is one
    transaction that first bumps the tenant's version (`_bump`: writers of a tenant queue on that row)
    and ends with `_log`. `before_commit` (a callable or None) runs inside every write transaction just
    before it commits: a fault-injection point for crash tests."""

    before_commit: Callable[[], None] | None = None

    def __init__(self, database: PgDatabase, tenant: str):
        self.database = database
        self.tenant = check_tenant(tenant)

    @property
    def spec(self) -> PgSpec:
        return PgSpec(self.database.dsn, self.tenant, self.database.table, self.database.timeout)

    @property
    def dim(self) -> int:
        return self.database.dim

    @property
    def table(self) -> str:
        return self.database.table

    def close(self) -> None:
        self.database.close()

    def _sql(self, text: str, **identifiers: str):
        """`text` as a statement: {t} is the index table, each keyword an identifier."""
        from psycopg import sql

        return sql.SQL(text).format(t=sql.Identifier(self.table),
                                    **{k: sql.Identifier(v) for k, v in identifiers.items()})

    # the version and the change log --------------------------------------------------------------
    def _version(self, conn) -> int:
        row = conn.execute("SELECT version FROM toolscout_versions WHERE tbl = %s AND tenant = %s",
                           [self.table, self.tenant]).fetchone()
        return 0 if row is None else int(row[0])

    def _bump(self, conn) -> int:
        return int(conn.execute(
            "INSERT INTO toolscout_versions AS v (tbl, tenant, version) VALUES (%s, %s, 1) "
            "ON CONFLICT (tbl, tenant) DO UPDATE SET version = v.version + 1 RETURNING version",
            [self.table, self.tenant]).fetchone()[0])

    def _log(self, conn, version: int, ids: list[str] | None) -> None:
        """Record which ids `version` changed (None: all), prune old entries, tell listeners; then run
        `before_commit`: this is the last step of every write transaction."""
        conn.execute("INSERT INTO toolscout_changes (tbl, tenant, version, ids) VALUES (%s, %s, %s, %s)",
                     [self.table, self.tenant, version, ids])
        conn.execute("DELETE FROM toolscout_changes WHERE tbl = %s AND tenant = %s AND version <= %s",
                     [self.table, self.tenant, version - CHANGES_KEPT])
        payload = json.dumps({"table": self.table, "tenant": self.tenant, "version": version})
        conn.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, payload])
        if self.before_commit is not None:
            self.before_commit()

    # rows, inside a write transaction -----------------------------------------------------------
    def _put_rows(self, conn, rows: Sequence[PgRow], delete: Sequence[str]) -> list[str]:
        """Upsert `rows` (each with its vector) and delete the ids `delete`; the ids deleted. A deleted tool's
        feedback goes with it; an edited tool keeps its own."""
        if rows:
            with conn.cursor() as cur:
                now = time.time()  # when new tools join: learning from before then never weighed them
                cur.executemany(self._sql(
                    "INSERT INTO {t} (tenant, id, namespace, text, content_hash, doc, embedding, joined_at) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, id) DO UPDATE SET "
                    "namespace = EXCLUDED.namespace, text = EXCLUDED.text, content_hash = EXCLUDED.content_hash, "
                    "doc = EXCLUDED.doc, embedding = EXCLUDED.embedding, base_embedding = NULL, "
                    "updated_at = now()"),
                    [(self.tenant, r.id, r.namespace or "", r.text, r.content_hash, as_jsonb(r.doc),
                      checked_vector(r.vector, self.dim), now) for r in rows])
        deleted = []
        if delete:
            deleted = [r[0] for r in conn.execute(
                self._sql("DELETE FROM {t} WHERE tenant = %s AND id = ANY(%s) RETURNING id"),
                [self.tenant, list(delete)]).fetchall()]
        pg_feedback.drop_tools(self, conn, deleted)
        return deleted


# --------------------------------------------------------------------------------------- store

class PgVectorStore(PgTenantRows):
    """The store contract (`store/base.py`) on PostgreSQL + pgvector, for one tenant of one index table.
    See the module doc; the tenant's catalog around these vectors is `pg_catalog.PgCatalog`."""

    kind = KIND

    def __init__(self, dsn: str, dim: int | None = None, *, tenant: str = "default",
                 table: str = schema.DEFAULT_TABLE, ef_search: int = 100, exact: bool = False,
                 pool_size: int = 8, answer_timeout: float = ANSWER_WAIT_S, database: PgDatabase | None = None):
        super().__init__(database or PgDatabase(dsn, table, dim, ef_search=ef_search, pool_size=pool_size,
                                                timeout=answer_timeout), tenant)
        self.exact = exact
        self.ef_search = min(int(ef_search), MAX_EF_SEARCH)

    @classmethod
    def from_spec(cls, spec: str | PgSpec, dim: int | None = None, **options: Any) -> "PgVectorStore":
        spec = spec if isinstance(spec, PgSpec) else PgSpec.parse(spec)
        return cls(spec.dsn, dim, tenant=spec.tenant, table=spec.table, answer_timeout=spec.answer_timeout,
                   **options)

    def for_tenant(self, tenant: str) -> "PgVectorStore":
        """A store on `tenant`'s rows sharing this one's connection pool."""
        return PgVectorStore(self.database.dsn, tenant=tenant, ef_search=self.ef_search, exact=self.exact,
                             database=self.database)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec}, exact={self.exact})"

    # reads --------------------------------------------------------------------------------
    def __len__(self) -> int:
        with self.database.connection() as conn:
            return conn.execute(self._sql("SELECT count(*) FROM {t} WHERE tenant = %s"), [self.tenant]).fetchone()[0]

    def get(self, ids: Sequence[str]) -> np.ndarray:
        with self.database.connection() as conn:
            rows = conn.execute(self._sql("SELECT id, embedding FROM {t} WHERE tenant = %s AND id = ANY(%s)"),
                                [self.tenant, list(ids)]).fetchall()
        found = {tid: as_array(vec) for tid, vec in rows}
        missing = [t for t in ids if t not in found]
        if missing:
            raise KeyError(missing[0])
        return np.stack([found[t] for t in ids]) if ids else np.zeros((0, self.dim), dtype=np.float32)

    def search(self, vectors: np.ndarray, k: int, filter: Filter | None = None) -> Results:
        """The k best rows for each query vector, in one statement for the batch."""
        vectors = self._queries(vectors, k)
        if _allows_nothing(filter):
            return Results.empty(len(vectors))
        params: dict[str, Any] = {"tenant": self.tenant, "k": int(k), "vecs": list(vectors)}
        statement = self._sql(_DENSE_SQL.format(where=_filter_sql(filter, params)))
        exact = self.exact or k > MAX_EF_SEARCH
        ef = max(self.ef_search, k)
        per_query = _group(self._run_search(statement, params, exact, ef), len(vectors))
        if not exact:  # a graph walk filtered afterwards (or through rows deleted but not yet
            # vacuumed) may come back short: redo those queries exactly (cheap when few rows qualify)
            short = [q for q in range(len(vectors)) if len(per_query[q][0]) < k]
            if short:
                params["vecs"] = [vectors[q] for q in short]
                redo = _group(self._run_search(statement, params, True, ef), len(short))
                for q, got in zip(short, redo):
                    if len(got[0]) > len(per_query[q][0]):
                        per_query[q] = got
        return Results(tuple(np.asarray(ids, dtype=object) for ids, _s in per_query),
                       tuple(np.asarray(scores, dtype=np.float32) for _i, scores in per_query))

    def _queries(self, vectors: np.ndarray, k: int) -> np.ndarray:
        """The query vectors as a float32 matrix; ValueError for a wrong dimension or k below 1."""
        vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
        if vectors.shape[1] != self.dim:
            raise ValueError(f"expected query vectors of dimension {self.dim}, got {vectors.shape[1]}")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        return vectors

    def _run_search(self, statement, params: dict, exact: bool, ef: int) -> list:
        with self.database.connection() as conn:
            if exact or ef != self.database.ef_search:  # a setting for this query only: SET LOCAL in a
                with conn.pipeline(), conn.transaction():  # transaction, sent with the query in one go
                    if exact:
                        conn.execute("SET LOCAL enable_indexscan = off")
                    else:
                        conn.execute(f"SET LOCAL hnsw.ef_search = {min(int(ef), MAX_EF_SEARCH)}")
                    return conn.execute(statement, params).fetchall()
            return conn.execute(statement, params).fetchall()

    # writes -------------------------------------------------------------------------------
    def upsert(self, ids: Sequence[str], vectors: np.ndarray, namespaces: Sequence[str | None] | None = None) -> None:
        """Insert or replace rows, in one write transaction (a new version, the ids logged). A row
        written here has no text, content hash or document: those are the catalog's (`PgCatalog.write`)."""
        rows = self._rows(ids, vectors, namespaces)
        if rows:
            self.database.writing(self.tenant, lambda conn: self._write_rows(conn, rows, []))

    def delete(self, ids: Sequence[str]) -> None:
        if len(ids):
            self.database.writing(self.tenant, lambda conn: self._write_rows(conn, [], list(dict.fromkeys(ids))),
                                  inserts=False)

    def update_vectors(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Replace the embeddings of stored rows (namespace, text, content hash and doc stay) in one write
        transaction that bumps the tenant's version and logs the ids; KeyError, and nothing written,
        when an id is not stored."""
        vectors = checked_vectors(ids, vectors, self.dim, "update_vectors")
        if not len(ids):
            return
        with self.database.connection(bounded=False) as conn, conn.transaction():
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
                                [(checked_vector(v, self.dim), self.tenant, tid) for tid, v in zip(ids, vectors)])
            self._log(conn, version, list(ids))

    def _rows(self, ids: Sequence[str], vectors: np.ndarray, namespaces: Sequence[str | None] | None) -> list[PgRow]:
        """What `upsert` writes, checked: the vectors' shape, no id twice, no NUL character."""
        vectors = checked_vectors(ids, vectors, self.dim, "upsert")
        namespaces = list(namespaces) if namespaces is not None else [None] * len(ids)
        rows = [PgRow(tid, ns, vec) for tid, ns, vec in zip(ids, namespaces, vectors)]
        for row in rows:
            refuse_nul({"id": row.id, "namespace": row.namespace}, f"tool {row.id!r}")
        return rows

    def _write_rows(self, conn, rows: list[PgRow], delete: list[str]) -> None:
        try:
            with conn.transaction():
                version = self._bump(conn)  # locks the tenant's version row: writers queue here
                deleted = self._put_rows(conn, rows, delete)
                if not rows and not deleted:
                    raise NothingToWrite
                self._log(conn, version, [r.id for r in rows] + deleted)
        except NothingToWrite:
            pass

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


# ----------------------------------------------------------------------------------- SQL pieces
# Python's format fills {where}; "{{t}}" becomes {t}, the table, filled by psycopg. Rows come ordered
# by query, then score (best first), then id.

_DENSE_SQL = (
    "SELECT q.ord, t.id, t.score FROM unnest(%(vecs)b::vector[]) WITH ORDINALITY AS q(vec, ord) "
    "CROSS JOIN LATERAL (SELECT id, (embedding <#> q.vec) * -1 AS score FROM {{t}} "
    "WHERE {where} ORDER BY embedding <#> q.vec LIMIT %(k)s) t ORDER BY 1, 3 DESC, 2")


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


def _group(rows: list, n: int) -> list[tuple[list[str], list[float]]]:
    """(ids, scores) of each of `n` queries, from rows (query number from 1, id, score)."""
    out: list[tuple[list[str], list[float]]] = [([], []) for _ in range(n)]
    for row in rows:
        ids, scores = out[int(row[0]) - 1]
        ids.append(row[1])
        scores.append(float(row[2]))
    return out



def checked_vector(vector: np.ndarray, dim: int) -> np.ndarray:
    vector = np.asarray(vector, dtype=np.float32)
    if vector.shape != (dim,):
        raise ValueError(f"expected a vector of dimension {dim}, got shape {vector.shape}")
    return vector


def as_jsonb(doc: dict | None):
    """`doc` as a jsonb parameter (None stays NULL): its JSON text, as a jsonb string. A jsonb object does not
    keep the order of its keys, and a tool's order (its parameters') is part of its text view, which rerankers
    read and agents are shown; `doc_of` reads it back."""
    from psycopg.types.json import Jsonb

    return None if doc is None else Jsonb(json.dumps(doc, ensure_ascii=False))


def doc_of(value: Any) -> dict | None:
    """A stored document as `as_jsonb` wrote it (rows written before documents were kept as text hold an
    object, its keys in jsonb's order)."""
    return json.loads(value) if isinstance(value, str) else value
