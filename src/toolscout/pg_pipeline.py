"""A tenant of a PostgreSQL index as the parts of its pipeline, and what the PostgreSQL store can serve.

The table's configuration records one pipeline spec (`toolscout.spec`), which every process serving any of
its tenants builds through the one factory, `ToolScout.build` (`ToolScout.from_tenant`). `TenantParts`
supplies what the factory does not make from the spec alone: the tools (in the order they joined the
catalog, the `seq` column), each first-stage retriever with its indexed data (BM25 over the tools' text
views; the dense part over the vectors the database holds), when tools joined, and the learned channel's
state, built from the feedback rows (`LearningFollower`). Nothing is embedded here but the tasks searched (and
requests recorded before their vectors were kept). `take` brings those parts up to date with rows written
since (what a replica reads from the change log, `serve/pg_replica.py`).

Up to `IN_MEMORY_TOOLS` tools the dense vectors are held in memory and searched exactly, as the library
does. Above, they would cost every replica too much memory (1.5 KB a tool in float32, plus the int8 copy
the scan reads first), so the dense part searches the database's HNSW index instead: the same pipeline
around it, with approximate dense hits.

What the store serves (`check_servable`, applied when a catalog is indexed or migrated, never replaced by
something else): first stages of BM25 and one dense retriever (alone, or fused by hybrids, with any
settings), any request splitting and fast tier, and a reranker that every replica can load (an LLM
endpoint, or a trained model directory at a path the replicas read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .feedback import PER_SOURCE_CAP
from .learning import LearningSettings
from .retrievers.bm25 import BM25Retriever
from .retrievers.dense import DenseRetriever, encoder_for
from .retrievers.hybrid import default_settings
from .spec import PipelineSpec, node_of
from .store import pg_feedback
from .store.local import make_store
from .store.pg_catalog import PgCatalog, stored_tool
from .store.pg_config import IndexConfig
from .store.pgvector import PgStoreError
from .tool import TextView, Tool

IN_MEMORY_TOOLS = 100_000
LEAVES = ("bm25", "dense")  # the first-stage retrievers a tenant's rows can make
SERVED = ("PostgreSQL serves first stages of bm25 and one dense retriever (alone or fused by a hybrid, with "
          "any settings), with request splitting, a fast tier and a reranker every replica can load")


# ------------------------------------------------------------------------------ what the store serves

def unservable(spec: PipelineSpec) -> list[str]:
    """Why the PostgreSQL store cannot serve `spec` (empty: it can), one reason per setting."""
    reasons = []
    leaves = spec.leaves()
    for leaf in leaves:
        if leaf.node["name"] not in LEAVES:
            reasons.append(f"retriever {leaf.node['name']!r} ({leaf.where}): its index is not rows of the table "
                           "(vectors learned from usage, a classifier head or its own tool tower)")
    dense = [leaf for leaf in leaves if leaf.node["name"] == "dense"]
    if len(dense) != 1:
        reasons.append(f"{len(dense)} dense retrievers: a table holds one column of dense vectors, so its "
                       "pipeline needs exactly one dense retriever")
    if spec.reranker is not None:
        reasons += _reranker_problems(spec.reranker)
    return reasons


def _reranker_problems(config: Mapping[str, Any]) -> list[str]:
    model = config.get("model")
    if model is None or Path(model).is_dir():
        return []
    return [f"reranker {config.get('reranker')!r}: its model directory {model} is not there, and every replica "
            "loads it from that path"]


def check_servable(spec: PipelineSpec, where: str = "this pipeline") -> None:
    """Refuse, naming each setting, a pipeline the PostgreSQL store cannot serve as it is."""
    reasons = unservable(spec)
    if reasons:
        raise PgStoreError(f"the PostgreSQL store cannot serve {where}: " + "; ".join(reasons) + f". {SERVED}; "
                           "index with --retriever hybrid or dense, or keep this pipeline in a directory (--out DIR "
                           "without --store)")


# ------------------------------------------------------------------------------ the table's pipeline

def table_spec(config: IndexConfig) -> PipelineSpec:
    """The pipeline every server of the table builds: the spec it records, or, for a table indexed before
    specs were recorded, the pipeline its servers built then (the default hybrid of BM25 and the dense
    vectors, or dense alone, splitting tasks as `intents` says)."""
    if config.pipeline:
        return PipelineSpec.from_dict(config.pipeline)
    dense = {"name": "dense", "settings": {"model": config.model, "view": config.view, "batch_size": 64,
                                           "summary_weight": config.summary_weight, "encoding": config.encoding}}
    if config.search != "hybrid":
        return PipelineSpec(dense, config.intents)
    return PipelineSpec(hybrid_of([node_of(BM25Retriever(TextView.from_dict(config.view))), dense]), config.intents)


def hybrid_of(nodes: Sequence[dict]) -> dict:
    """The node of a hybrid fusing `nodes` with the default fusion settings."""
    return {"name": "hybrid", "settings": default_settings([n["name"] for n in nodes]), "components": list(nodes)}


def dense_settings(spec: PipelineSpec) -> dict:
    """The settings of the pipeline's one dense retriever (`check_servable` makes sure there is one)."""
    found = [leaf.node["settings"] for leaf in spec.leaves() if leaf.node["name"] == "dense"]
    if len(found) != 1:
        check_servable(spec)
    return found[0]


