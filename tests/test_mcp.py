"""MCP end to end with the official SDK: the `search_tools` server over stdio and streamable HTTP, and
indexing the tools of running MCP servers (`toolscout index mcp:COMMAND` / an MCP URL)."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import anyio
import httpx
import pytest

from toolscout import Tool, ToolScout, load_tools
from toolscout.cli import main as cli

mcp = pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters  # noqa: E402

pytestmark = pytest.mark.slow  # starts servers and PostgreSQL

FIXTURE_SERVER = textwrap.dedent("""
    import sys
    from mcp.server import MCPServer

    server = MCPServer(sys.argv[1], log_level="WARNING")

    @server.tool(description="Search the documents of " + sys.argv[1])
    def search(query: str) -> str:
        return "nothing"

    @server.tool(description="Get the weather forecast for a city for the next days")
    def get_forecast(city: str, days: int = 3) -> str:
        return "sunny"

    server.run("stdio")
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def catalog():
    def obj(**props):
        return {"type": "object", "properties": {k: {"type": "string", "description": v} for k, v in props.items()}}

    return [
        Tool("weather.get_forecast", "get_forecast", "Get the weather forecast for a city for the next days.",
             obj(city="Name of the city"), namespace="weather"),
        Tool("flights.book", "book_flight", "Book a seat on a flight.", obj(flight_id="Flight"), namespace="travel"),
        Tool("hotels.book", "book_hotel", "Reserve a hotel room in a city.", obj(city="City"), namespace="travel"),
        Tool("mail.send", "send_email", "Send an email message to recipients.", obj(to="Addresses"), namespace="mail"),
        Tool("mail.search", "search_inbox", "Find emails in the inbox.", obj(query="Words"), namespace="mail"),
        Tool("calendar.create", "create_event", "Create a calendar event and invite people by email.",
             obj(title="Title"), namespace="calendar"),
    ]


@pytest.fixture(scope="module", params=["directory", "postgresql"])
def served(request, tmp_path_factory, encoder):
    """What `toolscout serve` is pointed at, for each store the service core serves: the arguments that
    name it, and a function giving arguments for one more server of the same catalog."""
    if request.param == "postgresql":
        from pgtest import new_table, postgres_uri, spec

        from toolscout.postgres import index_catalog
        from toolscout.store.pgvector import PgVectorStore

        store_spec = spec(postgres_uri(), new_table())
        store = PgVectorStore.from_spec(store_spec, encoder.dim)
        dense = ToolScout.from_tools([], retriever="dense", encoder=encoder)  # the directory's pipeline below
        index_catalog(store, catalog(), encoder, dense.spec)
        store.close()
        return lambda: ["--store", store_spec]  # every replica serves the same database
    folder = tmp_path_factory.mktemp("mcp") / "idx"
    ToolScout.from_tools(catalog(), retriever="dense", encoder=encoder).save(folder)

    def copy():  # a directory is locked by one server at a time: each server gets a copy
        target = tmp_path_factory.mktemp("copy") / "idx"
        ToolScout.load(folder).save(target)
        return [str(target)]

    return copy


