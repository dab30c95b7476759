"""toolscout and the alternatives, side by side, in one run (a script, not a test).

    .venv/bin/python benchmarks/peers.py [--sets apibank,bfcl] [--systems bm25s,llamaindex]
                                         [--max-queries 200] [--json FILE] [--markdown FILE]

Every system searches the same labelled sets of ../shared/data (test splits), each set against its own catalog
(as `toolscout eval` does), with the same queries in the same order, one at a time, k=10. Each system runs in
a fresh process of its own: toolscout's systems in the interpreter running this script (toolscout's own
environment, importing the same toolscout), the peers in the peers' environment (`--python`, default
.venv-peers/bin/python: see the README for how to make it). So each peak RSS (getrusage high-water mark of
that process) is the system's own. The child
(benchmarks/peer_systems.py, one adapter per system) returns top-10 tool ids; this script scores them all with
the same code, toolscout.eval.metrics: nDCG@10 (binary gains), Recall@10 and Completeness@10 (every gold tool
in the top 10), per set and as the macro mean.

Systems see the same tool information: id, name, description and parameters; each reads what its documented
usage reads (the table says what). Names that repeat within a set (bfcl, gorilla_*, rotbench) get a `_2`,
`_3`... suffix for every system, because MCP servers and LlamaIndex key tools by name. The children never see
the labels.

toolscout's shipped model was trained on the train splits of some sets (TRAINED_ON): their column headers get
an asterisk, and the headline is the macro over the sets that nothing was trained on, so the comparison is fair
to peers that learn nothing.

Build time is the per-catalog index build plus one warm-up query (so an index built lazily on the first search
counts); setup is one-time work per process (loading an embedding model); latency is p50/p99 over all timed
queries of all sets, wall clock, and the p50 of the process CPU time per query (all threads: far less
sensitive than wall clock to other jobs sharing the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_DATA, machine_line, percentile, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).resolve().parent / "peer_systems.py"
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
K = 10
METRICS = ("ndcg", "recall", "completeness")
TRAINED_ON = ("apibank", "gorilla_torchhub", "metatool", "rotbench", "sealtools", "toollens")


@dataclass(frozen=True)
class Entry:
    label: str
    reads: str  # what the system reads of a tool
    usage: str  # how it is used, and where that usage is documented
    peer: bool = True  # runs in the peers' environment; False: in toolscout's own (this script's interpreter)


SYSTEMS = {
    "toolscout-default": Entry(
        "toolscout (default pipeline)", "name, description, parameters",
        "`ToolScout.from_tools(tools).search(task, k=10)`: whatever `toolscout.defaults` says at run time",
        peer=False),
    "toolscout-bm25": Entry(
        "toolscout BM25", "name, description, parameters", '`ToolScout.from_tools(tools, retriever="bm25")`',
        peer=False),
    "toolscout-dense": Entry(
        "toolscout dense", "name, description, parameters",
        '`ToolScout.from_tools(tools, retriever="dense")` (its default encoder)', peer=False),
    "fastmcp-bm25": Entry(
        "fastmcp BM25SearchTransform", "name, description, parameter names + descriptions",
        "a FastMCP server with `add_transform(BM25SearchTransform(max_results=10))`, searched by an MCP client "
        "calling `search_tools(query=task)` (gofastmcp.com/servers/transforms/tool-search)"),
    "fastmcp-regex": Entry(
        "fastmcp RegexSearchTransform †", "name, description, parameter names + descriptions",
        "the same server with `RegexSearchTransform(max_results=10)`, `search_tools(pattern=task)`"),
    "bm25s": Entry(
        "bm25s (plain)", "name, description, parameter names + descriptions (one string)",
        '`bm25s.tokenize(texts, stopwords="en", stemmer=Stemmer("english"))`, `BM25().index`, '
        "`retrieve(k=10)` (its README quickstart)"),
    "llamaindex": Entry(
        "LlamaIndex ObjectIndex (MiniLM)", "name, description, parameters (as its tool node text)",
        "`McpToolSpec(...).to_tool_list_async()` → `ObjectIndex.from_objects(tools, index_cls=VectorStoreIndex, "
        "embed_model=HuggingFaceEmbedding(MiniLM))` → `as_retriever(similarity_top_k=10)` "
        "(developers.llamaindex.ai, examples/objects/object_index)"),
    "langgraph-bigtool": Entry(
        "langgraph-bigtool retrieve_tools (MiniLM)", '"name: description"',
        'its README: `InMemoryStore(index={embed, dims, fields: ["description"]})`, one `put` per tool, '
        "the `retrieve_tools` tool from `get_default_retrieval_tool(limit=10)`"),
}

# alternatives that cannot run here at all, and why (they still get a row)
CANNOT_RUN = {
    "fastmcp JevSearchTransform (experimental)": (
        "ranks tools with TypeSafe's hosted Jev model: needs TYPESAFE_API_KEY and the internet "
        "(fastmcp/experimental/transforms/jev_search.py); neither is available here"),
    "langgraph-bigtool agent end to end": (
        "`create_agent` needs a chat LLM to write the retrieval query and pick tools; no LLM or API key here, "
        "so only its retrieval step (the `retrieve_tools` row) is measured, given the task text as the query"),
}

FOOTNOTES = [
    ("† fastmcp's regex search tool takes a regex pattern that the agent's LLM writes; no LLM is available here, so "
     "it gets the task text itself as the pattern (what an agent passing the task through would get). Matches come "
     "back in catalog order, not ranked; a sentence used as a pattern rarely matches anything."),
]


# ------------------------------------------------------------------------------------------ data


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def labelled_sets(data_dir: Path) -> list[str]:
    """Sets under `data_dir` with labelled test queries (corpus-only folders have none)."""
    names = []
    for folder in sorted(p.parent for p in data_dir.glob("*/tools.jsonl")):
        queries = folder / "queries.jsonl"
        if queries.exists() and any(q.get("split") == "test" and q.get("labels") for q in read_jsonl(queries)):
            names.append(folder.name)
    if not names:
        raise SystemExit(f"no benchmark sets with labelled test queries under {data_dir}; pass --data DIR")
    return names


def unique_names(rows: list[dict]) -> list[str]:
    """Each tool's name, with `_2`, `_3`... on later repeats of a name, and no clash with an existing name."""
    taken = {r["name"] for r in rows}
    seen: Counter = Counter()
    out = []
    for r in rows:
        name = r["name"]
        seen[name] += 1
        if seen[name] > 1:
            n = seen[name]
            while f"{name}_{n}" in taken:
                n += 1
            name = f"{name}_{n}"
            taken.add(name)
        out.append(name)
    return out