def index_config(spec: PipelineSpec, feedback_cap: int = PER_SOURCE_CAP) -> IndexConfig:
    """The table configuration recording `spec` (the vectors' description taken from its dense retriever)."""
    dense = dense_settings(spec)
    return IndexConfig(dense["model"], dict(dense.get("view") or {}),
                       "hybrid" if spec.retriever["name"] == "hybrid" else "dense",
                       float(dense.get("summary_weight", 0.0)), spec.intents, int(feedback_cap),
                       dense.get("encoding", "exact"), spec.to_dict())


def with_search(spec: PipelineSpec, search: str) -> PipelineSpec:
    """`spec` switched to dense search (its dense retriever alone) or hybrid (a hybrid already, or the
    default hybrid of BM25 over the dense retriever's view and the dense retriever), all else kept."""
    dense = next(leaf.node for leaf in spec.leaves() if leaf.node["name"] == "dense")
    if search == "dense":
        retriever = dense
    elif spec.retriever["name"] == "hybrid":
        retriever = spec.retriever
    else:
        retriever = hybrid_of([node_of(BM25Retriever(TextView.from_dict(dense["settings"].get("view")))), dense])
    return PipelineSpec(retriever, spec.intents, spec.reranker, spec.fast_queries)


# ------------------------------------------------------------------------------ a tenant's parts

