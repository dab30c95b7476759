"""Calibrate the abstention threshold (`toolscout serve --min-score`) on benchmark sets.

    python -m toolscout.serve.abstain /work/shared/data/{apibank,metatool,rotbench,sealtools,toollens} \\
        --retriever dense -k 5 --json abstain.json

Protocol (per set; one global threshold):
- *normal* queries: the set's queries against its whole catalog;
- *no-match* queries: the same queries against the catalog with their own gold tools removed (a filter
  that excludes them: for the dense retriever exactly the same as deleting them), so no tool fits.
The threshold gates on the best retrieved score: below it, the search returns nothing. It is chosen on
train-split queries as the highest threshold that keeps at least `--keep` (default 0.95) of the
recall@k on normal queries, and reported on test-split queries: the share of no-match queries answered
with nothing, and recall@k on normal queries with and without abstention.

Scores are the retriever's own (for dense, a weighted mean of the cosines of a tool's text and its
summary): a threshold belongs to one retriever + model + summary weight. Tool
and query embeddings are cached under `--cache` so reruns are quick.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..query import Query, as_queries


class CachingEncoder:
    """Wraps an `Encoder`: vectors of texts seen before come from an on-disk cache (keyed by the model
    name and a hash of the text), the rest are encoded and added. Call `flush()` to write the cache."""

    def __init__(self, encoder: Any, folder: str | os.PathLike):
        self.encoder = encoder
        self.name = encoder.name
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.backend_in_use = getattr(encoder, "backend_in_use", None)  # what an index built with it records
        tag = hashlib.sha1(f"{encoder.name}|{getattr(encoder, 'path', '')}|{self.backend_in_use}".encode()).hexdigest()[:12]
        self._file = self.folder / f"{tag}.npz"
        self._index: dict[str, int] = {}
        self._vectors = np.zeros((0, encoder.dim), dtype=np.float32)
        if self._file.exists():
            with np.load(self._file) as data:
                keys, vectors = list(data["keys"]), data["vectors"]
            if len(keys) == len(vectors):
                self._index = {str(k): i for i, k in enumerate(keys)}
                self._vectors = vectors
        self._dirty = False

    @property
    def dim(self) -> int:
        return self.encoder.dim

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        keys = [self._key(t) for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._index))
        if missing:
            first = {k: t for k, t in zip(reversed(keys), reversed(list(texts)))}
            vectors = self.encoder.encode([first[k] for k in missing], batch_size=batch_size, show_progress=show_progress)
            start = len(self._vectors)
            self._vectors = np.concatenate([self._vectors, vectors.astype(np.float32)])
            self._index.update({k: start + i for i, k in enumerate(missing)})
            self._dirty = True
        return self._vectors[[self._index[k] for k in keys]]

    def encode_queries(self, queries: Sequence[Query | str]) -> np.ndarray:
        """As the wrapped `Encoder`'s: transcripts weigh in their latest turn (`toolscout.conversation`);
        a request cut from a task is embedded alone (the cache is keyed by text: no late chunking)."""
        from ..conversation import emphasise_latest_turn

        queries = as_queries(queries)
        return emphasise_latest_turn(self.encode([q.text for q in queries]), [q.latest_turn for q in queries],
                                     self.encode, self.encoder.latest_turn_weight)

    def flush(self) -> None:
        """Write the cache (one file, replaced atomically: concurrent runs cannot leave it half written)."""
        if not self._dirty:
            return
        keys = np.array(sorted(self._index, key=self._index.get))
        tmp = self._file.with_name(f".{self._file.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, keys=keys, vectors=self._vectors)
        os.replace(tmp, self._file)
        self._dirty = False


@dataclass
class Scored:
    """Per query: best score against the full catalog, recall@k there, best score with gold removed."""

    set: str
    split: str
    normal_top: float
    normal_recall: float
    nomatch_top: float


def score_set(bench: Any, scout: Any, queries: Sequence[Any], k: int, split: str) -> list[Scored]:
    from ..results import Filter

    texts = [q.text for q in queries]
    full = scout.retrieve(texts, k)
    out = []
    for q, (ids, scores) in zip(queries, full):
        gold = set(q.labels)
        recall = len(gold & set(ids)) / len(gold) if gold else 0.0
        removed = scout.retrieve([q.text], 1, Filter.make(exclude_ids=gold))
        top_removed = float(removed.scores[0][0]) if len(removed.scores[0]) else float("-inf")
        out.append(Scored(bench.name, split, float(scores[0]) if len(scores) else float("-inf"), recall, top_removed))
    return out


def evaluate(rows: Sequence[Scored], threshold: float | None) -> dict[str, float]:
    """Abstention rate on no-match queries and recall@k on normal queries at `threshold`."""
    if not rows:
        return {"queries": 0}
    t = float("-inf") if threshold is None else threshold
    normal_recall = np.array([r.normal_recall for r in rows])
    answered = np.array([r.normal_top >= t for r in rows])
    return {"queries": len(rows),
            "nomatch_abstained": 100.0 * float(np.mean([r.nomatch_top < t for r in rows])),
            "normal_answered": 100.0 * float(np.mean(answered)),
            "recall": 100.0 * float(np.mean(normal_recall * answered)),
            "recall_without_abstention": 100.0 * float(np.mean(normal_recall))}


def choose_threshold(rows: Sequence[Scored], keep: float) -> float:
    """The highest threshold whose recall on `rows` is at least `keep` × the recall without abstention.
    Recall is summed per set and averaged over sets, so no set dominates by its size."""
    sets = sorted({r.set for r in rows})
    by_set = {s: [r for r in rows if r.set == s] for s in sets}

    def macro_recall(t: float) -> float:
        return float(np.mean([np.mean([r.normal_recall * (r.normal_top >= t) for r in by_set[s]]) for s in sets]))

    base = macro_recall(float("-inf"))
    candidates = sorted({r.normal_top for r in rows} | {r.nomatch_top for r in rows})
    best = candidates[0] if candidates else 0.0
    lo, hi = 0, len(candidates) - 1  # recall falls as the threshold rises: binary search the last good one
    while lo <= hi:
        mid = (lo + hi) // 2
        if macro_recall(candidates[mid]) >= keep * base - 1e-12:
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return float(best)


def _sample(queries: list, n: int | None, seed: int) -> list:
    if n is None or len(queries) <= n:
        return queries
    rng = random.Random(seed)
    return rng.sample(queries, n)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolscout.serve.abstain", description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="+", metavar="SET_DIR")
    parser.add_argument("--retriever", default="dense")
    parser.add_argument("--model", default=None)
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--keep", type=float, default=0.95, help="share of train recall@k to keep (default %(default)s)")
    parser.add_argument("--max-train", type=int, default=400, help="train queries per set (sampled; default %(default)s)")
    parser.add_argument("--max-test", type=int, default=500, help="test queries per set (sampled; default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default="/tmp/toolscout-embeddings", help="embedding cache folder")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from ..benchmark import load_benchmark
    from ..pipeline import ToolScout

    options: dict[str, Any] = {}
    cache = None
    if args.retriever == "dense":
        from ..encoders import Encoder

        cache = CachingEncoder(Encoder.load(args.model), args.cache)
        options = {"encoder": cache}
    rows: list[Scored] = []
    start = time.perf_counter()
    for folder in args.sets:
        bench = load_benchmark(folder)
        train = _sample(bench.split("train"), args.max_train, args.seed)
        test = _sample(bench.split("test"), args.max_test, args.seed)
        if not train or not test:
            print(f"{bench.name}: skipped (needs train and test queries)", file=sys.stderr)
            continue
        scout = ToolScout.from_tools(bench.tools, retriever=args.retriever, **options)
        rows += score_set(bench, scout, train, args.k, "train") + score_set(bench, scout, test, args.k, "test")
        if cache is not None:
            cache.flush()
        print(f"{bench.name}: {len(bench.tools)} tools, {len(train)} train / {len(test)} test queries "
              f"({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    train_rows = [r for r in rows if r.split == "train"]
    threshold = choose_threshold(train_rows, args.keep)
    report: dict[str, Any] = {"retriever": args.retriever, "k": args.k, "keep": args.keep, "threshold": threshold,
                              "train": evaluate(train_rows, threshold), "test": {}, "test_sets": {}}
    test_rows = [r for r in rows if r.split == "test"]
    report["test"] = evaluate(test_rows, threshold)
    for name in sorted({r.set for r in test_rows}):
        report["test_sets"][name] = evaluate([r for r in test_rows if r.set == name], threshold)
    sets = list(report["test_sets"].values())
    report["test_macro"] = {key: float(np.mean([s[key] for s in sets])) for key in sets[0] if key != "queries"}
    report["curve_test"] = {f"{t:.3f}": evaluate(test_rows, t) for t in np.linspace(threshold - 0.15, threshold + 0.15, 7)}
    _print(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _print(report: dict[str, Any]) -> None:
    print(f"threshold (top-1 {report['retriever']} score, chosen on train to keep {report['keep']:.0%} of "
          f"recall@{report['k']}): {report['threshold']:.4f}")
    header = f"{'':22} {'queries':>7} {'no-match abstained':>19} {'recall@k kept':>14} {'recall@k no abst.':>18}"
    print(header)
    lines = [("train (all sets)", report["train"]), ("test (all sets)", report["test"])]
    lines += [(f"  test {name}", row) for name, row in report["test_sets"].items()]
    for label, row in lines:
        print(f"{label:22} {row['queries']:7d} {row['nomatch_abstained']:18.1f}% {row['recall']:13.1f}% "
              f"{row['recall_without_abstention']:17.1f}%")
    macro = report["test_macro"]
    print(f"{'test macro (sets)':22} {'':7} {macro['nomatch_abstained']:18.1f}% {macro['recall']:13.1f}% "
          f"{macro['recall_without_abstention']:17.1f}%")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
