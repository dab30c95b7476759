"""Scale benchmark: BM25, exact dense, the old hybrid, the default pipeline and FAISS-HNSW dense over a
~43k-tool catalog (a script, not a test).

    python benchmarks/scale.py [--tools 43000] [--queries 300] [--only bm25,dense,hybrid,default,hnsw]
    python benchmarks/scale.py --model minilm --only bm25,dense,hybrid,default   # the old defaults beside the new
                               [--reuse-embeddings] [--json FILE]

The catalog is every tool in ../shared/data/*/tools.jsonl (ids prefixed by their set), plus copies of the
same tools re-namespaced `mirror1`, `mirror2`, ... (ids prefixed `mirrorN/`) until `--tools` is reached.
Copies have the same text, so the dense sections embed each distinct text once (a content-hash cache
in front of the encoder) and say so; `--no-dedupe` embeds every row through `DenseRetriever` as is.
The distinct-text vectors are cached in `--embeddings-file` (under /tmp); `--reuse-embeddings` loads
them instead of re-embedding, and a section run after `dense` in the same invocation reuses the file
its predecessor wrote (embedding cost belongs to the encoder, not to the store).

Each section runs in a fresh subprocess so its peak RSS (getrusage high-water mark) is its own. Queries
are ~300 real test queries from the shared sets, issued one at a time (k=10); dense latency includes
query encoding. HNSW recall@10 is measured against exact search on the same vectors.

The `rerank` section times each second stage given with `--cross DIR` / `--refiner DIR` (trained model
directories) on the top-20 and top-64 BM25 candidates of each query over the same catalog, one query at a
time; the first stage's own time is not included (it is the sections above). Candidate vectors for the
refiner are its description embeddings, computed once before timing (a refiner that carries Tool2Vec usage
blends it into them on each call, as it does behind any first stage). The LLM reranker is not timed: its
latency is the endpoint's.

Add a section by writing `section_NAME(ctx) -> dict` and listing it in SECTIONS.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (DEFAULT_DATA, DEFAULT_EMBEDDINGS, DedupingEncoder, build_catalog, encoder_key,  # noqa: E402
                    latency_ms, machine_line, peak_rss_mb, sample_queries, write_json)


@dataclass
class Context:
    args: argparse.Namespace
    tools: list
    queries: list[str]
    note: str


def dense_section(ctx: Context, store: str) -> dict:
    from toolscout.encoders import Encoder, QueryCache
    from toolscout.retrievers.dense import DenseRetriever
    from toolscout.tool import tool_text

    args = ctx.args
    encoder = Encoder.load(args.model, backend=args.backend)
    encoder.query_cache = QueryCache(0)  # every timed query is encoded (the encode column timed cache hits)
    out: dict = {"backend": encoder.backend_in_use, "store": store}
    texts = [tool_text(t) for t in ctx.tools]
    out["distinct_texts"] = len(set(texts))
    reuse = args.reuse_embeddings or args.reuse_within_run
    if args.no_dedupe:
        wrapped = encoder
        out["dedupe"] = "off: every row embedded"
    else:
        wrapped = DedupingEncoder(encoder)
        key = encoder_key(encoder)
        meta = wrapped.preload(Path(args.embeddings_file), key) if reuse else None
        out["dedupe"] = (f"on: {len(texts):,} rows, {out['distinct_texts']:,} distinct texts embedded once"
                         + (f"; vectors loaded from {args.embeddings_file}" if meta else ""))
        if meta:
            out["cached_seconds_per_text"] = meta["seconds_per_text"]
    rss_before = peak_rss_mb()
    retriever = DenseRetriever(encoder=wrapped, store=store, batch_size=64)
    start = time.perf_counter()
    retriever.index(ctx.tools)
    if hasattr(retriever.store, "build"):
        retriever.store.build()  # FAISS builds its graph lazily; count it in the build
    build = time.perf_counter() - start
    out.update(rows=len(retriever), build_s=build, tools_per_s=len(ctx.tools) / build,
               rss_before_build_mb=rss_before)
    if isinstance(wrapped, DedupingEncoder):
        out["embedded_now"] = wrapped.embedded
        out["embed_s"] = wrapped.embed_seconds
        out["store_build_s"] = build - wrapped.embed_seconds
        if wrapped.embedded:
            per_text = wrapped.embed_seconds / wrapped.embedded
            out["embed_texts_per_s"] = 1.0 / per_text
            wrapped.save(Path(args.embeddings_file), encoder_key(encoder), per_text)
        elif args.rate_sample > 0:  # vectors came from the file: time the encoder on a sample, now
            sample = sorted(set(texts))[:: max(1, len(set(texts)) // args.rate_sample)][: args.rate_sample]
            start = time.perf_counter()
            encoder.encode(sample, batch_size=64)
            out["embed_texts_per_s"] = len(sample) / (time.perf_counter() - start)
            out["rate_sample"] = len(sample)
        elif "cached_seconds_per_text" in out:
            out["embed_texts_per_s"] = 1.0 / out["cached_seconds_per_text"]
        if out.get("embed_texts_per_s"):
            rate = out["embed_texts_per_s"]
            out["projected_embed_s_distinct"] = out["distinct_texts"] / rate
            out["projected_embed_s_all_rows"] = len(texts) / rate
    else:
        out["embed_texts_per_s"] = len(texts) / build

    queries = ctx.queries
    out.update(latency_ms(lambda q: retriever.search([q], k=10), queries))
    # where a query's time goes: encoding vs the store's search
    vectors = {q: encoder.encode_queries([q]) for q in queries}
    out["encode"] = latency_ms(lambda q: encoder.encode_queries([q]), queries)
    out["store_search"] = latency_ms(lambda q: retriever.store.search(vectors[q], 10), queries)
    if store != "numpy":
        matrix = np.concatenate([vectors[q] for q in queries])
        out.update(hnsw_recall(retriever.store, matrix, k=10))
        out["ef_sweep"] = ef_sweep(retriever.store, matrix, vectors, queries, ctx.args.ef_sweep)
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def hnsw_recall(store, query_vectors: np.ndarray, k: int) -> dict:
    """Recall@k of the approximate store against exact inner-product search on the same matrix.

    `recall_at_10`: fraction of the exact top-k ids the approximate search returns. Mirrored copies have
    identical vectors, so exact top-k is ambiguous among ties; `recall_at_10_ties_ok` also counts a
    returned id whose exact score reaches the exact k-th score (an equally good answer).
    """
    from toolscout.results import top_k_rows

    approx = store.search(query_vectors, k)
    scores = query_vectors @ store.matrix.T
    exact_rows = top_k_rows(scores, k)
    id_array = store.rows.id_array
    row_of = store.rows.row_of
    strict, ties_ok = [], []
    for q in range(len(query_vectors)):
        exact_ids = set(id_array[exact_rows[q]].tolist())
        got = approx.ids[q].tolist()
        strict.append(len(exact_ids & set(got)) / len(exact_ids))
        kth = scores[q, exact_rows[q][-1]]
        good = sum(1 for tid in got if scores[q, row_of[tid]] >= kth - 1e-6)
        ties_ok.append(min(good, len(exact_ids)) / len(exact_ids))
    return {"recall_at_10": float(np.mean(strict)), "recall_at_10_ties_ok": float(np.mean(ties_ok)),
            "ef_search": getattr(store, "ef_search", None)}


def ef_sweep(store, matrix: np.ndarray, vectors: dict, queries: list[str], efs: str) -> list[dict]:
    """Recall and search latency of the HNSW graph at other efSearch values (restored afterwards)."""
    index = store._ensure_index()
    hnsw = getattr(index, "hnsw", None)
    if hnsw is None or not efs:
        return []
    original = store.ef_search
    rows = []
    for ef in [int(x) for x in efs.split(",") if x.strip()]:
        store.ef_search = hnsw.efSearch = ef
        timing = latency_ms(lambda q: store.search(vectors[q], 10), queries)
        rows.append({"ef_search": ef, **hnsw_recall(store, matrix, 10), "search_p50_ms": timing["p50_ms"],
                     "search_cpu_p50_ms": timing["cpu_p50_ms"]})
    store.ef_search = hnsw.efSearch = original
    return rows


# ---------------------------------------------------------------------------------- sections


def section_bm25(ctx: Context) -> dict:
    from toolscout.retrievers.bm25 import BM25Retriever

    rss_before = peak_rss_mb()
    retriever = BM25Retriever()
    start = time.perf_counter()
    retriever.index(ctx.tools)
    build = time.perf_counter() - start
    out = {"rows": len(retriever), "build_s": build, "tools_per_s": len(ctx.tools) / build,
           "rss_before_build_mb": rss_before}
    out.update(latency_ms(lambda q: retriever.search([q], k=10), ctx.queries))
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def section_dense(ctx: Context) -> dict:
    return dense_section(ctx, "numpy")


def section_hnsw(ctx: Context) -> dict:
    return dense_section(ctx, ctx.args.hnsw_store)


def section_rerank(ctx: Context) -> dict:
    from toolscout.rerank.base import load_reranker
    from toolscout.retrievers.bm25 import BM25Retriever

    models = {"cross": ctx.args.cross, "refiner": ctx.args.refiner}
    if not any(models.values()):
        return {"skipped": "give --cross DIR and/or --refiner DIR (trained model directories)"}
    retriever = BM25Retriever()
    retriever.index(ctx.tools)
    tools = {t.id: t for t in ctx.tools}
    candidates = {q: retriever.search([q], k=64) for q in ctx.queries}
    out: dict = {"rss_before_build_mb": peak_rss_mb(), "build_s": 0.0, "tools_per_s": 0.0}
    for name, path in models.items():
        if not path:
            continue
        start = time.perf_counter()
        reranker = load_reranker(path)
        out[f"{name}_load_s"] = time.perf_counter() - start
        for depth in (20, 64):
            top = {q: candidates[q].top(depth) for q in ctx.queries}
            if name == "refiner":  # description vectors once, as a first stage's store would hold them
                reranker.description_vectors([tools[t] for q in ctx.queries for t in top[q].ids[0]])
            out[f"{name}@{depth}"] = latency_ms(lambda q: reranker.rerank([q], top[q], tools), ctx.queries)
    out["peak_rss_mb"] = peak_rss_mb()
    out["p50_ms"] = out["p99_ms"] = out["cpu_p50_ms"] = float("nan")
    return out


def section_hybrid(ctx: Context) -> dict:
    """The hybrid toolscout shipped before the default changed: BM25 + dense (--model), RRF k 60, 1 : 1."""
    from toolscout.encoders import Encoder

    encoder = Encoder.load(ctx.args.model, backend=ctx.args.backend)
    return pipeline_section(ctx, encoder, retriever="hybrid", fusion="rrf", rrf_k=60, weights=[1.0, 1.0])


def section_default(ctx: Context) -> dict:
    """`ToolScout.from_tools(tools)`: the default pipeline with the default encoder, whatever --model says."""
    from toolscout.encoders import Encoder

    return pipeline_section(ctx, Encoder.load(None, backend=ctx.args.backend))


def pipeline_section(ctx: Context, encoder, **options) -> dict:
    """Build a whole pipeline over the catalog and time a search through it (hits and all) and through its
    first stage alone, one query at a time. The encoder's query cache is off: every query is encoded."""
    from toolscout.encoders.query_cache import QueryCache
    from toolscout.pipeline import ToolScout

    encoder.query_cache = QueryCache(0)
    wrapped = DedupingEncoder(encoder)
    vectors_file = Path(ctx.args.embeddings_file)
    vectors_file = vectors_file.with_name(f"{vectors_file.stem}-{encoder_key(encoder)}.npz")  # one per model
    loaded = wrapped.preload(vectors_file, encoder_key(encoder))
    out: dict = {"backend": encoder.backend_in_use, "model": encoder.name, "rss_before_build_mb": peak_rss_mb()}
    start = time.perf_counter()
    scout = ToolScout.from_tools(ctx.tools, encoder=wrapped, **options)
    build = time.perf_counter() - start
    if wrapped.embedded:
        wrapped.save(vectors_file, encoder_key(encoder), wrapped.embed_seconds / wrapped.embedded)
    out.update(rows=len(scout.retriever), build_s=build, tools_per_s=len(ctx.tools) / build,
               embedded_now=wrapped.embedded, vectors_loaded=bool(loaded),
               pipeline=f"{scout.retriever.name} {getattr(scout.retriever, 'fusion', '')} "
                        f"{getattr(scout.retriever, 'weights', '')}".strip())
    out.update(latency_ms(lambda q: scout.search(q, k=10), ctx.queries))
    out["first_stage"] = latency_ms(lambda q: scout.retriever.search([q], k=10), ctx.queries)
    out["peak_rss_mb"] = peak_rss_mb()
    return out


