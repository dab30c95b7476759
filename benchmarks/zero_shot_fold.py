"""How the default encoder's training recipe and the default fusion were chosen: on train splits only.

Fold: train on FOLD_TRAIN's train splits; validate on HELD_OUT's train-split queries, each set ranked
against its own catalog (the zero-shot test protocol; bfcl / gorilla_huggingface are never read here).

  python benchmarks/zero_shot_fold.py train OUT [--steps N] [--eval-every E] [--lr X] [--batch-size B] [-o key=json ...]
  python benchmarks/zero_shot_fold.py score MODEL_DIR|base --json F     held-out train-split metrics: dense at several summary
                                                  weights, BM25, and hybrid fusions (cached components)
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

from common import DEFAULT_DATA as DATA

FOLD_TRAIN = ["metatool", "sealtools", "toollens"]
HELD_OUT = ["gorilla_torchhub", "rotbench", "apibank"]
CACHE = Path(__file__).resolve().parents[1] / "runs" / "zero_shot_fold"  # BM25 rankings, reused across runs


def fold_data():
    from toolscout.benchmark_sets import load_benchmark
    from toolscout.train.data import TrainingData, load_training_data

    data = load_training_data([DATA / s for s in FOLD_TRAIN], validation_fraction=0.0)
    tools, validation = dict(data.tools), []
    for name in HELD_OUT:
        bench = load_benchmark(DATA / name)
        for tool in bench.tools:
            assert tool.id not in tools
            tools[tool.id] = tool
        validation.extend(bench.split("train"))
    return TrainingData(tools, data.train, validation, FOLD_TRAIN + HELD_OUT)


def cmd_train(args):
    from toolscout.train import embed
    from toolscout.train.loop import TrainConfig

    class LoggedValidation(embed.SetValidation):  # print each set's score at every validation
        def __call__(self):
            score = super().__call__()
            print(json.dumps({"t": round(time.time() - t0), "macro": round(score, 3),
                              **{k: round(v, 3) for k, v in self.per_set.items()}}), flush=True)
            return score

    embed.SetValidation = LoggedValidation
    options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)}
    options.setdefault("max_validation", 450)
    options.setdefault("max_validation_tools", None)
    data = fold_data()
    assert not {q.id for q in data.train} & {q.id for q in data.validation}
    print(f"train {len(data.train)} queries of {FOLD_TRAIN}; validate {len(data.validation)} of {HELD_OUT}",
          flush=True)
    config = TrainConfig(max_steps=args.steps, eval_every=args.eval_every, lr=args.lr, batch_size=args.batch_size,
                         patience=1000, seed=args.seed, progress=False, checkpoint_every=10**9)
    t0 = time.time()
    summary = embed.fit_embed(data, args.out, config=config, **options)
    print(json.dumps({"done": True, "time_s": summary.time_s, "steps": summary.steps,
                      "best_step": summary.best_step, "best_validation": summary.best_validation}), flush=True)


class Cached:
    """A retriever stand-in that replays precomputed rankings (depth 100) for known query texts."""

    def __init__(self, table):
        self.table = table

    def search(self, queries, k=10, filter=None):
        from toolscout.results import Results

        rows = [self.table[q] for q in queries]
        return Results(tuple(ids[:k] for ids, _ in rows), tuple(s[:k] for _, s in rows))


def rankings(retriever, tools, queries, depth=100):
    retriever.index(tools)
    texts = list(dict.fromkeys(q.text for q in queries))
    out = {}
    for start in range(0, len(texts), 256):
        chunk = texts[start:start + 256]
        for text, (ids, scores) in zip(chunk, retriever.search(chunk, depth)):
            out[text] = (ids, scores)
    return out


def cmd_score(args):
    from toolscout.benchmark_sets import load_benchmark
    from toolscout.eval import evaluate
    from toolscout.retrievers.bm25 import BM25Retriever
    from toolscout.retrievers.dense import DenseRetriever, encoder_for
    from toolscout.retrievers.hybrid import HybridRetriever

    sets = [load_benchmark(DATA / s) for s in (args.sets or HELD_OUT)]
    model = None if args.model == "base" else args.model
    encoder = encoder_for(model)
    weights = [float(w) for w in args.summary_weights.split(",")]
    CACHE.mkdir(parents=True, exist_ok=True)
    cache = CACHE / "bm25_cache.pkl"
    bm25 = pickle.loads(cache.read_bytes()) if cache.exists() else {}
    dense: dict[float, dict] = {w: {} for w in weights}
    for bench in sets:
        queries = bench.split(args.split)
        if bench.name not in bm25:
            bm25[bench.name] = rankings(BM25Retriever(), bench.tools, queries)
            cache.write_bytes(pickle.dumps(bm25))
        for w in weights:
            dense[w][bench.name] = rankings(DenseRetriever(encoder=encoder, summary_weight=w), bench.tools, queries)
        print(f"ranked {bench.name}", file=sys.stderr, flush=True)

    def run(label, make):
        def factory(tools):
            name = next(b.name for b in sets if b.tools[0].id == tools[0].id)
            system = make(name)
            return type("S", (), {"retrieve": staticmethod(lambda qs, k: system.search(qs, k))})()
        report = evaluate(sets, factory, split=args.split, name=label, progress=False, warmup=0)
        row = report.to_json()
        out[label] = {"mean": row["mean"], "sets": {k: {m: v[m] for m in ("ndcg@10", "recall@10", "completeness@10")}
                                                     for k, v in row["sets"].items()}}
        per = " ".join(f"{k}={v['ndcg@10']:.2f}" for k, v in row["sets"].items())
        print(f"{label:40s} macro nDCG@10 {row['mean']['ndcg@10']:.2f}  {per}", flush=True)

    out: dict = {}
    run("bm25", lambda n: Cached(bm25[n]))
    for w in weights:
        run(f"dense sw={w}", lambda n, w=w: Cached(dense[w][n]))
    grid = ((1, 0.75), (1, 1), (1, 1.5), (1, 2), (1, 3))
    fusions = [("rrf", k, wt) for k in (10, 30, 60) for wt in grid] + [("score", None, wt) for wt in grid]
    for w in weights:
        for fusion, k, wt in fusions:
            label = f"hybrid sw={w} {fusion}" + (f" k={k}" if k else "") + f" w={wt[0]}:{wt[1]}"
            run(label, lambda n, w=w, fusion=fusion, k=k, wt=wt: HybridRetriever(
                [Cached(bm25[n]), Cached(dense[w][n])], weights=list(wt), fusion=fusion, rrf_k=k or 60))
    Path(args.json).write_text(json.dumps(out, indent=1))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("out")
    t.add_argument("--steps", type=int, default=1500)
    t.add_argument("--eval-every", type=int, default=250)
    t.add_argument("--lr", type=float, default=2e-5)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("-o", "--option", action="append", default=[])
    s = sub.add_parser("score")
    s.add_argument("model")
    s.add_argument("--json", required=True)
    s.add_argument("--split", default="train")
    s.add_argument("--sets", nargs="*")
    s.add_argument("--summary-weights", default="0,0.3")
    args = p.parse_args()
    {"train": cmd_train, "score": cmd_score}[args.cmd](args)


if __name__ == "__main__":
    main()
