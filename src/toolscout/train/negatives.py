"""Hard negatives: tools a first-stage retriever ranks high for a query that are not among its gold tools."""

from __future__ import annotations

from typing import Sequence

from ..benchmark_sets import Query
from ..results import Filter, Results


def hard_negatives(queries: Sequence[Query], results: Results, per_query: int) -> list[list[str]]:
    """For each query, the first `per_query` retrieved ids that are not gold (gold tools never count)."""
    out = []
    for query, (ids, _scores) in zip(queries, results):
        gold = set(query.labels)
        out.append([tid for tid in ids if tid not in gold][:per_query])
    return out


def mine_hard_negatives(retriever, queries: Sequence[Query], per_query: int = 7, depth: int = 30,
                        batch_size: int = 256, filter: Filter | None = None) -> list[list[str]]:
    """Run `retriever` (already indexed) over the queries and keep its top non-gold tools (among the
    tools `filter` allows, e.g. the queries' own training set)."""
    out: list[list[str]] = []
    for start in range(0, len(queries), batch_size):
        batch = queries[start:start + batch_size]
        results = retriever.search([q.text for q in batch], depth, filter=filter)
        out.extend(hard_negatives(batch, results, per_query))
    return out


def build_miner(kind: str, base_model: str, tools: Sequence):
    """The first-stage retriever that mines hard negatives: "bm25", or a dense retriever on `base_model`
    (without the summary blend: the miner the recorded runs used), indexed on `tools`."""
    if kind == "bm25":
        from ..retrievers.bm25 import BM25Retriever

        miner = BM25Retriever()
    else:
        from ..retrievers.dense import DenseRetriever

        miner = DenseRetriever(model=base_model, summary_weight=0.0)
    miner.index(list(tools))
    return miner
