"""The PostgreSQL store under the pipeline, the CLI and the servers: top-10 parity with the local index,
`toolscout index/search/migrate --store`, tenant isolation over HTTP, and two server processes on one DSN
seeing each other's writes at once."""

import contextlib
import json
import logging
import threading
import time

import numpy as np
import pytest
from pgtest import assert_same_ranking, new_table, own_server_uri, pg_ctl, postgres_uri, signal_server, spec
from servers import start_server
from traffic import RAIN, RAIN_TASK, events, mixed

from toolscout import ToolScout
from toolscout.tool import Tool

pytestmark = pytest.mark.slow  # starts PostgreSQL and servers

QUERIES = ["what is the weather tomorrow in Paris", "book me a flight to Rome", "send an email to my boss",
           "how much is 100 dollars in euros", "schedule a meeting with Ann on Monday", "open the notes file"]


@pytest.fixture(scope="session")
def pg():
    return postgres_uri()


def exact_store(store_spec):
    from toolscout.store.pgvector import PgVectorStore

    return PgVectorStore.from_spec(store_spec, exact=True)


def pg_catalog(store_spec):
    from toolscout.store.pg_catalog import PgCatalog

    return PgCatalog.from_spec(store_spec)


def test_a_local_index_migrated_to_postgres_gives_identical_top10(pg, tmp_path, tools, encoder):
    from toolscout.postgres import migrate_directory

    local = ToolScout.from_tools(tools, retriever="dense", encoder=encoder)
    local.save(tmp_path / "local")
    store_spec = spec(pg, new_table())
    report = migrate_directory(tmp_path / "local", store_spec)
    assert (report.tools, report.embedded) == (len(tools), 0)  # vectors copied, nothing re-embedded
    store = exact_store(store_spec)
    vectors = encoder.encode_queries(QUERIES)
    expected = local.retrieve(QUERIES, 10)
    got = store.search(vectors, 10)
    assert got.as_lists() == expected.as_lists()
    for a, b in zip(got.scores, expected.scores):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # the same content hashes: later edits re-embed the same
    assert pg_catalog(store_spec).hashes() == local.retriever.hashes
    # the same after the same edits on both sides: one tool changed, one removed, one added
    edited = Tool("mail.send", "send_email", "Send a text message (SMS) to a phone number.", namespace="mail")
    added = Tool("notes.open", "open_note", "Open a note from the notes file.", namespace="files")
    local.add([edited, added])
    local.remove(["files.read"])
    from toolscout.serve import ToolService

    with ToolService.open(store_spec, encoder=encoder, batch_workers=0) as service:
        service.upsert([edited, added])
        service.delete(["files.read"])
    assert store.search(vectors, 10).as_lists() == local.retrieve(QUERIES, 10).as_lists()


def test_index_catalog_records_the_summary_weight_and_refuses_to_mix_weights(pg, tools, encoder):
    from toolscout.postgres import index_catalog
    from toolscout.retrievers.dense import SUMMARY_WEIGHT, summary_view
    from toolscout.store.pg_config import IndexConfig
    from toolscout.store.pgvector import PgStoreError, PgVectorStore
    from toolscout.tool import TextView, tool_text

    store_spec = spec(pg, new_table())
    store = PgVectorStore.from_spec(store_spec, encoder.dim)
    try:
        index_catalog(store, tools, encoder)
        assert IndexConfig.from_dict(store.database.config()).summary_weight == SUMMARY_WEIGHT
        full, summary = (encoder.encode([tool_text(tools[0], view)]) for view in (None, summary_view(TextView())))
        q = encoder.encode_queries([QUERIES[0]])
        found = exact_store(store_spec).search(q, len(tools))
        scores = dict(zip(found.ids[0], found.scores[0]))
        blended = (full + SUMMARY_WEIGHT * summary) / (1 + SUMMARY_WEIGHT)
        assert scores[tools[0].id] == pytest.approx(float(blended[0] @ q[0]), abs=1e-4)
        with pytest.raises(PgStoreError, match="summary weight"):
            index_catalog(store, tools, encoder, summary_weight=0.0)  # vectors of another kind: refused
    finally:
        store.close()
    # a table written before the summary existed reads as weight 0, and re-indexing it keeps its weight
    assert IndexConfig.from_dict({"model": "m", "view": {}}).summary_weight == 0.0
    older = PgVectorStore.from_spec(spec(pg, new_table()), encoder.dim)
    try:
        assert index_catalog(older, tools, encoder, summary_weight=0.0).summary_weight == 0.0
        report = index_catalog(older, tools, encoder)  # no weight given: the table's, not the default
        assert (report.summary_weight, report.embedded) == (0.0, 0)
    finally:
        older.close()


def test_cli_index_search_and_migrate_with_a_postgres_store(pg, tmp_path, tools, encoder, capsys):
    from toolscout.cli import main

    catalog = tmp_path / "tools.json"
    catalog.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description,
                                                                     "parameters": t.parameters}} for t in tools]))
    from toolscout.store.pgvector import PgSpec

    table = new_table()
    store_spec = spec(pg, table, "team-a")
    assert main(["index", str(catalog), "--out", str(tmp_path / "idx"), "--store", store_spec]) == 0
    assert f"indexed {len(tools)} tools ({len(tools)} embedded) into" in capsys.readouterr().err  # no "rest"
    assert main(["index", str(catalog), "--out", str(tmp_path / "local")]) == 0
    capsys.readouterr()
    config = json.loads(next((tmp_path / "idx").glob("v*/config.json")).read_text())
    recorded = PgSpec.parse(config["postgres"])  # recorded without the password
    assert ":@" not in config["postgres"] and (recorded.tenant, recorded.table) == ("team-a", table)
    found = []
    for folder in ("idx", "local"):
        assert main(["search", str(tmp_path / folder), QUERIES[1], "-k", "3", "--json"]) == 0
        found.append([h["id"] for h in json.loads(capsys.readouterr().out)["hits"]])
    assert found[0] == found[1] and len(found[0]) == 3
    # `toolscout serve DIR` on that directory serves the database (not the snapshot beside it)
    from toolscout.cli import build_parser
    from toolscout.cli.serve import _open_service
    from toolscout.serve.auth import AuthConfig

    service = _open_service(build_parser().parse_args(["serve", str(tmp_path / "idx")]), AuthConfig())
    assert service.storage.kind == "postgresql" and "tenant=team-a" in service.describe()
    assert len(service) == len(tools)
    service.close()
    # re-indexing an unchanged catalog embeds nothing; the table's search mode can be switched
    assert main(["index", str(catalog), "--out", str(tmp_path / "idx"), "--store", store_spec]) == 0
    assert f"indexed {len(tools)} tools ({len(tools)} unchanged) into" in capsys.readouterr().err
    # a smaller catalog, one text edited: what was embedded, kept and removed, each said
    smaller = [{"type": "function", "function": {"name": t.name, "parameters": t.parameters,
                                                  "description": t.description + (" Fast." if i == 0 else "")}}
               for i, t in enumerate(tools[:-2])]
    (tmp_path / "smaller.json").write_text(json.dumps(smaller))
    assert main(["index", str(tmp_path / "smaller.json"), "--out", str(tmp_path / "idx"), "--store", store_spec]) == 0
    assert f"indexed {len(tools) - 2} tools (1 embedded, {len(tools) - 3} unchanged, 2 removed) into" in \
        capsys.readouterr().err
    assert main(["migrate", "--store", store_spec, "--search", "dense"]) == 0
    # the default index search (hybrid) no longer matches the table's: refused, naming what differs
    assert main(["index", str(catalog), "--out", str(tmp_path / "idx"), "--store", store_spec]) == 1
    assert "serves every tenant with another pipeline" in (err := capsys.readouterr().err)
    assert "retriever.name: 'dense' there, 'hybrid' here" in err and "migrate --store DSN --search" in err


