"""The retrieval-quality check a faster encoding must pass before toolscout uses it (`encoders/quality.py`).

    python benchmarks/quantization.py                              # the default encoder, every dev set
    python benchmarks/quantization.py --model minilm --json runs/int8.json
    python scripts/record_quality_check.py runs/int8.json --model minilm   # keep the verdict (a release step)

Ranks every labelled dev set's test queries against its own catalog with the dense retriever twice, in
one run: with the exact (float32) encoding and with dynamically quantised int8 weights. Prints nDCG@10
per set and the macro mean for both, the macro delta and the verdict (passes when it moves by less than
0.3 points), and the query encoding time of each; `--pipeline` also ranks with the default pipeline under
each encoding (for information: the check is the dense retriever's, where an encoding's change shows
most). `scripts/record_quality_check.py` keeps the `--json` verdict with the model, where `backend="auto"`
reads it. The verdict keeps the int8 encoder's embeddings of the export probe texts, so `auto` uses int8
only on machines whose int8 kernels give the encoding that was checked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import DEFAULT_DATA, DEV_SETS, encode_ms, machine_line, ndcg_per_set, print_check_table, write_json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", default=None, help="encoder name or folder (default: the default encoder)")
    parser.add_argument("--sets", default=",".join(DEV_SETS))
    parser.add_argument("--max-queries", type=int, default=None)
    parser.add_argument("--pipeline", action="store_true",
                        help="also rank with the default pipeline (BM25 + dense) under each encoding, for information")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from toolscout.benchmark_sets import load_benchmark
    from toolscout.encoders import PROBE_TEXTS, Encoder
    from toolscout.encoders.query_cache import QueryCache
    from toolscout.encoders.quality import verdict

    print(machine_line(), file=sys.stderr)
    folders = [args.data / s for s in args.sets.split(",") if s]
    probes = [q.text for f in folders[:4] for q in load_benchmark(f).split("test")[:50]]
    results, pipeline, speed, encoders = {}, {}, {}, {}
    for backend in ("exact", "onnx-int8"):
        encoder = encoders[backend] = Encoder.load(args.model, backend=backend)
        encoder.query_cache = QueryCache(0)  # every task encoded
        speed[backend] = encode_ms(encoder.encode_queries, probes)
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
    print_check_table("dense retriever (the check)", check)
    if pipeline:
        print_check_table("default pipeline (for information)", check["default_pipeline"])
    print(f"verdict: {'PASS' if check['passed'] else 'FAIL'} (|delta| < {check['tolerance']}); query encoding "
          f"{check['query_ms_exact']:.2f} -> {check['query_ms_int8']:.2f} ms")
    write_json(args.json, check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
