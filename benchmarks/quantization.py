"""The retrieval-quality check a faster encoding must pass before toolscout uses it (`encoders/quality.py`).

    python benchmarks/quantization.py                              # the default encoder, every dev set
    python benchmarks/quantization.py --model minilm --record      # and keep the verdict with the model

Ranks every labelled dev set's test queries against its own catalog with the dense retriever twice, in
one run: with the exact (float32) encoding and with dynamically quantised int8 weights. Prints nDCG@10
per set and the macro mean for both, the macro delta and the verdict (passes when it moves by less than
0.3 points), and the query encoding time of each; `--pipeline` also ranks with the default pipeline under
each encoding (for information: the check is the dense retriever's, where an encoding's change shows
most). `--record` writes the verdict with the model, where `backend="auto"` reads it: a packaged model's
manifest in the source tree (so the wheel carries it), or `toolscout-quality.json` in a model folder. The
verdict keeps the int8 encoder's embeddings of the export probe texts, so `auto` uses int8 only on
machines whose int8 kernels give the encoding that was checked.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import DEFAULT_DATA, machine_line, write_json

SETS = ("apibank", "bfcl", "gorilla_huggingface", "gorilla_torchhub", "metatool", "rotbench", "sealtools", "toollens")


def ndcg_per_set(encoder, folders: list[Path], max_queries: int | None, system: str = "dense",
                 fast_queries: bool = False) -> dict[str, float]:
    """nDCG@10 per set of the dense retriever alone (`system="dense"`: the check, where an encoding's
    change shows most) or of the default pipeline with this encoder (`"default"`: what users get);
    `fast_queries`: tasks through the static table distilled from the encoder (benchmarks/fast_tier.py)."""
    from toolscout.eval import evaluate
    from toolscout.pipeline import ToolScout

    options = {"retriever": "dense", "intents": None} if system == "dense" else {}

    def build(tools):
        scout = ToolScout.from_tools(tools, encoder=encoder, **options)
        return scout.use_fast_queries() if fast_queries else scout

    report = evaluate(folders, build, k=10, progress=False, max_queries=max_queries)
    return {name: s.metrics["ndcg@10"] for name, s in report.sets.items()}


def query_ms(encoder, queries: list[str]) -> float:
    """Median milliseconds to encode one query (the cache bypassed: each query is new)."""
    times = []
    for q in queries:
        start = time.perf_counter()
        encoder._encode_queries([q])
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def print_table(title: str, check: dict) -> None:
    print(f"{title}\n\n| set | exact | int8 | delta |\n|---|---|---|---|")
    for name, row in check["per_set"].items():
        print(f"| {name} | {row['exact']:.2f} | {row['fast']:.2f} | {row['fast'] - row['exact']:+.2f} |")
    print(f"| macro | {check['macro_exact']:.2f} | {check['macro_fast']:.2f} | {check['macro_delta']:+.2f} |\n")


def record_target(model: str) -> Path:
    """Where the verdict is kept: a packaged model's source folder, or the model folder itself."""
    from toolscout.encoders import resolve_model
    from toolscout.encoders.packaged import packaged_models

    return packaged_models().get(model) or Path(resolve_model(model))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", default=None, help="encoder name or folder (default: the default encoder)")
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--max-queries", type=int, default=None)
    parser.add_argument("--record", action="store_true", help="keep the verdict with the model")
    parser.add_argument("--pipeline", action="store_true",
                        help="also rank with the default pipeline (BM25 + dense) under each encoding, for information")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from toolscout.benchmark import load_benchmark
    from toolscout.encoders import PROBE_TEXTS, Encoder
    from toolscout.encoders.quality import record, verdict

    print(machine_line(), file=sys.stderr)
    folders = [args.data / s for s in args.sets.split(",") if s]
    probes = [q.text for f in folders[:4] for q in load_benchmark(f).split("test")[:50]]
    results, pipeline, speed, encoders = {}, {}, {}, {}
    for backend in ("exact", "onnx-int8"):
        encoder = encoders[backend] = Encoder.load(args.model, backend=backend)
        speed[backend] = query_ms(encoder, probes)
        results[backend] = ndcg_per_set(encoder, folders, args.max_queries)
        print(f"{backend} ({encoder.backend_in_use}): " + ", ".join(f"{k} {v:.2f}" for k, v in results[backend].items())
              + f"; query {speed[backend]:.2f} ms", file=sys.stderr, flush=True)
        if args.pipeline:
            pipeline[backend] = ndcg_per_set(encoder, folders, args.max_queries, system="default")
    check = verdict(results["exact"], results["onnx-int8"],
                    probe_vectors=encoders["onnx-int8"].encode(list(PROBE_TEXTS)))
    check.update({"query_ms_exact": round(speed["exact"], 3), "query_ms_int8": round(speed["onnx-int8"], 3),
                  "sets": sorted(results["exact"]), "command": "python benchmarks/quantization.py"
                  + (f" --model {args.model}" if args.model else "")})
    if pipeline:
        check["default_pipeline"] = verdict(pipeline["exact"], pipeline["onnx-int8"])
    print_table("dense retriever (the check)", check)
    if pipeline:
        print_table("default pipeline (for information)", check["default_pipeline"])
    print(f"verdict: {'PASS' if check['passed'] else 'FAIL'} (|delta| < {check['tolerance']}); query encoding "
          f"{check['query_ms_exact']:.2f} -> {check['query_ms_int8']:.2f} ms")
    if args.record:
        from toolscout.encoders.resolve import default_encoder_name

        print(f"recorded in {record(record_target(args.model or default_encoder_name()), check)}")
    write_json(args.json, check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