def test_cli_index_into_postgres_draws_a_progress_bar_as_into_a_directory(pg, tmp_path, tools, encoder, capsys,
                                                                           monkeypatch):
    """--quiet draws none; without it, a catalog of at least PROGRESS_FROM tools draws one (here: the threshold
    lowered to the test catalog's size), as `index` into a directory does."""
    from toolscout import encoders
    from toolscout.cli import main

    catalog = tmp_path / "tools.json"
    catalog.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description}}
                                   for t in tools]))
    store_spec = spec(pg, new_table())
    monkeypatch.setattr(encoders, "PROGRESS_FROM", len(tools))
    assert main(["index", str(catalog), "--out", str(tmp_path / "idx"), "--store", store_spec, "--quiet"]) == 0
    assert "encoding:" not in capsys.readouterr().err
    catalog.write_text(json.dumps([{"type": "function", "function": {"name": t.name,
                                                                     "description": t.description + "."}}
                                   for t in tools]))  # changed texts: all embedded again
    assert main(["index", str(catalog), "--out", str(tmp_path / "idx"), "--store", store_spec]) == 0
    assert "encoding:" in capsys.readouterr().err


def test_cli_learns_and_reports_on_a_postgres_store_and_a_migration_counts_what_it_left(pg, tmp_path, tools, encoder,
                                                                                       capsys):
    """`toolscout learn --store DSN LOG` (docs/postgres.md: a directory's feedback reaches the database so),
    `toolscout learning report DSN`, and `migrate` of a directory that learned, which says how many events
    stayed behind."""
    from toolscout.cli import main

    catalog = tmp_path / "tools.json"
    catalog.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description,
                                                                     "parameters": t.parameters}} for t in tools]))
    log = tmp_path / "feedback.jsonl"
    log.write_text("".join(json.dumps({"query": q, "tool_ids": [t.name]}) + "\n"
                           for q, t in (("book me a flight to Rome", tools[0]), ("what is the weather", tools[1]))))
    store_spec = spec(pg, new_table(), "team-a")
    assert main(["index", str(catalog), "--out", str(tmp_path / "idx"), "--store", store_spec]) == 0
    capsys.readouterr()
    assert main(["learn", "--store", store_spec, str(log)]) == 0  # the log is not taken for a directory
    assert "2 events: 2 (tool, request) pairs learned" in capsys.readouterr().err
    assert main(["learning", "report", store_spec, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["events_scored"] == 2


def test_a_migrated_directory_brings_what_it_learned_with_its_sources_and_times(pg, tmp_path, tools, encoder,
                                                                               capsys):
    """`toolscout migrate DIR --store DSN` left a directory's learning behind, advising an import of logs a gateway
    never writes (trial 11). It teaches the tenant each (tool, source, request) the directory learned, with its
    source and time: the tenant's learning report is the directory's, and `learn --forget` and `learning
    rollback` take back in the database what they take back in the directory."""
    from toolscout.cli import main

    catalog = tmp_path / "tools.json"
    catalog.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description,
                                                                     "parameters": t.parameters}} for t in tools]))
    by_name = {t.name: t for t in tools}
    taught = [("alice", 1000, "plan a trip to Rome", "book_flight"),
              ("alice", 1500, "tell my boss about the trip", "send_email"),
              ("bob", 2000, "is it going to rain", "get_forecast"),
              ("bob", 2500, "how much is my money worth in yen", "convert_currency"),
              ("bob", 3000, "put the team lunch in my diary", "create_event"),
              ("carol", 4000, "show me what is in the notes", "read_file")]
    log = tmp_path / "feedback.jsonl"
    log.write_text("".join(json.dumps({"query": q, "tool_ids": [by_name[t].name], "source": who, "time": when})
                           + "\n" for who, when, q, t in taught))
    local, store_spec = str(tmp_path / "local"), spec(pg, new_table(), "team-b")
    assert main(["index", str(catalog), "--out", local]) == 0
    assert main(["learn", local, str(log)]) == 0
    assert main(["learning", "weight", local, "*", "0.5"]) == 0  # an operator's setting goes with it
    capsys.readouterr()
    assert main(["migrate", local, "--store", store_spec]) == 0
    err = capsys.readouterr().err
    assert "6 (tool, request) pairs from 6 feedback events, with their sources and times" in err, err
    assert "6 events: 6 (tool, request) pairs learned" in err and "not copied" not in err

    def report(target):
        assert main(["learning", "report", target, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    learned = report(local)
    assert (learned["requests"], learned["tools_taught"], learned["events_scored"]) == (6, 6, 6)
    assert learned["weights"] == {"": {"weight": 0.5, "how": "set"}}, learned["weights"]
    assert report(store_spec) == learned  # the same pairs, scored at the same ranks, in the same order
    for verb, left in ((["learn", "--forget", "alice"], 4), (["learning", "rollback", "--before", "2800"], 2)):
        for target in (local, store_spec):  # the same taking back in both
            at = ["--store", target] if verb[0] == "learn" and target == store_spec else [target]
            assert main([*verb[:-2], *at, *verb[-2:]] if verb[0] == "learning" else [verb[0], *at, *verb[1:]]) == 0
        capsys.readouterr()
        assert report(local)["requests"] == report(store_spec)["requests"] == left, verb


def test_migrate_brings_the_writes_a_journal_held_and_waits_for_a_server_holding_the_directory(pg, tmp_path, tools,
                                                                                                capsys):
    """migrate copied the snapshot alone: a tool and feedback acknowledged by a server stopped without saving (only
    in the journal) were left behind (reviewer, session 19). They are saved into the snapshot first, as a server's
    start would; a directory a server holds is refused, since its journal is live."""
    from toolscout import Tool
    from toolscout.cli import main
    from toolscout.feedback import FeedbackEvent
    from toolscout.serve import ToolService

    catalog = tmp_path / "tools.json"
    catalog.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description}}
                                   for t in tools]))
    local, store_spec = str(tmp_path / "local"), spec(pg, new_table(), "journalled")
    assert main(["index", str(catalog), "--out", local]) == 0
    service = ToolService.open(local)
    service.upsert([Tool(id="water_plants", name="water_plants", description="water the garden plants on a schedule")])
    service.feedback([FeedbackEvent("book me a flight to Rome", (tools[3].name,), source="alice")])
    assert main(["migrate", local, "--store", store_spec]) == 1  # the server still holds it
    assert "another toolscout server is serving this directory" in capsys.readouterr().err
    service.close(compact=False)  # stopped without saving: the tool and the event are only in the journal
    assert main(["migrate", local, "--store", store_spec]) == 0
    err = capsys.readouterr().err
    assert "saved the 2 write(s) its journal held" in err and "1 (tool, request) pairs from 1 feedback" in err, err
    with ToolService.open(store_spec) as tenant:
        assert tenant.get("water_plants").description == "water the garden plants on a schedule"
        assert tenant.learning()["requests"] == 1
    with ToolService.open(local):  # a server whose journal holds nothing yet: its next write would be lost too
        assert main(["migrate", local, "--store", store_spec]) == 1
        assert "another toolscout server is serving this directory" in capsys.readouterr().err