def load_set(folder: Path, max_queries: int | None) -> dict:
    """Catalog rows and test queries of one set; the first `max_queries` test queries, as `toolscout eval`."""
    if not (folder / "tools.jsonl").exists():
        raise SystemExit(f"{folder}: not a benchmark folder (no tools.jsonl)")
    rows = read_jsonl(folder / "tools.jsonl")
    names = unique_names(rows)
    tools = [{"id": r["id"], "name": n, "description": r.get("description") or "", "parameters": r.get("parameters")}
             for r, n in zip(rows, names, strict=True)]
    queries = [q for q in read_jsonl(folder / "queries.jsonl") if q.get("split") == "test" and q.get("labels")]
    if not queries:
        raise SystemExit(f"{folder}: no labelled test queries")
    queries = queries[:max_queries] if max_queries else queries
    renamed = sum(1 for r, n in zip(rows, names, strict=True) if r["name"] != n)
    return {"name": folder.name, "tools": tools, "queries": queries, "renamed": renamed}


def child_task(sets: list[dict]) -> dict:
    """What a child sees: catalogs and query texts, never labels."""
    return {"sets": [{"name": s["name"], "tools": s["tools"], "queries": [q["query"] for q in s["queries"]]}
                     for s in sets]}


# ------------------------------------------------------------------------------------------ running


