"""The HTTP API: every endpoint, its errors, tokens and namespace restrictions. One suite, run against
both catalogs the service core serves: a pipeline directory and the PostgreSQL store (a real server from
pgserver), each with the same dense index of the same tools."""

import json
import logging
import re

import pytest

from traffic import RAIN, RAIN_TASK, mixed
from pgtest import new_table, postgres_uri, spec
from starlette.testclient import TestClient
from test_explain import EXPECTED as EXPLAINED
from test_explain import TASK as EXPLAIN_TASK

from toolscout import Tool, ToolScout
from toolscout.serve import ToolService, create_app
from toolscout.serve.auth import AuthConfig

ADMIN = {"authorization": "Bearer admin-secret"}
MAIL = {"authorization": "Bearer mail-team-1"}  # read+write, namespace "mail" only
READER = {"authorization": "Bearer reader-123"}  # read only, every namespace


def expect_error(r, status):
    """The error body of a response that must have `status`."""
    assert r.status_code == status, r.text
    return r.json()["error"]


def directory_target(tmp_path, tools, encoder):
    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever="dense", encoder=encoder).save(folder)
    return str(folder), {"fsync": False}


def postgres_target(tmp_path, tools, encoder):
    from toolscout.postgres import index_catalog
    from toolscout.store.pgvector import PgVectorStore

    store_spec = spec(postgres_uri(), new_table())
    store = PgVectorStore.from_spec(store_spec, encoder.dim)
    dense = ToolScout.from_tools([], retriever="dense", encoder=encoder)  # the directory's pipeline
    index_catalog(store, tools, encoder, dense.spec)
    store.close()
    return store_spec, {"encoder": encoder}


@pytest.fixture(params=["directory", pytest.param("postgresql", marks=pytest.mark.slow)])  # slow: PostgreSQL
def served(request, tmp_path, tools, encoder):
    """start(**options) -> a TestClient of the HTTP API over a fresh catalog of `tools` in this store."""
    make = directory_target if request.param == "directory" else postgres_target
    target, open_options = make(tmp_path, tools, encoder)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"token": "mail-team-1", "name": "mail", "namespaces": ["mail"], "write": True},
        {"token": "reader-123", "name": "reader"},
        {"token": "agent-7-feedback", "name": "agent-7", "feedback": True},
        {"token": "mallory-feedback", "name": "mallory", "feedback": True}]}))

    def start(require_read_token=False, max_body_bytes=4096, **options):
        service = ToolService.open(target, **open_options, **options)
        auth = AuthConfig.build("admin-secret", tokens, require_read_token)
        return TestClient(create_app(service, auth, max_body_bytes=max_body_bytes))

    start.store = request.param
    return start


def test_search_single_batch_filters_and_formats(served):
    with served() as client:
        r = client.post("/search", json={"query": "book a flight to Paris", "k": 2})
        assert r.status_code == 200
        body = r.json()
        hits = body["results"][0]["hits"]
        assert [h["id"] for h in hits][:1] == ["flights.book"] and [h["rank"] for h in hits] == [1, 2]
        assert set(hits[0]) >= {"id", "name", "namespace", "score", "match", "description", "input_schema"}
        assert hits[0]["input_schema"]["properties"]["flight_id"]["type"] == "string"

        r = client.post("/search", json={"queries": ["send an email", "weather in Oslo"], "k": 3,
                                         "namespaces": ["mail", "calendar"]})
        results = r.json()["results"]
        assert [x["query"] for x in results] == ["send an email", "weather in Oslo"]
        assert all(h["namespace"] in ("mail", "calendar") for x in results for h in x["hits"])

        r = client.post("/search", json={"query": "read a file", "k": 1, "format": "anthropic",
                                         "always_include": ["mail.send"]})
        result = r.json()["results"][0]
        assert [t["name"] for t in result["tools"]] == ["read_file", "send_email"]
        assert result["tools"][0]["input_schema"]["type"] == "object" and result["hits"][1]["match"] == "always"
        r = client.post("/search", json={"query": "read a file", "k": 1, "format": "openai"})
        assert r.json()["results"][0]["tools"][0]["function"]["name"] == "read_file"

        r = client.post("/search", json={"query": "search_inbox", "k": 3})
        assert r.json()["results"][0]["hits"][0]["match"] == "name"

        r = client.post("/search", json={"query": "reserve a seat on a flight", "min_score": 1000.0})
        assert r.json()["results"][0] == {"query": "reserve a seat on a flight", "abstained": True,
                                          "truncated": False, "hits": []}


def test_explain_adds_the_matched_words_to_every_hit(served):
    with served() as client:
        body = {"query": EXPLAIN_TASK, "ids": list(EXPLAINED), "k": 4, "abstain": False}  # dense ranks all four
        hits = client.post("/search", json={**body, "explain": True}).json()["results"][0]["hits"]
        assert {h["id"]: h["matched"] for h in hits} == EXPLAINED  # worked out by hand in test_explain.py
        hits = client.post("/search", json=body).json()["results"][0]["hits"]
        assert len(hits) == 4 and not any("matched" in h for h in hits)
        assert client.post("/search", json={**body, "explain": "perhaps"}).status_code == 422

        schemas = client.get("/openapi.json").json()["components"]["schemas"]
        assert schemas["SearchRequest"]["properties"]["explain"]["type"] == "boolean"
        assert schemas["SearchRequest"]["properties"]["explain"]["default"] is False
        matched = schemas["HitOut"]["properties"]["matched"]
        assert {"type": "array", "items": {"type": "string"}} in matched["anyOf"] and "matched" not in \
            schemas["HitOut"].get("required", [])


def test_server_threshold_abstains_unless_the_request_turns_it_off(served):
    with served(min_score=1000.0) as client:
        assert client.post("/search", json={"query": "reserve a seat on a flight"}).json()["results"][0]["abstained"]
        r = client.post("/search", json={"query": "reserve a seat on a flight", "abstain": False})
        assert r.json()["results"][0]["hits"][0]["id"] == "flights.book"