def test_migrating_a_frozen_directory_says_what_its_freeze_held_back_and_how_to_hold_it_in_the_tenant(
        pg, tmp_path, tools, capsys):
    """A freeze cannot be dated back through the service: what it held back in the directory is learned by the
    tenant, and the migration says so, with the commands that freeze the tenant or take those pairs back."""
    from toolscout.cli import main

    catalog = tmp_path / "tools.json"
    catalog.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description}}
                                   for t in tools]))
    local, store_spec = str(tmp_path / "local"), spec(pg, new_table(), "frozen")
    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    before.write_text(json.dumps({"query": "book me a flight to Rome", "tool_ids": [tools[3].name], "time": 1000}))
    after.write_text(json.dumps({"query": "what is the weather", "tool_ids": [tools[1].name]}))  # dated now
    assert main(["index", str(catalog), "--out", local]) == 0
    assert main(["learn", local, str(before)]) == 0
    assert main(["learning", "freeze", local]) == 0
    assert main(["learn", local, str(after)]) == 0  # held back by the freeze
    capsys.readouterr()
    assert main(["migrate", local, "--store", store_spec]) == 0
    err = capsys.readouterr().err
    assert f"warning: learning in {local} is frozen (since " in err
    assert "the tenant's is not: the 1 pair(s) the freeze held back are learned there" in err
    assert "toolscout learning freeze DSN" in err and "toolscout learning rollback DSN --before " in err, err
    frozen_at = ToolScout.load(local).learning.settings.frozen_at
    assert f"--before {frozen_at!r}" in err and frozen_at != round(frozen_at)  # to the fraction, not rounded


def test_a_tenant_with_no_catalog_is_refused_by_learning_and_approvals_and_warned_of_by_serve(pg, tmp_path, tools,
                                                                                               encoder, capsys):
    """A mistyped ?tenant= read as an empty deployment: reports of zeros, "nothing waits", and a freeze that made
    the typo a tenant. Now those commands refuse it, naming the table's tenants, and create nothing; serve warns;
    `index` still makes a new tenant."""
    import psycopg

    from toolscout.cli import build_parser, main
    from toolscout.cli.serve import _open_service
    from toolscout.errors import NotFound
    from toolscout.serve.auth import AuthConfig
    from toolscout.store.pg_schema import partition_name

    catalog = tmp_path / "tools.json"
    catalog.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description}}
                                   for t in tools]))
    table = new_table()
    assert main(["index", str(catalog), "--out", str(tmp_path / "idx"), "--store", spec(pg, table, "team-a")]) == 0
    with psycopg.connect(pg, autocommit=True) as conn:  # what an older toolscout's freeze of a typo left: no catalog
        conn.execute("INSERT INTO toolscout_versions (tbl, tenant, version) VALUES (%s, 'team-old', 1)", [table])
    typo = spec(pg, table, "team-aa")
    capsys.readouterr()
    for command in (["learning", "freeze", typo], ["learning", "weight", typo, "*", "0.5"],
                    ["learning", "report", typo], ["learning", "rollback", typo, "--before", "0"],
                    ["learn", "--store", typo, "--forget", "x"],
                    ["gateway", "approve", "--store", typo, "--list"]):
        assert main(command) == 1, command
        err = capsys.readouterr().err
        assert (f"tenant 'team-aa' has no catalog in index table '{table}' (the table's tenants: 'team-a'), so "
                f"`toolscout {' '.join(command[:2]) if command[0] != 'learn' else 'learn'}` has nothing") in err, err
        assert "toolscout index CATALOG --out DIR --store" in err and "tenant=team-aa" in err
    with psycopg.connect(pg, autocommit=True) as conn:
        made = conn.execute("SELECT tenant FROM toolscout_versions WHERE tbl = %s ORDER BY tenant", [table]).fetchall()
    assert made == [("team-a",), ("team-old",)]  # nothing made for the typo
    service = _open_service(build_parser().parse_args(["serve", "--store", typo]), AuthConfig())
    with pytest.raises(NotFound, match="no tool with id 'search.web'"):  # a DELETE served for the typo
        service.delete(["search.web"])
    service.close()
    assert ("warning: tenant 'team-aa' has no catalog in index table "
            f"'{table}' (the table's tenants: 'team-a'): its searches find nothing") in capsys.readouterr().err
    with psycopg.connect(pg, autocommit=True) as conn:  # no partition made for it (with one, any later version
        # row, such as a feedback event's, would make the typo a catalog)
        assert conn.execute("SELECT to_regclass(%s)", [partition_name(table, "team-aa")]).fetchone()[0] is None
    # a new tenant is made by indexing a catalog into it, and is then a tenant like any other
    assert main(["index", str(catalog), "--out", str(tmp_path / "idx2"), "--store", typo]) == 0
    assert main(["learning", "freeze", typo]) == 0
    assert "learning is frozen" in capsys.readouterr().err


