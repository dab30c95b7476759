"""The default pipeline against what toolscout shipped before, on tools no model was trained on.

    python benchmarks/default_pipeline.py --json runs/default_pipeline.json

Zero-shot protocol: the test queries of bfcl and gorilla_huggingface, whose tools no
toolscout model has seen, each set ranked against its own catalog. Systems, in one run so they can be
compared query by query:

  dense/minilm        the old default: dense retrieval with the untrained all-MiniLM-L6-v2
  hybrid-rrf/minilm   the old hybrid: BM25 + that dense, reciprocal-rank fusion (k 60, equal weights)
  hybrid/minilm       the default fusion with the untrained encoder (what the fusion alone brings)
  dense/tools         dense retrieval with the packaged tool-tuned encoder (what the encoder alone brings)
  default             `ToolScout.from_tools(tools)`: whatever `toolscout.defaults` says (the others rank
                      each task as one request, as toolscout did before multi-request splitting)

`--rerank DIR` also evaluates each system with that trained second stage (`NAME+cross@20`). Prints
nDCG@10, Recall@10 and Completeness@10 per set and macro, and a paired bootstrap of the default against
the old hybrid and the old default; `--json` keeps it all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import DEFAULT_DATA, ZERO_SHOT, machine_line, write_json

METRICS = ("ndcg@10", "recall@10", "completeness@10")


def systems(reranker=None) -> dict:
    """name -> factory(tools) of each system compared; with `reranker`, each system also with that second
    stage (as "NAME+RERANKER@DEPTH")."""
    from toolscout.pipeline import ToolScout
    from toolscout.retrievers.dense import encoder_for

    minilm, tools_encoder = encoder_for("minilm"), encoder_for(None)
    old_hybrid = {"fusion": "rrf", "rrf_k": 60, "weights": [1.0, 1.0]}
    whole = {"intents": None}  # every system but the default ranks each task as one request, as before
    settings = {
        "dense/minilm": dict(retriever="dense", encoder=minilm, **whole),
        "hybrid-rrf/minilm": dict(retriever="hybrid", encoder=minilm, **old_hybrid, **whole),
        "hybrid/minilm": dict(retriever="hybrid", encoder=minilm, **whole),
        "dense/tools": dict(retriever="dense", encoder=tools_encoder, **whole),
        "default": {},
    }
    out = {name: (lambda t, o=options: cold(ToolScout.from_tools(t, **o))) for name, options in settings.items()}
    if reranker is not None:
        out.update({f"{name}+{reranker.name}@{reranker.depth}":
                    (lambda t, o=options: cold(ToolScout.from_tools(t, reranker=reranker, **o)))
                    for name, options in settings.items()})
    return out


def cold(scout):
    """`scout` with an empty query cache: the systems share encoders, and each is timed as it would run alone."""
    from toolscout.retrievers.base import forget_task_vectors

    forget_task_vectors(scout.retriever)
    return scout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--sets", default=",".join(ZERO_SHOT))
    parser.add_argument("--only", action="append", help="evaluate only these systems (repeatable)")
    parser.add_argument("--rerank", default=None, metavar="DIR",
                        help="also evaluate each system with this second stage (a `toolscout train cross|refiner` dir)")
    parser.add_argument("--bootstrap", type=int, default=10000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from toolscout.eval import evaluate, format_table, paired_bootstrap

    print(machine_line(), file=sys.stderr)
    folders = [args.data / name for name in args.sets.split(",") if name]
    reranker = None
    if args.rerank:
        from toolscout.rerank.base import load_reranker

        reranker = load_reranker(args.rerank)
    chosen = {n: f for n, f in systems(reranker).items() if not args.only or n.split("+")[0] in args.only}
    reports = {name: evaluate(folders, factory, k=10, name=name, progress=False) for name, factory in chosen.items()}
    print(format_table(list(reports.values()), metrics=list(METRICS)))
    tests = {}
    for baseline in ("hybrid-rrf/minilm", "dense/minilm"):
        if baseline in reports and "default" in reports:
            for metric in METRICS:
                result = paired_bootstrap(reports[baseline], reports["default"], metric, args.bootstrap)
                tests[f"default vs {baseline}: {metric}"] = result.to_dict()
                print(f"default vs {baseline}, {metric}: {result.diff:+.2f} points "
                      f"(95% CI {result.ci_low:+.2f} .. {result.ci_high:+.2f}, p = {result.p_two_sided:.4f} two-sided, "
                      f"{result.n_queries} queries)")
    write_json(args.json, {"sets": args.sets, "systems": {n: r.to_json() for n, r in reports.items()},
                           "bootstrap": tests})
    return 0


if __name__ == "__main__":
    sys.exit(main())
