"""The storage behind the one service core: what varies between a local pipeline directory
(`serve/directory.py`) and the shared PostgreSQL index (`serve/pg_storage.py`).

`ToolService` (`serve/service.py`) holds every policy: who may see and write what, search filters,
abstention, name matches, always-include, batching. It reads (searches, gets, lists) the tenant's pipeline
itself, a `ToolScout`; a `Storage` only stores: for one tenant at a time (`Storage.tenant`), a
`TenantStorage` keeps that pipeline current and makes writes durable, with no notion of callers. Checks
that depend on the stored state (may this caller overwrite this existing tool?) are handed in as callbacks
that the storage runs at the moment it reads that state, so a check and the write it guards see the same
catalog. What only some storages can do (compact, retrain) are protocols of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

from ..feedback import FeedbackEvent, LearnResult
from ..tool import Tool

if TYPE_CHECKING:
    from ..pipeline import ToolScout

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


class TenantStorage(Protocol):
    """One tenant's catalog in a storage: the pipeline every read goes to, and the durable writes.

    Reads are not verbs of the storage: the service reads the pipeline itself (`ToolScout`), so search, get
    and lists are declared once, there. What a storage adds is where state lives: how writes become durable
    (a journal, a transaction) and how its pipeline is kept current (a replica follows the database)."""

    def pipeline(self, fresh: bool = True) -> ToolScout:
        """The tenant's pipeline, current as of the catalog's version now (`fresh`), or else as of this
        process's last read or write (cheaper; may lag other replicas a little)."""
        ...

    def held(self) -> ToolScout | None:
        """The pipeline as this process holds it, asking the storage nothing (None before the first read):
        what a gateway routes a call with, so that calls go on while a database does not answer."""
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

    def forget(self, source: str) -> list[str] | None:
        """Take back, durably and exactly, everything feedback from `source` taught; the tools it had taught.
        None when no feedback of `source` is stored: nothing is written (the version stays)."""
        ...

    def set_learning(self, weights: dict[str, float | None], freeze: bool | None) -> dict[str, Any]:
        """Durably set learning's weights (None: automatic) and freeze it or not; the settings now."""
        ...

    def rollback(self, before: float, dry_run: bool = False) -> list[tuple[str, float]]:
        """Durably take back what was learned (or held by a freeze) at or after `before`: the (source, time)
        of each (request, tool) pair taken back. `dry_run`, or nothing to take back: no write, not even a new
        version; the pairs it would take back."""
        ...

    def feedback_of(self, tool_id: str) -> dict[str, int]:
        """What feedback taught one tool: {"learned", "sources", "reported"} (kept where the feedback is)."""
        ...

    def learned_of(self, tool_ids: Sequence[str]) -> dict[str, int]:
        """How many requests feedback taught each of these tools (0 for one it taught none, or unknown), in
        one read: what an operator's bulk removal drops with them."""
        ...

    def feedback_totals(self) -> dict[str, Any]:
        """Feedback over the whole catalog: events, failures, learned requests, requests per source."""
        ...


class Storage(Protocol):
    """Every tenant's catalog in one storage."""

    kind: str  # "directory" or "postgresql"
    failed: str | None  # set when writes are refused after a storage failure (health reads it)
    versions_are_local: bool  # this process sees every write (a directory): its version is current for free

    def tenant(self, name: str | None) -> TenantStorage:
        """The catalog of tenant `name` (None: the storage's default tenant)."""
        ...

    def describe(self) -> str:
        """Where the catalog lives, for people (a directory, a DSN without its password)."""
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


# Abilities only some storages have: the service asks `isinstance(storage, Compacts)`, and a storage
# without one declares nothing (no stub that answers "no").

@runtime_checkable
class Compacts(Protocol):
    """A storage that folds pending writes into a snapshot (a directory and its journal)."""

    def compact(self) -> bool:
        """Fold pending writes into a snapshot now; False when there is nothing to do."""
        ...


@runtime_checkable
class ProbesServer(Protocol):
    """A storage on a database server that may be down (PostgreSQL), which it can tell at once."""

    def check_answering(self) -> None:
        """Raise Unavailable now when the server is known not to answer (/health and /metrics, which probes
        poll with short timeouts, ask this first); return otherwise."""
        ...


@runtime_checkable
class Retrains(Protocol):
    """A storage whose pipeline's models can be retrained from its feedback (`toolscout.train.feedback`)."""

    def check_retraining(self, method: str, **options: Any) -> None:
        """Raise now what `retrain` would refuse before training: Conflict (too little feedback, one already
        running) or InvalidRequest (an unknown method or setting)."""
        ...

    def retrain(self, method: str, workdir: Any = None, **options: Any) -> Any:
        """Heavier learning from the feedback so far, swapped in only when it ranks held-back feedback
        better; refused as `check_retraining` says."""
        ...
