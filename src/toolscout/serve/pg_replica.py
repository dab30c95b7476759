"""One tenant of a PostgreSQL index as the library's own pipeline, in this process: what every replica ranks
with, so a replica ranks exactly as `ToolScout` does in process.

A `Replica` builds the pipeline the index table records (`toolscout.spec`) through the library's one factory
(`ToolScout.from_tenant`), from the tenant's rows (`pg_pipeline.TenantParts`: the tools in catalog order,
each first-stage retriever over them, the dense vectors the database holds) and the learned channel built
from the feedback rows: the same first stage, fusion, request splitting, reranker and fast tier as a
directory of the same spec. Nothing is embedded here but the tasks searched (and requests recorded before
their vectors were kept).

It is kept current through the change log: `catch_up(version)` reads the ids written since the version it
reflects and takes in those rows in one step a search sees (`ToolScout.apply`); a log that no longer reaches
back (or a whole-catalog replace) rebuilds it. Learning follows on its own: new feedback rows are taught by
their sequence numbers; when the tenant's learning epoch moved (something was taken back, or settings
changed), the channel is built again. Up to `pg_pipeline.IN_MEMORY_TOOLS` tools the dense vectors are in
memory; above, the dense part searches the database's HNSW index.
"""

from __future__ import annotations

import threading
from typing import Any

from ..pg_pipeline import TenantParts
from ..pipeline import ToolScout
from ..store.pg_config import IndexConfig
from ..store.pg_catalog import PgCatalog


class Replica:
    """See the module doc. `catalog`: the tenant's catalog in the database; `config`: its table's
    configuration; `fast_queries`: how this process encodes tasks (None: as the pipeline was indexed;
    False: the encoder itself; "table" or "student": that fast tier); `version` is the catalog version the
    pipeline reflects."""

    def __init__(self, catalog: PgCatalog, encoder: Any, config: IndexConfig, fast_queries: bool | str | None = None):
        self.catalog, self.encoder, self.config, self.fast_queries = catalog, encoder, config, fast_queries
        self.version = -1
        self.scout: ToolScout | None = None
        self.parts: TenantParts | None = None
        self._lock = threading.Lock()  # one catch-up at a time; searches go on meanwhile

    @property
    def in_memory(self) -> bool:
        """Whether the dense vectors are in this process (else: the database's HNSW index)."""
        return self.parts is None or self.parts.in_memory

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
                    self.parts.take(self.scout, changed)
                self.parts.learning.follow(self.scout)
                self.version = max(self.version, current)
            return self.scout

    def _build(self) -> None:
        parts = TenantParts(self.catalog, self.config, self.encoder)
        self.scout = ToolScout.from_tenant(parts, fast_queries=self.fast_queries)
        self.parts, self.version = parts, parts.version
