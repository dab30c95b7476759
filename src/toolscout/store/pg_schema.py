"""The PostgreSQL schema of the pgvector store, created and upgraded by versioned migrations.

One *index table* (default `toolscout_tools`) holds every tenant's tools, LIST-partitioned by tenant: each
tenant's rows live in their own partition with its own HNSW graph, so a tenant's search walks only its
own graph (no post-filtered recall loss, no cross-tenant scan) and a whole tenant catalog can be
replaced by building a new partition and swapping it in. Columns:

    tenant text, id text, namespace text ('' = none), text text (the tool's text view), content_hash text,
    doc jsonb (the Tool), embedding vector(dim), updated_at timestamptz, usage text (the words of the
    requests that taught the tool), base_embedding vector(dim) (its own vector while feedback moves
    `embedding`; NULL when nothing taught it), reported integer (feedback events that named it),
    tsv tsvector (generated from text and usage), seq bigint (the order tools joined the catalog, from the
    sequence `{table}_seq`: replicas list the catalog in that order, as the library keeps it)

Shared bookkeeping tables (one set per database):

    toolscout_schema_migrations(tbl, version, description, applied_at)   what has been applied, per index table
    toolscout_indexes(tbl, dim, config, updated_at)                        encoder / text view / search mode
    toolscout_versions(tbl, tenant, version)                               bumped by every committed write
    toolscout_changes(tbl, tenant, version, ids, at)                       which ids each version touched
    toolscout_feedback(tbl, tenant, source, tool_id, query_key, query, learned, seq, at)
                                                                           tool-use feedback, one row per
                                                                           (source, tool, task): repeats count once
    toolscout_usage(tbl, tenant, tool_id, source, n, vsum)                 per tool and source, the sum of the
                                                                           taught requests' embeddings
    toolscout_feedback_totals(tbl, tenant, events, failures)               events reported, all outcomes
    toolscout_definitions(tbl, tenant, id, first_seen, first, fields, changes, approved, stamp)
                                                                           gateway replicas: each tool definition's
                                                                           fingerprint, its changes and approval
    toolscout_listings(tbl, tenant, namespace, replica, ids, listed_at, at)  gateway replicas: each one's latest
                                                                           listing of each upstream (`at`: alive)

Migrations run in one transaction under an advisory lock, so concurrent processes starting against a
fresh database apply them exactly once. A database migrated by a newer toolscout is refused.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Callable

from ..errors import ToolScoutError

DEFAULT_TABLE = "toolscout_tools"
TEXT_SEARCH_CONFIG = "english"
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64
MIGRATION_LOCK = 0x746F6F6C73636F75  # advisory lock key ("toolscou"), held while migrating
_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")
# the database-wide relations every index table shares (the `toolscout_*` names the migrations and `migrate`
# create): names an index table cannot take
BOOKKEEPING = frozenset({
    "toolscout_schema_migrations", "toolscout_indexes", "toolscout_versions", "toolscout_changes",
    "toolscout_feedback", "toolscout_feedback_tool", "toolscout_usage", "toolscout_feedback_totals",
    "toolscout_requests", "toolscout_scored", "toolscout_learning", "toolscout_definitions_stamp",
    "toolscout_definitions", "toolscout_definitions_by_stamp", "toolscout_listings",
    "toolscout_incoming"})  # the last: a replace's temporary table, which would shadow an index table so named


class SchemaError(ToolScoutError):
    """The database's toolscout schema is missing, newer than this toolscout, or does not fit."""


def check_table_name(table: str) -> str:
    if not _TABLE_NAME.match(table):
        raise ValueError(f"invalid index table name {table!r}: use 1-32 lowercase letters, digits and '_', "
                         "starting with a letter or '_'")
    if table in BOOKKEEPING:
        raise ValueError(f"index table name {table!r} is reserved for toolscout's own bookkeeping (what every index "
                         "table of the database shares); choose another (?table=NAME in the store spec)")
    return table


def partition_name(table: str, tenant: str) -> str:
    """The partition holding `tenant`'s rows (a digest: tenant keys may hold any characters)."""
    return f"{table}_t{hashlib.sha256(tenant.encode('utf-8')).hexdigest()[:12]}"


def index_ddl(table: str, target: str) -> list[str]:
    """CREATE INDEX statements for `target` (the partitioned table itself, or a table about to be attached
    as one of its partitions: the definitions must match so ATTACH adopts them instead of rebuilding)."""
    return [
        f"CREATE INDEX {target}_ns ON {target} (tenant, namespace)",
        f"CREATE INDEX {target}_hnsw ON {target} USING hnsw (embedding vector_ip_ops) "
        f"WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION})",
    ]


