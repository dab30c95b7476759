"""The pgvector store and a tenant's catalog against a real PostgreSQL (pgserver): parity with the local
numpy store, filters, versioned writes and the change log, tenants, migrations, crash safety of writes."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pgtest import new_table, own_server_uri, pg_ctl, postgres_uri, spec

from toolscout.results import Filter
from toolscout.store.base import VectorStore
from toolscout.store.local import NumpyStore, load_store, make_store

pytestmark = pytest.mark.slow  # starts PostgreSQL


@pytest.fixture(scope="session")
def pg():
    return postgres_uri()


def unit(rng, n, d):
    v = rng.normal(size=(n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def pg_store(uri, dim, tenant=None, **options):
    from toolscout.store.pgvector import PgVectorStore

    return PgVectorStore.from_spec(spec(uri, new_table(), tenant), dim, **options)


def catalog_of(store):
    from toolscout.store.pg_catalog import PgCatalog

    return PgCatalog(store)


def assert_same(pg_results, local_results):
    assert pg_results.as_lists() == local_results.as_lists()
    for a, b in zip(pg_results.scores, local_results.scores):
        np.testing.assert_allclose(a, b, atol=1e-5)


# ------------------------------------------------------------------------------ no database needed

def test_spec_parsing_keeps_libpq_parameters_and_never_records_the_password():
    from toolscout.store.pgvector import PgSpec, PgStoreError, redact

    s = PgSpec.parse("postgresql://bob:s3cret@db.example:5433/tools?sslmode=require&tenant=acme%20co&table=tools_v2")
    assert s.dsn == "postgresql://bob:s3cret@db.example:5433/tools?sslmode=require"
    assert (s.tenant, s.table) == ("acme co", "tools_v2")
    assert str(s) == "postgresql://bob@db.example:5433/tools?sslmode=require&tenant=acme%20co&table=tools_v2"
    assert PgSpec.parse(str(s)).tenant == "acme co"
    assert redact("postgres://u:p@h/db?password=x&host=/tmp/s") == "postgres://u@h/db?host=/tmp/s"
    assert PgSpec.parse("postgresql:///db").tenant == "default"
    assert redact("postgresql:///db?password=x") == "postgresql:///db" == PgSpec.parse("postgresql:///db").dsn
    assert redact("postgresql://u@h/db?sslpassword=k3y&sslmode=verify-full") == "postgresql://u@h/db?sslmode=verify-full"
    with pytest.raises(ValueError, match="invalid index table name"):
        PgSpec.parse("postgresql:///db?table=Robert');DROP")
    with pytest.raises(Exception, match="expected postgresql://"):
        PgSpec.parse("mysql://h/db")
    timed = PgSpec.parse("postgresql:///db?answer_timeout=2.5&tenant=t")
    assert (timed.dsn, timed.answer_timeout, PgSpec.parse("postgresql:///db").answer_timeout) == ("postgresql:///db", 2.5, 30)
    assert PgSpec.parse(str(timed)) == timed and str(timed).endswith("answer_timeout=2.5")
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(PgStoreError, match=f"answer_timeout='{bad}' in the store spec: give the seconds"):
            PgSpec.parse(f"postgresql:///db?answer_timeout={bad}")
    with pytest.raises(PgStoreError, match='invalid URI query parameter: "sslmod".*toolscout\'s own: answer_timeout, table, tenant'):
        PgSpec.parse("postgresql://u:pw@h/db?sslmod=require&tenant=t")  # a misspelt libpq parameter, before connecting


def test_a_mistyped_scheme_or_a_keyword_dsn_is_refused_without_echoing_its_password(tmp_path, capsys):
    """`postgresq://`, `pgsql://`, `postgress://` or libpq's `key=value` form: not a PostgreSQL spec here, so the
    commands refuse it, but never by printing it whole (postgres.md: passwords are never written anywhere)."""
    from toolscout.cli import main
    from toolscout.store.pgvector import redact

    assert redact("pgsql://alice:S3cretPW@db/t?password=x&sslmode=require") == "pgsql://alice@db/t?sslmode=require"
    assert redact("host=db password='S3 cretPW' user=alice") == "host=db user=alice"
    assert redact("faiss:HNSW32") == "faiss:HNSW32"  # not a DSN: unchanged
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": "mcp-server-time"}}}))
    catalog = Path(__file__).resolve().parents[1] / "src/toolscout/data/catalogs/petstore_openapi.yaml"
    for command in (["serve", "--store", "postgresq://alice:S3cretPW@db.example/tools"],
                    ["gateway", str(config), "--store", "pgsql://alice:S3cretPW@db.example/tools"],
                    ["index", str(catalog), "--out", str(tmp_path / "x"), "--store", "postgress://alice:S3cretPW@db/t"],
                    ["serve", "--store", "host=db password=S3cretPW"]):
        assert main(command) != 0, command
        err = capsys.readouterr().err
        assert "S3cretPW" not in err and ("alice@db" in err or "'host=db'" in err), err


def test_a_parameter_given_twice_is_refused_naming_it_and_its_values():
    from toolscout.store.pgvector import PgSpec, PgStoreError

    for spec, says in (
            # a config's DSN with "&tenant=..." appended: taking the last would replace team_b's whole catalog
            ("postgresql:///db?tenant=team_a&sslmode=disable&tenant=team_b",
             r"gives 'tenant' 2 times \('team_a', 'team_b'\): give it once"),
            ("postgresql:///db?table=tools_a&table=tools_a", r"gives 'table' 2 times \('tools_a', 'tools_a'\)"),
            ("postgresql:///db?answer_timeout=5&tenant=t&answer_timeout=9",
             r"gives 'answer_timeout' 2 times \('5', '9'\)"),
            # libpq's own: the second dbname would win there (a write into another database); secrets unsaid
            ("postgresql://h/x?dbname=prod&dbname=staging", r"gives 'dbname' 2 times \('prod', 'staging'\)"),
            ("postgresql://u@h/db?password=s3cret&password=other", r"gives 'password' 2 times: give it once$"),
            ("postgresql://u@h/db?sslpassword=s3cret&sslpassword=other",
             r"gives 'sslpassword' 2 times: give it once$")):
        with pytest.raises(PgStoreError, match=says):
            PgSpec.parse(spec)

def test_the_names_of_toolscouts_own_bookkeeping_tables_are_refused_as_reserved():
    import inspect
    import re

    from toolscout.store import pg_schema
    from toolscout.store.pgvector import PgSpec

    with pytest.raises(ValueError, match="index table name 'toolscout_feedback' is reserved for toolscout's own "
                                         "bookkeeping .*choose another"):
        PgSpec.parse("postgresql:///db?table=toolscout_feedback")
    # every shared relation the schema creates is reserved, and the temporary table a replace creates (which
    # would shadow an index table so named); the index tables' default name is not
    from toolscout.store import pg_catalog

    ddl = [st for m in pg_schema.MIGRATIONS for st in m.statements("idx", 8)] + [inspect.getsource(pg_schema.migrate)]
    ddl += re.findall(r"CREATE TEMP TABLE \w+", inspect.getsource(pg_catalog))
    assert {name for text in ddl for name in re.findall(r"\btoolscout_[a-z_]+", text)} == pg_schema.BOOKKEEPING
    assert PgSpec.parse("postgresql:///db?table=toolscout_tools").table == pg_schema.DEFAULT_TABLE


def test_a_table_someone_else_made_is_refused_by_name_and_kept(pg):
    import psycopg

    from toolscout.store.pg_schema import SchemaError
    from toolscout.store.pgvector import PgVectorStore

    table = new_table()
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, note text)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 'keep me')")
    for dim in (8, None):  # indexing into it (its dimension given), and serving it (read from the table)
        with pytest.raises(SchemaError, match=f"a table named '{table}' exists in this database, but toolscout did "
                                              "not make it"):
            PgVectorStore.from_spec(spec(pg, table), dim).get(["x"])
    with psycopg.connect(pg, autocommit=True) as conn:
        assert conn.execute(f"SELECT note FROM {table}").fetchall() == [("keep me",)]


# ---------------------------------------------------------------------------------------- parity

def test_exact_search_matches_the_local_store_through_upserts_deletes_and_filters(pg):
    rng = np.random.default_rng(0)
    n, dim = 400, 24
    vecs, ids = unit(rng, n, dim), [f"t{i}" for i in range(n)]
    namespaces = ["a" if i % 4 == 0 else ("b" if i % 4 == 1 else None) for i in range(n)]
    local, store = NumpyStore(dim), pg_store(pg, dim, exact=True)
    assert isinstance(store, VectorStore)  # the contract, and nothing the catalog holds
    for s in (local, store):
        s.upsert(ids, vecs, namespaces)
    queries = unit(rng, 12, dim)
    assert len(store) == n
    assert_same(store.search(queries, 10), local.search(queries, 10))

    changed = unit(rng, 30, dim)  # replace 30 vectors (one namespace changes too), delete 40 tools
    for s in (local, store):
        s.upsert(ids[:30], changed, ["b"] + namespaces[1:30])
        s.delete(ids[200:240] + ["never-there"])
    assert len(store) == len(local) == n - 40
    np.testing.assert_array_equal(store.get(["t0", "t5", "t399"]), local.get(["t0", "t5", "t399"]))
    with pytest.raises(KeyError):
        store.get(["t210"])
    assert_same(store.search(queries, 10), local.search(queries, 10))
    for flt in (Filter.make(namespaces=["a"]), Filter.make(namespaces=[""]), Filter.make(namespaces=["a", "b"]),
                Filter.make(ids=["t1", "t2", "t3", "t210", "t300"]), Filter.make(exclude_ids=ids[:150]),
                Filter.make(namespaces=["b"], exclude_ids=["t1"])):
        assert_same(store.search(queries, 10, flt), local.search(queries, 10, flt))
    assert store.search(queries[:1], 10, Filter.make(ids=[])).as_lists() == [[]]


def test_hnsw_search_is_close_to_exact_and_filtered_searches_come_back_full(pg):
    rng = np.random.default_rng(1)
    n, dim = 1500, 32
    vecs, ids = unit(rng, n, dim), [f"t{i}" for i in range(n)]
    namespaces = ["rare" if i % 100 == 0 else "common" for i in range(n)]  # 15 rare tools
    local, store = NumpyStore(dim), pg_store(pg, dim)
    for s in (local, store):
        s.upsert(ids, vecs, namespaces)
    queries = unit(rng, 20, dim)
    approx, exact = store.search(queries, 10).as_lists(), local.search(queries, 10).as_lists()
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact)])
    assert recall >= 0.9
    rare = Filter.make(namespaces=["rare"])  # 1% of the rows: a graph walk filtered afterwards finds few
    assert store.search(queries, 10, rare).as_lists() == local.search(queries, 10, rare).as_lists()


def test_store_made_by_make_store_replaces_the_tenant_catalog_with_its_first_write(pg, tmp_path):
    uri_spec = spec(pg, new_table(), "acme")
    rng = np.random.default_rng(2)
    old = make_store(uri_spec, 8)
    old.upsert(["x", "y", "z"], unit(rng, 3, 8), ["n", "n", None])
    new = make_store(uri_spec, 8)
    assert isinstance(new, VectorStore)
    assert len(new) == 0 and new.search(unit(rng, 1, 8), 5).as_lists() == [[]]  # a new, empty index
    with pytest.raises(KeyError):
        new.get(["x"])
    assert len(old) == 3  # ... while the old catalog is still served
    new.upsert(["y", "w"], unit(rng, 2, 8), [None, None])
    assert len(old) == 2 and sorted(old.search(unit(rng, 1, 8), 5).as_lists()[0]) == ["w", "y"]
    config = new.save(tmp_path / "store")
    assert config["store"] == "pgvector" and config["tenant"] == "acme" and "postgres:@" not in config["dsn"]
    again = load_store(tmp_path / "store", config)
    assert len(again) == 2 and again.tenant == "acme"


def test_update_vectors_replaces_embeddings_in_one_logged_write_and_refuses_unknown_ids(pg):
    rng = np.random.default_rng(5)
    dim, ids = 8, [f"t{i}" for i in range(20)]
    vecs = unit(rng, 20, dim)
    namespaces = ["a" if i % 2 else None for i in range(20)]
    from toolscout.store.pgvector import PgRow

    local, store = NumpyStore(dim), pg_store(pg, dim, exact=True)
    catalog = catalog_of(store)
    catalog.write([PgRow(i, ns, v, f"text {n}", f"h{n}") for n, (i, ns, v) in enumerate(zip(ids, namespaces, vecs))])
    local.upsert(ids, vecs, namespaces)
    version = catalog.version()

    moved = unit(rng, 2, dim)
    for s in (local, store):
        s.update_vectors(["t3", "t4"], moved)
    assert catalog.version() == version + 1 and catalog.changes_since(version) == (version + 1, ["t3", "t4"])
    np.testing.assert_allclose(store.get(["t3", "t4"]), moved, atol=1e-6)
    assert catalog.hashes(["t3", "t4"]) == {"t3": "h3", "t4": "h4"}  # text and hash stay with the row
    assert catalog.namespace_counts() == {"": 10, "a": 10}
    queries = np.vstack([moved, unit(rng, 3, dim)])
    for flt in (None, Filter.make(namespaces=["a"]), Filter.make(namespaces=[""])):
        assert_same(store.search(queries, 5, flt), local.search(queries, 5, flt))

    with pytest.raises(KeyError):
        store.update_vectors(["t5", "nope"], unit(rng, 2, dim))
    assert catalog.version() == version + 1  # rolled back: no version, no change
    np.testing.assert_allclose(store.get(["t5"]), vecs[[5]], atol=1e-6)
    with pytest.raises(KeyError):  # a store made by make_store is a new, empty index until its first write
        make_store(spec(pg, store.table), dim).update_vectors(["t1"], unit(rng, 1, dim))


def test_tool2vec_learns_usage_on_the_postgresql_store_as_on_the_local_one(pg, tools, encoder):
    from toolscout.retrievers import make_retriever

    local = make_retriever("tool2vec", encoder=encoder, prior=0.5)
    shared = make_retriever("tool2vec", encoder=encoder, prior=0.5, store=spec(pg, new_table()))
    usage = ["what's on my agenda tomorrow", "what does my week look like", "do I have anything on Friday"]
    for r in (local, shared):
        r.index(tools)
        r.add_usage("calendar.list", usage)
    blend = encoder.encode(usage).sum(axis=0) + 0.5 * shared.descriptions["calendar.list"]  # the Tool2Vec formula
    np.testing.assert_allclose(shared.store.get(["calendar.list"])[0], blend / np.linalg.norm(blend), atol=1e-5)
    np.testing.assert_allclose(shared.store.get(["calendar.list"]), local.store.get(["calendar.list"]), atol=1e-5)
    query = ["what does my day look like on Thursday"]
    assert list(shared.search(query, 3).ids[0]) == list(local.search(query, 3).ids[0])
    assert catalog_of(shared.store).namespace_counts()["calendar"] == 2  # the namespace stayed


# ------------------------------------------------------------------------------------- tenants

def test_tenants_share_a_table_but_never_each_others_rows(pg):
    from toolscout.store.pgvector import PgVectorStore

    rng = np.random.default_rng(3)
    a = PgVectorStore.from_spec(spec(pg, new_table(), "a"), 8)
    b = a.for_tenant("b")
    catalog_a, catalog_b = catalog_of(a), catalog_of(a).for_tenant("b")
    va, vb = unit(rng, 3, 8), unit(rng, 4, 8)
    a.upsert(["t1", "t2", "t3"], va, ["ns"] * 3)
    assert catalog_a.changes_since(0) == (1, ["t1", "t2", "t3"])  # the store's writes are versioned and logged
    b.upsert(["t1", "t2", "b3", "b4"], vb, ["ns", "other", "other", "other"])
    assert (len(a), len(b)) == (3, 4)
    np.testing.assert_array_equal(a.get(["t1"]), va[:1])
    np.testing.assert_array_equal(b.get(["t1"]), vb[:1])
    with pytest.raises(KeyError):
        a.get(["b3"])
    assert sorted(a.search(vb, 10).as_lists()[0]) == ["t1", "t2", "t3"]
    assert catalog_a.namespace_counts() == {"ns": 3} and catalog_b.namespace_counts() == {"ns": 1, "other": 3}
    assert catalog_a.page(namespace="other") == (0, [])
    version_b = catalog_b.version()
    a.delete(["t1", "t2"])
    a.delete(["never-there"])  # deletes nothing: no new version
    assert len(a) == 1 and len(b) == 4 and catalog_b.version() == version_b
    assert catalog_a.changes_since(catalog_a.version() - 1) == (catalog_a.version(), ["t1", "t2"])


# ----------------------------------------------------------------------------------- migrations

def test_schema_migrations_are_versioned_and_upgrade_existing_rows(pg):
    import psycopg

    from toolscout.store import pg_schema
    from toolscout.store.pgvector import PgVectorStore

    table = new_table()
    with psycopg.connect(pg, autocommit=True) as conn:
        assert pg_schema.migrate(conn, table, 3, target=1) == [1]  # a database left at version 1
        conn.execute(f"CREATE TABLE {table}_p PARTITION OF {table} FOR VALUES IN ('default')")
        conn.execute(f"INSERT INTO {table} (tenant, id, text, embedding) VALUES ('default', 'old', "
                     "'translate text between languages', '[1,0,0]')")
        assert pg_schema.migrate(conn, table, 3, target=4) == [2, 3, 4]  # feedback once moved vectors (v3):
        conn.execute(f"UPDATE {table} SET embedding = '[0,0,1]', base_embedding = '[1,0,0]', usage = 'taught words' "
                     "WHERE id = 'old'")  # a taught tool's vector blended, its own one kept aside
    store = PgVectorStore.from_spec(spec(pg, table), 3)
    assert store.search(np.array([[1, 0, 0]], dtype=np.float32), 5).as_lists() == [["old"]]
    assert store.database.migrated == [5, 6, 7]
    with psycopg.connect(pg, autocommit=True) as conn:
        rows = conn.execute("SELECT version FROM toolscout_schema_migrations WHERE tbl = %s ORDER BY 1",
                            [table]).fetchall()
        assert rows == [(1,), (2,), (3,), (4,), (5,), (6,), (7,)]
        # v7: scores name whose lifts passed a tool; those recorded before say none
        assert conn.execute("SELECT column_default FROM information_schema.columns WHERE table_name = "
                            "'toolscout_scored' AND column_name = 'passed_by'").fetchone() == ("'{}'::text[]",)
        # v6: what gateway replicas share beside the catalog (definitions, listings) has its tables
        assert conn.execute("SELECT to_regclass('toolscout_definitions') IS NOT NULL, "
                            "to_regclass('toolscout_listings') IS NOT NULL").fetchone() == (True, True)
        # v5: learning is a channel of its own: the taught tool has its own vector back, and no usage words
        assert conn.execute(f"SELECT embedding::text, joined_at FROM {table} WHERE id = 'old'").fetchone() == \
            ("[1,0,0]", 0.0)
        # v2 indexed the existing row's text; v3: it is untaught (its own vector, no usage words) and its
        # text still indexed; v4: it has a place in the catalog's order, and a tool written after it comes after it
        assert conn.execute(f"SELECT usage, base_embedding, reported, tsv @@ to_tsquery('english', 'translate') "
                            f"FROM {table} WHERE id = 'old'").fetchone() == ("", None, 0, True)
        conn.execute(f"INSERT INTO {table} (tenant, id, text, embedding) VALUES ('default', 'a-new', 'x', '[0,1,0]')")
        assert [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY seq")] == ["old", "a-new"]
        assert pg_schema.migrate(conn, table, 3) == []  # up to date: nothing to do
    with pytest.raises(Exception, match="3-dimensional vectors, not 5"):
        len(PgVectorStore.from_spec(spec(pg, table), 5))
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute("INSERT INTO toolscout_schema_migrations VALUES (%s, 99, 'from the future')", [table])
        with pytest.raises(pg_schema.SchemaError, match="newer than this toolscout"):
            pg_schema.migrate(conn, table, 3)


# ---------------------------------------------------------------------------------- crash safety

CRASHING_WRITER = """
import os, signal, sys
import numpy as np
from toolscout.store.pg_catalog import PgCatalog
from toolscout.store.pgvector import PgRow