def test_tool_crud_and_versions(served, tools):
    with served() as client:
        start = client.get("/health").json()["version"]
        new = {"name": "translate", "namespace": "lang", "description": "Translate text into another language",
               "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}
        r = client.put("/tools/lang.translate", json=new, headers=ADMIN)
        assert r.status_code == 200 and r.json()["created"] == ["lang.translate"] and r.json()["version"] == start + 1
        assert client.put("/tools/lang.translate", json=new, headers=ADMIN).json()["unchanged"] == ["lang.translate"]
        assert client.get("/tools/lang.translate").json() == {
            "id": "lang.translate", **new, "feedback": {"learned": 0, "sources": 0, "reported": 0}}
        hit = client.post("/search", json={"query": "translate this text to French", "k": 1}).json()["results"][0]
        assert hit["hits"][0]["id"] == "lang.translate"

        r = client.post("/tools", headers=ADMIN, json={"tools": [
            {"name": "ocr", "namespace": "lang", "description": "Read text in an image"},
            {"id": "mail.send", "name": "send_email", "namespace": "mail", "description": "Send a letter by post"}]})
        assert r.json()["created"] == ["lang.ocr"] and r.json()["updated"] == ["mail.send"]
        catalog = [{"type": "function", "function": {"name": "get_time", "description": "Current time in a city",
                                                     "parameters": {"type": "object", "properties": {}}}}]
        r = client.post("/tools", headers=ADMIN, json={"catalog": catalog, "namespace": "clock"})
        assert r.json()["created"] == ["clock.get_time"]

        page = client.get("/tools", params={"limit": 5, "offset": 10}).json()
        every_id = sorted([t.id for t in tools] + ["lang.translate", "lang.ocr", "clock.get_time"])
        assert page["total"] == len(tools) + 3 and page["offset"] == 10
        assert [t["id"] for t in page["tools"]] == every_id[10:15]  # pages are ordered by id on every store
        assert [t["id"] for t in client.get("/tools", params={"namespace": "lang"}).json()["tools"]] == \
            ["lang.ocr", "lang.translate"]
        assert client.get("/namespaces").json()["namespaces"]["lang"] == 2

        assert client.delete("/tools/lang.ocr", headers=ADMIN).json()["deleted"] == ["lang.ocr"]
        r = client.post("/tools/delete", headers=ADMIN, json={"ids": ["clock.get_time", "lang.translate"]})
        assert r.json()["deleted"] == ["clock.get_time", "lang.translate"] and r.json()["version"] == start + 5
        assert client.get("/tools/lang.ocr").status_code == 404
        r = client.delete("/tools/lang.ocr", headers=ADMIN)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
        r = client.post("/tools/delete", headers=ADMIN, json={"ids": ["mail.search", "nope"]})
        assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
        assert client.get("/tools/mail.search").status_code == 200  # all or nothing

        health = client.get("/health").json()
        assert health["status"] == "ok" and health["version"] == start + 5 and health["tools"] == len(tools)
        compacted = client.post("/admin/compact", headers=ADMIN).json()
        if served.store == "directory":  # the journal's writes go into a new snapshot
            assert compacted["compacted"] and compacted["journal_records"] == 0
        else:  # the database holds every write: nothing to compact
            assert not compacted["compacted"] and "journal_records" not in compacted


def test_a_posted_catalog_answers_with_what_reading_it_skipped_or_warned_of(served):
    weather = {"openapi": "3.0.0", "info": {"title": "天気予報 API"}, "paths": {"/f": {"get": {
        "operationId": "forecast", "summary": "Weather forecast", "parameters": [
            {"name": "city", "in": "query", "schema": {"$ref": "common.yaml#/City"}}]}}}}
    hooks = {"openapi": "3.1.0", "info": {"title": "Hooks"}, "webhooks": {"newPet": {"post": {"operationId": "n"}}}}
    anthropic = [{"name": "search_web", "type": "web_search_20250305"},
                 {"name": "get_stock", "description": "Stock price", "input_schema": {"type": "object"}}]
    with served() as client:
        r = client.post("/tools", headers=ADMIN, json={"catalog": weather})
        assert r.status_code == 200 and r.json()["created"] == ["天気予報-api.forecast"]
        assert r.json()["warnings"] == ["catalog: paths./f.get.parameters[0].schema: $ref 'common.yaml#/City' "
                                        "points outside this file and was kept unresolved"]
        assert client.get("/namespaces").json()["namespaces"]["天気予報-api"] == 1
        r = client.post("/tools", headers=ADMIN, json={"catalog": hooks})
        assert r.status_code == 200 and r.json()["created"] == []
        assert r.json()["warnings"] == ["catalog: no tools loaded: it holds none (an OpenAPI document's tools are "
                                        "the operations under 'paths'; its 'webhooks' are requests the API sends, "
                                        "not operations to call)"]
        r = client.post("/tools", headers=ADMIN, json={"catalog": {"tools": []}})  # was a 422 asking for a format
        assert r.status_code == 200 and r.json()["created"] == []
        assert r.json()["warnings"] == ["catalog: no tools loaded: it holds none"]
        r = client.post("/tools", headers=ADMIN, json={"catalog": anthropic, "namespace": "fin"})
        assert r.json()["created"] == ["fin.get_stock"]
        assert r.json()["warnings"] == ["catalog: [0]: Anthropic server tool 'search_web' (type 'web_search_20250305') "
                                        "runs on Anthropic's side and has no input_schema to retrieve by (skipped)"]
        r = client.post("/tools", headers=ADMIN, json={"tools": [{"name": "ocr", "namespace": "lang"}]})
        assert "warnings" not in r.json()  # records are not read as a catalog


def test_parameters_that_cannot_describe_arguments_are_refused_as_from_a_file(served):
    with served() as client:
        start = client.get("/health").json()["version"]
        e = expect_error(client.post("/tools", headers=ADMIN, json={"tools": [
            {"name": "x", "parameters": {"type": "array"}}]}), 422)
        assert e["message"] == "tool 'x': parameters.type must be 'object' (tool arguments are one JSON object), " \
                               "got 'array'"
        e = expect_error(client.put("/tools/y", headers=ADMIN, json={"name": "y", "parameters": {
            "properties": {"a": {"type": "string"}}, "required": "a"}}), 422)
        assert e["message"] == "tool 'y': parameters.required must be a list of argument names (strings), got string"
        catalog = [{"type": "function", "function": {"name": "z", "parameters": {"properties": {"a": "notaschema"}}}}]
        e = expect_error(client.post("/tools", headers=ADMIN, json={"catalog": catalog}), 422)
        assert e["message"] == "catalog: [0].function.parameters.properties.a: must be a JSON schema (an object, or " \
                               "true/false), got string"
        assert client.get("/health").json()["version"] == start  # nothing was written


def test_a_body_nested_too_deeply_to_read_is_told_as_such(served):
    import sys

    depth = sys.getrecursionlimit() + 100  # past what the JSON reader recurses into
    body = '{"query": "x", "ids": ' + "[" * depth + "]" * depth + "}"
    with served() as client:
        e = expect_error(client.post("/search", content=body.encode(), headers={"content-type": "application/json"}),
                         400)
        assert e == {"type": "invalid_json", "message": "request body nests arrays or objects too deeply to read"}


def test_malformed_requests_get_clear_4xx_json_errors(served):
    with served(max_body_bytes=2048) as client:
        error = expect_error
        e = error(client.post("/search", content=b'{"query": "x",', headers={"content-type": "application/json"}), 400)
        assert e["type"] == "invalid_json"
        e = error(client.post("/search", content='{"query": "caf\u00e9"}'.encode("latin-1"),
                              headers={"content-type": "application/json"}), 400)
        assert e == {"type": "invalid_json", "message": "request body is not JSON text in UTF-8"}
        e = error(client.post("/search", json={"query": "x", "top_k": 3}), 422)
        assert e["message"] == "top_k: unknown field (not allowed)"
        e = error(client.put("/tools/a.b", json={"name": "b", "nmespace": "a"}, headers=ADMIN), 422)
        assert e["details"][0]["field"] == "nmespace"
        assert "exactly one of" in error(client.post("/search", json={"k": 3}), 422)["message"]
        assert "exactly one of" in error(client.post("/search", json={"query": "a", "queries": ["b"]}), 422)["message"]
        both = {"tools": [], "catalog": {}}  # both given is what is wrong, not that each is empty
        assert error(client.post("/tools", json=both, headers=ADMIN), 422)["message"] == \
            "body: give exactly one of 'tools' or 'catalog'"
        assert error(client.post("/search", json={"query": "", "queries": []}), 422)["message"] == \
            "body: give exactly one of 'query' or 'queries'"
        assert error(client.post("/search", json={"query": "a", "k": 1000}), 422)["details"][0]["field"] == "k"
        assert error(client.post("/search", json={"query": ""}), 422)["details"][0]["field"] == "query"
        blank = error(client.post("/search", json={"query": " \u3000\t"}), 422)  # every field named, however blank
        assert (blank["message"], blank["details"][0]["field"]) == ("query: must hold more than white space", "query")
        assert error(client.post("/search", json={"queries": ["a", "  "]}), 422)["details"][0]["field"] == "queries.1"
        invisible = error(client.post("/search", json={"query": "\u200b\ufeff"}), 422)  # zero-width space, BOM
        assert invisible["message"] == "query: must hold more than white space"
        pattern = client.get("/openapi.json").json()["components"]["schemas"]["SearchRequest"]["properties"][
            "query"]["pattern"]  # the schema says the same, as a pattern a client's validator reads
        assert re.search(pattern, "\u200b\ufeff") is None and re.search(pattern, "\u200ba") is not None
        assert error(client.put("/tools/x", json={"name": "\u2060"}, headers=ADMIN), 422)["details"][0][
            "field"] == "name"
        blank = error(client.post("/feedback", json={"events": [{"query": "a", "tool_ids": ["x"]},
                                                                {"query": "\n", "tool_ids": ["x"]}]}, headers=ADMIN), 422)
        assert blank["message"] == "events.1.query: must hold more than white space"
        assert error(client.post("/search", json=["x"]), 422)["type"] == "invalid_request"
        e = error(client.put("/tools/a.b", json={"id": "c.d", "name": "b"}, headers=ADMIN), 422)
        assert "takes the tool's id from the path" in e["message"]
        e = error(client.post("/search", json={"query": "x", "explain": 1}), 422)  # no coercion: 1 is not true
        assert e["details"][0]["field"] == "explain"
        assert client.post("/search", json={"query": "x", "k": 2.0}).status_code == 200  # JSON's integer 2
        nameless = [{"type": "function", "function": {"description": "no name"}}]
        e = error(client.post("/tools", json={"catalog": nameless}, headers=ADMIN), 422)
        assert e["type"] == "invalid_request" and "name" in e["message"]
        e = error(client.post("/tools", json={"catalog": [None]}, headers=ADMIN), 422)  # as the document says
        assert "holds objects" in e["message"]
        items = client.get("/openapi.json").json()["components"]["schemas"]["UpsertRequest"]["properties"]
        assert {"type": "array", "minItems": 1, "items": {"type": "object"}} in items["catalog"]["anyOf"]
        big = {"query": "x" * 3000}
        e = error(client.post("/search", json=big), 413)  # the body limit, not the task
        assert e == {"type": "payload_too_large",
                     "message": "request body is larger than the limit of 2048 bytes (the server's --max-body)"}

        def chunks():  # no Content-Length: the limit is enforced while reading
            for _ in range(10):
                yield b" " * 500
        e = error(client.post("/search", content=chunks(), headers={"content-type": "application/json"}), 413)
        assert e["message"] == "request body is larger than the limit of 2048 bytes (the server's --max-body)"
        e = error(client.post("/search", content=b"query=x", headers={"content-type": "text/plain"}), 415)
        assert "application/json" in e["message"]
        assert error(client.get("/nope"), 404)["type"] == "not_found"
        assert error(client.delete("/search"), 405)["type"] == "method_not_allowed"
        assert error(client.get("/tools", params={"limit": 0}), 422)["details"][0]["field"] == "query.limit"
        # a body of one of two shapes is told what is wrong with the shape it meant
        batch = {"events": [{"query": "a", "tool_ids": ["mail.send"]}, {"query": "b"}]}
        e = error(client.post("/feedback", json=batch, headers=ADMIN), 422)  # and of that shape only
        assert e["message"] == "events.1.tool_ids: Field required"
        assert [d["field"] for d in e["details"]] == ["events.1.tool_ids"]
        e = error(client.post("/feedback", json={"query": "b"}, headers=ADMIN), 422)
        assert e["message"] == "tool_ids: Field required" and [d["field"] for d in e["details"]] == ["tool_ids"]
        nan = b'{"query": "x", "min_score": NaN}'  # Python's parser reads it; JSON has no NaN
        e = error(client.post("/search", content=nan, headers={"content-type": "application/json"}), 422)
        assert e["details"][0]["field"] == "min_score"
        e = error(client.put("/tools/" + "x" * 513, json={"name": "x"}, headers=ADMIN), 422)  # feedback could not name it
        assert e["details"][0]["field"] == "path.tool_id"


@pytest.mark.parametrize("bug", [KeyError("a slip"), ValueError("a slip"), RuntimeError("a slip")])
def test_a_bug_inside_toolscout_is_a_logged_500_not_a_404_or_422(served, bug, caplog):
    with served() as client:
        catalog = client.app.app.app.app.state.service.storage  # Observe > InternalErrors > BodyLimit > FastAPI

        def broken(*_args, **_kwargs):
            raise bug

        pipeline = catalog.tenant(None).pipeline()  # what the service reads
        pipeline.get = broken
        with caplog.at_level(logging.ERROR, logger="toolscout.serve"):
            r = client.get("/tools/mail.send")
        assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
        assert "a slip" not in r.text  # the details go to the log, not to the client
        logged = [rec for rec in caplog.records if rec.name == "toolscout.serve" and rec.exc_info]
        assert logged and logged[0].exc_info[1] is bug and "GET /tools/mail.send" in logged[0].getMessage()


def test_tokens_guard_writes_and_restrict_namespaces(served):
    with served() as client:
        tool = {"name": "x1", "namespace": "mail", "description": "Archive an email"}
        r = client.put("/tools/mail.x1", json=tool)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        r = client.put("/tools/mail.x1", json=tool, headers={"authorization": "Bearer wrong-token"})
        assert r.status_code == 401 and r.json()["error"]["message"] == "invalid bearer token"
        r = client.put("/tools/mail.x1", json=tool, headers={"authorization": "Basic abc"})
        assert r.status_code == 401
        assert client.put("/tools/mail.x1", json=tool, headers=READER).status_code == 403
        assert client.put("/tools/mail.x1", json=tool, headers=MAIL).status_code == 200
        r = client.put("/tools/travel.x2", json={**tool, "namespace": "travel"}, headers=MAIL)
        assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden"
        r = client.put("/tools/flights.book", json={**tool, "name": "book_flight"}, headers=MAIL)
        assert r.status_code == 403  # taking over another namespace's tool by id: named by where it is
        assert r.json()["error"]["message"] == ("tool 'flights.book': namespace 'travel' (where the stored tool "
                                                "is) is outside what this token may write")
        assert client.get("/tools/flights.book").json()["namespace"] == "travel"
        assert client.delete("/tools/flights.book", headers=MAIL).status_code == 404
        assert client.post("/admin/compact", headers=MAIL).status_code == 403

        # the mail token never sees another namespace's tools, however it asks
        for body in ({"query": "book a flight to Paris", "k": 10},
                     {"query": "book_flight", "k": 10},
                     {"query": "book a flight", "namespaces": ["travel"]},
                     {"query": "book a flight", "ids": ["flights.book"], "always_include": ["flights.book"]}):
            hits = client.post("/search", json=body, headers=MAIL).json()["results"][0]["hits"]
            assert all(h["namespace"] == "mail" for h in hits), body
        assert client.post("/search", json={"query": "book a flight", "k": 3}, headers=READER).json()[
            "results"][0]["hits"][0]["id"] == "flights.book"
        # a namespace the caller cannot see reads as one that does not exist; a typo is said, not an empty find
        named = {"query": "book a flight", "namespaces": ["travel", "trvel"]}
        assert client.post("/search", json=named, headers=MAIL).json()["unknown_namespaces"] == ["travel", "trvel"]
        assert client.post("/search", json=named, headers=READER).json()["unknown_namespaces"] == ["trvel"]
        assert "unknown_namespaces" not in client.post("/search", json={**named, "namespaces": ["travel"]},
                                                       headers=READER).json()
        assert client.get("/tools/flights.book", headers=MAIL).status_code == 404
        assert {t["namespace"] for t in client.get("/tools", headers=MAIL).json()["tools"]} == {"mail"}
        assert client.get("/namespaces", headers=MAIL).json() == {"namespaces": {"mail": 3}}


def test_reads_can_require_a_token(served):
    with served(require_read_token=True) as client:
        assert client.post("/search", json={"query": "x"}).status_code == 401
        assert client.get("/tools").status_code == 401
        assert client.post("/mcp", json={}).status_code == 401
        assert client.post("/search", json={"query": "book a flight"}, headers=READER).status_code == 200
        assert client.get("/health").status_code == 200  # a liveness probe needs no token
        assert client.get("/metrics").status_code == 401  # it tells of every namespace (the next tests)


TAUGHT = {"rain": "stocks.quote", "mail": "mail.send", "calendar": "calendar.create", "files": "files.read"}


def test_health_shows_each_caller_only_the_namespaces_it_may_read(served, tools):
    """/health answered everyone with every namespace's learning weights and the whole catalog's counts, even
    where reads need a token: now a caller without one sees liveness only, a token limited to `mail` sees mail's
    tool count and learning, and a token that may read everything sees what an open server shows."""
    with served(require_read_token=True, max_body_bytes=1 << 16) as client:
        assert client.post("/feedback", headers=AGENT, json={"events": mixed(TAUGHT, 12)}).status_code == 200

        anonymous = client.get("/health")
        assert anonymous.status_code == 200 and anonymous.json()["status"] == "ok"
        assert set(anonymous.json()) <= {"status", "storage", "writes", "uptime_s", "snapshots"}, anonymous.json()
        stranger = client.get("/health", headers={"authorization": "Bearer not-a-token"})
        assert stranger.status_code == 200 and set(stranger.json()) == set(anonymous.json())  # no 401 for a probe

        mine = client.get("/health", headers=MAIL).json()
        mail = [t for t in tools if t.namespace == "mail"]
        assert mine["tools"] == len(mail) < len(tools) and set(mine["learning"]["weights"]) == {"mail"}
        learned = client.get("/learning", headers=MAIL).json()
        assert {k: mine["learning"][k] for k in ("requests", "tools_taught", "events_scored")} == \
            {k: learned[k] for k in ("requests", "tools_taught", "events_scored")}
        assert not {"feedback_events", "feedback_sources", "answer_cache_hits", "journal_records"} & set(mine)

        everything = client.get("/health", headers=READER).json()
        assert everything["tools"] == len(tools) and everything["feedback_events"] == 48
        assert set(everything["learning"]["weights"]) > {"mail", "finance", "calendar"}
        assert everything["learning"]["requests"] > mine["learning"]["requests"]


def test_metrics_need_a_caller_that_may_read_every_namespace(served):
    """/metrics listed toolscout_learning_weight{namespace=...} and toolscout_learning_events{namespace=...} of
    every namespace to a caller without a token, where reads need one: now 401 without a token, 403 for a
    token limited to some namespaces (on an open server too), and everything for a token that may read all."""
    with served(require_read_token=True, max_body_bytes=1 << 16) as client:
        client.post("/feedback", headers=AGENT, json={"events": mixed(TAUGHT, 12)})
        assert expect_error(client.get("/metrics"), 401)["type"] == "unauthorized"
        assert "every namespace" in expect_error(client.get("/metrics", headers=MAIL), 403)["message"]
        text = client.get("/metrics", headers=READER).text
        assert 'toolscout_learning_weight{namespace="finance"' in text and "toolscout_feedback_events 48" in text
    with served() as client:  # reads open: a caller without a token reads every namespace, so it scrapes too
        assert client.get("/metrics").status_code == 200
        assert client.get("/metrics", headers=MAIL).status_code == 403


def test_setting_a_weight_by_hand_keeps_the_weights_series(served):
    """A Prometheus series is its name and labels: setting a weight by hand changes the value of
    toolscout_learning_weight{namespace="mail"}, not its labels; how it came is a gauge of its own."""
    def series(client):
        lines = client.get("/metrics", headers=ADMIN).text.splitlines()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines
                if line.startswith("toolscout_learning_weight")}

    with served() as client:
        client.post("/feedback", json={"query": "mail Bo the notes", "tool_ids": ["mail.send"]}, headers=AGENT)
        assert series(client) == {'toolscout_learning_weight{namespace="mail"}': 1.0,
                                  'toolscout_learning_weight_set_by_hand{namespace="mail"}': 0.0}
        assert client.post("/learning", json={"weights": {"mail": 0.25}}, headers=ADMIN).status_code == 200
        assert series(client) == {'toolscout_learning_weight{namespace="mail"}': 0.25,
                                  'toolscout_learning_weight_set_by_hand{namespace="mail"}': 1.0}