SECTIONS = {"bm25": section_bm25, "dense": section_dense, "hybrid": section_hybrid, "default": section_default,
            "hnsw": section_hnsw, "rerank": section_rerank}


# ------------------------------------------------------------------------------------ driver


def run_child(args) -> None:
    tools, sets, note = build_catalog(args.data, args.tools)
    queries = sample_queries(sets, args.queries)
    result = SECTIONS[args.child](Context(args, tools, queries, note))
    Path(args.child_out).write_text(json.dumps(result, default=float))


def run_section(name: str, argv: list[str], reuse_within_run: bool) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out_file = fh.name
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", name, "--child-out", out_file]
    if reuse_within_run:
        cmd.append("--reuse-within-run")
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"section {name} failed (exit {proc.returncode})")
    result = json.loads(Path(out_file).read_text())
    os.unlink(out_file)
    result["section_wall_s"] = time.perf_counter() - start
    return result


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_report(note: str, n_queries: int, results: dict) -> None:
    print(f"\ncatalog: {note}")
    print(f"queries: {n_queries} real test queries, one at a time, k=10   ({machine_line()})\n")
    print(f"{'retriever':22s} {'build s':>9s} {'tools/s':>9s} {'embed s':>9s} {'RSS before':>11s} {'peak RSS':>9s} "
          f"{'p50 ms':>8s} {'p99 ms':>8s} {'cpu p50':>8s}  target")
    for name, r in results.items():
        if name == "rerank":
            continue
        label = name if name != "hnsw" else f"hnsw ({r.get('store')})"
        target = ""
        if name == "bm25":
            target = f"p50 <= 5 ms: {verdict(r['p50_ms'] <= 5.0)}"
        elif name == "dense":
            target = f"p50 <= 12 ms: {verdict(r['p50_ms'] <= 12.0)}"
        elif name == "default":
            first = r["first_stage"]
            target = (f"pipeline p50 <= 20, p99 <= 60 ms: {verdict(r['p50_ms'] <= 20 and r['p99_ms'] <= 60)}; first "
                      f"stage p50 {first['p50_ms']:.2f} / p99 {first['p99_ms']:.2f} ms, <= 10 / 30: "
                      f"{verdict(first['p50_ms'] <= 10 and first['p99_ms'] <= 30)}")
        elif name == "hnsw":
            target = (f"recall@10 >= 0.98: {verdict(r['recall_at_10_ties_ok'] >= 0.98)} counting equal-score "
                      f"copies, {verdict(r['recall_at_10'] >= 0.98)} by id")
        if r.get("embedded_now") and "embed_s" in r:
            embed = f"{r['embed_s']:9.1f}"
        elif r.get("projected_embed_s_distinct"):
            embed = f"~{r['projected_embed_s_distinct']:.0f}".rjust(9)
        else:
            embed = f"{'-':>9s}"
        print(f"{label:22s} {r['build_s']:9.1f} {r['tools_per_s']:9.0f} {embed} {r['rss_before_build_mb']:9.0f}MB "
              f"{r['peak_rss_mb']:7.0f}MB {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['cpu_p50_ms']:8.2f}  {target}")
    print("(build s: the retriever's index() call, which includes embedding only for texts not in the vector "
          "cache;\n embed s: embedding the distinct texts, measured now, or ~projected from the encoder's rate when "
          "the vectors came from the cache;\n p50/p99: wall clock per query; cpu p50: process CPU time per query, "
          "all threads, which other processes on the machine inflate far less)")
    rerank = results.get("rerank")
    if rerank is not None:
        print("\nsecond stages (reranking BM25's top-N for one query at a time; first stage not included):")
        if "skipped" in rerank:
            print(f"  skipped: {rerank['skipped']}")
        for key, r in rerank.items():
            if isinstance(r, dict) and "p50_ms" in r:
                print(f"  {key:12s} p50 {r['p50_ms']:8.2f} ms   p99 {r['p99_ms']:8.2f} ms   cpu p50 {r['cpu_p50_ms']:8.2f} ms")
    for name, r in results.items():
        if name in ("bm25", "rerank") or "store_search" not in r:  # the pipeline sections: the table says it all
            continue
        print(f"\n{name}: encoder backend {r['backend']}; {r['dedupe']}")
        if r.get("embedded_now"):
            print(f"  embedded {r['embedded_now']:,} texts in {r['embed_s']:.1f}s ({r['embed_texts_per_s']:.0f} texts/s); "
                  f"rest of index() (text views, hashes, store inserts, graph) {r['store_build_s']:.2f}s")
        elif "store_build_s" in r:
            rate = r.get("embed_texts_per_s")
            how = (f"; encoder timed now on {r['rate_sample']} distinct texts: {rate:.0f} texts/s" if r.get("rate_sample")
                   else f", measured when they were made: {rate:.0f} texts/s" if rate else "")
            print(f"  embedding skipped (cached vectors{how}); rest of index() (text views, hashes, store inserts, "
                  f"graph) {r['store_build_s']:.2f}s")
        if r.get("projected_embed_s_all_rows"):
            print(f"  at that rate: {r['distinct_texts']:,} distinct texts = {r['projected_embed_s_distinct']:.0f}s "
                  f"vs all {r['rows']:,} rows = {r['projected_embed_s_all_rows']:.0f}s without dedupe")
        e, s = r["encode"], r["store_search"]
        print(f"  per query: encode p50 {e['p50_ms']:.2f} ms / p99 {e['p99_ms']:.2f} ms (cpu p50 {e['cpu_p50_ms']:.2f}); "
              f"store search p50 {s['p50_ms']:.2f} ms / p99 {s['p99_ms']:.2f} ms (cpu p50 {s['cpu_p50_ms']:.2f})")
        if "recall_at_10" in r:
            print(f"  recall@10 vs exact: {r['recall_at_10']:.4f} by id; {r['recall_at_10_ties_ok']:.4f} counting "
                  f"equal-score copies as hits (efSearch={r['ef_search']})")
        for row in r.get("ef_sweep", []):
            print(f"    efSearch {row['ef_search']:4d}: recall@10 {row['recall_at_10']:.4f} by id, "
                  f"{row['recall_at_10_ties_ok']:.4f} ties ok; search p50 {row['search_p50_ms']:.2f} ms "
                  f"(cpu {row['search_cpu_p50_ms']:.2f} ms)")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of benchmark sets (default ../shared/data)")
    ap.add_argument("--tools", type=int, default=43000, help="catalog size (default 43000)")
    ap.add_argument("--queries", type=int, default=300, help="real test queries to time (default 300)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of sections: {','.join(SECTIONS)}")
    ap.add_argument("--model", default=None, help="encoder of the dense, hybrid and hnsw sections (default: "
                                                  "toolscout's default encoder; the default section always uses it)")
    ap.add_argument("--backend", default="auto", help="encoder backend: auto, torch, onnx, onnx-int8")
    ap.add_argument("--hnsw-store", default="faiss:HNSW32", help="store spec for the hnsw section")
    ap.add_argument("--ef-sweep", default="32,64,128,256,512", help="efSearch values to also try in the hnsw section")
    ap.add_argument("--embeddings-file", default=str(DEFAULT_EMBEDDINGS))
    ap.add_argument("--reuse-embeddings", action="store_true", help="load tool vectors from --embeddings-file")
    ap.add_argument("--rate-sample", type=int, default=512,
                    help="with cached vectors, time the encoder on this many distinct texts (0: skip)")
    ap.add_argument("--no-dedupe", action="store_true", help="embed every catalog row (slow: ~3.4x the texts)")
    ap.add_argument("--cross", default=None, help="rerank section: a `toolscout train cross` directory")
    ap.add_argument("--refiner", default=None, help="rerank section: a `toolscout train refiner` directory")
    ap.add_argument("--json", default=None, help="write all numbers to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--reuse-within-run", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        run_child(args)
        return {}
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    if "rerank" in names and not (args.cross or args.refiner):
        names.remove("rerank")  # nothing to time without a trained second stage
        print("rerank section skipped: give --cross DIR and/or --refiner DIR", flush=True)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown section(s) {unknown}; known: {', '.join(SECTIONS)}")
    _, sets, note = build_catalog(args.data, args.tools)
    print(f"catalog: {note}; sections: {', '.join(names)} (each in a fresh process)", flush=True)
    results, embedded = {}, False
    for name in names:
        print(f"\n== {name} ==", flush=True)
        results[name] = run_section(name, argv, reuse_within_run=embedded)
        embedded = embedded or (name in ("dense", "hnsw") and not args.no_dedupe)
        print(f"   done in {results[name]['section_wall_s']:.0f}s", flush=True)
    write_json(args.json, {"catalog": note, "queries": args.queries, "machine": machine_line(),  # numbers first
                           "args": {k: v for k, v in vars(args).items() if not k.startswith("child")},
                           "results": results})
    print_report(note, args.queries, results)
    return results


if __name__ == "__main__":
    main()