catalog = PgCatalog.from_spec(sys.argv[1], 8)
catalog.before_commit = lambda: os.kill(os.getpid(), signal.SIGKILL)  # die between the writes and COMMIT
vectors = np.full((2, 8), 1 / np.sqrt(8), dtype=np.float32)
if sys.argv[2] == "upsert":
    catalog.write([PgRow("t0", "moved", vectors[0]), PgRow("new", None, vectors[1])], ["t1"])
elif sys.argv[2] == "store upsert":
    catalog.vectors.upsert(["t0", "new"], vectors, ["moved", None])
else:
    catalog.write([PgRow("only", None, vectors[0])], replace=True)
"""


def snapshot(store):
    catalog = catalog_of(store)
    ids = sorted(catalog.hashes())
    return ids, store.get(ids).tolist(), catalog.namespace_counts(), catalog.version()


def wait_for_no_open_transactions(uri, timeout=10.0):
    import psycopg

    deadline = time.time() + timeout
    with psycopg.connect(uri, autocommit=True) as conn:
        while time.time() < deadline:
            busy = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%%' "
                                "AND pid <> pg_backend_pid()").fetchone()[0]
            if not busy:
                return
            time.sleep(0.05)
    raise AssertionError("a killed writer's transaction is still open")


@pytest.mark.parametrize("mode", ["upsert", "store upsert", "replace"])
def test_a_writer_killed_before_commit_leaves_the_previous_state(pg, tmp_path, mode):
    from toolscout.store.pgvector import PgVectorStore

    store_spec = spec(pg, new_table())
    store = PgVectorStore.from_spec(store_spec, 8)
    rng = np.random.default_rng(4)
    store.upsert([f"t{i}" for i in range(5)], unit(rng, 5, 8), ["ns"] * 5)
    before = snapshot(store)
    script = tmp_path / "writer.py"
    script.write_text(CRASHING_WRITER)
    proc = subprocess.run([sys.executable, str(script), store_spec, mode], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    wait_for_no_open_transactions(pg)
    assert snapshot(store) == before
    # the store is usable at once: no lock held, versions continue, a later replace drops the dead one's table
    catalog = catalog_of(store)
    catalog.write([], ["t4"])
    assert catalog.version() == before[3] + 1 and len(store) == 4
    store.upsert(["t0"], unit(rng, 1, 8), ["ns"])
    fresh = make_store(store_spec, 8)
    fresh.upsert(["z"], unit(rng, 1, 8), [None])
    assert sorted(catalog.hashes()) == ["z"] and catalog.changes_since(catalog.version() - 1)[1] is None
    import psycopg

    with psycopg.connect(pg, autocommit=True) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE %s AND relkind = 'r'",
                              [store.table + "\\_t%"]).fetchone()[0]
    assert tables == 1  # the live partition only


def test_a_statement_that_fails_on_its_own_is_not_taken_for_a_database_that_is_down(pg):
    """A statement timeout is the statement's: retrying will not help, so it is not Unavailable (503); a lock
    not granted (as a deadlock) is worth retrying, and is."""
    import psycopg

    from toolscout.errors import Unavailable
    from toolscout.store.pgvector import PgDatabase, PgSpec

    parsed = PgSpec.parse(spec(pg, new_table()))
    database = PgDatabase(parsed.dsn, parsed.table, dim=8)
    try:
        with pytest.raises(psycopg.errors.QueryCanceled) as raised:
            with database.connection() as conn, conn.transaction():
                conn.execute("SET LOCAL statement_timeout = 1")
                conn.execute("SELECT pg_sleep(1)")
        assert not isinstance(raised.value, Unavailable)
        with database.connection() as conn:  # the connection went back to the pool fit for use
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # a lock not granted in time (like a deadlock or a serialization failure) may be granted next time
        with psycopg.connect(parsed.dsn, autocommit=True) as holder, holder.transaction():
            holder.execute(f"LOCK TABLE {parsed.table} IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(Unavailable, match="rolled the request back .*; retry it"):
                with database.connection() as conn, conn.transaction():
                    conn.execute("SET LOCAL lock_timeout = '50ms'")
                    conn.execute(f"SELECT count(*) FROM {parsed.table}")
    finally:
        database.close()


def test_work_the_database_leaves_unanswered_past_the_answer_timeout_is_cut_and_the_pool_recovers(pg):
    """libpq waits for an answer with no bound: a request on a database that stopped answering hung for good.
    Bounded work past `timeout` has its connection cut (Unavailable, a 503 naming the database and the spec's
    setting); work that grows with the data (`bounded=False`) is left to finish; the pool then serves again."""
    from toolscout.errors import Unavailable
    from toolscout.store.pgvector import PgDatabase, PgSpec

    parsed = PgSpec.parse(spec(pg, new_table()))
    database = PgDatabase(parsed.dsn, parsed.table, dim=8, timeout=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(Unavailable, match=r"did not answer within 1 s \(answer_timeout in the store spec\)"):
            with database.connection() as conn:
                conn.execute("SELECT pg_sleep(60)")
        assert time.monotonic() - started < 20  # cut at 1 s; the statement alone would take 60
        with database.connection(bounded=False) as conn:
            assert conn.execute("SELECT pg_sleep(1.5), 7").fetchone()[1] == 7
        with database.connection() as conn:  # the cut connection was replaced
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        database.close()


def test_the_first_requests_after_a_restart_nobody_saw_are_served_at_once_however_many_connections_it_closed(
        tmp_path):
    """A pool grown to 8 connections, all closed by a database restart while no request came: psycopg_pool
    checked them one by one as requests took them, 1 s, then 2 s, ... apart, so the first request spent its
    5 s on four dead ones and was a 503, and so was the next (30 s of them with 30 connections). The first
    dead one now has them all replaced: every request is served as soon as the database is back."""
    import contextlib

    from toolscout.store.pgvector import PgDatabase

    data = tmp_path / "pgdata"
    database = PgDatabase(own_server_uri(data), new_table(), dim=8, pool_size=8)
    try:
        with contextlib.ExitStack() as held:  # eight requests at once: the pool grows to eight connections
            conns = [held.enter_context(database.connection()) for _ in range(8)]
            opened = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
            assert conns[0].execute(opened).fetchone() == (8,)
        pg_ctl(data, "stop")
        pg_ctl(data, "start")
        for _ in range(3):
            started = time.monotonic()
            with database.connection() as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
            assert time.monotonic() - started < 1  # a new connection on a local socket: milliseconds
    finally:
        database.close()
        pg_ctl(data, "stop")


def test_a_request_the_database_is_down_for_is_told_why_the_pool_cannot_connect(tmp_path):
    """A request that got no connection was told "it does not answer, or every connection is busy" even
    when the pool's attempts to connect failed for a reason psycopg gave (and the log had): it is given."""
    import contextlib

    from toolscout.errors import Unavailable
    from toolscout.store.pgvector import PgDatabase

    data = tmp_path / "pgdata"
    database = PgDatabase(own_server_uri(data), new_table(), dim=8, timeout=1.0)
    try:
        with database.connection() as conn:
            conn.execute("SELECT 1")
        pg_ctl(data, "stop")
        with pytest.raises(Unavailable) as down, database.connection() as conn:
            conn.execute("SELECT 1")
        # a server that stopped took its socket file away: what libpq says of it, on one line
        said = str(down.value)
        assert "within 1 s: it does not answer (" in said and "No such file or directory" in said, said
        assert "every connection is busy" not in said and "\n" not in said, said
    finally:
        database.close()
        with contextlib.suppress(AssertionError):  # stopped already, unless the test failed before
            pg_ctl(data, "stop")


