"""How the default fusion was chosen: leave one training set out at a time (train splits only).

    python benchmarks/leave_one_out.py rank              # train and rank, cached under runs/leave_one_out/ (~45 min)
    python benchmarks/leave_one_out.py fuse --json F     # every fusion over the cached rankings (seconds)

For each of the six dev sets with a train split, the default encoder's recipe (Tool-Embed, the
transformer layers, 50 steps: scripts/build_default_model.sh) is trained on the other five, and the
held-out set's *train-split* queries (at most --max-queries, in file order) are ranked against its own
catalog: tools that model never saw, as a new user's catalog is. That imitates the zero-shot protocol
without reading bfcl, gorilla_huggingface or any test split. Dense rankings are kept for the untrained
base, the tuned model and weight-space blends of the two (WiSE-FT: base + a * (tuned - base)), and BM25
rankings beside them; `fuse` then scores each way of fusing BM25 with each encoder: min-max or
divided-by-the-best scaling at several weights and depths, z-scores, reciprocal rank, and BM25's own
scores plus the dense list divided by its best ("raw-bm25").

docs/default-model.md has the tables this printed.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

import numpy as np

from common import DEFAULT_DATA, machine_line, write_json

SETS = ("apibank", "gorilla_torchhub", "metatool", "rotbench", "sealtools", "toollens")
ALPHAS = (0.5, 1.0, 1.5)  # WiSE-FT blends kept beside the base (a = 0) and the recipe's model (a = 1)
CACHE = Path(__file__).resolve().parents[1] / "runs" / "leave_one_out"
DEPTH = 100


class _Vectors:
    """An encoder stand-in over a live SentenceTransformer (weights swapped between rankings)."""

    def __init__(self, model):
        self.model, self.name, self.dim, self.backend_in_use = model, "leave-one-out", 384, "torch"

    def encode(self, texts, batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        return np.asarray(self.model.encode(list(texts), batch_size=64, normalize_embeddings=True,
                                            convert_to_numpy=True), dtype=np.float32)

    def encode_queries(self, queries) -> np.ndarray:
        from toolscout.conversation import LATEST_TURN_WEIGHT, emphasise_latest_turn
        from toolscout.query import as_queries

        queries = as_queries(queries)
        vectors = self.encode([q.text for q in queries])
        return emphasise_latest_turn(vectors, [q.latest_turn for q in queries], lambda t: self.encode(list(t)),
                                     LATEST_TURN_WEIGHT)


def rankings(retriever, tools, queries) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    retriever.index(tools)
    texts = list(dict.fromkeys(q.text for q in queries))
    out = {}
    for start in range(0, len(texts), 256):
        chunk = texts[start:start + 256]
        out.update(zip(chunk, retriever.search(chunk, DEPTH)))
    return out


def train_recipe(model, data) -> dict:
    """The default encoder's recipe (scripts/build_default_model.sh) on `data`; the tuned weights."""
    import torch

    from toolscout.tool import TextView
    from toolscout.train import embed
    from toolscout.train.loop import set_seed, warmup_then_decay

    steps, names = 50, embed.freeze_parameters(model, "layers")
    setup = embed.PairSetup.of(data, TextView())
    sampler = embed.RandomNegatives(list(data.tools), groups=setup.sets_of_tools)
    examples = embed.epoch_examples(setup.pairs, setup.pair_groups, "sets", 0, 0)
    batches = embed.make_batches(examples, data.train, sampler, 1, 32, 0, 0)
    loss_of = embed.BatchLoss(model, data.train, setup.documents, loss="infonce", tau=0.05, margin=0.3,
                              max_query_length=64, max_doc_length=128, device="cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=5e-5, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay(steps, steps // 10))
    set_seed(0)
    model.train()
    for step in range(steps):
        loss = loss_of(batches[step])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    assert names, "nothing was trained"
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def cmd_rank(args) -> None:
    import torch

    from toolscout.benchmark_sets import load_benchmark
    from toolscout.retrievers.bm25 import BM25Retriever
    from toolscout.retrievers.dense import DenseRetriever, encoder_for
    from toolscout.train.data import load_training_data

    torch.set_num_threads(2)
    CACHE.mkdir(parents=True, exist_ok=True)
    model = encoder_for("minilm", backend="torch").model
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def dense(state, bench, queries):
        model.load_state_dict(state)
        with torch.no_grad():
            return rankings(DenseRetriever(encoder=_Vectors(model), summary_weight=0.3), bench.tools, queries)

    for held in args.sets.split(","):
        target = CACHE / f"{held}.pkl"
        if target.exists():
            continue
        start = time.time()
        bench = load_benchmark(args.data / held)
        queries = bench.split("train")[: args.max_queries]
        out = {"queries": [(q.text, list(q.labels)) for q in queries], "bm25": rankings(BM25Retriever(), bench.tools, queries),
               "dense a=0": dense(base, bench, queries)}
        model.load_state_dict(base)
        tuned = train_recipe(model, load_training_data([args.data / s for s in SETS if s != held], validation_fraction=0.0))
        for a in ALPHAS:
            blend = {k: base[k] + a * (tuned[k] - base[k]) if tuned[k].is_floating_point() else tuned[k] for k in tuned}
            out[f"dense a={a:g}"] = dense(blend, bench, queries)
        model.load_state_dict(base)
        pickle.dump(out, open(target, "wb"))
        print(f"{held}: {len(queries)} queries ranked in {time.time() - start:.0f}s", file=sys.stderr, flush=True)


def scaled(scores: np.ndarray, how: str) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    if len(s) == 0:
        return s
    if how == "max":
        return s / s.max() if s.max() > 0 else np.zeros_like(s)
    if how == "minmax":
        return np.ones_like(s) if s.max() == s.min() else (s - s.min()) / (s.max() - s.min())
    if how == "raw":
        return s
    if how == "z":
        return np.zeros_like(s) if s.std() == 0 else (s - s.mean()) / s.std()
    return 1.0 / (60 + np.arange(1, len(s) + 1))  # rrf


def fused_top10(lists, weights, how: str, depth: int) -> list[str]:
    """The top 10 of BM25's list and a dense one (in that order) fused as `how` says; "raw-bm25" sums
    BM25's own scores with the dense list divided by its best."""
    total: dict[str, float] = {}
    hows = ["raw", "max"] if how == "raw-bm25" else [how, how]
    for (ids, scores), weight, list_how in zip(lists, weights, hows):
        for tid, part in zip(ids[:depth], scaled(scores[:depth], list_how)):
            total[tid] = total.get(tid, 0.0) + weight * part
    return [tid for tid, _ in sorted(total.items(), key=lambda kv: -kv[1])[:10]]


FUSIONS = [("minmax", w, d) for w in (1.0, 1.5, 2.0, 3.0) for d in (50, 100)] \
    + [("max", w, d) for w in (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0) for d in (50, 100)] \
    + [("z", w, 100) for w in (1.5, 2.0, 2.5)] + [("rrf", w, 100) for w in (1.0, 1.5, 2.0)] \
    + [("raw-bm25", w, 100) for w in (8, 12, 16, 20, 24, 28, 32, 40)]


def cmd_fuse(args) -> None:
    from toolscout.eval.metrics import ndcg_at_k

    runs = {s: pickle.load(open(CACHE / f"{s}.pkl", "rb")) for s in args.sets.split(",") if (CACHE / f"{s}.pkl").exists()}
    if not runs:
        raise SystemExit(f"no cached rankings in {CACHE}: run `rank` first")
    encoders = [k for k in next(iter(runs.values())) if k.startswith("dense")]

    def macro(system) -> dict:
        per_set = {s: 100 * float(np.mean([ndcg_at_k(system(r, text), set(labels), 10) for text, labels in r["queries"]]))
                   for s, r in runs.items()}
        return {"macro": round(float(np.mean(list(per_set.values()))), 3), "sets": {s: round(v, 2) for s, v in per_set.items()}}

    table = {"bm25": macro(lambda r, t: list(r["bm25"][t][0][:10]))}
    for enc in encoders:
        table[enc] = macro(lambda r, t, e=enc: list(r[e][t][0][:10]))
        for how, weight, depth in FUSIONS:
            table[f"{enc} + bm25, {how} 1:{weight:g} depth {depth}"] = macro(
                lambda r, t, e=enc, h=how, w=weight, d=depth: fused_top10([r["bm25"][t], r[e][t]], [1.0, w], h, d))
    print(f"sets: {', '.join(runs)}; macro nDCG@10 of the held-out sets' train-split queries\n")
    print("| system | macro | " + " | ".join(runs) + " |\n|---|---|" + "---|" * len(runs))
    for name, row in sorted(table.items(), key=lambda kv: -kv[1]["macro"]):
        print(f"| {name} | {row['macro']:.2f} | " + " | ".join(f"{row['sets'][s]:.2f}" for s in runs) + " |")
    write_json(args.json, {"machine": machine_line(), "systems": table})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("rank", "fuse"):
        p = sub.add_parser(name)
        p.add_argument("--data", type=Path, default=DEFAULT_DATA)
        p.add_argument("--sets", default=",".join(SETS))
        p.add_argument("--max-queries", type=int, default=2000)
        p.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    print(machine_line(), file=sys.stderr)
    {"rank": cmd_rank, "fuse": cmd_fuse}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