def test_tenants_are_isolated_on_every_http_path(pg, tmp_path, tools, encoder):
    from starlette.testclient import TestClient

    from toolscout.postgres import index_catalog
    from toolscout.serve import ToolService
    from toolscout.serve.auth import AuthConfig
    from toolscout.serve.http import create_app
    from toolscout.store.pgvector import PgVectorStore

    table = new_table()
    store_a = PgVectorStore.from_spec(spec(pg, table, "a"), encoder.dim)
    index_catalog(store_a, tools, encoder)
    secret = Tool("vault.open", "open_vault", "Open the secret bank vault with the launch codes.", namespace="vault")
    b_tools = [Tool("mail.send", "send_email", "Tenant B's own mail sender.", namespace="mail"), secret]
    index_catalog(store_a.for_tenant("b"), b_tools, encoder)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"token": "token-of-a", "name": "a", "tenant": "a", "write": True},
        {"token": "token-of-b", "name": "b", "tenant": "b", "write": True}]}))
    service = ToolService.open(spec(pg, table, "a"), encoder=encoder)
    client = TestClient(create_app(service, AuthConfig.build(tokens_file=tokens, require_read_token=True)))
    A, B = ({"authorization": f"Bearer token-of-{t}"} for t in "ab")

    r = client.post("/search", json={"query": "open the secret bank vault", "k": 20}, headers=A).json()
    assert "vault.open" not in {h["id"] for h in r["results"][0]["hits"]}
    assert len(r["results"][0]["hits"]) == len(tools)
    r = client.post("/search", json={"query": "open_vault", "k": 3}, headers=A).json()  # a name in B only
    assert all(h["match"] != "name" for h in r["results"][0]["hits"])
    r = client.post("/search", json={"query": "open_vault", "k": 3}, headers=B).json()
    assert r["results"][0]["hits"][0]["id"] == "vault.open" and r["results"][0]["hits"][0]["match"] == "name"
    assert client.get("/tools/vault.open", headers=A).status_code == 404
    assert client.get("/tools/vault.open", headers=B).status_code == 200
    assert client.get("/tools/mail.send", headers=A).json()["description"] == tools[5].description
    assert client.get("/tools/mail.send", headers=B).json()["description"] == "Tenant B's own mail sender."
    assert client.get("/tools", headers=A).json()["total"] == len(tools)
    assert client.get("/tools", params={"namespace": "vault"}, headers=A).json() == {"total": 0, "offset": 0,
                                                                                      "tools": []}
    assert "vault" not in client.get("/namespaces", headers=A).json()["namespaces"]
    assert client.get("/namespaces", headers=B).json()["namespaces"] == {"mail": 1, "vault": 1}
    version_b = client.post("/search", json={"query": "x y", "k": 1}, headers=B).json()["version"]
    # writes: A creating an id B holds creates A's own; A cannot delete B's tool; B's version is untouched
    r = client.put("/tools/vault.open", json={"name": "open_vault", "description": "A's vault."}, headers=A)
    assert r.status_code == 200 and r.json()["created"] == ["vault.open"]
    assert client.delete("/tools/b-only", headers=A).status_code == 404
    assert client.get("/tools/vault.open", headers=B).json()["description"] == secret.description
    assert client.delete("/tools/vault.open", headers=A).status_code == 200
    assert client.get("/tools/vault.open", headers=B).status_code == 200
    assert client.post("/search", json={"query": "x y", "k": 1}, headers=B).json()["version"] == version_b
    assert client.post("/search", json={"query": "x"}).status_code == 401
    service.close()


# ------------------------------------------------------------------------------ two server processes

TOKEN = "pg-replica-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def start_servers(store_spec, n):
    return [start_server(["--store", store_spec], token=TOKEN) for _ in range(n)]


def listen(uri, received, ready, stop):
    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("LISTEN toolscout")
        ready.set()
        while not stop.is_set():
            received.extend(json.loads(note.payload) for note in conn.notifies(timeout=0.2))