def child_env(peer: bool) -> dict:
    """No model hub for anyone. toolscout's children import the toolscout this script imports (a source
    checkout on PYTHONPATH or an installed one); the peers' children get no PYTHONPATH, only their venv."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)
    if not peer:
        import toolscout

        env["PYTHONPATH"] = str(Path(toolscout.__file__).resolve().parents[1])
    return env


def interpreter(name: str, peers: str) -> str:
    return peers if SYSTEMS[name].peer else sys.executable


def prepare(systems: list[str]) -> None:
    """Make toolscout's one-time caches (its encoder's ONNX export) before any timed process starts."""
    own = [s for s in systems if not SYSTEMS[s].peer]
    if own:
        print(f"preparing {', '.join(own)} (untimed: one-time per-machine caches)", flush=True)
        command = [sys.executable, str(CHILD), "--prepare", *own]
        if subprocess.run(command, env=child_env(peer=False), check=False).returncode != 0:
            print("   preparation failed; the systems' own runs will report why", flush=True)


def run_system(name: str, peers: str, task_file: str, timeout: float | None) -> dict:
    """Run one system in a fresh child process; its result, or `{"error": why}`."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out_file = fh.name
    start = time.perf_counter()
    try:
        command = [interpreter(name, peers), str(CHILD), name, task_file, out_file]
        proc = subprocess.run(command, env=child_env(SYSTEMS[name].peer), timeout=timeout, check=False)
        text = Path(out_file).read_text() if Path(out_file).stat().st_size else ""
        result = json.loads(text) if text else {"error": f"the child exited {proc.returncode} without a result"}
    except subprocess.TimeoutExpired:
        result = {"error": f"did not finish within --timeout {timeout:.0f}s"}
    finally:
        Path(out_file).unlink(missing_ok=True)
    result["wall_s"] = time.perf_counter() - start
    return result


def score(result: dict, sets: list[dict], trained_on: set[str]) -> dict:
    """Per-set means (0-100) of toolscout.eval.metrics over the child's rankings, the macros and timings."""
    from toolscout.eval.metrics import query_metrics

    per_set = {}
    for s in sets:
        rankings = result["sets"][s["name"]]["rankings"]
        rows = [query_metrics(r, set(q["labels"]), K) for r, q in zip(rankings, s["queries"], strict=True)]
        per_set[s["name"]] = {**{f"{m}@{K}": 100 * statistics.fmean(x[f"{m}@{K}"] for x in rows)
                                 for m in (*METRICS, "mrr")}, "queries": len(rows)}
    latency = [ms for s in sets for ms in result["sets"][s["name"]]["latency_ms"]]
    cpu = [ms for s in sets for ms in result["sets"][s["name"]]["cpu_ms"]]
    return {
        "sets": per_set,
        "macro": macro(per_set, [s["name"] for s in sets]),
        "headline": macro(per_set, [s["name"] for s in sets if s["name"] not in trained_on]),
        "build_s": sum(result["sets"][s["name"]]["build_s"] for s in sets),
        "build_s_per_set": {s["name"]: result["sets"][s["name"]]["build_s"] for s in sets},
        "setup_s": result["setup_s"],
        "latency_ms": {"p50": percentile(latency, 50), "p99": percentile(latency, 99),
                       "cpu_p50": percentile(cpu, 50)},
        "peak_rss_mb": result["peak_rss_mb"],
        "rss_with_task_mb": result.get("rss_with_task_mb"),
        "versions": result.get("versions", {}),
        "notes": result.get("notes", []),
        "wall_s": result["wall_s"],
    }


def macro(per_set: dict, names: list[str]) -> dict | None:
    if not names:
        return None
    return {f"{m}@{K}": statistics.fmean(per_set[n][f"{m}@{K}"] for n in names) for m in (*METRICS, "mrr")}


# ------------------------------------------------------------------------------------------ report


