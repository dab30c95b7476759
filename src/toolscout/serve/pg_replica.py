"""One tenant of a PostgreSQL index as the library's own pipeline, in this process: what every replica ranks
with, so a replica ranks exactly as `ToolScout` does in process.

A `Replica` is built from the tenant's rows: the tools (in catalog order), BM25 over their text views and the
requests feedback taught them, the dense part over the vectors the database holds (what feedback taught
included: the database blends them, with the same formula as the library), fused and split into
requests as the library's default pipeline is. Nothing is embedded here but the tasks searched.

It is kept current through the change log: `catch_up(version)` reads the ids written since the version it
reflects and takes in those rows (and their feedback) in one step a search sees (`ToolScout.apply`); a
log that no longer reaches back (or a whole-catalog replace) rebuilds it.

Up to `IN_MEMORY_TOOLS` tools a replica holds the dense vectors in memory and searches them exactly, as the
library does. Above, they would cost every replica too much memory (1.5 KB a tool in float32, plus the
int8 copy the scan reads first), so the dense part searches the database's HNSW index instead: the same
pipeline around it, with approximate dense hits.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from ..feedback import Usage
from ..intents import IntentMerge
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
        self._taught: dict[str, set[str]] = {}  # tool -> the feedback sources its BM25 field holds
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
                self.version = max(self.version, current)
            return self.scout

    # building -----------------------------------------------------------------------------------
    def _build(self) -> None:
        version = self.catalog.version()  # read before the rows: the pipeline may be newer, never older
        self.in_memory = len(self.catalog.vectors) <= IN_MEMORY_TOOLS
        rows = self.catalog.replica_rows(vectors=self.in_memory)
        tools = [stored_tool(tid, ns, doc) for tid, ns, _hash, doc, _vector in rows]
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
        self._taught = {}
        self._teach(pg_feedback.learned_requests(self.catalog))
        self.version = version

    def _teach(self, requests: Sequence[tuple[str, str, str]]) -> None:
        """BM25 learns the requests feedback taught (the dense vectors hold theirs already)."""
        if self._bm25 is None or not requests:
            return
        self._bm25.learn([Usage(tool_id, source, query) for tool_id, source, query in requests])
        for tool_id, source, _query in requests:
            self._taught.setdefault(tool_id, set()).add(source)

    # following the change log --------------------------------------------------------------------
    def _take(self, ids: list[str]) -> None:
        """Take in the current rows of `ids` (gone ones are removed) and what feedback taught them."""
        rows = self.catalog.replica_rows(ids, vectors=self.in_memory)
        tools = [stored_tool(tid, ns, doc) for tid, ns, _hash, doc, _vector in rows]
        present = {t.id for t in tools}
        removed = [i for i in ids if i not in present and self.scout.get(i, None) is not None]
        requests = pg_feedback.learned_requests(self.catalog, ids)

        def change() -> None:
            if self._bm25 is not None:
                self._bm25.learn(forgotten=[(t, s) for t in ids for s in self._taught.pop(t, ())])
                self._bm25.remove(removed)
                self._bm25.add(tools)
                self._teach(requests)
            if self.in_memory:
                self._dense.remove(removed)
                self._put_vectors(tools, rows)

        self.scout.apply(change, tools, removed)

    def _put_vectors(self, tools: list[Tool], rows: list[tuple]) -> None:
        """The in-memory dense part takes the rows' vectors as they are (the database's, feedback blended)."""
        if tools:
            self._dense.put(tools, np.stack([r[4] for r in rows]), [r[2] for r in rows])