PROM_LINE = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)*\})? [0-9.e+-]+$')


def test_metrics_openapi_and_health(served, tools):
    with served() as client:
        for _ in range(3):
            client.post("/search", json={"query": "book a flight"})
        client.post("/search", json={"query": "x", "bogus": 1})
        client.post("/search", content=b"query=x", headers={"content-type": "text/plain"})  # 415, before routing
        client.get("/no-such-route")
        text = client.get("/metrics").text
        lines = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert all(PROM_LINE.match(line) for line in lines), [x for x in lines if not PROM_LINE.match(x)]
        assert 'toolscout_http_requests_total{method="POST",route="/search",status="200"} 3' in lines
        assert 'toolscout_http_requests_total{method="POST",route="/search",status="422"} 1' in lines
        assert 'toolscout_http_requests_total{method="POST",route="/search",status="415"} 1' in lines
        assert 'toolscout_http_requests_total{method="GET",route="unmatched",status="404"} 1' in lines
        assert 'toolscout_http_request_duration_seconds_count{method="POST",route="/search"} 5' in lines
        assert any(line.startswith('toolscout_http_request_duration_seconds_bucket{method="POST",route="/search",'
                                   'le="+Inf"} 5') for line in lines)
        assert 'toolscout_search_events_total{event="queries"} 3' in lines and f"toolscout_tools {len(tools)}" in lines
        assert any(line.startswith("toolscout_journal_records ") for line in lines) == (served.store == "directory")

        spec_doc = client.get("/openapi.json").json()
        assert {"/search", "/tools", "/tools/{tool_id}", "/tools/delete", "/health", "/metrics"} <= set(spec_doc["paths"])
        schemas = spec_doc["components"]["schemas"]
        assert schemas["SearchRequest"]["additionalProperties"] is False
        assert schemas["ToolIn"]["additionalProperties"] is False
        assert "401" in spec_doc["paths"]["/tools/{tool_id}"]["put"]["responses"]
        docs = client.get("/docs")  # Swagger UI comes from a CDN: the page says what works without it
        assert docs.status_code == 200 and 'href="/openapi.json"' in docs.text and 'href="/ui"' in docs.text
        health = client.get("/health").json()
        assert health["storage"] == served.store and health["tools"] == len(tools)