def triple(values: dict | None) -> str:
    if not values:
        return "–"
    return " / ".join(f"{values[f'{m}@{K}']:.1f}" for m in METRICS)


def markdown(report: dict) -> str:
    names = report["config"]["sets"]
    trained = set(report["config"]["trained_on"])
    clean = [n for n in names if n not in trained]
    headers = (["system", "reads", f"**headline** ({', '.join(clean) or 'none run'})", "macro, all sets"]
               + [f"{n}*" if n in trained else n for n in names]
               + ["setup s", "build s", "p50 ms", "p99 ms", "CPU p50 ms", "peak MB"])
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for key, r in report["systems"].items():
        entry = SYSTEMS[key]
        if "error" in r:
            cells = [entry.label, entry.reads, f"could not run: {r['error']}"] + [""] * (len(headers) - 3)
        else:
            cells = ([entry.label, entry.reads, f"**{triple(r['headline'])}**", triple(r["macro"])]
                     + [triple(r["sets"][n]) for n in names]
                     + [f"{r['setup_s']:.1f}", f"{r['build_s']:.1f}", f"{r['latency_ms']['p50']:.1f}",
                        f"{r['latency_ms']['p99']:.1f}", f"{r['latency_ms']['cpu_p50']:.1f}",
                        f"{r['peak_rss_mb']:.0f}"])
        lines.append("| " + " | ".join(cells) + " |")
    for label, reason in CANNOT_RUN.items():
        lines.append("| " + " | ".join([label, "", f"cannot run here: {reason}"] + [""] * (len(headers) - 3)) + " |")
    return "\n".join(lines + [""] + legend(report)) + "\n"


def legend(report: dict) -> list[str]:
    cfg = report["config"]
    queries = ", ".join(f"{n} {q}" for n, q in cfg["queries"].items())
    first = f" (the first {cfg['max_queries']} of each)" if cfg["max_queries"] else ""
    out = [
        (f"Cells: nDCG@10 / Recall@10 / Completeness@10, 0-100, test split, each set searched over its own "
         f"catalog. Queries per set: {queries}{first}. "
         "* = toolscout's shipped model was trained on this set's train split; the headline is the macro over "
         "the other sets. Build s: all sets' index builds (+ one warm-up query each); setup s: one-time model "
         "loading; p50/p99: per query, wall clock, all sets; CPU p50: the process's CPU time per query (all "
         "threads); peak MB: the system's own process (ru_maxrss), which also holds every set's catalog and "
         f"query texts (~{cfg['rss_with_task_mb']:.0f} MB before setup)."),
        (f"Machine: {report['machine']} (load average at the end of the run; wall-clock times taken while "
         "other jobs share the cores are not final)."),
        "",
    ]
    for key, r in report["systems"].items():
        entry = SYSTEMS[key]
        extra = "" if "error" in r else "; ".join(r["notes"])
        pins = "" if "error" in r else ", ".join(f"{p} {v}" for p, v in r["versions"].items())
        out.append(f"- **{entry.label}**: {entry.usage}." + (f" {extra}." if extra else "")
                   + (f" ({pins})" if pins else ""))
    out += [""] + FOOTNOTES
    return out


# ------------------------------------------------------------------------------------------ driver


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of benchmark sets (default ../shared/data)")
    ap.add_argument("--sets", default=None, help="comma list of sets (default: every set with labelled test queries)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of: {', '.join(SYSTEMS)}")
    ap.add_argument("--max-queries", type=int, default=None, help="first N test queries per set (default: all)")
    ap.add_argument("--trained-on", default=",".join(TRAINED_ON),
                    help="sets whose train splits trained toolscout's shipped model (marked *, not in the headline)")
    ap.add_argument("--python", default=None,
                    help="interpreter of the peers' environment (default .venv-peers/bin/python)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds one system may take (default: no limit)")
    ap.add_argument("--json", default=None, help="write all numbers, per-set build times and notes to this file")
    ap.add_argument("--markdown", default=None, help="write the table to this file")
    ap.add_argument("--keep", default=None, metavar="JSON",
                    help="an earlier --json of the same sets and queries: its systems that this run does not run "
                         "are kept in the table (marked as kept, with that run's machine line)")
    args = ap.parse_args(argv)
    if args.max_queries is not None and args.max_queries < 1:
        ap.error("--max-queries must be at least 1")
    return args