@pytest.fixture(scope="module")
def http_server(served, tmp_path_factory):
    """`python -m toolscout.serve` over HTTP (API + /mcp) with a token limited to the mail namespace."""
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"token": "mail-only-1", "namespaces": ["mail"]},
                                             {"token": "everything-1"},
                                             {"token": "feedback-mail-1", "namespaces": ["mail"], "feedback": True}]}))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "toolscout.serve", *served(), "--port", str(port),
                             "--tokens", str(tokens), "--require-read-token", "--no-fsync"],
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(900):
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode()[-2000:])
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def test_sdk_client_lists_and_calls_search_tools_over_stdio(served):
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "toolscout.serve", *served(), "--mcp", "--min-score", "0.3"],
                                   env={"HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", ""),
                                        "PYTHONPATH": os.environ.get("PYTHONPATH", "")})  # this checkout's toolscout

    async def session():
        async with Client(params) as client:
            assert client.server_info.name == "toolscout"
            listed = (await client.list_tools()).tools
            assert [t.name for t in listed] == ["search_tools", "record_tool_use"]
            schema = listed[0].input_schema
            assert schema["required"] == ["task"] and {"task", "k", "namespaces"} <= set(schema["properties"])
            assert listed[0].output_schema is not None

            result = await client.call_tool("search_tools", {"task": "weather forecast for a city", "k": 2})
            assert not result.is_error
            found = result.structured_content["tools"]
            assert found[0]["name"] == "get_forecast" and found[0]["namespace"] == "weather"
            assert found[0]["input_schema"]["properties"]["city"]["type"] == "string"
            assert json.loads(result.content[0].text)["tools"][0]["id"] == "weather.get_forecast"

            result = await client.call_tool("search_tools", {"task": "send an email", "namespaces": ["calendar"]})
            assert [t["namespace"] for t in result.structured_content["tools"]] == ["calendar"]
            assert result.structured_content["unknown_namespaces"] == []
            result = await client.call_tool("search_tools", {"task": "send an email",  # a typo is said, not
                                                             "namespaces": ["calender", "calendar"]})  # an empty find
            assert result.structured_content["unknown_namespaces"] == ["calender"]
            result = await client.call_tool("search_tools", {"task": "lattice chromodynamics on a supercomputer"})
            assert result.structured_content == {"tools": [], "abstained": True, "unknown_namespaces": [],
                                                 "degraded": None}  # null: the pipeline ranked it fully
            bad = await client.call_tool("search_tools", {"task": "x", "k": 0})
            assert bad.is_error
            blank = await client.call_tool("search_tools", {"task": "   "})  # toolscout's own errors say why
            assert blank.is_error and blank.content[0].text.endswith("task must not be blank")

            # reporting use is recorded at once (once per source); one tool's reports alone lift it for no
            # task, not even their own: until several tools are taught, the index cannot tell "similar
            # requests need this tool" from "every request is this tool's" (docs/learning.md)
            task = "zyzzyva quark frobnicate"
            assert (await client.call_tool("search_tools", {"task": task})).structured_content["abstained"]
            recorded = await client.call_tool("record_tool_use", {"task": task, "tool_ids": ["hotels.book", "x.y"]})
            # the counts POST /feedback answers, from the one place both take them (trial 10 #10)
            assert recorded.structured_content == {"learned": 1, "duplicate": False, "unknown_tools": ["x.y"],
                                                  "held_by_freeze": 0, "failures": 0, "incidental": 0, "capped": 0,
                                                  "note": None}
            failed = await client.call_tool("record_tool_use", {"task": "book it", "tool_ids": ["hotels.book"],
                                                                "outcome": "failure"})
            assert (failed.structured_content["learned"], failed.structured_content["failures"]) == (0, 1)
            again = await client.call_tool("record_tool_use", {"task": task, "tool_ids": ["hotels.book"]})
            assert again.structured_content["duplicate"] is True
            for phrasing in ("quark zyzzyva frobnication", "frobnicate the zyzzyva quarks"):
                await client.call_tool("record_tool_use", {"task": phrasing, "tool_ids": ["hotels.book"]})
            assert (await client.call_tool("search_tools", {"task": task})).structured_content["abstained"]

    anyio.run(session)


