"""PostgreSQL + pgvector at scale, next to the local stores, in one run (a script, not a test).

    python benchmarks/pg_scale.py [--tools 43000] [--queries 300] [--dsn postgresql://...]
                                  [--ef-search 40,100,200] [--reuse-embeddings] [--json FILE]

The catalog is scale.py's (every tool of ../shared/data, then re-namespaced copies up to --tools). Tool
vectors come from scale.py's embeddings cache (each distinct text embedded once; missing ones are
embedded now and the cache updated), so every store below holds the very same float32 vectors:

- local exact (NumpyStore) and local HNSW (FaissStore HNSW32, efSearch 128): the in-process stores;
- pgvector exact (index scans off: every row of the tenant scanned) and pgvector HNSW (m=16,
  ef_construction=64) at each --ef-search, one tenant partition holding the whole catalog
  (`PgVectorStore.search`, the store the replicas' dense part uses above their in-memory limit);
- a namespace-filtered pgvector HNSW search (one benchmark set's namespace).

Latency is per query, one at a time, k=10, store search only (query vectors are encoded once up front;
the encoder's own time is reported separately: it is the same for every store). PostgreSQL runs over a
unix socket on the same machine (pgserver in a temporary directory unless --dsn is given), so its numbers
include a client round trip, which an in-process store does not pay. Recall@10 is against exact
inner-product search in numpy; copies have identical vectors, so `ties ok` also counts a returned id
whose exact score reaches the exact 10th score.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# One query at a time: a multi-threaded BLAS per scan only adds spinning threads (as `toolscout serve` sets).
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (DEFAULT_DATA, DEFAULT_EMBEDDINGS, DedupingEncoder, build_catalog, encoder_key,  # noqa: E402
                    latency_ms, machine_line, sample_queries, write_json)


def embed_catalog(tools, args) -> tuple[np.ndarray, object, dict]:
    from toolscout.encoders import Encoder
    from toolscout.tool import tool_text

    encoder = Encoder.load(args.model)
    wrapped = DedupingEncoder(encoder)
    key = encoder_key(encoder)
    meta = wrapped.preload(Path(args.embeddings_file), key) if args.reuse_embeddings else None
    texts = [tool_text(t) for t in tools]
    start = time.perf_counter()
    matrix = wrapped.encode(texts, batch_size=64, show_progress=True)
    info = {"distinct_texts": len(set(texts)), "embedded_now": wrapped.embedded,
            "embed_s": time.perf_counter() - start, "vectors_from_cache": bool(meta)}
    if wrapped.embedded:
        wrapped.save(Path(args.embeddings_file), key, wrapped.embed_seconds / wrapped.embedded)
    return np.ascontiguousarray(matrix, dtype=np.float32), encoder, info


def recall(got_ids, exact_scores, exact_top, row_of) -> dict:
    strict, ties_ok = [], []
    for q, ids in enumerate(got_ids):
        exact = set(exact_top[q])
        strict.append(len(exact & set(ids)) / len(exact))
        kth = exact_scores[q][-1]
        good = sum(1 for tid in ids if row_scores(q, tid, row_of) >= kth - 1e-5)
        ties_ok.append(min(good, len(exact)) / len(exact))
    return {"recall_at_10": float(np.mean(strict)), "recall_at_10_ties_ok": float(np.mean(ties_ok))}


_SCORES: dict = {}


def row_scores(q: int, tool_id: str, row_of: dict) -> float:
    return float(_SCORES["all"][q, row_of[tool_id]])


def timed(fn, items) -> dict:
    out = latency_ms(fn, items)
    return {k: round(v, 3) for k, v in out.items()}


def start_postgres(args):
    if args.dsn:
        return args.dsn, None
    import pgserver

    server = pgserver.get_server(tempfile.mkdtemp(prefix="toolscout-pgbench-"), cleanup_mode="delete")
    return server.get_uri(), server


def run(args) -> dict:
    from toolscout.results import Filter, top_k_rows
    from toolscout.store.local import FaissStore, NumpyStore
    from toolscout.store.pg_catalog import PgCatalog
    from toolscout.store.pgvector import PgDatabase, PgRow, PgVectorStore
    from toolscout.tool import tool_text

    tools, sets, note = build_catalog(args.data, args.tools)
    queries = sample_queries(sets, args.queries)
    print(f"catalog: {note}; {len(queries)} queries", flush=True)
    matrix, encoder, embed_info = embed_catalog(tools, args)
    ids = [t.id for t in tools]
    namespaces = [t.namespace for t in tools]
    row_of = {tid: i for i, tid in enumerate(ids)}
    encode = timed(lambda q: encoder.encode_queries([q]), queries)
    qvec = {q: encoder.encode_queries([q]) for q in queries}
    qmat = np.concatenate([qvec[q] for q in queries])
    _SCORES["all"] = qmat @ matrix.T
    exact_rows = top_k_rows(_SCORES["all"], 10)
    exact_top = [[ids[r] for r in rows] for rows in exact_rows]
    exact_scores = [_SCORES["all"][q, rows] for q, rows in enumerate(exact_rows)]
    results: dict = {"catalog": note, "queries": len(queries), "embedding": embed_info, "encode_query": encode}

    # local stores ------------------------------------------------------------------------
    local = NumpyStore(matrix.shape[1])
    local.upsert(ids, matrix, namespaces)
    results["local_exact"] = timed(lambda q: local.search(qvec[q], 10), queries)
    faiss = FaissStore(matrix.shape[1])
    faiss.upsert(ids, matrix, namespaces)
    start = time.perf_counter()
    faiss.build()
    results["local_hnsw"] = {"build_s": round(time.perf_counter() - start, 2), "ef_search": faiss.ef_search,
                             **timed(lambda q: faiss.search(qvec[q], 10), queries),
                             **recall(faiss.search(qmat, 10).as_lists(), exact_scores, exact_top, row_of)}
    print("local stores done", flush=True)

    # PostgreSQL ----------------------------------------------------------------------------
    uri, server = start_postgres(args)
    table = "bench_tools"
    database = PgDatabase(uri, table, matrix.shape[1], ef_search=max(args.ef_search_list))
    store = PgVectorStore(uri, tenant="bench", database=database)
    rows = [PgRow(t.id, t.namespace, matrix[i], tool_text(t), "", None) for i, t in enumerate(tools)]
    start = time.perf_counter()
    PgCatalog(store).write(rows, replace=True)  # one bulk load, then the HNSW build
    results["pg_load"] = {"rows": len(store), "load_and_index_s": round(time.perf_counter() - start, 2)}
    print(f"postgres loaded in {results['pg_load']['load_and_index_s']}s", flush=True)
    exact = PgVectorStore(uri, tenant="bench", exact=True, database=database)
    got = exact.search(qmat, 10)
    same_ids = sum(a == b for a, b in zip(got.as_lists(), exact_top))
    same_scores = sum(np.allclose(s, e, atol=1e-5) for s, e in zip(got.scores, exact_scores))
    results["pg_exact"] = {**timed(lambda q: exact.search(qvec[q], 10), queries),
                           "identical_top10_ids": f"{same_ids}/{len(queries)}",
                           "identical_top10_scores": f"{same_scores}/{len(queries)}",
                           **recall(got.as_lists(), exact_scores, exact_top, row_of)}
    for ef in args.ef_search_list:
        hnsw = PgVectorStore(uri, tenant="bench", ef_search=ef, database=database)
        results[f"pg_hnsw_ef{ef}"] = {**timed(lambda q: hnsw.search(qvec[q], 10), queries),
                                      **recall(hnsw.search(qmat, 10).as_lists(), exact_scores, exact_top, row_of)}
    hnsw = PgVectorStore(uri, tenant="bench", ef_search=args.ef_search_list[0], database=database)
    ns = sets[0].name
    flt = Filter.make(namespaces=[ns])
    share = sum(1 for n in namespaces if n == ns) / len(namespaces)
    mask = np.array([n == ns for n in namespaces])
    masked = np.where(mask[None, :], _SCORES["all"], -np.inf)
    f_rows = top_k_rows(masked, 10)
    f_top = [[ids[r] for r in rows] for rows in f_rows]
    f_scores = [masked[q, rows] for q, rows in enumerate(f_rows)]
    results["pg_hnsw_filtered"] = {"namespace": ns, "share": round(share, 4),
                                   **timed(lambda q: hnsw.search(qvec[q], 10, flt), queries),
                                   **recall(hnsw.search(qmat, 10, flt).as_lists(), f_scores, f_top, row_of)}
    results["local_exact_filtered"] = timed(lambda q: local.search(qvec[q], 10, flt), queries)
    database.close()
    if server is not None:
        server.cleanup()
    return results


def print_report(results: dict) -> None:
    print(f"\ncatalog: {results['catalog']}")
    print(f"queries: {results['queries']} real test queries, one at a time, k=10, store search only "
          f"({machine_line()})")
    e = results["embedding"]
    print(f"vectors: {e['distinct_texts']:,} distinct texts, {e['embedded_now']:,} embedded now "
          f"({'rest from cache' if e['vectors_from_cache'] else 'no cache'}); query encoding p50 "
          f"{results['encode_query']['p50_ms']:.2f} ms (the same for every store)")
    print(f"postgres: load + index {results['pg_load']['rows']:,} rows in {results['pg_load']['load_and_index_s']}s; "
          f"local FAISS HNSW build {results['local_hnsw']['build_s']}s\n")
    print(f"{'store':34s} {'p50 ms':>8s} {'p99 ms':>8s} {'recall@10':>10s} {'ties ok':>8s}")
    for name, r in results.items():
        if not isinstance(r, dict) or "p50_ms" not in r:
            continue
        rec = f"{r['recall_at_10']:.4f}" if "recall_at_10" in r else ""
        ties = f"{r['recall_at_10_ties_ok']:.4f}" if "recall_at_10_ties_ok" in r else ""
        label = name + (f" ({r['namespace']}, {r['share']:.1%})" if "namespace" in r else "")
        print(f"{label:34s} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {rec:>10s} {ties:>8s}")
    x = results["pg_exact"]
    print(f"\npgvector exact vs numpy exact: identical top-10 ids {x['identical_top10_ids']}, "
          f"scores within 1e-5 {x['identical_top10_scores']} (copies tie: ids may swap among equal scores)")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of benchmark sets (default ../shared/data)")
    ap.add_argument("--tools", type=int, default=43000, help="catalog size (default 43000)")
    ap.add_argument("--queries", type=int, default=300, help="real test queries to time (default 300)")
    ap.add_argument("--dsn", default=None, help="a PostgreSQL with pgvector to use (default: pgserver in a temp dir)")
    ap.add_argument("--ef-search", default="40,100,200", help="pgvector hnsw.ef_search values to time")
    ap.add_argument("--model", default=None, help="encoder name or folder (default all-MiniLM-L6-v2)")
    ap.add_argument("--embeddings-file", default=str(DEFAULT_EMBEDDINGS), help="scale.py's vector cache")
    ap.add_argument("--reuse-embeddings", action="store_true", help="load tool vectors from --embeddings-file")
    ap.add_argument("--json", default=None, help="write all numbers to this file")
    args = ap.parse_args(argv)
    args.ef_search_list = [int(x) for x in args.ef_search.split(",") if x.strip()]
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    results = run(args)
    print_report(results)
    write_json(args.json, {"machine": machine_line(), "args": {k: v for k, v in vars(args).items()},
                           "results": results})
    return results


if __name__ == "__main__":
    main()