class TenantParts:
    """The parts of one tenant's pipeline that come from its rows (see the module doc). `encoder`: one
    already loaded for the table's model (a server shares one between its tenants); None: loaded here."""

    def __init__(self, catalog: PgCatalog, config: IndexConfig, encoder: Any = None):
        self.catalog, self.config, self.encoder = catalog, config, encoder
        self.spec = table_spec(config)
        self.version = catalog.version()  # read before the rows: the pipeline may be newer, never older
        self.in_memory = len(catalog.vectors) <= IN_MEMORY_TOOLS
        self._rows = catalog.replica_rows(vectors=self.in_memory)
        self.tools = [stored_tool(tid, ns, doc) for tid, ns, _hash, doc, _vector, _joined in self._rows]
        self.joined = {r[0]: r[5] for r in self._rows if r[5] > 0}  # when tools joined, as the database recorded
        self.lexical: list[BM25Retriever] = []
        self.dense: DenseRetriever | None = None
        self.learning = LearningFollower(catalog)

    @classmethod
    def open(cls, store: str) -> "TenantParts":
        """Connect to the store spec's tenant and read its parts (the connection stays open: `release`)."""
        catalog = PgCatalog.from_spec(store)
        try:
            return cls(catalog, IndexConfig.from_dict(catalog.database.config()))
        except BaseException:
            catalog.close()
            raise

    def release(self) -> None:
        """Close the connection, unless the pipeline's dense part searches the database."""
        if self.in_memory:
            self.catalog.close()

    def leaf(self, node: Mapping[str, Any], _where: str = "") -> Any:
        """A first-stage retriever of the spec, with the tenant's tools in it (the factory's leaf source)."""
        name, settings = node["name"], node["settings"]
        if name == "bm25":
            lexical = BM25Retriever.from_settings(settings)
            lexical.index(self.tools)
            self.lexical.append(lexical)
            return lexical
        if name != "dense" or self.dense is not None:
            check_servable(self.spec, f"index table {self.catalog.table!r}'s pipeline")
        encoder = self.encoder or encoder_for(settings["model"], backend=settings.get("encoding", "exact"))
        vectors = make_store("numpy", encoder.dim) if self.in_memory else self.catalog.vectors
        self.dense = DenseRetriever.from_settings(settings, encoder=encoder, vectors=vectors)
        if self.in_memory:
            self._put_vectors(self.tools, self._rows)
        self._rows = []  # what the built parts hold now
        return self.dense

    def take(self, scout: Any, ids: list[str]) -> None:
        """Take the current rows of `ids` into `scout`, this tenant's pipeline (gone ones are removed), in one
        step a search sees (`ToolScout.apply`)."""
        rows = self.catalog.replica_rows(ids, vectors=self.in_memory)
        tools = [stored_tool(tid, ns, doc) for tid, ns, _hash, doc, _vector, _joined in rows]
        present = {t.id for t in tools}
        removed = [i for i in ids if i not in present and scout.get(i, None) is not None]

        def change() -> None:
            for lexical in self.lexical:
                lexical.remove(removed)
                lexical.add(tools)
            if self.in_memory:
                self.dense.remove(removed)
                self._put_vectors(tools, rows)

        scout.apply(change, tools, removed, joined={r[0]: r[5] for r in rows if r[5] > 0})

    def _put_vectors(self, tools: list[Tool], rows: list[tuple]) -> None:
        """The in-memory dense part takes the rows' vectors as the database holds them."""
        if tools:
            self.dense.put(tools, np.stack([r[4] for r in rows]), [r[2] for r in rows])


class LearningFollower:
    """Teaches a tenant pipeline's learned channel the feedback rows recorded since it last looked (all of
    them, afresh, when the tenant's learning epoch moved: something was taken back, or settings changed)."""

    def __init__(self, catalog: PgCatalog):
        self.catalog = catalog
        self.learned = (-1, 0, 0)  # (learning epoch, last feedback seq, last score seq) the channel reflects

    def follow(self, scout: Any) -> None:
        epoch, settings = pg_feedback.learning_state(self.catalog)
        fresh = epoch != self.learned[0]
        since_taught, since_scored = (0, 0) if fresh else self.learned[1:]
        rows = pg_feedback.taught_since(self.catalog, since_taught)
        last_scored, records = pg_feedback.scored_since(self.catalog, since_scored)
        if not (fresh or rows or records):
            return
        frozen_at = settings.get("frozen_at")  # taught from then on: learned when unfrozen (a new epoch)
        taught = [r for r in rows if frozen_at is None or r.time < frozen_at]
        channel = scout.learning
        keys = {row.query: row.key or channel.key(row.query) for row in taught}
        vectors = pg_feedback.request_vectors(self.catalog, sorted(set(keys.values())))
        missing = sorted(set(keys.values()) - set(vectors) - set(channel.memory.row_of))
        if missing:  # recorded before request vectors were kept: made here, as the writer would have
            vectors.update(zip(missing, channel.space.requests(missing)))
        lessons = [(keys[r.query], vectors.get(keys[r.query]), r.tool, r.source, r.untaught_rank, r.time)
                   for r in taught]
        scout.follow_learning(settings=LearningSettings.from_dict(settings) if fresh else None,
                              lessons=lessons, key_of=keys, records=records)
        self.learned = (epoch, rows[-1].seq if rows else since_taught, last_scored)