def test_a_request_waits_for_a_lock_another_session_holds_only_as_long_as_for_a_connection(pg):
    """An operator's LOCK TABLE (or a migration) held every request until it was released: each pooled
    connection bounds its waits for a lock (`lock_wait`, the pool's wait by default), and a request that
    runs out is Unavailable, a 503 saying to retry."""
    import threading

    import psycopg

    from toolscout.errors import Unavailable
    from toolscout.store.pgvector import PgDatabase, PgSpec

    parsed = PgSpec.parse(spec(pg, new_table()))
    database = PgDatabase(parsed.dsn, parsed.table, dim=8, lock_wait=0.2)
    outcome: list[BaseException | None] = []

    def count() -> None:
        try:
            with database.connection() as conn:
                conn.execute(f"SELECT count(*) FROM {parsed.table}")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001  (what the request met is the test's answer)
            outcome.append(exc)

    try:
        count()  # opens the database: its table is made
        assert outcome.pop() is None
        with psycopg.connect(parsed.dsn, autocommit=True) as holder, holder.transaction():
            holder.execute(f"LOCK TABLE {parsed.table} IN ACCESS EXCLUSIVE MODE")
            request = threading.Thread(target=count, daemon=True)
            request.start()
            request.join(30)  # the lock is held for as long as this waits: a request bound by nothing hangs
            assert not request.is_alive(), "the request waited on the lock with no bound"
        assert isinstance(outcome[0], Unavailable) and "retry it" in str(outcome[0]), outcome
    finally:
        database.close()