def text_index_ddl(target: str) -> str:
    return f"CREATE INDEX {target}_tsv ON {target} USING gin (tsv)"


def partition_ddl(table: str, name: str, dim: int, tenant: str, indexes: bool = True) -> list:
    """Statements creating table `name`, ready to be attached as `tenant`'s partition of `table` at the
    latest schema version: the same columns as `table` (keep in step with MIGRATIONS), a CHECK on the
    tenant (so ATTACH need not scan it) and, with `indexes`, the indexes ATTACH expects."""
    from psycopg import sql

    create = sql.SQL(
        "CREATE TABLE {name} ("
        " tenant text NOT NULL CHECK (tenant = {tenant}),"
        " id text NOT NULL,"
        " namespace text NOT NULL DEFAULT '',"
        " text text NOT NULL DEFAULT '',"
        " content_hash text NOT NULL DEFAULT '',"
        " doc jsonb,"
        " embedding vector({dim}) NOT NULL,"
        " updated_at timestamptz NOT NULL DEFAULT now(),"
        " usage text NOT NULL DEFAULT '',"
        " base_embedding vector({dim}),"
        " reported integer NOT NULL DEFAULT 0,"
        " tsv tsvector GENERATED ALWAYS AS (to_tsvector({cfg}::regconfig, text || ' ' || usage)) STORED,"
        " seq bigint NOT NULL DEFAULT nextval({sequence}),"
        " joined_at double precision NOT NULL DEFAULT 0)"
    ).format(name=sql.Identifier(name), tenant=sql.Literal(tenant), dim=sql.Literal(int(dim)),
             cfg=sql.Literal(TEXT_SEARCH_CONFIG), sequence=sql.Literal(f"{check_table_name(table)}_seq"))
    return [create, *(partition_indexes(table, name) if indexes else [])]


def partition_indexes(table: str, name: str) -> list[str]:
    """The primary key and indexes of a partition-to-be (built after a bulk load: much faster)."""
    check_table_name(table)
    return [f"ALTER TABLE {name} ADD CONSTRAINT {name}_pkey PRIMARY KEY (tenant, id)",
            *index_ddl(table, name), text_index_ddl(name)]


def attach_sql(table: str, name: str, tenant: str):
    from psycopg import sql

    return sql.SQL("ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES IN ({tenant})").format(
        table=sql.Identifier(table), name=sql.Identifier(name), tenant=sql.Literal(tenant))


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: Callable[[str, int], list[str]]  # (table, dim) -> SQL


def _v1(table: str, dim: int) -> list[str]:
    return [
        f"""CREATE TABLE {table} (
              tenant text NOT NULL,
              id text NOT NULL,
              namespace text NOT NULL DEFAULT '',
              text text NOT NULL DEFAULT '',
              content_hash text NOT NULL DEFAULT '',
              doc jsonb,
              embedding vector({dim}) NOT NULL,
              updated_at timestamptz NOT NULL DEFAULT now(),
              PRIMARY KEY (tenant, id)
            ) PARTITION BY LIST (tenant)""",
        *index_ddl(table, table),
        """CREATE TABLE IF NOT EXISTS toolscout_indexes (
              tbl text PRIMARY KEY, dim integer NOT NULL, config jsonb NOT NULL DEFAULT '{}',
              updated_at timestamptz NOT NULL DEFAULT now())""",
        """CREATE TABLE IF NOT EXISTS toolscout_versions (
              tbl text NOT NULL, tenant text NOT NULL, version bigint NOT NULL, PRIMARY KEY (tbl, tenant))""",
        """CREATE TABLE IF NOT EXISTS toolscout_changes (
              tbl text NOT NULL, tenant text NOT NULL, version bigint NOT NULL, ids text[],
              at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tbl, tenant, version))""",
        f"INSERT INTO toolscout_indexes (tbl, dim) VALUES ('{table}', {int(dim)})",
    ]


def _v2(table: str, dim: int) -> list[str]:
    return [
        f"ALTER TABLE {table} ADD COLUMN tsv tsvector "
        f"GENERATED ALWAYS AS (to_tsvector('{TEXT_SEARCH_CONFIG}'::regconfig, text)) STORED",
        text_index_ddl(table),
    ]