def test_two_servers_on_one_dsn_see_each_others_writes_at_once(pg, tools, encoder):
    import httpx

    from toolscout.postgres import index_catalog
    from toolscout.store.pgvector import PgVectorStore

    store_spec = spec(pg, new_table())
    index_catalog(PgVectorStore.from_spec(store_spec, encoder.dim), tools, encoder)
    received, ready, stop = [], threading.Event(), threading.Event()
    listener = threading.Thread(target=listen, args=(pg, received, ready, stop), daemon=True)
    listener.start()
    ready.wait(10)
    servers = start_servers(store_spec, 2)
    (_p1, one), (_p2, two) = servers
    try:
        with httpx.Client(timeout=30, headers=AUTH) as http:
            kite = {"name": "fly_kite", "namespace": "fun", "description": "Fly a kite in the park on a windy day."}
            w1 = http.put(f"{one}/tools/fun.kite", json=kite).json()
            # no waiting: the next request to the other server sees the committed write
            assert http.get(f"{two}/tools/fun.kite").json()["description"] == kite["description"]
            hits = http.post(f"{two}/search", json={"query": "fly_kite", "k": 3}).json()["results"][0]["hits"]
            assert (hits[0]["id"], hits[0]["match"]) == ("fun.kite", "name")  # its name index caught up too
            hits = http.post(f"{two}/search", json={"query": "go kiting when it is windy",
                                                    "k": 1}).json()["results"][0]["hits"]
            assert hits[0]["id"] == "fun.kite"
            # an update through the second, a delete through the first
            kite["description"] = "Launch a kite on the beach."
            w2 = http.put(f"{two}/tools/fun.kite", json=kite).json()
            assert w2["updated"] == ["fun.kite"] and w2["version"] == w1["version"] + 1
            assert http.get(f"{one}/tools/fun.kite").json()["description"] == "Launch a kite on the beach."
            w3 = http.delete(f"{one}/tools/fun.kite").json()
            assert http.get(f"{two}/tools/fun.kite").status_code == 404
            hits = http.post(f"{two}/search", json={"query": "fly_kite", "k": 3}).json()["results"][0]["hits"]
            assert "fun.kite" not in {h["id"] for h in hits}
            # concurrent writers on both servers: every write lands once, with its own version
            def write(url, i):
                return http.put(f"{url}/tools/fun.t{i}", json={"name": f"t{i}", "namespace": "fun",
                                                               "description": f"Tool number {i}."}).json()["version"]
            results = []
            threads = [threading.Thread(target=lambda u=u, i=i: results.append(write(u, i)))
                       for i, u in enumerate([one, two] * 4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(results) == list(range(w3["version"] + 1, w3["version"] + 9))
            for url in (one, two):
                assert http.get(f"{url}/tools", params={"namespace": "fun"}).json()["total"] == 8
        deadline = time.time() + 10
        while len(received) < 11 and time.time() < deadline:
            time.sleep(0.05)
        stop.set()
        versions = [n["version"] for n in received if n["table"] == store_spec.split("table=")[1]]
        assert versions[:3] == [w1["version"], w2["version"], w3["version"]]
    finally:
        for proc, _url in servers:
            proc.terminate()
        for proc, _url in servers:
            proc.wait(timeout=30)


def test_the_python_pipeline_runs_on_a_postgres_store(pg, tmp_path, tools, encoder):
    store_spec = spec(pg, new_table())
    local = ToolScout.from_tools(tools, retriever="dense", encoder=encoder)
    scout = ToolScout.from_tools(tools, retriever="dense", encoder=encoder, store=store_spec)
    assert scout.retrieve(QUERIES, 5).as_lists() == local.retrieve(QUERIES, 5).as_lists()
    scout.remove(["files.read"])
    local.remove(["files.read"])
    assert scout.retrieve(QUERIES, 5).as_lists() == local.retrieve(QUERIES, 5).as_lists()
    scout.save(tmp_path / "idx")
    again = ToolScout.load(tmp_path / "idx")  # reconnects from the saved config
    assert again.retrieve(QUERIES, 5).as_lists() == local.retrieve(QUERIES, 5).as_lists()
    # a second pipeline indexed into the same tenant replaces the catalog the first one wrote
    ToolScout.from_tools(tools[:3], retriever="dense", encoder=encoder, store=store_spec)
    assert sorted(pg_catalog(store_spec).hashes()) == sorted(t.id for t in tools[:3])


def test_a_replica_name_cache_is_never_staler_than_its_bound(pg, tools, encoder):
    from toolscout.postgres import index_catalog
    from toolscout.serve import ToolService
    from toolscout.store.pgvector import PgVectorStore

    store_spec = spec(pg, new_table())
    index_catalog(PgVectorStore.from_spec(store_spec, encoder.dim), tools, encoder)
    writer = ToolService.open(store_spec, encoder=encoder, batch_workers=0)
    reader = ToolService.open(store_spec, encoder=encoder, batch_workers=0, max_stale_s=0.3)
    assert not reader.name_is_shared("send_email")
    writer.upsert([Tool("mail2.send", "send_email", "Send an email from the second account.", namespace="mail2")])
    # a search reads the catalog version with its ranking and catches the name index up first: no delay
    hits = reader.search("send_email", 3, min_score=None)
    assert {h.tool.id for h in hits if h.match == "name"} == {"mail.send", "mail2.send"}
    writer.delete(["mail2.send"])
    time.sleep(0.35)  # without a search in between, name_is_shared re-checks once its index is 0.3 s old
    assert not reader.name_is_shared("send_email")
    writer.upsert([Tool("mail3.send", "send_email", "Send an email from a third account.", namespace="mail3")])
    time.sleep(0.35)
    assert reader.name_is_shared("send_email")
    writer.close()
    reader.close()


def test_feedback_through_one_replica_changes_the_others_rankings_at_once(pg, tools, encoder):
    """Staleness bound: none. Each replica reads the change log before it searches, so feedback committed
    through one is in the other's very next ranking."""
    from toolscout.postgres import index_catalog
    from toolscout.serve import ToolService
    from toolscout.store.pgvector import PgVectorStore

    store_spec = spec(pg, new_table())
    index_catalog(PgVectorStore.from_spec(store_spec, encoder.dim), tools, encoder)
    one = ToolService.open(store_spec, encoder=encoder, batch_workers=0)
    two = ToolService.open(store_spec, encoder=encoder, batch_workers=0)
    try:
        before = [(h.tool.id, h.score) for h in two.search(RAIN_TASK, 5, min_score=None)]
        assert before[0][0] != "hotels.book"
        result = one.feedback(mixed({"rain": "hotels.book", "mail": "mail.send", "calendar": "calendar.create",
                                     "files": "files.read", "facts": "calendar.list"}, 12))
        assert len(result.learned) == 60
        assert two.search(RAIN_TASK, 1, min_score=None)[0].tool.id == "hotels.book"  # the very next search
        assert two.feedback_of("hotels.book") == {"learned": 12, "sources": 1, "reported": 12}
        assert two.learning()["measured"]["namespaces"]["travel"]["all"]["events"] == 12  # scored before learning
        two.forget("default")  # taken back through the other replica: exactly as before
        assert [(h.tool.id, h.score) for h in one.search(RAIN_TASK, 5, min_score=None)] == before
    finally:
        one.close()
        two.close()


def test_indexing_a_catalog_again_keeps_the_feedback_counts_of_the_tools_it_keeps(pg, tools, encoder):
    """`toolscout index --store` into a tenant that has a catalog replaces it whole (a new partition): a tool it
    keeps, changed or not, keeps the count of events that named it (`reported`, failures too) as it keeps the
    requests they taught (it was reset to 0 while those stayed); a tool it leaves out goes with its feedback,
    and comes back with none. A single-tool upsert keeps the count too."""
    from toolscout.postgres import index_catalog
    from toolscout.serve import ToolService
    from toolscout.store.pgvector import PgVectorStore

    store_spec = spec(pg, new_table())
    store = PgVectorStore.from_spec(store_spec, encoder.dim)
    index_catalog(store, tools, encoder)
    service = ToolService.open(store_spec, encoder=encoder, batch_workers=0)
    try:
        service.feedback([{"query": "send an email to my boss", "tool_ids": ["mail.send"]},
                          {"query": "mail the team the notes file", "tool_ids": ["mail.send", "files.read"]},
                          {"query": "email the landlord", "tool_ids": ["mail.send"], "outcome": "failure"},
                          {"query": "tomorrow's weather in Oslo", "tool_ids": ["weather.get_forecast"]}])
        counted = {"mail.send": {"learned": 2, "sources": 1, "reported": 3},
                   "weather.get_forecast": {"learned": 1, "sources": 1, "reported": 1}}
        assert {tid: service.feedback_of(tid) for tid in counted} == counted
        assert service.learned_of(["mail.send", "files.read", "weather.get_forecast", "no.such_tool"]) == {
            "mail.send": 2, "files.read": 1, "weather.get_forecast": 1, "no.such_tool": 0}  # one query for all
        edited = Tool("mail.send", "send_email", "Send an email, with attachments, to recipients.", namespace="mail")
        kept = [edited if t.id == "mail.send" else t for t in tools if t.id != "files.read"]
        assert index_catalog(store, kept, encoder).embedded == 1  # the edited tool alone
        assert {tid: service.feedback_of(tid) for tid in counted} == counted
        index_catalog(store, tools, encoder)  # files.read back: a new tool, its feedback gone with it
        assert service.feedback_of("files.read") == {"learned": 0, "sources": 0, "reported": 0}
        assert service.feedback_of("weather.get_forecast") == counted["weather.get_forecast"]
        service.upsert([edited])
        assert service.feedback_of("mail.send") == {"learned": 2, "sources": 1, "reported": 3}
    finally:
        service.close()
        store.close()


def _openai_catalog(path, tools):
    path.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description,
                                                                  "parameters": t.parameters}} for t in tools]))
    return str(path)


