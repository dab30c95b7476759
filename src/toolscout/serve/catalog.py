"""The storage behind the one service core: what varies between a local pipeline directory
(`serve/local.py`) and the shared PostgreSQL index (`serve/postgres.py`).

`ToolService` (`serve/service.py`) holds every policy: who may see and write what, search filters,
abstention, name matches, always-include, batching. A `Catalog` only stores and ranks: it answers for
one tenant at a time (`Catalog.tenant`), and every method of a `TenantCatalog` is a plain storage
operation with no notion of callers. Checks that depend on the stored state (may this caller overwrite
this existing tool?) are handed in as callbacks that the storage runs at the moment it reads that state,
so a check and the write it guards see the same catalog.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from ..feedback import FeedbackEvent, LearnResult
from ..hits import Hit, HitPolicy
from ..results import Filter
from ..tool import Tool

# authorize(new tool, the stored tool it replaces or None): raises Forbidden to refuse the write.
Authorize = Callable[[Tool, "Tool | None"], None]
# visible(namespace of a stored tool): False makes a delete of that tool fail as unknown.
Visible = Callable[["str | None"], bool]


@dataclass
class WriteResult:
    """What one write did. `seq` is the catalog version after it."""

    seq: int
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.seq, "created": self.created, "updated": self.updated,
                "unchanged": self.unchanged, "deleted": self.deleted}


class TenantCatalog(Protocol):
    """One tenant's tools, searchable and editable."""

    def search(self, queries: Sequence[str], filter: Filter | None, policy: HitPolicy) -> list[list[Hit]]:
        """One list of hits per query (`toolscout.hits.assemble_hits` over this storage's ranking)."""
        ...

    def get(self, tool_id: str) -> Tool | None: ...

    def page(self, namespace: str | None, namespaces: frozenset[str] | None, offset: int,
             limit: int) -> tuple[int, list[Tool]]:
        """(tools matching, one page of them, ordered by id): in `namespace` when given, within `namespaces`
        (None: all)."""
        ...

    def namespace_counts(self, namespaces: frozenset[str] | None) -> dict[str, int]: ...

    def name_count(self, name: str) -> int:
        """How many tools carry this name (more than one: agents need a qualified name)."""
        ...

    def version(self) -> int:
        """The catalog version as of this process's last read or write (cheap; may lag other replicas)."""
        ...

    def current_version(self) -> int:
        """The catalog version now, whoever wrote last (what a cached answer must be keyed by)."""
        ...

    def upsert(self, tools: Sequence[Tool], authorize: Authorize) -> WriteResult:
        """Insert or replace tools by id, durably; unchanged tools are reported and cost nothing."""
        ...

    def delete(self, ids: Sequence[str], visible: Visible) -> WriteResult:
        """Remove tools by id, durably; all or none (NotFound names an unknown or invisible id)."""
        ...

    def learn(self, events: Sequence[FeedbackEvent]) -> LearnResult:
        """Record tool-use feedback durably and fold it into the ranking at once (`toolscout.feedback`)."""
        ...

    def forget(self, source: str) -> list[str]:
        """Take back, durably and exactly, everything feedback from `source` taught; the tools it had taught."""
        ...

    def learning_report(self, brief: bool = False) -> dict[str, Any]:
        """`LearnedChannel.report` of this catalog's pipeline."""
        ...

    def set_learning(self, weights: dict[str, float | None], freeze: bool | None) -> dict[str, Any]:
        """Durably set learning's weights (None: automatic) and freeze it or not; the settings now."""
        ...

    def rollback(self, before: float) -> int:
        """Durably take back what was learned at or after `before`; how many (request, tool) pairs."""
        ...

    def namespaces_of(self, ids: Sequence[str]) -> dict[str, str | None]:
        """id -> namespace of each of `ids` in the catalog (unknown ids left out)."""
        ...

    def feedback_of(self, tool_id: str) -> dict[str, int]:
        """What feedback taught one tool: {"learned", "sources", "reported"}."""
        ...

    def feedback_totals(self) -> dict[str, Any]:
        """Feedback over the whole catalog: events, failures, learned requests, requests per source."""
        ...

    def __len__(self) -> int: ...


class Catalog(Protocol):
    """Every tenant's catalog in one storage."""

    kind: str  # "directory" or "postgresql"
    failed: str | None  # set when writes are refused after a storage failure (health reads it)
    versions_are_local: bool  # this process sees every write (a directory): its version is current for free

    def tenant(self, name: str | None) -> TenantCatalog:
        """The catalog of tenant `name` (None: the storage's default tenant)."""
        ...

    def describe(self) -> str:
        """Where the catalog lives, for people (a directory, a DSN without its password)."""
        ...

    def compact(self) -> bool:
        """Fold pending writes into a snapshot now; False when there is nothing to do."""
        ...

    def check_retraining(self, method: str, **options: Any) -> None:
        """Raise now what `retrain` would refuse before training: Conflict (a storage that cannot, too little
        feedback, one already running) or InvalidRequest (an unknown method or setting)."""
        ...

    def retrain(self, method: str, workdir: Any = None, **options: Any) -> Any:
        """Heavier learning from the feedback so far (`toolscout.train.feedback`), swapped in only when it
        ranks held-back feedback better; refused as `check_retraining` says."""
        ...

    def set_feedback_cap(self, cap: int) -> None:
        """From now on, one feedback source teaches one tool at most `cap` requests (kept with the catalog)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Storage-specific figures for /health and /metrics (journal size, search mode, ...)."""
        ...

    def close(self, compact: bool = True) -> None:
        """Release the storage; `compact=False` skips the final snapshot (tests of crash recovery)."""
        ...


# ------------------------------------------------------------------------ reads over an in-process pipeline
# What a catalog that ranks with an in-process `ToolScout` answers from it (the directory and every
# PostgreSQL replica alike).

def hits_of(scout: Any, queries: Sequence[str], filter: Filter | None, policy: HitPolicy) -> list[list[Hit]]:
    """`ToolScout.search` under a search's hit policy (the public entry point: it checks the queries and k
    again, which costs microseconds, rather than the service reaching into the pipeline's internals)."""
    return scout.search(list(queries), policy.k, filter=filter, min_score=policy.min_score,
                        min_probability=policy.min_probability, always_include=policy.always_include,
                        match_names=policy.match_names, explain=policy.explain)


def page_of(scout: Any, namespace: str | None, namespaces: frozenset[str] | None, offset: int,
            limit: int) -> tuple[int, list[Tool]]:
    """(tools matching, one page of them, ordered by id)."""
    tools = [t for t in scout.tools if (namespaces is None or (t.namespace or "") in namespaces)
             and (namespace is None or (t.namespace or "") == namespace)]
    tools.sort(key=lambda t: t.id)
    return len(tools), tools[offset:offset + limit]


def namespace_counts_of(scout: Any, namespaces: frozenset[str] | None) -> dict[str, int]:
    counts = Counter((t.namespace or "") for t in scout.tools)
    return {ns: n for ns, n in sorted(counts.items()) if namespaces is None or ns in namespaces}