def _v3(table: str, dim: int) -> list[str]:
    return [
        f"ALTER TABLE {table} ADD COLUMN usage text NOT NULL DEFAULT ''",
        f"ALTER TABLE {table} ADD COLUMN base_embedding vector({int(dim)})",
        f"ALTER TABLE {table} ADD COLUMN reported integer NOT NULL DEFAULT 0",
        f"ALTER TABLE {table} DROP COLUMN tsv",  # regenerated over the text and what feedback taught
        f"ALTER TABLE {table} ADD COLUMN tsv tsvector "
        f"GENERATED ALWAYS AS (to_tsvector('{TEXT_SEARCH_CONFIG}'::regconfig, text || ' ' || usage)) STORED",
        text_index_ddl(table),
        """CREATE TABLE IF NOT EXISTS toolscout_feedback (
              tbl text NOT NULL, tenant text NOT NULL, source text NOT NULL, tool_id text NOT NULL,
              query_key text NOT NULL, query text NOT NULL, learned boolean NOT NULL,
              seq bigserial NOT NULL, at timestamptz NOT NULL DEFAULT now(),
              PRIMARY KEY (tbl, tenant, source, tool_id, query_key))""",
        "CREATE INDEX IF NOT EXISTS toolscout_feedback_tool ON toolscout_feedback (tbl, tenant, tool_id)",
        """CREATE TABLE IF NOT EXISTS toolscout_usage (
              tbl text NOT NULL, tenant text NOT NULL, tool_id text NOT NULL, source text NOT NULL,
              n integer NOT NULL, vsum vector NOT NULL, PRIMARY KEY (tbl, tenant, tool_id, source))""",
        """CREATE TABLE IF NOT EXISTS toolscout_feedback_totals (
              tbl text NOT NULL, tenant text NOT NULL, events bigint NOT NULL DEFAULT 0,
              failures bigint NOT NULL DEFAULT 0, PRIMARY KEY (tbl, tenant))""",
    ]


def _v4(table: str, dim: int) -> list[str]:
    return [
        f"CREATE SEQUENCE IF NOT EXISTS {table}_seq",
        f"ALTER TABLE {table} ADD COLUMN seq bigint NOT NULL DEFAULT nextval('{table}_seq')",
    ]


def _v5(table: str, dim: int) -> list[str]:
    return [
        "ALTER TABLE toolscout_feedback ADD COLUMN IF NOT EXISTS taught_at double precision NOT NULL DEFAULT 0",
        "ALTER TABLE toolscout_feedback ADD COLUMN IF NOT EXISTS untaught_rank integer",
        "ALTER TABLE toolscout_feedback ADD COLUMN IF NOT EXISTS request_key text",
        """CREATE TABLE IF NOT EXISTS toolscout_requests (
              tbl text NOT NULL, tenant text NOT NULL, key text NOT NULL, embedding vector NOT NULL,
              PRIMARY KEY (tbl, tenant, key))""",
        """CREATE TABLE IF NOT EXISTS toolscout_scored (
              tbl text NOT NULL, tenant text NOT NULL, seq bigserial NOT NULL, time double precision NOT NULL,
              source text NOT NULL, namespace text NOT NULL, tool_id text NOT NULL, query text NOT NULL,
              taught_before boolean NOT NULL, served integer, untaught integer, learned integer,
              PRIMARY KEY (tbl, tenant, seq))""",
        f"ALTER TABLE {table} ADD COLUMN joined_at double precision NOT NULL DEFAULT 0",  # 0: there before learning
        """CREATE TABLE IF NOT EXISTS toolscout_learning (
              tbl text NOT NULL, tenant text NOT NULL, epoch bigint NOT NULL DEFAULT 0,
              settings jsonb NOT NULL DEFAULT '{}', PRIMARY KEY (tbl, tenant))""",
        # feedback no longer moves tool vectors: put back each taught tool's own vector and words
        f"UPDATE {table} SET embedding = base_embedding, base_embedding = NULL WHERE base_embedding IS NOT NULL",
        f"UPDATE {table} SET usage = '' WHERE usage <> ''",
        f"DELETE FROM toolscout_usage WHERE tbl = '{table}'",
    ]