def test_a_replace_that_leaves_tools_out_says_what_went_with_them(pg, tmp_path, tools, encoder, capsys):
    """Re-indexing a tenant (`index CATALOG --store`) or migrating a directory into it with a catalog that
    leaves tools out removes them and what feedback taught them: both say how many tools went and, in the
    words a directory's re-index uses, how many taught (tool, request) pairs were kept and dropped."""
    from toolscout.cli import main
    from toolscout.store.pgvector import PgSpec

    store_spec = spec(pg, new_table(), "team-a")
    taught = {0: ["weather for the weekend in Lyon", "will it be sunny on Sunday", "forecast for Oslo"],
              1: ["how warm is it outside right now", "is it windy now"],
              2: ["find me a way to get to Lisbon"],
              5: ["write to my landlord", "tell Ann that I am late", "mail the report to Bob"]}  # tools[i]: 9 pairs
    log = tmp_path / "feedback.jsonl"
    log.write_text("".join(json.dumps({"query": q, "tool_ids": [tools[i].name]}) + "\n"
                           for i, queries in taught.items() for q in queries))
    out = ["--out", str(tmp_path / "idx"), "--store", store_spec]
    assert main(["index", _openai_catalog(tmp_path / "all.json", tools), *out]) == 0
    assert main(["learn", "--store", store_spec, str(log)]) == 0
    assert "9 (tool, request) pairs learned" in capsys.readouterr().err
    assert main(["index", _openai_catalog(tmp_path / "fewer.json", tools[2:]), *out]) == 0
    err = capsys.readouterr().err
    assert "removed 2 tools of tenant 'team-a' that the new catalog leaves out, with their feedback" in err
    assert (f"kept what {PgSpec.parse(store_spec)} learned from feedback: 4 (tool, request) pairs; dropped 5 whose "
            "tool is no longer in the catalog") in err
    assert main(["index", _openai_catalog(tmp_path / "local.json", tools[3:]), "--out", str(tmp_path / "local")]) == 0
    assert main(["migrate", str(tmp_path / "local"), "--store", store_spec]) == 0
    err = capsys.readouterr().err
    assert "removed 1 tool of tenant 'team-a'" in err and "feedback: 3 (tool, request) pairs; dropped 1 whose" in err
    assert main(["index", _openai_catalog(tmp_path / "same.json", tools[3:]), *out]) == 0
    assert "removed" not in (err := capsys.readouterr().err) and "kept what" in err  # nothing left out this time


def test_health_says_when_a_running_replica_must_restart_to_serve_its_tables_new_pipeline(pg, tools, encoder,
                                                                                        caplog):
    """`toolscout migrate --store DSN --search dense` switches the pipeline of the table's servers as they start;
    one already running goes on ranking with the pipeline it built. Its /health says so (`restart_needed`, naming
    both first stages, or the settings that differ; nothing did), and its log says so once for each change
    however often /health is read; a replica started after the switch serves the table's pipeline, and needs
    no restart."""
    from starlette.testclient import TestClient

    from toolscout.cli import main
    from toolscout.postgres import index_catalog
    from toolscout.serve import ToolService
    from toolscout.serve.http import create_app
    from toolscout.store.pgvector import PgVectorStore

    store_spec = spec(pg, new_table())
    store = PgVectorStore.from_spec(store_spec, encoder.dim)
    index_catalog(store, tools, encoder)  # the default pipeline: hybrid
    indexed = store.database.config()
    with ToolService.open(store_spec, encoder=encoder, batch_workers=0) as running:
        client = TestClient(create_app(running))
        health = client.get("/health").json()
        assert (health["retriever"], health["restart_needed"]) == ("hybrid", None)
        assert main(["migrate", "--store", store_spec, "--search", "dense"]) == 0
        for _probe in range(3):
            health = client.get("/health").json()
            assert health["retriever"] == "hybrid"  # what it still ranks with
            assert "pipeline than this replica started with (first stage 'dense' there, 'hybrid' here)" in \
                health["restart_needed"]
        told = [r.getMessage() for r in caplog.records if r.name == "toolscout.serve.pg_storage"]
        assert told == [health["restart_needed"]]
        with ToolService.open(store_spec, encoder=encoder, batch_workers=0) as started_after:
            stats = started_after.stats()
            assert (stats["retriever"], stats["restart_needed"]) == ("dense", None)
        store.database.set_config(indexed)  # back as it started: nothing to restart for
        assert client.get("/health").json()["restart_needed"] is None
        indexed["pipeline"]["retriever"]["settings"]["rrf_k"] += 1  # the same first stage, fused otherwise
        store.database.set_config(indexed)
        health = client.get("/health").json()
        assert health["restart_needed"].endswith("(settings that differ: retriever.settings.rrf_k): this replica "
                                                 "ranks with its own until it is restarted")
        told = [r.getMessage() for r in caplog.records if r.name == "toolscout.serve.pg_storage"]
        assert told[1:] == [health["restart_needed"]]
    store.close()


