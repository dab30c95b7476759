"""One deployment model: a pipeline indexed with `toolscout index --store postgresql://...` is the pipeline the
same flags index into a directory, and ranks identically through every entry point (Python, the CLI, HTTP and
MCP), before and after feedback, for pipelines other than the default (a hybrid with other weights and fusion,
and one with a reranker); what the store cannot serve is refused when indexing, naming the setting."""

import json
import os
import re
import sys
import zlib

import anyio
import httpx
import numpy as np
import pytest
from fakellm import FakeLLM, Reply, message_text
from pgtest import assert_same_ranking, new_table, postgres_uri, spec
from servers import start_server, stop
from traffic import RAIN_TASK, mixed

from toolscout import ToolScout
from toolscout.cli import main

pytestmark = pytest.mark.slow  # starts PostgreSQL, servers and MCP servers

K = 5
QUERIES = ["what is the weather tomorrow in Paris", "book me a flight to Rome and a hotel near the station",
           "send an email to my boss", "how much is 100 dollars in euros", "schedule a meeting with Ann on Monday",
           "open the notes file", RAIN_TASK, "email the team about the report"]
FEEDBACK = mixed({"rain": "get_stock_quote", "mail": "send_email", "calendar": "create_event", "files": "read_file",
                  "facts": "list_events"}, 16, "agents")  # ids of an OpenAI-format catalog: the tools' names


def judge(request: dict) -> Reply:
    """An LLM reranker's judge that grades (task, tool) by the words they share, with a small term from the
    document's checksum so no two tools tie: deterministic, so both deployments get the same answers."""
    text = message_text(request)
    task = re.search(r"Task:\n(.*?)\n\nTool documentation:", text, re.S).group(1)
    doc = re.search(r"Tool documentation:\n(.*?)\n\nDoes this tool", text, re.S).group(1)
    words = set(re.findall(r"[a-z]{3,}", task.lower()))
    shared = len(words & set(re.findall(r"[a-z]{3,}", doc.lower())))
    l_true = -2.0 / (1 + shared) - (zlib.crc32(doc.encode()) % 97) / 1000
    l_false = -0.7
    top = [{"token": "true", "logprob": l_true}, {"token": "false", "logprob": l_false}]
    return Reply("true" if l_true > l_false else "false",
                 logprobs=[{"token": "true", "logprob": max(l_true, l_false), "bytes": None, "top_logprobs": top}])


@pytest.fixture(scope="module")
def llm():
    with FakeLLM(responder=judge) as fake:
        yield fake


@pytest.fixture(scope="module")
def catalog_file(tmp_path_factory):
    from conftest import sample_tools

    path = tmp_path_factory.mktemp("catalog") / "tools.json"
    path.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description,
                                                                     "parameters": t.parameters}}
                                for t in sample_tools()]))
    return path


def pipeline_flags(name, tmp_path, llm):
    if name == "default":
        return []
    if name == "hybrid-rrf":  # other weights, another fusion, no request splitting
        return ["-o", "weights=[2, 1]", "-o", "fusion=rrf", "-o", "rrf_k=10", "--no-split"]
    config = tmp_path / "judge.yaml"
    config.write_text(f"base_url: {llm.url}\nmodel: judge\nmax_retries: 0\ntimeout: 20\n")
    return ["--rerank", f"llm:{config}", "--rerank-depth", "8"]


# ------------------------------------------------------------------------------------------ entry points

def by_python(target):
    scout = ToolScout.load(target)
    return [[(h.tool.id, h.score) for h in hits] for hits in scout.search(QUERIES, k=K)]


def by_cli(target, capsys):
    capsys.readouterr()
    assert main(["search", str(target), *QUERIES, "-k", str(K), "--json"]) == 0
    return [[(h["id"], h["score"]) for h in found["hits"]] for found in json.loads(capsys.readouterr().out)]


def by_http(args):
    proc, url = start_server(args)
    try:
        return [[(h["id"], h["score"]) for h in httpx.post(f"{url}/search", json={"query": q, "k": K}, timeout=60)
                 .json()["results"][0]["hits"]] for q in QUERIES]
    finally:
        stop(proc)