def _v6(table: str, dim: int) -> list[str]:
    return [
        "CREATE SEQUENCE IF NOT EXISTS toolscout_definitions_stamp",
        """CREATE TABLE IF NOT EXISTS toolscout_definitions (
              tbl text NOT NULL, tenant text NOT NULL, id text NOT NULL, first_seen double precision NOT NULL,
              first text NOT NULL, fields jsonb NOT NULL, changes jsonb NOT NULL DEFAULT '[]', approved text,
              stamp bigint NOT NULL DEFAULT nextval('toolscout_definitions_stamp'), PRIMARY KEY (tbl, tenant, id))""",
        "CREATE INDEX IF NOT EXISTS toolscout_definitions_by_stamp ON toolscout_definitions (tbl, tenant, stamp)",
        """CREATE TABLE IF NOT EXISTS toolscout_listings (
              tbl text NOT NULL, tenant text NOT NULL, namespace text NOT NULL, replica text NOT NULL,
              ids text[] NOT NULL, listed_at timestamptz NOT NULL DEFAULT now(),
              at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tbl, tenant, namespace, replica))""",
    ]


def _v7(table: str, dim: int) -> list[str]:
    return ["ALTER TABLE toolscout_scored ADD COLUMN IF NOT EXISTS passed_by text[] NOT NULL DEFAULT '{}'"]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "tools table partitioned by tenant, HNSW (inner product) index, versions and change log", _v1),
    Migration(2, "lexical search: generated tsvector column over the text view, GIN index", _v2),
    Migration(3, "learning from use: feedback and per-source usage tables, usage words in the tsvector", _v3),
    Migration(4, "catalog order: seq, the order tools joined the catalog (replicas keep it, as the library does)",
              _v4),
    Migration(5, "learning as its own channel: request vectors, scores, settings and epoch; tool vectors unmoved",
              _v5),
    Migration(6, "gateway replicas: shared tool definitions and approvals, each replica's listing of each upstream",
              _v6),
    Migration(7, "scores name the namespaces whose lifts passed a tool (what the automatic weight reads)", _v7),
)
LATEST = MIGRATIONS[-1].version


def applied_versions(conn, table: str) -> list[int]:
    exists = conn.execute("SELECT to_regclass('toolscout_schema_migrations')").fetchone()[0]
    if exists is None:
        return []
    rows = conn.execute("SELECT version FROM toolscout_schema_migrations WHERE tbl = %s ORDER BY version",
                        [table]).fetchall()
    return [r[0] for r in rows]


def check_not_foreign(conn, table: str) -> None:
    """A table of that name that toolscout did not make (no schema version recorded for it) is someone
    else's: refused, and left as it is."""
    if applied_versions(conn, table):
        return
    if conn.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is not None:
        raise SchemaError(f"a table named {table!r} exists in this database, but toolscout did not make it (no "
                          "schema version is recorded for it); choose another table (?table=NAME in the store spec)")


def migrate(conn, table: str, dim: int, target: int = LATEST) -> list[int]:
    """Bring index table `table` up to schema version `target`; return the versions applied now.

    `conn` must be in autocommit mode; everything runs in one transaction under an advisory lock, so a
    failure applies nothing and concurrent callers wait for one another."""
    check_table_name(table)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIGRATION_LOCK])
        _create_extension(conn)
        conn.execute("""CREATE TABLE IF NOT EXISTS toolscout_schema_migrations (
                          tbl text NOT NULL, version integer NOT NULL, description text NOT NULL,
                          applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tbl, version))""")
        check_not_foreign(conn, table)
        done = set(applied_versions(conn, table))
        newer = [v for v in done if v > LATEST]
        if newer:
            raise SchemaError(f"index table {table!r} is at schema version {max(newer)}, newer than this toolscout "
                              f"understands ({LATEST}); upgrade toolscout")
        applied = []
        for migration in MIGRATIONS:
            if migration.version in done or migration.version > target:
                continue
            for statement in migration.statements(table, dim):
                conn.execute(statement)
            conn.execute("INSERT INTO toolscout_schema_migrations (tbl, version, description) VALUES (%s, %s, %s)",
                         [table, migration.version, migration.description])
            applied.append(migration.version)
    return applied


def _create_extension(conn) -> None:
    import psycopg

    installed = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    if installed is not None:
        return
    try:
        with conn.transaction():
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        raise SchemaError(f"the pgvector extension is not installed in this database and could not be created "
                          f"({exc.diag.message_primary or exc}); install pgvector on the server and run "
                          "`CREATE EXTENSION vector` as a superuser, then retry") from None


def table_dim(conn, table: str) -> int | None:
    """The dimension of `table`'s embedding column (None if the table does not exist)."""
    row = conn.execute("SELECT a.atttypmod FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) "
                       "AND a.attname = 'embedding' AND NOT a.attisdropped", [table]).fetchone()
    return None if row is None else int(row[0])
