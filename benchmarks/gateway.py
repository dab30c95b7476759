"""The gateway in front of a real catalog served by many stdio servers (docs/gateway.md has the figures).

    python benchmarks/gateway.py                        # metatool's tools on 20 servers, every test task
    python benchmarks/gateway.py --set ../shared/data/bfcl --servers 24 --max-queries 1000 --json out.json
    python benchmarks/gateway.py --sections stdio_startup,hosts   # a host's first search; hosts sharing an index

The set's tools are dealt to `--servers` stub MCP servers (tests/fixtures/mcp_stub.py: each serves its share
of the tool list and answers a call by echoing what it received), and a real `toolscout gateway` stands in
front of them. Four measurements, each through the official MCP SDK client:

1. quality: nDCG@10 / Recall@10 of `search_tools` through the gateway over the test tasks, next to
   `toolscout eval` on the same catalog (the tools the gateway indexed, in its order, written as a benchmark
   folder);
2. call forwarding: `call_tool` through a stdio gateway against the same call made directly to the
   same upstream over stdio, alternated, one run: p50 and p99 of each and of the difference;
3. start-up: seconds from starting the gateway to its first answered search and to every upstream
   connected, on a new index and again on a restart over the index it left;
4. learning from calls: an agent searches each task of one half and calls its gold tools (no /feedback, no
   record_tool_use); nDCG@10 of the other half before and after, over all of its tasks and over those
   whose gold tools no call touched;
5. a host's first search (`stdio_startup`): the SDK client launches a stdio gateway and searches the first
   test task as soon as the handshake is done: seconds to the handshake and to that search's answer, its
   hits and the servers it named not searchable; on a new index, on the index it kept, and on a new index
   with `--search-wait 0` (what a host got before searches waited for starting servers);
6. hosts sharing an index (`hosts`): a second host's gateway attaches to the first's (seconds to its
   handshake and first search); the first quits (seconds until its gateway has exited), then the second
   searches: seconds to that answer, which comes once the second's gateway has taken the index over.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from common import DEFAULT_DATA, STUB, deal_catalog  # noqa: E402
from servers import free_port, stop  # noqa: E402  (tests/servers.py: a free loopback port, a clean stop)

K = 10


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default=str(DEFAULT_DATA / "metatool"), help="a benchmark folder (default metatool)")
    parser.add_argument("--servers", type=int, default=20, help="stub servers the tools are dealt to (default 20)")
    parser.add_argument("--max-queries", type=int, default=None, help="use the first N test tasks (default all)")
    parser.add_argument("--calls", type=int, default=2000, help="calls timed in the forwarding section")
    parser.add_argument("--sections", default="quality,forwarding,startup,learning,stdio_startup,hosts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="toolscout-gateway-bench-"))
    catalog = deal_catalog(Path(args.set), args.servers, work, args.max_queries)
    print(f"{catalog['set']}: {catalog['tools']} tools on {args.servers} servers, {len(catalog['tasks'])} test tasks; "
          f"work folder {work}", file=sys.stderr)
    sections = args.sections.split(",")
    figures: dict = {"set": catalog["set"], "servers": args.servers, "tools": catalog["tools"],
                     "tasks": len(catalog["tasks"])}
    if "startup" in sections or "quality" in sections or "learning" in sections:
        figures.update(http_sections(catalog, work, sections, args.seed))
    if "forwarding" in sections:
        figures["forwarding"] = anyio.run(forwarding, catalog, work, args.calls)
    if "stdio_startup" in sections:
        figures["stdio_startup"] = stdio_startups(catalog, work)
    if "hosts" in sections:
        figures["hosts"] = anyio.run(shared_hosts, catalog, work)
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


# ------------------------------------------------------------------------------- the HTTP sections

def http_sections(catalog: dict, work: Path, sections: list[str], seed: int) -> dict:
    out: dict = {}
    index = work / "index"
    proc, url, out["startup_new_index"] = start_timed(catalog, index)
    try:
        if "quality" in sections:
            ranked = anyio.run(search_all, url, [text for text, _ in catalog["tasks"]])
        if "learning" in sections:
            out["learning"] = learning(catalog, url, proc, seed)  # changes what tools learned, not the tools
    finally:
        stop(proc)
    if "quality" in sections:
        out["quality"] = quality(catalog, ranked, export_catalog(index, catalog["tasks"], work / "as-indexed"))
    if "startup" in sections:
        proc, url, out["startup_restart"] = start_timed(catalog, index)
        stop(proc)
    return out


def start_timed(catalog: dict, index: Path) -> tuple[subprocess.Popen, str, dict]:
    """Start a gateway over HTTP; seconds to its first answered search and to all upstreams up."""
    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "toolscout", "gateway", str(catalog["config"]), "--index",
                             str(index), "--port", str(port), "--no-fsync", "--feedback-rate", "0"],
                            stderr=open(index.parent / "gateway.log", "a"))
    url = f"http://127.0.0.1:{port}"
    first = poll(lambda: answered(url), proc)
    first_search = time.perf_counter() - started
    poll(lambda: all_up(url, catalog["servers"]), proc)
    return proc, url, {"first_search_s": round(first_search, 2),
                       "all_upstreams_s": round(time.perf_counter() - started, 2), "first_hits": first}


def answered(url: str) -> int:
    try:
        hits = httpx.post(f"{url}/search", json={"query": "find a tool", "k": 3}, timeout=30).json()
    except httpx.HTTPError:
        return 0
    return len(hits["results"][0]["hits"])


def all_up(url: str, names: list[str]) -> bool:
    state = {u["name"]: u["state"] for u in httpx.get(f"{url}/health", timeout=30).json()["upstreams"]}
    return all(state.get(n) == "up" for n in names)


def poll(check, proc: subprocess.Popen, timeout: float = 900.0):
    deadline = time.perf_counter() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit("the gateway exited; see gateway.log in the work folder")
        try:
            value = check()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        if time.perf_counter() > deadline:
            raise SystemExit("timed out waiting for the gateway")
        time.sleep(0.05)


def quality(catalog: dict, ranked: list[list[str]], folder: Path) -> dict:
    """search_tools through the gateway (`ranked`), and `toolscout eval` on the tools the gateway indexed."""
    through = scores(ranked, [gold for _, gold in catalog["tasks"]])
    report = folder.parent / "eval.json"
    subprocess.run([sys.executable, "-m", "toolscout", "eval", str(folder), "-k", str(K), "--json", str(report)],
                   check=True, stdout=subprocess.DEVNULL)
    evaluated = json.loads(report.read_text())["sets"][folder.name]
    return {"through_gateway": through, "toolscout_eval": {m: round(evaluated[f"{m}@{K}"], 2)
                                                           for m in ("ndcg", "recall")}}


async def search_all(url: str, tasks: list[str]) -> list[list[str]]:
    from mcp import Client

    out = []
    async with Client(f"{url}/mcp") as client:
        for task in tasks:
            result = await client.call_tool("search_tools", {"task": task, "k": K})
            out.append([t["id"] for t in result.structured_content["tools"]])
    return out


def scores(ranked: list[list[str]], golds: list[list[str]]) -> dict:
    from toolscout.eval.metrics import ndcg_at_k, recall_at_k

    n = max(1, len(golds))
    return {"ndcg": round(100 * sum(ndcg_at_k(r, g, K) for r, g in zip(ranked, golds)) / n, 2),
            "recall": round(100 * sum(recall_at_k(r, g, K) for r, g in zip(ranked, golds)) / n, 2),
            "tasks": len(golds)}


def export_catalog(index: Path, tasks: list, folder: Path) -> Path:
    """The tools exactly as the gateway indexed them, in its index's order (rankings break ties by catalog
    order, and the gateway's is the order its upstreams listed in), with the tasks, as a benchmark folder.
    Read from the index the stopped gateway left (its last snapshot holds every write)."""
    from toolscout.benchmark_sets import Query, read_jsonl, write_benchmark
    from toolscout.spec import read_pipeline_config
    from toolscout.tool import Tool

    snapshot, _config = read_pipeline_config(index)
    tools = [Tool.from_dict(row) for _n, row in read_jsonl(snapshot / "tools.jsonl")]
    write_benchmark(folder, tools, [Query(f"q{i}", text, tuple(gold), "test") for i, (text, gold) in enumerate(tasks)])
    return folder


def learning(catalog: dict, url: str, proc: subprocess.Popen, seed: int) -> dict:
    """One half's tasks searched and their gold tools called; the other half scored before and after."""
    tasks = list(catalog["tasks"])
    random.Random(seed).shuffle(tasks)
    taught, held_out = tasks[: len(tasks) // 2], tasks[len(tasks) // 2:]
    called = {t for _, gold in taught for t in gold}
    untouched = [(text, gold) for text, gold in held_out if not set(gold) & called]
    before = anyio.run(search_all, url, [text for text, _ in held_out])
    calls = anyio.run(agent, url, taught)
    poll(lambda: httpx.get(f"{url}/health").json()["learning_from_calls"]["pending"] == 0, proc)
    after = anyio.run(search_all, url, [text for text, _ in held_out])
    index = {text: i for i, (text, _) in enumerate(held_out)}
    pick = lambda ranked, subset: [ranked[index[text]] for text, _ in subset]  # noqa: E731
    learned = httpx.get(f"{url}/health").json()["learning_from_calls"]
    return {"taught_tasks": len(taught), "calls": calls, "learned": learned,
            "held_out": {"before": scores(before, [g for _, g in held_out]),
                         "after": scores(after, [g for _, g in held_out])},
            "held_out_gold_never_called": {"before": scores(pick(before, untouched), [g for _, g in untouched]),
                                           "after": scores(pick(after, untouched), [g for _, g in untouched])}}


async def agent(url: str, tasks: list) -> int:
    """Search each task, then call each of its gold tools (what a successful agent does)."""
    from mcp import Client

    calls = 0
    async with Client(f"{url}/mcp") as client:
        for text, gold in tasks:
            await client.call_tool("search_tools", {"task": text, "k": K})
            for tool_id in gold:
                result = await client.call_tool("call_tool", {"name": tool_id, "arguments": {}})
                assert not result.is_error, result.content[0].text
                calls += 1
    return calls


# ------------------------------------------------------------------- a host's first search, shared hosts

def stdio_params(catalog: dict, index: Path, *flags: str):
    from mcp import StdioServerParameters

    return StdioServerParameters(command=sys.executable, args=[
        "-m", "toolscout", "gateway", str(catalog["config"]), "--index", str(index), "--no-fsync", *flags],
        env={**os.environ, "HF_HUB_OFFLINE": "1"})


def stdio_startups(catalog: dict, work: Path) -> dict:
    """A host's first search on a new index, on the index that run kept, and on a new index without waiting."""
    index = work / "stdio-index"
    return {"new_index": anyio.run(first_search, catalog, index),
            "kept_index": anyio.run(first_search, catalog, index),
            "new_index_search_wait_0": anyio.run(first_search, catalog, work / "stdio-index-nowait",
                                                 ("--search-wait", "0"))}


async def first_search(catalog: dict, index: Path, flags: tuple = ()) -> dict:
    """Launch a stdio gateway and search the first test task as soon as the handshake is done."""
    from mcp import Client

    task, gold = catalog["tasks"][0]
    started = time.perf_counter()
    async with Client(stdio_params(catalog, index, *flags)) as client:
        handshake = time.perf_counter() - started
        result = await client.call_tool("search_tools", {"task": task, "k": K})
        answered = time.perf_counter() - started
    found = result.structured_content
    return {"handshake_s": round(handshake, 2), "first_search_s": round(answered, 2), "hits": len(found["tools"]),
            "gold_in_hits": any(t["id"] in gold for t in found["tools"]),
            "not_searchable": len(found.get("not_searchable", []))}


async def shared_hosts(catalog: dict, work: Path) -> dict:
    """A second host's gateway attaching to the first's, and taking the index over when the first quits."""
    from mcp import Client

    index, task = work / "stdio-index", catalog["tasks"][0][0]  # the index the first-search section kept
    out: dict = {}
    first_quit, second_quit, first_done = anyio.Event(), anyio.Event(), anyio.Event()
    clients: dict = {}

    async def host(name, quit_event, ready, done=None):
        try:
            async with Client(stdio_params(catalog, index)) as client:
                clients[name] = client
                ready.set()
                await quit_event.wait()
        finally:
            if done is not None:
                done.set()

    async with anyio.create_task_group() as hosts:
        first_ready, second_ready = anyio.Event(), anyio.Event()
        hosts.start_soon(host, "first", first_quit, first_ready, first_done)
        await first_ready.wait()
        for name in catalog["servers"]:  # every upstream up (a call waits for its server): nothing else runs
            if catalog["lists"][name]:
                tool = catalog["lists"][name][0]["name"]
                result = await clients["first"].call_tool("call_tool", {"name": f"{name}.{tool}", "arguments": {}})
                assert not result.is_error, result.content[0].text
        started = time.perf_counter()
        hosts.start_soon(host, "second", second_quit, second_ready)
        await second_ready.wait()
        out["attach_handshake_s"] = round(time.perf_counter() - started, 2)
        result = await clients["second"].call_tool("search_tools", {"task": task, "k": K})
        out["attach_first_search_s"] = round(time.perf_counter() - started, 2)
        out["attach_first_search_hits"] = len(result.structured_content["tools"])
        started = time.perf_counter()
        first_quit.set()
        await first_done.wait()
        out["first_quit_s"] = round(time.perf_counter() - started, 2)  # its gateway stopped its servers and exited
        started = time.perf_counter()  # the second's next search: through the gateway that took the index over
        result = await clients["second"].call_tool("search_tools", {"task": task, "k": K})
        out["take_over_search_s"] = round(time.perf_counter() - started, 2)
        out["take_over_search_hits"] = len(result.structured_content["tools"])
        second_quit.set()
    return out


# ---------------------------------------------------------------------------------- call forwarding

async def forwarding(catalog: dict, work: Path, n: int) -> dict:
    """Alternate the same echo call directly to one upstream and through a stdio gateway."""
    from mcp import Client, StdioServerParameters

    server = catalog["servers"][0]
    tool = catalog["lists"][server][0]["name"]
    direct = StdioServerParameters(command=sys.executable, args=[str(STUB), server, "--tools",
                                                                 str(work / f"{server}.json"), "--no-builtins"])
    through = StdioServerParameters(command=sys.executable, args=[
        "-m", "toolscout", "gateway", str(catalog["config"]), "--index", str(work / "index"), "--no-fsync",
        "--learn-from-calls", "off"], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    timings: dict[str, list[float]] = {"direct": [], "gateway": []}
    async with Client(direct) as plain, Client(through) as gateway:
        for name in catalog["servers"]:  # every upstream up and indexed: nothing else runs while timing
            if catalog["lists"][name]:
                await wait_listed(gateway, f"{name}.{catalog['lists'][name][0]['name']}")
        for i in range(n + 50):
            for name, call in (("direct", lambda: plain.call_tool(tool, {"x": i})),
                               ("gateway", lambda: gateway.call_tool("call_tool", {"name": f"{server}.{tool}",
                                                                                   "arguments": {"x": i}}))):
                started = time.perf_counter()
                result = await call()
                elapsed = (time.perf_counter() - started) * 1000
                assert not result.is_error, result.content[0].text
                if i >= 50:  # the first calls warm both paths up
                    timings[name].append(elapsed)
    return summarise(timings)


async def wait_listed(gateway, tool_id: str) -> None:
    for _ in range(3000):
        result = await gateway.call_tool("search_tools", {"task": tool_id, "k": 1})
        if [(t["id"], t["available"]) for t in result.structured_content["tools"]] == [(tool_id, True)]:
            return
        await anyio.sleep(0.1)
    raise SystemExit(f"{tool_id} never appeared in the gateway's search")


def summarise(timings: dict[str, list[float]]) -> dict:
    def q(values: list[float], p: float) -> float:
        return round(statistics.quantiles(values, n=100)[int(p) - 1], 3)

    difference = [g - d for g, d in zip(timings["gateway"], timings["direct"])]
    out = {name: {"p50_ms": q(v, 50), "p99_ms": q(v, 99), "calls": len(v)} for name, v in timings.items()}
    out["overhead"] = {"p50_ms": round(out["gateway"]["p50_ms"] - out["direct"]["p50_ms"], 3),
                       "p99_ms": round(out["gateway"]["p99_ms"] - out["direct"]["p99_ms"], 3),
                       "paired_difference_p50_ms": q(difference, 50)}
    return out


if __name__ == "__main__":
    sys.exit(main())
