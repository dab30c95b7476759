"""One tenant of a PostgreSQL index as the library's own pipeline, in this process: what every replica ranks
with, so a replica ranks exactly as `ToolScout` does in process.

A `Replica` is built from the tenant's rows: the tools (in catalog order), BM25 over their text views, the
dense part over the vectors the database holds, fused and split into requests as the library's default
pipeline is, and the learned channel (`toolscout.learning`) built from the feedback rows, their requests'
vectors and the scores the database holds. Nothing is embedded here but the tasks searched (and requests
recorded before their vectors were kept).

It is kept current through the change log: `catch_up(version)` reads the ids written since the version it
reflects and takes in those rows in one step a search sees (`ToolScout.apply`); a log that no longer reaches
back (or a whole-catalog replace) rebuilds it. Learning follows on its own: new feedback rows are taught by
their sequence numbers; when the tenant's learning epoch moved (something was taken back, or settings
changed), the channel is built again.

Up to `IN_MEMORY_TOOLS` tools a replica holds the dense vectors in memory and searches them exactly, as the
library does. Above, they would cost every replica too much memory (1.5 KB a tool in float32, plus the
int8 copy the scan reads first), so the dense part searches the database's HNSW index instead: the same
pipeline around it, with approximate dense hits.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..intents import IntentMerge
from ..learning import LearningSettings
from ..pipeline import ToolScout
from ..retrievers.bm25 import BM25Retriever
from ..retrievers.dense import DenseRetriever
from ..retrievers.hybrid import HybridRetriever
from ..store import pg_feedback
from ..store.local import make_store
from ..store.pg_config import IndexConfig
from ..store.pg_catalog import PgCatalog, stored_tool
from ..tool import TextView, Tool

IN_MEMORY_TOOLS = 100_000


class Replica:
    """See the module doc. `catalog`: the tenant's catalog in the database; `version` is the catalog
    version the pipeline reflects."""

    def __init__(self, catalog: PgCatalog, encoder: Any, config: IndexConfig, fast_queries: str | None = None):
        self.catalog, self.encoder, self.config, self.fast_queries = catalog, encoder, config, fast_queries
        self.view = TextView.from_dict(config.view)
        self.version = -1
        self.scout: ToolScout | None = None
        self.in_memory = True  # the dense vectors are in this process (else: the database's HNSW index)
        self._bm25: BM25Retriever | None = None
        self._dense: DenseRetriever | None = None
        self._learned = (-1, 0, 0)  # (learning epoch, last feedback seq, last score seq) the channel reflects
        self._lock = threading.Lock()  # one catch-up at a time; searches go on meanwhile

    def catch_up(self, version: int) -> ToolScout:
        """The pipeline, brought up to at least `version` (the catalog version a caller just read)."""
        if self.scout is not None and self.version >= version:
            return self.scout
        with self._lock:
            if self.scout is None:
                self._build()
            if self.version < version:
                current, changed = self.catalog.changes_since(self.version)
                if changed is None:
                    self._build()
                elif changed:
                    self._take(changed)
                self._follow_learning()
                self.version = max(self.version, current)
            return self.scout

    # building -----------------------------------------------------------------------------------
    def _build(self) -> None:
        version = self.catalog.version()  # read before the rows: the pipeline may be newer, never older
        self.in_memory = len(self.catalog.vectors) <= IN_MEMORY_TOOLS
        rows = self.catalog.replica_rows(vectors=self.in_memory)
        tools = [stored_tool(tid, ns, doc) for tid, ns, _hash, doc, _vector, _joined in rows]
        self._bm25 = BM25Retriever(self.view) if self.config.search == "hybrid" else None
        vectors = make_store("numpy", self.encoder.dim) if self.in_memory else self.catalog.vectors
        self._dense = DenseRetriever(encoder=self.encoder, view=self.view, summary_weight=self.config.summary_weight,
                                     vectors=vectors)
        if self._bm25 is not None:
            self._bm25.index(tools)
        if self.in_memory:
            self._put_vectors(tools, rows)
        if self.fast_queries:
            self._dense.use_fast_queries(self.fast_queries)
        retriever = HybridRetriever([self._bm25, self._dense]) if self._bm25 is not None else self._dense
        self.scout = ToolScout(retriever, tools, indexed=True, intents=IntentMerge.from_dict(self.config.intents))
        self.scout.apply(lambda: None, joined={r[0]: r[5] for r in rows if r[5] > 0})
        self._learned = (-1, 0, 0)
        self._follow_learning()
        self.version = version

    # learning -------------------------------------------------------------------------------------
    def _follow_learning(self) -> None:
        """Teach the channel the feedback rows recorded since it last looked (all of them, afresh, when the
        tenant's learning epoch moved)."""
        epoch, settings = pg_feedback.learning_state(self.catalog)
        fresh = epoch != self._learned[0]
        since_taught, since_scored = (0, 0) if fresh else self._learned[1:]
        rows = pg_feedback.taught_since(self.catalog, since_taught)
        last_scored, records = pg_feedback.scored_since(self.catalog, since_scored)
        if not (fresh or rows or records):
            return
        frozen_at = settings.get("frozen_at")  # taught from then on: learned when unfrozen (a new epoch)
        taught = [r for r in rows if frozen_at is None or r.time < frozen_at]
        channel = self.scout.learning
        keys = {row.query: row.key or channel.key(row.query) for row in taught}
        vectors = pg_feedback.request_vectors(self.catalog, sorted(set(keys.values())))
        missing = sorted(set(keys.values()) - set(vectors) - set(channel.memory.row_of))
        if missing:  # recorded before request vectors were kept: made here, as the writer would have
            vectors.update(zip(missing, channel.space.requests(missing)))
        lessons = [(keys[r.query], vectors.get(keys[r.query]), r.tool, r.source, r.untaught_rank, r.time)
                   for r in taught]
        self.scout.follow_learning(settings=LearningSettings.from_dict(settings) if fresh else None,
                                   lessons=lessons, key_of=keys, records=records)
        self._learned = (epoch, rows[-1].seq if rows else since_taught, last_scored)

    # following the change log --------------------------------------------------------------------
    def _take(self, ids: list[str]) -> None:
        """Take in the current rows of `ids` (gone ones are removed) and what feedback taught them."""
        rows = self.catalog.replica_rows(ids, vectors=self.in_memory)
        tools = [stored_tool(tid, ns, doc) for tid, ns, _hash, doc, _vector, _joined in rows]
        present = {t.id for t in tools}
        removed = [i for i in ids if i not in present and self.scout.get(i, None) is not None]

        def change() -> None:
            if self._bm25 is not None:
                self._bm25.remove(removed)
                self._bm25.add(tools)
            if self.in_memory:
                self._dense.remove(removed)
                self._put_vectors(tools, rows)

        self.scout.apply(change, tools, removed, joined={r[0]: r[5] for r in rows if r[5] > 0})

    def _put_vectors(self, tools: list[Tool], rows: list[tuple]) -> None:
        """The in-memory dense part takes the rows' vectors as the database holds them."""
        if tools:
            self._dense.put(tools, np.stack([r[4] for r in rows]), [r[2] for r in rows])