AGENT = {"authorization": "Bearer agent-7-feedback"}  # read + feedback, every namespace, source "agent-7"


def test_feedback_is_learned_at_once_counted_and_taken_back_exactly(served):
    with served(max_body_bytes=1 << 16) as client:
        task = {"query": RAIN_TASK, "k": 3}
        before = client.post("/search", json=task).json()["results"][0]["hits"]
        assert before[0]["id"] != "stocks.quote"
        taught = mixed({"rain": "stocks.quote", "mail": "mail.send", "calendar": "calendar.create",
                        "files": "files.read", "facts": "calendar.list"}, 12)
        r = client.post("/feedback", headers=AGENT, json={"events": taught + [
            {"query": RAIN[0], "tool_ids": ["stocks.quote", "nope.nothing"]},  # a repeat, and an unknown tool
            {"query": "it did not work", "tool_ids": ["files.read", "nope.nothing"], "outcome": "failure"}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["events"], body["learned"], body["duplicates"], body["failures"]) == (62, 60, 1, 1)
        # named twice: listed once, counted twice (trial 10 #10: a batch echoed an id per occurrence)
        assert (body["unknown_tools"], body["unknown_tool_mentions"]) == (["nope.nothing"], 2)
        after = client.post("/search", json=task).json()["results"][0]["hits"]
        assert after[0]["id"] == "stocks.quote"  # learned at once, no retraining
        assert client.get("/tools/stocks.quote").json()["feedback"] == {"learned": 12, "sources": 1, "reported": 13}
        metrics = client.get("/metrics").text
        assert "toolscout_feedback_events 62" in metrics and "toolscout_feedback_learned 60" in metrics
        assert 'toolscout_search_events_total{event="feedback_events"} 62' in metrics
        learned = client.get("/learning", headers=AGENT).json()
        assert f"toolscout_learning_requests {learned['requests']}" in metrics and learned["tools_taught"] == 5
        assert learned["measured"]["all"]["events"] == 61  # every successful event scored before learning
        mine = client.get("/learning", headers=MAIL).json()  # a token that sees the mail namespace only
        assert (mine["tools_taught"], set(mine["measured"]["namespaces"])) == (1, {"mail"})
        assert mine["events_scored"] == mine["measured"]["namespaces"]["mail"]["all"]["events"] < 61
        assert 0 < mine["requests"] < learned["requests"] and "calibration" not in mine
        # every deployment-wide total is dropped: all, and the first-seen and repeat splits (review: they leaked)
        assert {"all", "first_seen", "repeats"} <= set(learned["measured"]) and set(mine["measured"]) == {"namespaces"}
        single = client.post("/feedback", headers=AGENT, json={"query": "umbrella needed?", "tool_ids": ["weather.get_current"],
                                                                 "source": "agent-7", "outcome": "success"})
        assert single.json()["learned"] == 1
        r = client.delete("/feedback", params={"source": "agent-7"}, headers=AGENT)
        assert r.status_code == 200 and r.json()["tools"] == 6
        restored = client.post("/search", json=task).json()["results"][0]["hits"]
        assert [(h["id"], h["score"]) for h in restored] == [(h["id"], h["score"]) for h in before]
        assert client.get("/tools/stocks.quote").json()["feedback"]["learned"] == 0


def test_learning_counts_event_tool_pairs_and_says_so(served):
    """Three events naming two tools each: six (event, tool) pairs scored, three in each namespace; every
    place that shows the count names that unit."""
    from toolscout.cli.learn import render_report

    with served() as client:
        events = [{"query": q, "tool_ids": ["mail.send", "files.read"]}
                  for q in ("mail the contract to Bo", "send Ann the slides", "share the budget file by email")]
        assert client.post("/feedback", json={"events": events}, headers=AGENT).json()["events"] == 3
        report = client.get("/learning", headers=ADMIN).json()
        assert report["events_scored"] == report["measured"]["all"]["events"] == 6
        assert {ns: f["all"]["events"] for ns, f in report["measured"]["namespaces"].items()} == {"mail": 3, "files": 3}
        metrics = client.get("/metrics", headers=ADMIN).text
        assert "# HELP toolscout_learning_events (event, tool) pairs scored" in metrics
        assert 'toolscout_learning_events{namespace="mail"} 3' in metrics
        assert "(event, tool) pairs" in client.get("/openapi.json").json()["paths"]["/learning"]["get"]["description"]
        table = render_report(report).splitlines()
        assert "6 (event, tool) pairs scored (an event counts once per tool it names)" in table[0]
        assert table[3].startswith("| namespace | (event, tool) pairs: first-seen + repeats |")
        assert table[5].startswith("| files | 3 + 0 |")
        # the same requests again: repeats, counted apart in /learning, /metrics and the table (trial 10)
        client.post("/feedback", json={"events": events}, headers=AGENT)
        mail = client.get("/learning", headers=ADMIN).json()["measured"]["namespaces"]["mail"]
        assert (mail["all"]["events"], mail["first_seen"]["events"], mail["repeats"]["events"]) == (6, 3, 3)
        metrics = client.get("/metrics", headers=ADMIN).text
        assert 'toolscout_learning_first_seen_events{namespace="mail"} 3' in metrics
        assert (f'toolscout_learning_mrr{{namespace="mail",window="repeats",ranking="served"}} '
                f'{mail["repeats"]["served"]["mrr"]}') in metrics


def test_learning_says_it_lifts_nothing_until_five_tools_are_taught(served):
    """memory.MIN_TOOLS: with fewer tools taught similarity earns nothing, and /learning, /health and the
    report say so, with the count; a namespace-limited token is not told the deployment's count."""
    from toolscout.cli.learn import render_report

    with served() as client:
        mail = {"query": "mail the contract to Bo", "tool_ids": ["mail.send"]}
        assert client.post("/feedback", json=mail, headers=AGENT).json()["learned"] == 1
        report = client.get("/learning", headers=ADMIN).json()
        assert report["dormant"] == "learning lifts nothing until 5 tools are taught: 1 so far"
        assert client.get("/health", headers=ADMIN).json()["learning"]["dormant"] == report["dormant"]
        assert client.get("/learning", headers=MAIL).json()["dormant"] == "learning lifts nothing until 5 tools are taught"
        assert render_report(report).splitlines()[:2] == [
            "learned requests: 1 over 1 tool; 1 (event, tool) pairs scored (an event counts once per tool it names)",
            "learning lifts nothing until 5 tools are taught: 1 so far (docs/learning.md, 'How it learns', step 3)"]
        tools = [t["id"] for t in client.get("/tools", headers=ADMIN).json()["tools"]][:5]
        events = [{"query": f"please use {tool} now", "tool_ids": [tool]} for tool in tools]
        client.post("/feedback", json={"events": events}, headers=AGENT)
        report = client.get("/learning", headers=ADMIN).json()
        assert report["tools_taught"] >= 5 and report["dormant"] is None
        assert "learning lifts nothing" not in render_report(report)


def test_forgetting_a_source_that_posted_nothing_changes_nothing_and_says_so(served):
    with served() as client:
        bo = {"query": "mail Bo", "tool_ids": ["mail.send"]}
        assert client.post("/feedback", json=bo, headers=AGENT).status_code == 200
        version = client.get("/health").json()["version"]
        r = client.delete("/feedback", params={"source": "nobody"}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["tools"] == 0 and r.json()["version"] == version
        assert r.json()["note"] == "source 'nobody' has no feedback stored here (a typo?): nothing was taken back, " \
                                   "nothing changed"
        assert client.get("/health").json()["version"] == version  # the answer cache is not reset either
        r = client.delete("/feedback", params={"source": "agent-7"}, headers=ADMIN)
        assert (r.json()["tools"], r.json()["note"]) == (1, None) and r.json()["version"] > version


def test_a_rollback_to_a_future_or_negative_time_is_refused_naming_the_field_and_unit(served):
    import time

    with served() as client:
        bo = {"query": "mail Bo", "tool_ids": ["mail.send"]}
        assert client.post("/feedback", json=bo, headers=AGENT).status_code == 200
        millis = round(time.time() * 1000)
        e = expect_error(client.post("/learning/rollback", json={"before": millis}, headers=ADMIN), 422)
        assert e["message"].startswith(f"before {millis:g}: in the future (") and "(milliseconds? " in e["message"]
        assert e["message"].endswith("give seconds since the epoch, at most now")
        e = expect_error(client.post("/learning/rollback", json={"before": -1}, headers=ADMIN), 422)
        assert e["message"] == ("before -1: a negative time, before 1970: it would take back everything; give "
                                "seconds since the epoch, at most now")
        assert client.get("/tools/mail.send").json()["feedback"]["learned"] == 1  # nothing taken back
        r = client.post("/learning/rollback", json={"before": time.time() - 3600}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["taken_back"] == 1


def test_a_rollback_can_be_tried_first_and_one_that_takes_back_nothing_changes_nothing(served):
    """`{"before": 1}` took everything back with no way to see it first, and a rollback that took back nothing
    still made a new version (trial 10 #9): a dry run says how many pairs and which sources, changing nothing;
    an empty rollback changes nothing, as forgetting an unknown source does; pairs a freeze only held are told
    apart from learned ones."""
    import time

    from toolscout.cli.learn import said_rollback

    with served() as client:
        assert client.post("/feedback", json={"query": "mail Bo", "tool_ids": ["mail.send"]}, headers=AGENT).status_code == 200
        version = client.get("/health").json()["version"]
        hour_ago = time.time() - 3600
        r = client.post("/learning/rollback", json={"before": hour_ago, "dry_run": True}, headers=ADMIN)
        said = r.json()
        assert r.status_code == 200 and (said["taken_back"], said["learned"], said["held_by_freeze"]) == (1, 1, 0)
        assert list(said["sources"].values()) == [1] and said["dry_run"] is True and said["version"] == version
        assert client.get("/tools/mail.send").json()["feedback"]["learned"] == 1  # nothing taken back
        assert said_rollback(said, hour_ago).startswith("would take back 1 (request, tool) pairs learned at or after")
        done = client.post("/learning/rollback", json={"before": hour_ago}, headers=ADMIN).json()
        assert (done["taken_back"], done["dry_run"]) == (1, False) and done["version"] > version
        again = client.post("/learning/rollback", json={"before": hour_ago}, headers=ADMIN).json()
        assert (again["taken_back"], again["version"]) == (0, done["version"])  # not even a new version
        assert client.get("/health").json()["version"] == done["version"]
        assert said_rollback(again, hour_ago).endswith(": nothing to take back, nothing changed")
        assert client.post("/learning", json={"freeze": True}, headers=ADMIN).status_code == 200
        client.post("/feedback", json={"query": "mail Ann", "tool_ids": ["mail.send"]}, headers=AGENT)
        held = client.post("/learning/rollback", json={"before": hour_ago}, headers=ADMIN).json()
        assert (held["taken_back"], held["learned"], held["held_by_freeze"]) == (1, 0, 1)
        assert "took back 0 (request, tool) pairs learned and 1 held by the freeze (never learned)" in \
            said_rollback(held, hour_ago)


def test_an_operator_sets_learning_weights_over_http_and_auto_means_automatic_again(served):
    with served() as client:
        r = client.post("/learning", json={"weights": {"mail": 0.25}}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["weights"] == {"mail": 0.25}
        assert client.get("/learning", headers=ADMIN).json()["weights"]["mail"]["weight"] == 0.25
        r = client.post("/learning", json={"weights": {"mail": "auto"}}, headers=ADMIN)  # as the CLI says it
        assert r.status_code == 200 and r.json()["weights"] == {}
        for wrong, shown in (("automatic", '"automatic"'), (2, "2"), ("0.5", '"0.5"')):
            e = expect_error(client.post("/learning", json={"weights": {"mail": wrong}}, headers=ADMIN), 422)
            assert [d["field"] for d in e["details"]] == ["weights.mail"]  # once, not per member of the union
            assert e["message"] == f'weights.mail: a number from 0 to 1, "auto" or null (automatic), got {shown}'
        assert client.post("/learning", json={"weights": {"mail": 0.5}}, headers=MAIL).status_code == 403


def test_feedback_while_learning_is_frozen_is_said_to_be_recorded_not_learned(served):
    with served() as client:
        event = {"query": "send the quarterly report", "tool_ids": ["mail.send", "files.read"]}
        assert client.post("/learning", json={"freeze": True}, headers=ADMIN).status_code == 200
        body = client.post("/feedback", json=event, headers=AGENT).json()
        assert body["learned"] == 0 and body["held_by_freeze"] == 2
        assert body["note"].startswith("learning is frozen: these events were recorded but not learned")
        assert client.get("/learning", headers=ADMIN).json()["requests"] == 0  # indeed nothing learned
        assert client.post("/learning", json={"freeze": False}, headers=ADMIN).status_code == 200
        body = client.post("/feedback", json={**event, "query": "mail the report"}, headers=AGENT).json()
        assert body["learned"] == 2 and body["held_by_freeze"] == 0 and body["note"] is None


def test_feedback_needs_permission_and_stays_within_what_the_caller_sees(served):
    with served() as client:
        event = {"query": "send the quarterly report", "tool_ids": ["mail.send"]}
        assert client.post("/feedback", json=event, headers=READER).status_code == 403  # no feedback permission
        r = client.post("/feedback", json={**event, "source": "someone-else"}, headers=AGENT)
        assert r.status_code == 403 and "agent-7" in r.json()["error"]["message"]
        r = client.post("/feedback", json={"query": "book it", "tool_ids": ["flights.book"]}, headers=MAIL)
        assert r.status_code == 200 and r.json()["unknown_tools"] == ["flights.book"]  # outside its namespaces
        assert client.get("/tools/flights.book").json()["feedback"]["learned"] == 0
        assert client.post("/feedback", json=event, headers=MAIL).json()["learned"] == 1
        assert client.delete("/feedback", params={"source": "agent-7"}, headers=MAIL).status_code == 403
        assert client.delete("/feedback", params={"source": "mail"}, headers=MAIL).json()["tools"] == 1
        assert client.post("/feedback", json={"query": "x", "tool_ids": []}, headers=ADMIN).status_code == 422
        assert client.post("/feedback", json={"query": "x", "tool_ids": ["a"], "extra": 1}, headers=ADMIN).status_code == 422


def test_feedback_over_its_rate_is_refused_with_retry_after(served):
    from toolscout.serve.limits import FeedbackLimits

    with served(limits=FeedbackLimits(rate=1.0, burst=3, volume=None)) as client:
        events = [{"query": f"send report number {i}", "tool_ids": ["mail.send"]} for i in range(3)]
        assert client.post("/feedback", json={"events": events}, headers=AGENT).status_code == 200
        r = client.post("/feedback", json={"query": "one more report", "tool_ids": ["mail.send"]}, headers=AGENT)
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limited"
        assert int(r.headers["retry-after"]) >= 1
        assert client.get("/tools/mail.send").json()["feedback"]["learned"] == 3  # nothing of the refused batch


def test_a_feedback_batch_larger_than_the_burst_is_refused_at_once_not_asked_to_wait(served):
    """A bucket of 3 can never hold a batch of 4: waiting would not help, so no 429 and Retry-After."""
    from toolscout.serve.limits import FeedbackLimits

    with served(limits=FeedbackLimits(rate=1.0, burst=3, volume=None)) as client:
        events = [{"query": f"send report number {i}", "tool_ids": ["mail.send"]} for i in range(4)]
        r = client.post("/feedback", json={"events": events}, headers=AGENT)
        e = expect_error(r, 413)
        assert "retry-after" not in r.headers
        assert "batch of 4" in e["message"] and "burst of 3" in e["message"] and "--feedback-burst" in e["message"]
        assert client.get("/tools/mail.send").json()["feedback"]["learned"] == 0  # nothing of it counted
        assert client.post("/feedback", json={"events": events[:3]}, headers=AGENT).status_code == 200  # bucket full


def test_one_source_cannot_shift_a_task_further_than_the_limits_allow(served, tools, encoder):
    """10,000 events from one source tie a popular task to the wrong tool. The burst limit admits 2,000 of
    them, the per-tool cap lets 5 teach: learning may lift that one tool, so the right tool drops by at most
    that one place and every other tool keeps its place and score; deleting the source gives back the
    rankings exactly."""
    from toolscout.serve.limits import FeedbackLimits

    mallory = {"authorization": "Bearer mallory-feedback"}
    task = "send an email to my team"
    limits = FeedbackLimits(rate=0.01, burst=2000, volume=None)  # bursts of 2,000, then next to nothing
    with served(feedback_cap=5, limits=limits, max_body_bytes=1 << 20) as client:
        def ranking():
            hits = client.post("/search", json={"query": task, "k": 12, "abstain": False,
                                                "match_names": False}).json()["results"][0]["hits"]
            return [(h["id"], h["score"]) for h in hits]

        before = ranking()
        assert before[0][0] == "mail.send"
        events = [{"query": f"{task}, variant {i}", "tool_ids": ["files.read"]} for i in range(10_000)]
        statuses = [client.post("/feedback", json={"events": events[i:i + 1000]}, headers=mallory).status_code
                    for i in range(0, len(events), 1000)]
        assert statuses[:2] == [200, 200] and set(statuses[2:]) == {429}  # the burst of 2,000, then refused
        assert client.get("/tools/files.read").json()["feedback"]["learned"] == 5
        after = ranking()
        assert [t for t, _s in after].index("mail.send") <= 1  # one tool moved: one place at most
        assert [p for p in after if p[0] != "files.read"] == [p for p in before if p[0] != "files.read"]
        assert client.delete("/feedback", params={"source": "mallory"}, headers=mallory).status_code == 200
        assert ranking() == before


def test_retraining_is_for_trusted_tokens_and_reports_its_state(served):
    with served() as client:
        assert client.get("/admin/learn", headers=ADMIN).json() == {"state": "never"}
        assert client.post("/admin/learn", json={"train": "mlc"}, headers=MAIL).status_code == 403
        assert client.post("/admin/learn", json={"train": "tool2vec"}, headers=ADMIN).status_code == 422
        e = expect_error(client.post("/admin/learn", json={"train": "mlc", "options": {"epochs": 2, "bogus": 1}},
                              headers=ADMIN), 422)
        assert "options.bogus" in e["message"]
        # refused at once, before anything starts: no feedback to train on (directory), or a store that
        # cannot retrain (PostgreSQL); the state is untouched
        e = expect_error(client.post("/admin/learn", json={"train": "mlc", "options": {"epochs": 2}}, headers=ADMIN), 409)
        assert ("too little feedback" in e["message"]) == (served.store == "directory")
        assert ("pipeline directory" in e["message"]) == (served.store == "postgresql")
        assert client.get("/admin/learn", headers=ADMIN).json() == {"state": "never"}


def test_the_retraining_bodies_the_docs_show_are_the_ones_the_server_takes(served):
    """docs/serving.md and docs/learning.md show where a retraining's settings go; each body they show is
    read (refused only for too little feedback, or a store that cannot retrain: 409), not a 422."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    shown = [json.loads(m) for doc in ("serving.md", "learning.md")
             for m in re.findall(r"""(\{"train": "mlc".*?\}\})""", (docs / doc).read_text())]
    assert len(shown) >= 2 and all("options" in body for body in shown), shown
    with served() as client:
        for body in shown:
            assert client.post("/admin/learn", json=body, headers=ADMIN).status_code == 409, body


def test_each_task_is_focused_once_per_search(served, monkeypatch):
    """The HTTP answer, the service and the pipeline read one `Query` per task (its `truncated` too), so a
    long task is focused once per search, not once per layer."""
    import toolscout.query
    from toolscout.conversation import focus

    focused = []
    monkeypatch.setattr(toolscout.query, "focus", lambda text: focused.append(text) or focus(text))
    with served() as client:
        focused.clear()
        assert client.post("/search", json={"query": "book a flight to Paris", "k": 2}).status_code == 200
        assert focused == ["book a flight to Paris"]
        focused.clear()
        r = client.post("/search", json={"queries": ["book a flight", "send an email"], "k": 2})
        assert r.status_code == 200 and focused == ["book a flight", "send an email"]


def test_a_task_longer_than_search_reads_is_answered_and_says_it_was_cut(served):
    with served(max_body_bytes=1 << 20) as client:
        image = "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUgAA" * 2000  # 48,000 characters of blob
        task = f"Here is a picture of my trip {image} - book me a flight to Paris for the same dates"
        r = client.post("/search", json={"query": task, "k": 3})
        assert r.status_code == 200, r.text
        result = r.json()["results"][0]
        assert result["truncated"] is True
        # the blob dropped: the same answer as the task without it
        read = client.post("/search", json={"query": task.replace(image, " "), "k": 3}).json()["results"][0]
        assert read["truncated"] is False and {h["id"] for h in read["hits"]} >= {"flights.book"}
        assert [(h["id"], h["score"]) for h in result["hits"]] == [(h["id"], h["score"]) for h in read["hits"]]


def test_a_write_of_a_blank_id_or_name_is_refused_and_a_stored_one_still_loads_and_deletes(served, tmp_path):
    # PUT /tools/%20 stored a tool whose id was one space; one stored so before still loads (the index would
    # not open otherwise) and can be deleted
    with served() as client:
        r = client.put("/tools/%20", json={"name": "x"}, headers=ADMIN)
        assert r.status_code == 422 and "need a character other than whitespace" in r.json()["error"]["message"]
        for tool in ({"id": "\t", "name": "x"}, {"name": " "}):
            assert client.post("/tools", json={"tools": [tool]}, headers=ADMIN).status_code == 422, tool
    old = ToolScout.from_tools([Tool(" ", "blank"), Tool("a.b", "b", "kept")], retriever="bm25")
    old.save(tmp_path / "old")
    with ToolService.open(tmp_path / "old", fsync=False, batch_workers=0) as service:
        assert len(service) == 2 and service.delete([" "]).deleted == [" "]


def test_tools_with_no_namespace_are_searched_as_namespace_empty_string(served):
    """/namespaces lists "" for tools with no namespace (and the playground's "(no namespace)" filter sends
    `namespaces: [""]`): search takes it, as `/tools?namespace=` and the Python API do."""
    with served() as client:
        note = {"name": "add_note", "description": "Write a short note and save it."}  # no namespace
        assert client.put("/tools/add_note", json=note, headers=ADMIN).status_code == 200
        assert client.get("/namespaces").json()["namespaces"][""] == 1
        assert [t["id"] for t in client.get("/tools", params={"namespace": ""}).json()["tools"]] == ["add_note"]
        r = client.post("/search", json={"query": "write a note", "k": 5, "namespaces": [""], "abstain": False})
        assert r.status_code == 200, r.text
        assert [h["id"] for h in r.json()["results"][0]["hits"]] == ["add_note"]
        assert "unknown_namespaces" not in r.json()
        r = client.post("/search", json={"query": "write a note", "namespaces": ["", "mail"], "abstain": False})
        assert {h["namespace"] for h in r.json()["results"][0]["hits"]} == {None, "mail"}
        assert client.post("/search", json={"query": "x", "namespaces": ["n" * 257]}).status_code == 422


def test_a_search_says_which_of_its_ids_no_answer_can_hold(served):
    """Ids and always_include that name no tool the caller may see come back in `unknown_ids`, and those that
    exclude_ids takes out again in `excluded_ids` (each read as "nothing fits" before); an empty `namespaces` or
    `ids` could find nothing at all, and is refused."""
    with served() as client:
        def search(headers=None, **body):
            r = client.post("/search", json={"query": "book a flight", "abstain": False, **body}, headers=headers)
            assert r.status_code == 200, r.text
            answer = r.json()
            return ([h["id"] for h in answer["results"][0]["hits"]],
                    {key: answer[key] for key in ("unknown_ids", "excluded_ids") if key in answer})

        assert search(ids=["flights.book", "flights.bok"]) == (["flights.book"], {"unknown_ids": ["flights.bok"]})
        assert search(ids=["nope"]) == ([], {"unknown_ids": ["nope"]})
        hits, told = search(k=1, always_include=["mail.send", "mail.sned"])
        assert hits[-1] == "mail.send" and told == {"unknown_ids": ["mail.sned"]}
        assert search(ids=["flights.book"], exclude_ids=["flights.book"]) == ([], {"excluded_ids": ["flights.book"]})
        assert search(ids=["flights.book", "hotels.book"], exclude_ids=["hotels.book", "mail.send"],
                      always_include=["mail.send"]) == (["flights.book"], {"excluded_ids": ["hotels.book", "mail.send"]})
        assert search(MAIL, ids=["flights.book", "mail.send"]) == (["mail.send"], {"unknown_ids": ["flights.book"]})
        assert search(ids=["flights.book"], exclude_ids=["hotels.book"]) == (["flights.book"], {})
        for field, what in (("namespaces", "namespace"), ("ids", "tool")):
            e = expect_error(client.post("/search", json={"query": "x", field: []}), 422)
            assert e["message"] == f"{field}: names no {what}, so the search could find nothing: name one, or " \
                                   "leave the field out"


def test_search_definitions_say_which_tool_and_which_keys_a_model_s_call_means(tmp_path):
    import httpx
    from servers import start_server, stop

    from toolscout.ingest import load_tools

    spec = tmp_path / "tickets.yaml"
    spec.write_text("openapi: 3.0.3\ninfo: {title: Tickets, version: '1'}\npaths:\n  /tickets:\n    get:\n"
                    "      summary: List support tickets by status\n      parameters:\n"
                    "        - {name: 'filter[status]', in: query, schema: {type: string}}\n")
    ToolScout.from_tools(load_tools(spec), retriever="bm25").save(tmp_path / "idx")
    proc, url = start_server([str(tmp_path / "idx")])
    try:
        result = httpx.post(f"{url}/search", json={"query": "list support tickets", "format": "anthropic"}).json()
    finally:
        stop(proc)
    [definition] = result["results"][0]["tools"]
    name = definition["name"]  # no operationId: `GET /tickets` as a valid name
    assert name == "GET_tickets" and list(definition["input_schema"]["properties"]) == ["filter_status_"]
    assert result["results"][0]["tool_ids"] == {name: "tickets.GET /tickets"}
    assert result["results"][0]["argument_names"] == {name: {"filter_status_": "filter[status]"}}


@pytest.mark.filterwarnings("ignore::toolscout.errors.DegradedResults")  # what the answer says is checked
def test_a_task_the_llm_reranker_could_not_judge_says_so_in_its_answer(tmp_path, caplog):
    """An LLM reranker that failed on a task left the first stage's hits in a 200 answer with nothing saying
    so (trial8 #5; the warning was on the server's stderr only). Now that task's result has `degraded`
    {stage, reason} and the other task's has none; such an answer is not cached: the next search asks again."""
    from conftest import sample_tools
    from fakellm import FakeLLM, Reply, message_text

    from toolscout.llm import LLMSettings
    from toolscout.rerank.llm import LLMReranker

    top = [{"token": "true", "logprob": -0.1}, {"token": "false", "logprob": -2.4}]
    judgement = Reply("true", logprobs=[{"token": "true", "logprob": -0.1, "top_logprobs": top}])

    def respond(request):  # the model fails on one task only
        return Reply(status=500) if "flight to Paris" in message_text(request) else judgement

    with FakeLLM(responder=respond) as llm:
        reranker = LLMReranker(LLMSettings(base_url=llm.url, model="m", timeout=5.0, max_retries=0))
        ToolScout.from_tools(sample_tools(), retriever="bm25", reranker=reranker).save(tmp_path / "idx")
        service = ToolService.open(tmp_path / "idx", fsync=False)
        with TestClient(create_app(service, AuthConfig.build("admin-secret", None))) as client:
            both = {"queries": ["book a flight to Paris", "send an email"], "k": 2}
            failed, judged = client.post("/search", json=both).json()["results"]
            asked = llm.calls
            again = client.post("/search", json={"query": "book a flight to Paris", "k": 2}).json()["results"][0]
            asked_again = llm.calls - asked
            schema = client.get("/openapi.json").json()["components"]["schemas"]["QueryResult"]["properties"]
    assert failed["degraded"]["stage"] == "LLM reranker" and "degraded" not in judged
    assert failed["degraded"]["reason"] == "the LLM answered HTTP 500"  # no URL or reply for callers
    assert all(0 <= h["score"] <= 1 for h in judged["hits"])  # P(true): the reranker ranked this one
    assert again["degraded"] == failed["degraded"] and again["hits"] == failed["hits"] and asked_again > 0
    assert "degraded" in schema
    logged = [r.getMessage() for r in caplog.records if r.name == "toolscout.serve.service"]
    assert any(line.startswith("search: the LLM reranker could not rank a task: ") and
               f"POST {llm.url}/chat/completions → HTTP 500" in line for line in logged), logged


def test_a_degraded_answer_tells_callers_the_kind_of_failure_not_the_llm_url_or_reply():
    """`degraded.reason` went to every search caller with the internal LLM URL, a snippet of its reply body and
    setting names (review #6). Now callers read a coarse reason; the full error stays in `detail`, which only
    the local CLI shows (`degraded_dict(detail=True)`)."""
    from toolscout.hits import Hits
    from toolscout.llm import LLMConnectionError, LLMHTTPError, LLMReplyError, LLMTimeoutError, public_reason
    from toolscout.results import Degraded

    url = "http://llm.internal:8000/v1/chat/completions"
    errors = {LLMHTTPError(url, 500, "stack trace with OPENAI_API_KEY"): "the LLM answered HTTP 500",
              LLMTimeoutError(f"POST {url}: no reply within 5 s"): "the LLM did not answer in time",
              LLMConnectionError(f"POST {url}: cannot reach the server"): "the LLM endpoint could not be reached",
              LLMReplyError(f"POST {url} → HTTP 200 but the body is not JSON: <html>"): "the LLM's replies could not be read"}
    for error, reason in errors.items():
        hits = Hits([], Degraded("LLM reranker", public_reason(error), f"{error} (tool 'x')"))
        assert hits.degraded_dict() == {"degraded": {"stage": "LLM reranker", "reason": reason}}
        local = hits.degraded_dict(detail=True)["degraded"]
        assert local["detail"] == f"{error} (tool 'x')" and url in local["detail"]