def by_mcp(args):
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "toolscout.serve", *args, "--mcp"],
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"})  # PYTHONPATH: this checkout

    async def session():
        async with Client(params) as client:
            out = []
            for q in QUERIES:
                result = await client.call_tool("search_tools", {"task": q, "k": K})
                assert not result.is_error
                out.append([(t["id"], t["score"]) for t in result.structured_content["tools"]])
            return out

    return anyio.run(session)


def ids(ranked):
    """The ids of (id, score) lists."""
    return [[tool_id for tool_id, _score in hits] for hits in ranked]


def assert_same(local, shared, what):
    assert [[i for i, _s in hits] for hits in shared] == [[i for i, _s in hits] for hits in local], what
    for a, b in zip(local, shared):
        np.testing.assert_allclose([s for _i, s in b], [s for _i, s in a], atol=1e-5, err_msg=what)


def every_entry_point(local, pointer, store_spec, capsys, when, servers=True):
    """The hits of QUERIES from each deployment through each entry point must be the same, in the same order.
    `servers=False`: the in-process entry points only (Python, CLI), which build the same pipeline."""
    for name, search in (("python", by_python), ("cli", lambda t: by_cli(t, capsys))):
        assert_same(search(local), search(pointer), f"{name}, {when}")
    if not servers:
        return
    assert_same(by_http([str(local), "--no-fsync"]), by_http(["--store", store_spec]), f"http, {when}")
    with capsys.disabled():  # the SDK hands the server's stderr a real file
        assert_same(by_mcp([str(local), "--no-fsync"]), by_mcp([str(pointer)]), f"mcp, {when}")


# ------------------------------------------------------------------------------------------ the tests

@pytest.mark.parametrize("pipeline", ["default", "hybrid-rrf", "reranked"])
def test_index_store_ranks_as_the_same_pipeline_indexed_locally_everywhere(pipeline, catalog_file, tmp_path, llm,
                                                                           capsys):
    flags = pipeline_flags(pipeline, tmp_path, llm)
    local, pointer = tmp_path / "local", tmp_path / "pointer"
    store_spec = spec(postgres_uri(), new_table(), "acme")
    assert main(["index", str(catalog_file), "--out", str(local), *flags]) == 0
    assert main(["index", str(catalog_file), "--out", str(pointer), "--store", store_spec, *flags]) == 0
    # the servers are started once, after feedback, where their pipelines have the most to get right (the
    # first stage as above, plus the learned channel); each start costs seconds of model loading
    every_entry_point(local, pointer, store_spec, capsys, "before feedback", servers=False)
    # one saved configuration: the directory's, the pointer's and the table's
    scout, shared = ToolScout.load(local), ToolScout.load(pointer)
    assert shared.spec == scout.spec
    # the tools as indexed: their parameters in their order (part of the text a reranker reads, and agents see)
    assert [list(t.parameters["properties"]) for t in shared.tools] == [list(t.parameters["properties"])
                                                                        for t in scout.tools]
    if pipeline == "default":  # what `index --store` saved before: dense alone, tasks never split
        assert shared.retriever.name == "hybrid" and shared.intents is not None
    elif pipeline == "hybrid-rrf":
        assert scout.spec.retriever["settings"]["weights"] == [2.0, 1.0] and scout.spec.intents is None
        assert shared.retriever.fusion == "rrf" and shared.intents is None
        default = ToolScout.from_tools(scout.tools, encoder=scout.retriever.components[1].encoder)
        assert ([[h.tool.id for h in hits] for hits in default.search(QUERIES, k=K)]
                != ids(by_python(local)))  # the test tells the default pipeline apart
    else:
        assert shared.reranker.name == "llm" and shared.reranker.depth == 8
        assert shared.spec.reranker["settings"]["base_url"] == llm.url
    untaught = by_python(local)
    log = tmp_path / "feedback.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in FEEDBACK))
    assert main(["learn", str(local), str(log)]) == 0
    assert main(["learn", str(pointer), str(log)]) == 0  # into the database
    assert ids(by_python(local)) != ids(untaught)  # learning is in play
    every_entry_point(local, pointer, store_spec, capsys, "after feedback")