def test_migrate_search_says_what_it_changes_for_which_tenants_and_that_a_custom_hybrid_is_not_kept(pg, tmp_path,
                                                                                                     tools, capsys):
    """`migrate --store DSN --search dense|hybrid` switches the first stage of every tenant of the table: it
    says so, before -> after, naming the tenants; switching a custom hybrid to dense warns that its settings
    are not kept (back to hybrid is the default hybrid, which it says too), and a switch to what the table
    serves already changes nothing and says so."""
    from toolscout.cli import main
    from toolscout.store.pgvector import PgDatabase

    table = new_table()
    catalog = _openai_catalog(tmp_path / "tools.json", tools)
    for tenant in ("team-b", "team-a"):
        assert main(["index", catalog, "--out", str(tmp_path / tenant), "--store", spec(pg, table, tenant),
                     "-o", "weights=[2,1]", "-o", "fusion=rrf"]) == 0
    capsys.readouterr()
    custom = "hybrid of bm25 + dense (depth=100, fusion=rrf, rrf_k=60, weights=[2.0, 1.0])"
    default = "hybrid of bm25 + dense (depth=100, fusion=max, rrf_k=60, weights=[1.0, 3.0])"
    assert main(["migrate", "--store", spec(pg, table, "team-a"), "--search", "dense"]) == 0
    err = capsys.readouterr().err
    assert (f"first stage of index table {table!r}: {custom} -> dense, for every tenant of the table (2 tenants: "
            "team-a, team-b), served by each server that starts from now on") in err
    assert ("warning: the hybrid's settings are not kept: --search hybrid would switch to the default hybrid, which "
            "differs (fusion 'rrf' -> 'max', weights [2.0, 1.0] -> [1.0, 3.0]); no command changes") in err
    assert main(["migrate", "--store", spec(pg, table, "team-a"), "--search", "hybrid"]) == 0
    err = capsys.readouterr().err
    assert f"first stage of index table {table!r}: dense -> {default}, for every tenant" in err
    assert "note: this hybrid has the default settings" in err
    database = PgDatabase(pg, table)
    try:
        assert database.config()["pipeline"]["retriever"]["settings"] == {"depth": 100, "fusion": "max",
                                                                           "rrf_k": 60, "weights": [1.0, 3.0]}
    finally:
        database.close()
    assert main(["migrate", "--store", spec(pg, table, "team-a"), "--search", "hybrid"]) == 0
    assert f"index table {table!r} serves {default} already: nothing changed" in capsys.readouterr().err


def test_replicas_turn_down_the_weight_of_the_namespace_whose_lifts_did_harm_as_the_library_does(pg, tools,
                                                                                                   encoder):
    """Scores keep whose lifts passed a tool (schema v7): a replica that only reads them from the database
    turns down the weight of the namespace whose tool was lifted wrongly, as the library does, and leaves
    the namespace of the tool the agents use at full weight."""
    from toolscout.postgres import index_catalog
    from toolscout.serve import ToolService
    from toolscout.store.pgvector import PgVectorStore

    store_spec = spec(pg, new_table())
    index_catalog(PgVectorStore.from_spec(store_spec, encoder.dim), tools, encoder)
    library = ToolScout.from_tools(tools, encoder=encoder)
    one = ToolService.open(store_spec, encoder=encoder, batch_workers=0)
    two = ToolService.open(store_spec, encoder=encoder, batch_workers=0)
    try:
        first = mixed({"rain": "hotels.book", "mail": "mail.send", "calendar": "calendar.create",
                       "files": "files.read", "facts": "calendar.list"}, 60, start=0.0)
        one.feedback(first)
        library.learn(first)
        for event in events(RAIN, "weather.get_forecast", 60, "agent-2", start=1000.0):  # minds changed
            one.feedback([event])
            library.learn([event])
        weights = {ns: w["weight"] for ns, w in two.learning()["weights"].items()}
        assert weights == {ns: w["weight"] for ns, w in library.learning_report()["weights"].items()}
        assert weights["travel"] < 1.0 and weights.get("weather", 1.0) == 1.0
    finally:
        one.close()
        two.close()


def test_a_nul_character_is_refused_by_name_and_nothing_is_written(pg, tools, encoder):
    """PostgreSQL text cannot hold U+0000: the store says which field holds one, before its transaction."""
    from toolscout.errors import InvalidRequest, NotFound
    from toolscout.postgres import index_catalog
    from toolscout.serve import ToolService
    from toolscout.store.pgvector import PgVectorStore

    store_spec = spec(pg, new_table())
    index_catalog(PgVectorStore.from_spec(store_spec, encoder.dim), tools, encoder)
    service = ToolService.open(store_spec, encoder=encoder, batch_workers=0)
    try:
        version = service.version()
        bad = Tool("x.nul", "nul", "fine", namespace="x", parameters={"properties": {"a\x00b": {"type": "string"}}})
        with pytest.raises(InvalidRequest, match=r"tool 'x.nul', field parameters.properties.a\x00b \(its name\)"):
            service.upsert([bad])
        with pytest.raises(InvalidRequest, match="feedback event 1, field query"):
            service.feedback([{"query": "ok", "tool_ids": ["mail.send"]}, {"query": "o\x00k", "tool_ids": ["mail.send"]}])
        with pytest.raises(NotFound):  # an id to look up is looked up in the replica: no tool has it
            service.get("mail\x00send")
        with pytest.raises(InvalidRequest, match=r"learning weights: 'a\\x00b' is not a namespace"):
            service.set_learning(weights={"a\x00b": 0.5})
        assert service.version() == version and "x.nul" not in {t.id for t in service.list()[1]}
        assert service.feedback_of("mail.send")["reported"] == 0  # the good event was not written either
    finally:
        service.close()


@pytest.mark.parametrize("dense_in", ["memory", "pgvector"])
def test_replicas_rank_exactly_as_the_library_before_and_after_feedback(pg, tools, encoder, monkeypatch, dense_in):
    """Two replicas on one database and the default pipeline in process: the same hits in the same order
    with the same scores, for every query; then the same again after feedback taught through replica A
    (replica B learns of it only through the database). With more tools than a replica keeps in memory,
    the dense part searches pgvector instead (its HNSW graph finds every tool of so small a catalog) and
    nothing else changes."""
    from toolscout.postgres import index_catalog
    from toolscout import pg_pipeline
    from toolscout.serve import ToolService
    from toolscout.store.pgvector import PgVectorStore

    if dense_in == "pgvector":
        monkeypatch.setattr(pg_pipeline, "IN_MEMORY_TOOLS", len(tools) - 1)
    store_spec = spec(pg, new_table())
    local = ToolScout.from_tools(tools, encoder=encoder)
    index_catalog(PgVectorStore.from_spec(store_spec, encoder.dim, exact=True), tools, encoder, local.spec)
    one, two = (ToolService.open(store_spec, encoder=encoder, batch_workers=0) for _ in range(2))
    try:
        def same(queries):
            wanted = local.search(queries, k=6)
            for replica in (one, two):
                for q, want in zip(queries, wanted):
                    assert_same_ranking(replica.search(q, 6, min_score=None), want)
            assert one.stats()["dense_search"] == ("in memory" if dense_in == "memory" else "pgvector HNSW")

        same(QUERIES)
        taught = mixed({"rain": "stocks.quote"}, 40, "t") + mixed(
            {"mail": "mail.send", "calendar": "calendar.create", "files": "files.read", "facts": "calendar.list"}, 12, "s")
        # requests of numbers and dates alone are recorded and teach nothing, on either side
        taught += [{"query": f"{400 + i}-0{i} 10:{10 + i} 2026-11-1{i}", "tool_ids": ["stocks.quote"], "source": "t"}
                   for i in range(8)]
        local.learn(taught)
        assert one.feedback(taught).incidental == 8
        assert local.search(RAIN_TASK, k=1)[0].tool.id == "stocks.quote"  # learning is in play
        same(QUERIES + [RAIN_TASK, "email the team about the report", "should I take a raincoat tonight",
                        "555-0199 at 10:45 on 2026-12-01"])
        local.forget("t")
        two.forget("t")
        same(QUERIES + [RAIN_TASK, "email the team about the report"])
    finally:
        one.close()
        two.close()