def peers_python(choice: str | None) -> str:
    python = Path(choice) if choice else PEERS_PYTHON
    if not python.exists():
        raise SystemExit(f"no peers' environment at {python}: create it as the README's 'toolscout and the "
                         f"alternatives' section says (torch==2.13.0 first, then benchmarks/peers-requirements.txt), "
                         f"or pass --python")
    return str(python)


def chosen(spec: str, known, what: str) -> list[str]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return names


def run_all(systems: list[str], sets: list[dict], peers: str | None, timeout: float | None,
            trained_on: set[str]) -> dict:
    """Each system in its own child process over the same task file; the scored results by system."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(child_task(sets), fh)
        task_file = fh.name
    results = {}
    prepare(systems)
    try:
        for name in systems:
            print(f"\n== {name} ({interpreter(name, peers)}) ==", flush=True)
            raw = run_system(name, peers, task_file, timeout)
            results[name] = raw if "error" in raw else score(raw, sets, trained_on)
            print(f"   {'FAILED: ' + raw['error'] if 'error' in raw else 'done'} in {raw['wall_s']:.0f}s", flush=True)
    finally:
        os.unlink(task_file)
    return results


def kept_results(path: Path, queries: dict[str, int], fresh: dict) -> dict:
    """The systems of an earlier report at `path` that this run did not run, if it scored the same queries."""
    earlier = json.loads(path.read_text())
    if earlier["config"]["queries"] != queries:
        raise SystemExit(f"--keep {path}: that run scored {earlier['config']['queries']}, this one {queries}; "
                         "results are only comparable over the same sets and queries")
    kept = {}
    for name, result in earlier["systems"].items():
        if name not in fresh:
            note = f"kept from an earlier run ({path.name}; {earlier['machine']})"
            kept[name] = {**result, "notes": [*result.get("notes", []), note]}
    return kept


def main(argv=None) -> dict:
    args = parse_args(argv)
    available = labelled_sets(args.data)
    set_names = chosen(args.sets, available, "set(s)") if args.sets else available
    systems = chosen(args.systems, SYSTEMS, "system(s)")
    trained_on = set(chosen(args.trained_on, available, "trained-on set(s)")) if args.trained_on else set()
    peers = peers_python(args.python) if any(SYSTEMS[n].peer for n in systems) else None
    sets = [load_set(args.data / n, args.max_queries) for n in set_names]
    described = ", ".join(f"{s['name']} ({len(s['tools'])} tools, {len(s['queries'])} queries)" for s in sets)
    print(f"sets: {described}; systems: {', '.join(systems)}", flush=True)
    results = run_all(systems, sets, peers, args.timeout, trained_on)
    if args.keep:
        merged = {**kept_results(Path(args.keep), {s["name"]: len(s["queries"]) for s in sets}, results), **results}
        results = {name: merged[name] for name in SYSTEMS if name in merged}
    rss = [r["rss_with_task_mb"] for r in results.values() if r.get("rss_with_task_mb")]
    report = {
        "config": {"sets": set_names, "trained_on": sorted(trained_on & set(set_names)), "k": K,
                   "max_queries": args.max_queries, "queries": {s["name"]: len(s["queries"]) for s in sets},
                   "renamed_tools": {s["name"]: s["renamed"] for s in sets},
                   "python": {"toolscout": sys.executable, "peers": peers},
                   "rss_with_task_mb": statistics.fmean(rss) if rss else float("nan")},
        "machine": machine_line(),
        "systems": results,
    }
    table = markdown(report)
    print("\n" + table)
    if args.markdown:
        Path(args.markdown).write_text(table)
        print(f"wrote {args.markdown}")
    write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