def test_a_migrated_directory_keeps_its_pipeline(tmp_path, tools, encoder):
    from toolscout.postgres import migrate_directory
    from toolscout.serve import ToolService

    local = ToolScout.from_tools(tools, encoder=encoder, weights=[1, 1], fusion="score", intents=None)
    local.save(tmp_path / "local")
    store_spec = spec(postgres_uri(), new_table())
    migrate_directory(tmp_path / "local", store_spec)
    with ToolService.open(store_spec, encoder=encoder, batch_workers=0) as service:
        pipeline = service.storage.tenant(None).pipeline()
        assert pipeline.spec == local.spec and pipeline.retriever.fusion == "score"
        for q in QUERIES:
            assert_same_ranking(service.search(q, K, min_score=None), local.search(q, k=K))


def test_what_postgresql_cannot_serve_is_refused_naming_the_setting(catalog_file, tmp_path, tools, encoder, capsys):
    from toolscout.postgres import migrate_directory
    from toolscout.serve import ToolService
    from toolscout.serve.errors import ServiceError
    from toolscout.store.pgvector import PgStoreError

    store_spec = spec(postgres_uri(), new_table())
    out = str(tmp_path / "idx")
    for retriever, named in (("tool2vec", "retriever 'tool2vec'"), ("bm25", "0 dense retrievers")):
        assert main(["index", str(catalog_file), "--out", out, "--store", store_spec, "--retriever", retriever]) == 1
        err = capsys.readouterr().err
        assert named in err and "PostgreSQL serves first stages of bm25 and one dense retriever" in err
    ToolScout.from_tools(tools, retriever="tool2vec", encoder=encoder).save(tmp_path / "t2v")
    with pytest.raises(PgStoreError, match="retriever 'tool2vec' \\(the retriever\\): its index is not rows"):
        migrate_directory(tmp_path / "t2v", store_spec)
    # a table serves one pipeline: another one is refused, naming each setting that differs
    assert main(["index", str(catalog_file), "--out", out, "--store", store_spec]) == 0
    assert main(["index", str(catalog_file), "--out", out, "--store", store_spec, "-o", "weights=[1,1]"]) == 1
    err = capsys.readouterr().err
    assert "serves every tenant with another pipeline" in err
    assert "retriever.settings.weights: [1.0, 3.0] there, [1.0, 1.0] here" in err
    assert "--search dense|hybrid" not in err  # switching the first stage would not change its weights
    # a directory that points at the database is no directory to journal writes in
    with pytest.raises(ServiceError, match="was indexed into PostgreSQL"):
        ToolService.open(out)


def test_a_table_made_reading_descriptions_as_written_keeps_that_reading(catalog_file, tmp_path, tools, encoder):
    """A table indexed before descriptions were read as plain text (its view saved without `descriptions`, as
    that code saved it): `toolscout index --store` with default flags joins it and keeps its reading, instead
    of refusing the table's own pipeline; vectors made reading them as plain text are refused, naming both."""
    from toolscout.postgres import index_catalog, migrate_directory
    from toolscout.spec import PipelineSpec, read_pipeline_config
    from toolscout.store.pg_catalog import PgCatalog
    from toolscout.store.pgvector import PgSpec, PgStoreError
    from toolscout.tool import TextView

    uri, table = postgres_uri(), new_table()

    def table_view() -> dict:
        catalog = PgCatalog.from_spec(PgSpec.parse(spec(uri, table, "first")), encoder.dim)
        try:
            return catalog.database.config()["view"]
        finally:
            catalog.close()

    catalog = PgCatalog.from_spec(PgSpec.parse(spec(uri, table, "first")), encoder.dim)
    try:
        index_catalog(catalog, tools, encoder, view=TextView(descriptions="as-written"))
    finally:
        catalog.close()
    saved = table_view()
    assert "descriptions" not in saved and TextView.from_dict(saved).descriptions == "as-written"
    pointer = tmp_path / "pointer"
    assert main(["index", str(catalog_file), "--out", str(pointer), "--store", spec(uri, table, "second")]) == 0
    assert table_view() == saved
    _live, config = read_pipeline_config(pointer)
    served = PipelineSpec.from_dict(config["pipeline"])  # what the pointer records and its servers build
    views = [leaf.node["settings"]["view"] for leaf in served.leaves() if "view" in leaf.node["settings"]]
    assert views and all(TextView.from_dict(v).descriptions == "as-written" for v in views)
    ToolScout.from_tools(tools, encoder=encoder).save(tmp_path / "plain")
    with pytest.raises(PgStoreError, match="reads tool descriptions as-written .* these vectors read them plain"):
        migrate_directory(tmp_path / "plain", spec(uri, table, "third"))
