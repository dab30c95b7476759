"""Encoder backends side by side: single-query latency, batch throughput, agreement with sentence-transformers.

    python benchmarks/encoders.py [--texts 400] [--queries 200] [--json FILE]

Variants: the SentenceTransformer (`st.encode`), the bare transformers forward pass (no pooling, the
floor for torch), and ONNX exports run by onnxruntime: plain fp32, fp32 fused by onnxruntime's
transformer optimizer (what `backend="onnx"` uses), and dynamic int8 (`backend="onnx-int8"`).
Latency calls are interleaved (query 1 on every variant, then query 2 ...), so a busy machine slows
all variants alike. Agreement is the cosine between a variant's vector and sentence-transformers' for
the same text, over real queries and tool texts from ../shared/data.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_DATA, load_sets, machine_line, percentile, sample_queries, sample_tool_texts, write_json  # noqa: E402


def build_variants(st, cache: Path, names: list[str]) -> dict:
    from toolscout.encoders import OnnxEncoder, export_onnx

    out = {}
    for name in names:
        folder = cache / name
        if not (folder / "meta.json").exists():
            variant = "onnx-int8" if name == "onnx-int8" else "onnx"
            start = time.perf_counter()
            export_onnx(st, folder, variant, fuse=(name == "onnx-fused"))
            print(f"  exported {name} in {time.perf_counter() - start:.1f}s -> {folder}")
        out[name] = OnnxEncoder(folder)
    return out


def torch_forward(st):
    """The bare transformer forward pass for one text (tokenise + forward, no pooling): the torch floor."""
    import torch

    tokenizer, model = st.tokenizer, st[0].auto_model

    def run(text):
        with torch.inference_mode():
            features = tokenizer([text], padding=True, truncation=True, max_length=st.max_seq_length,
                                 return_tensors="pt")
            return model(**features).last_hidden_state
    return run


def agreement(reference: np.ndarray, vectors: np.ndarray) -> dict[str, float]:
    cosine = np.sum(reference * vectors, axis=1)
    return {"cos_mean": float(cosine.mean()), "cos_min": float(cosine.min()),
            "cos_p01": float(np.percentile(cosine, 1))}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--model", default=None, help="encoder name or folder (default all-MiniLM-L6-v2)")
    ap.add_argument("--texts", type=int, default=400, help="texts for the agreement check (half queries, half tools)")
    ap.add_argument("--queries", type=int, default=200, help="queries for the latency runs")
    ap.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "toolscout-bench" / "onnx-variants")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from toolscout.encoders import Encoder

    sets = load_sets(args.data)
    queries = sample_queries(sets, args.texts // 2)
    tools = sample_tool_texts(sets, args.texts - len(queries))
    texts = queries + tools
    encoder = Encoder.load(args.model, backend="torch")
    st = encoder.model
    print(f"model {encoder.path}  max_seq_length {st.max_seq_length}  {machine_line()}")
    cache = args.cache_dir / Path(encoder.path).name
    variants = build_variants(st, cache, ["onnx-plain", "onnx-fused", "onnx-int8"])

    reference = st.encode(texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    results: dict[str, dict] = {}
    for name, runner in variants.items():
        batched = runner.encode(texts, batch_size=32)
        one_by_one = np.concatenate([runner.encode([t]) for t in texts[:100]])
        results[name] = agreement(reference, batched)
        results[name]["batch_vs_single_cos_min"] = float(np.min(np.sum(batched[:100] * one_by_one, axis=1)))
        results[name]["queries_cos_min"] = float(np.min(np.sum(reference[:len(queries)] * batched[:len(queries)], axis=1)))
        results[name]["tools_cos_min"] = float(np.min(np.sum(reference[len(queries):] * batched[len(queries):], axis=1)))

    import torch

    threads = torch.get_num_threads()

    def st_one_thread(q):  # torch's OpenMP threads suffer most when other processes share the cores
        torch.set_num_threads(1)
        try:
            return st.encode([q], convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
        finally:
            torch.set_num_threads(threads)

    fns = {
        "torch st.encode": lambda q: st.encode([q], convert_to_numpy=True, normalize_embeddings=True,
                                                show_progress_bar=False),
        "torch st.encode 1t": st_one_thread,
        "torch raw forward": torch_forward(st),
        **{name: (lambda r: (lambda q: r.encode([q])))(runner) for name, runner in variants.items()},
    }
    latency_queries = sample_queries(sets, args.queries, seed=1)
    for fn in fns.values():  # warm up
        for q in latency_queries[:5]:
            fn(q)
    times = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for q in latency_queries:
        for name, fn in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn(q)
            cpu[name].append((time.process_time() - start_cpu) * 1000)
            times[name].append((time.perf_counter() - start) * 1000)
    for name, ts in times.items():
        results.setdefault(name, {}).update(p50_ms=percentile(ts, 50), p90_ms=percentile(ts, 90),
                                            p99_ms=percentile(ts, 99), cpu_p50_ms=percentile(cpu[name], 50))

    # batch throughput on tool texts (what index building pays), 64 per batch
    docs = sample_tool_texts(sets, 256, seed=2, longest=0)
    for name, fn in {"torch st.encode": lambda ts: st.encode(ts, batch_size=64, show_progress_bar=False),
                     **{n: r.encode for n, r in variants.items()}}.items():
        start, start_cpu = time.perf_counter(), time.process_time()
        fn(docs)
        results[name]["batch64_texts_per_s"] = len(docs) / (time.perf_counter() - start)
        results[name]["batch64_texts_per_cpu_s"] = len(docs) / (time.process_time() - start_cpu)

    print(f"\nagreement with sentence-transformers over {len(texts)} real texts "
          f"({len(queries)} test queries + {len(tools)} tool texts, incl. the 20 longest, truncated):")
    print(f"  {'variant':18s} {'cos mean':>10s} {'cos min':>10s} {'cos p1':>10s} {'queries min':>12s} "
          f"{'tools min':>10s} {'batch~single':>13s}")
    for name in variants:
        r = results[name]
        print(f"  {name:18s} {r['cos_mean']:10.7f} {r['cos_min']:10.7f} {r['cos_p01']:10.7f} "
              f"{r['queries_cos_min']:12.7f} {r['tools_cos_min']:10.7f} {r['batch_vs_single_cos_min']:13.7f}")
    print(f"\nsingle-query latency over {len(latency_queries)} real queries (interleaved), and batch throughput:")
    print(f"  {'variant':18s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} {'cpu p50':>8s} {'texts/s @64':>12s} "
          f"{'texts/cpu-s':>12s}")
    for name, r in results.items():
        tput, cput = r.get("batch64_texts_per_s"), r.get("batch64_texts_per_cpu_s")
        print(f"  {name:18s} {r['p50_ms']:8.2f} {r['p90_ms']:8.2f} {r['p99_ms']:8.2f} {r['cpu_p50_ms']:8.2f} "
              f"{(f'{tput:12.0f}' if tput else ' ' * 12)} {(f'{cput:12.0f}' if cput else ' ' * 12)}")
    print("  (cpu p50: process CPU time per call, all threads; other processes on the machine inflate it far "
          f"less than wall time)  {machine_line()}")
    write_json(args.json, {"model": encoder.path, "machine": machine_line(), "results": results})
    return results


if __name__ == "__main__":
    main()