def _outage_log(caplog) -> list[str]:
    """What the log told of the database so far, as "down" and "back"; fails on a warning of psycopg_pool's,
    which the outage's own lines replace."""
    pool = [r.getMessage() for r in caplog.records if r.name == "psycopg.pool" and r.levelno >= logging.WARNING]
    assert pool == [], f"{len(pool)} warnings of psycopg_pool's: {pool[:3]}"
    told = []
    for record in caplog.records:
        message = record.getMessage()
        if record.name == "toolscout.store.pg_outage" and record.levelno == logging.WARNING:
            told.append("down" if message.startswith("cannot connect to the PostgreSQL database postgresql://")
                        else "back" if " answers again: " in message else message)
    return told


@contextlib.contextmanager
def own_database_client(data, tools, encoder, options: str = ""):
    """An HTTP client of a service on a PostgreSQL of its own in the folder `data` (one a test may stop), whose
    table holds `tools`, searched densely; `options`: more of the store spec ("&answer_timeout=3"). The
    database is stopped afterwards, whatever happened."""
    from starlette.testclient import TestClient

    from toolscout.postgres import index_catalog
    from toolscout.serve import ToolService
    from toolscout.serve.http import create_app
    from toolscout.store.pgvector import PgVectorStore

    try:
        store_spec = spec(own_server_uri(data), new_table()) + options
        store = PgVectorStore.from_spec(store_spec, encoder.dim)
        index_catalog(store, tools, encoder, ToolScout.from_tools([], retriever="dense", encoder=encoder).spec)
        store.close()
        with ToolService.open(store_spec, encoder=encoder, batch_workers=0) as service:
            yield TestClient(create_app(service))
    finally:  # stopped whatever happened; a failure to stop must not hide the test's own
        with contextlib.suppress(Exception):
            pg_ctl(data, "stop")


def test_a_database_that_stops_is_a_fast_503_naming_it_and_its_return_serves_without_a_500(tmp_path, tools,
                                                                                           encoder, caplog):
    """Down: every request is told within seconds that the database does not answer (it was a 500 after a
    30 s wait, /health too), and the log says so once (psycopg_pool warned at every reconnection attempt: 21
    lines in these 20 s, in one run). Back: the next request is served, the log says so once, and the
    connections a restart closed are replaced, not handed to requests."""
    data = tmp_path / "pgdata"
    with own_database_client(data, tools, encoder) as client:
        assert client.post("/search", json={"query": RAIN_TASK}).status_code == 200
        pg_ctl(data, "stop")
        for path, call in (("/search", lambda: client.post("/search", json={"query": RAIN_TASK})),
                           ("/health", lambda: client.get("/health"))):
            started = time.monotonic()
            answer = call()
            assert answer.status_code == 503, (path, answer.text)
            assert "PostgreSQL database postgresql://" in answer.json()["error"]["message"], answer.text
            assert time.monotonic() - started < 15, path
        # down about 20 s in all (the two requests above waited 5 s each): the pool's doubling backoff would
        # try next at about 31 s, past the 5 s a request waits (it waited up to a minute after a longer
        # outage); the first request after the database is back is answered
        outage = time.monotonic() + 8
        while time.monotonic() < outage:
            assert client.post("/search", json={"query": RAIN_TASK}).status_code == 503
        assert _outage_log(caplog) == ["down"]  # one line for the whole outage, and none of the pool's own
        pg_ctl(data, "start")
        answer = client.post("/search", json={"query": RAIN_TASK})
        assert answer.status_code == 200, answer.text
        assert _outage_log(caplog) == ["down", "back"]
        pg_ctl(data, "stop")  # a restart while nobody asks: the pool holds connections it closed
        pg_ctl(data, "start")
        assert [client.post("/search", json={"query": RAIN_TASK}).status_code for _ in range(8)] == [200] * 8
        # a reconnection attempt still scheduled from the outage may have met the restart: a second outage,
        # told as one too
        assert _outage_log(caplog) in (["down", "back"], ["down", "back"] * 2)


def test_health_on_a_database_known_to_be_down_is_a_503_within_a_probes_timeout(tmp_path, tools, encoder):
    """/health waited for a pooled connection as long as a request does before its 503, so a probe with the
    usual 1 s timeout saw a timeout while the database was down. Once the pool knows it cannot connect,
    /health tries one connection of its own and answers 503 at once, saying why."""
    data = tmp_path / "pgdata"
    with own_database_client(data, tools, encoder, "&answer_timeout=2") as client:  # requests wait 2 s
        pg_ctl(data, "stop")
        assert client.post("/search", json={"query": RAIN_TASK}).status_code == 503  # the pool finds it down
        started = time.monotonic()
        answer = client.get("/health")
        assert answer.status_code == 503 and time.monotonic() - started < 1, answer.text
        message = answer.json()["error"]["message"]
        assert "PostgreSQL database postgresql://" in message and "No such file or directory" in message, message


def test_a_database_that_freezes_is_a_503_naming_it_not_a_hung_request(tmp_path, tools, encoder):
    """A database stopped without closing its sockets (SIGSTOP: a frozen process or virtual machine) never
    answers, and libpq waits for ever: a search hung with no end. Now the request is a 503 naming the
    database within seconds, and once the database runs again, searches are served."""
    import signal
    import threading

    data = tmp_path / "pgdata"
    with own_database_client(data, tools, encoder, "&answer_timeout=3") as client:
        assert client.post("/search", json={"query": RAIN_TASK}).status_code == 200
        signal_server(data, signal.SIGSTOP)
        try:
            answers = []
            request = threading.Thread(target=lambda: answers.append(
                client.post("/search", json={"query": "is it windy in Oslo right now"})), daemon=True)
            request.start()
            request.join(60)  # the database stays frozen for as long as this waits
            assert not request.is_alive(), "the search hung on the frozen database"
        finally:
            signal_server(data, signal.SIGCONT)
        assert answers[0].status_code == 503, answers[0].text
        assert "PostgreSQL database postgresql://" in answers[0].json()["error"]["message"]
        answer = client.post("/search", json={"query": "is it windy in Oslo right now"})
        assert answer.status_code == 200, answer.text