def test_a_stdio_server_limited_to_a_namespace_no_tool_is_in_says_so_at_start(tmp_path):
    """`serve DIR --mcp --namespace nope` would answer every search with nothing: its host is told at start."""
    from mcp.client.stdio import stdio_client

    folder = tmp_path / "idx"
    ToolScout.from_tools(catalog(), retriever="bm25").save(folder)
    params = StdioServerParameters(command=sys.executable, args=["-m", "toolscout.serve", str(folder), "--mcp",
                                                                 "--namespace", "mail", "--namespace", "nope"],
                                   env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", "")})

    async def session(errlog):
        async with Client(stdio_client(params, errlog=errlog)) as client:
            found = await client.call_tool("search_tools", {"task": "send an email", "k": 5})
            return {tool["namespace"] for tool in found.structured_content["tools"]}

    with open(tmp_path / "stderr.txt", "w") as errlog:
        assert anyio.run(session, errlog) == {"mail"}
    said = (tmp_path / "stderr.txt").read_text().splitlines()
    assert said[:2] == ["toolscout: warning: no tool is in namespace 'nope' (--namespace): searches find nothing "
                        "there", f"toolscout: MCP over stdio, 2 tools from {folder}"], said


# Calls whose arguments are wrong, and what both MCP servers (serve's, the gateway's) answer them: as the HTTP
# API answers such a body (no unknown arguments, no coercion, k within the API's bound), in words that name
# the argument, without pydantic's dump of the input and its link.
WRONG_ARGUMENTS = {
    ("search_tools", (("task", "x"), ("bogus", 1))):
        "search_tools: bogus: unknown argument (search_tools takes task, k, namespaces)",
    ("search_tools", (("task", "book a flight"), ("k", "3"))): "search_tools: k: Input should be a valid integer",
    ("search_tools", (("task", "book a flight"), ("k", 101))):
        "search_tools: k: Input should be less than or equal to 100",
    ("search_tools", (("task", "book a flight"), ("k", True))): "search_tools: k: Input should be a valid integer",
    ("search_tools", (("task", "book a flight"), ("namespaces", "mail"))):
        "search_tools: namespaces: Input should be a valid list",
    ("search_tools", (("k", 3),)): "search_tools: task: Field required",
    ("record_tool_use", (("task", "x"), ("tool_ids", "mail.send"))):
        "record_tool_use: tool_ids: Input should be a valid list",
    ("record_tool_use", (("task", "x"), ("tool_ids", ("mail.send",)), ("source", "me"))):
        "record_tool_use: source: unknown argument (record_tool_use takes task, tool_ids, outcome)",
}


async def answers_to_arguments(client) -> dict:
    """{call: its error text, or the number of tools found} for WRONG_ARGUMENTS and a few right ones, and the
    bound on k that search_tools' input schema states."""
    answers = {}
    right = [("search_tools", (("task", "book a flight"), ("k", 100))),
             ("search_tools", (("task", "book a flight"), ("k", 2.0))),  # JSON's integer 2, as the HTTP API takes
             ("search_tools", (("task", "send an email"), ("namespaces", ("mail", ""))))]
    for name, arguments in [*WRONG_ARGUMENTS, *right]:
        sent = {key: list(value) if isinstance(value, tuple) else value for key, value in arguments}
        result = await client.call_tool(name, sent)
        answers[name, arguments] = result.content[0].text if result.is_error else len(
            result.structured_content["tools"])
    schema = next(t for t in (await client.list_tools()).tools if t.name == "search_tools").input_schema
    answers["schema"] = (schema["additionalProperties"], schema["properties"]["k"]["maximum"])
    return answers


def expected_answers_to_arguments(tools_found: dict) -> dict:
    from toolscout.serve.schemas import SearchRequest

    http_k = SearchRequest.model_json_schema()["properties"]["k"]["maximum"]
    return {**WRONG_ARGUMENTS, **tools_found, "schema": (False, http_k)}


def test_search_tools_reads_its_arguments_as_the_http_api_reads_a_body(tmp_path):
    from toolscout.serve.mcp import build_mcp_server
    from toolscout.serve.service import ToolService

    ToolScout.from_tools(catalog(), retriever="bm25").save(tmp_path / "idx")
    service = ToolService.open(tmp_path / "idx", fsync=False)

    async def session():
        async with Client(build_mcp_server(service)) as client:
            return await answers_to_arguments(client)

    async def invisible():  # a zero-width space is as blank as white space
        async with Client(build_mcp_server(service)) as client:
            return (await client.call_tool("search_tools", {"task": "\u200b"})).content[0].text

    try:
        answers = anyio.run(session)
        assert anyio.run(invisible).endswith("task must not be blank")
    finally:
        service.close()
    assert answers == expected_answers_to_arguments({  # bm25 finds the two booking tools; and the two mail tools
        ("search_tools", (("task", "book a flight"), ("k", 100))): 2,  # (calendar's, which also says "email",
        ("search_tools", (("task", "book a flight"), ("k", 2.0))): 2,  # is filtered out; "" holds no tool)
        ("search_tools", (("task", "send an email"), ("namespaces", ("mail", "")))): 2})


def test_search_tools_abstains_when_only_always_included_tools_come_back(tmp_path):
    """As POST /search and `toolscout search --json` say it: an always-included tool is no fit for the task."""
    from toolscout.serve.mcp import build_mcp_server
    from toolscout.serve.service import ToolService

    ToolScout.from_tools(catalog(), retriever="bm25").save(tmp_path / "idx")
    service = ToolService.open(tmp_path / "idx", fsync=False, always_include=["mail.send"])

    async def session():
        async with Client(build_mcp_server(service)) as client:
            return [(await client.call_tool("search_tools", {"task": task})).structured_content
                    for task in ("qwxzv plork", "book a flight")]

    try:
        nothing, found = anyio.run(session)
    finally:
        service.close()
    assert ([t["id"] for t in nothing["tools"]], nothing["abstained"]) == (["mail.send"], True)
    assert ([t["id"] for t in found["tools"]][-1], found["abstained"]) == ("mail.send", False)


@pytest.mark.filterwarnings("ignore::toolscout.errors.DegradedResults")  # what the answer says is checked
def test_search_tools_says_when_the_llm_reranker_could_not_rank_the_task(tmp_path):
    """As POST /search says it (trial8 #5): the first stage's tools, and `degraded` naming the stage and why."""
    from fakellm import FakeLLM, Reply

    from toolscout.llm import LLMSettings
    from toolscout.rerank.llm import LLMReranker
    from toolscout.serve.mcp import build_mcp_server
    from toolscout.serve.service import ToolService

    with FakeLLM(responder=lambda request: Reply(status=503)) as llm:
        reranker = LLMReranker(LLMSettings(base_url=llm.url, model="m", timeout=5.0, max_retries=0))
        ToolScout.from_tools(catalog(), retriever="bm25", reranker=reranker).save(tmp_path / "idx")
        service = ToolService.open(tmp_path / "idx", fsync=False)

        async def session():
            async with Client(build_mcp_server(service)) as client:
                return (await client.call_tool("search_tools", {"task": "book a flight"})).structured_content

        try:
            found = anyio.run(session)
        finally:
            service.close()
    assert found["degraded"]["stage"] == "LLM reranker" and found["degraded"]["reason"] == "the LLM answered HTTP 503"
    assert found["tools"] and not found["abstained"]


def test_streamable_http_endpoint_applies_the_callers_token(http_server):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async def search(token):
        transport = streamable_http_client(f"{http_server}/mcp", http_client=httpx2.AsyncClient(
            headers={"authorization": f"Bearer {token}"}))
        async with Client(transport) as client:
            result = await client.call_tool("search_tools", {"task": "book a flight and send an email", "k": 12})
            return {t["namespace"] for t in result.structured_content["tools"]}

    assert anyio.run(search, "mail-only-1") == {"mail"}
    assert {"mail", "travel"} <= anyio.run(search, "everything-1")

    async def record(token):
        transport = streamable_http_client(f"{http_server}/mcp", http_client=httpx2.AsyncClient(
            headers={"authorization": f"Bearer {token}"}))
        async with Client(transport) as client:
            result = await client.call_tool("record_tool_use", {"task": "archive old mail", "tool_ids": ["mail.search"]})
            return result.is_error, result.structured_content or result.content[0].text

    refused = anyio.run(record, "everything-1")  # a read-only token without feedback permission
    assert refused[0] and refused[1].endswith("may not post tool-use feedback")
    assert anyio.run(record, "feedback-mail-1") == (False, {"learned": 1, "duplicate": False, "unknown_tools": [],
                                                        "held_by_freeze": 0, "failures": 0, "incidental": 0,
                                                        "capped": 0, "note": None})
    r = httpx.post(f"{http_server}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 401


def test_index_tools_of_live_stdio_servers_under_their_names(tmp_path, capsys):
    script = tmp_path / "server.py"
    script.write_text(FIXTURE_SERVER)
    out = tmp_path / "live"
    code = cli(["index", f"mcp:{sys.executable} {script} alpha", f"mcp:{sys.executable} {script} beta",
                "--out", str(out), "--retriever", "bm25"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "2 tools (mcp)" in err
    scout = ToolScout.load(out)
    assert sorted(t.id for t in scout.tools) == ["alpha.get_forecast", "alpha.search", "beta.get_forecast",
                                                  "beta.search"]
    alpha = scout.get("alpha.search")
    assert alpha.namespace == "alpha" and alpha.parameters["properties"]["query"]["type"] == "string"
    hits = scout.search("search", k=4)
    assert {h.tool.id for h in hits[:2]} == {"alpha.search", "beta.search"} and hits[0].match == "name"
    tools = load_tools(f"mcp:{sys.executable} {script} gamma", namespace="docs")
    assert sorted(t.id for t in tools) == ["docs.get_forecast", "docs.search"]


def test_index_tools_of_an_mcp_url(http_server):
    from toolscout.errors import CatalogError
    from toolscout.ingest.live_mcp import load_live_tools

    tools = load_live_tools(f"{http_server}/mcp", headers={"authorization": "Bearer everything-1"})
    assert [t.id for t in tools] == ["toolscout.search_tools", "toolscout.record_tool_use"]
    # the prefix is for commands, but an endpoint written with it is one (it was run as a command 'http://...')
    prefixed = load_live_tools(f"mcp:{http_server}/mcp", headers={"authorization": "Bearer everything-1"})
    assert [t.to_dict() for t in prefixed] == [t.to_dict() for t in tools]
    assert tools[0].parameters["required"] == ["task"] and tools[0].returns is not None
    assert tools[1].parameters["required"] == ["task", "tool_ids"]
    with pytest.raises(CatalogError, match="could not list"):
        load_tools(f"{http_server}/mcp")  # this server wants a token
    with pytest.raises(CatalogError, match="No such file|not found|could not list"):
        load_tools("mcp:/nonexistent/mcp-server --flag")
