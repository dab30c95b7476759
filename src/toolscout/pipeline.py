"""`ToolScout`: the one public facade. A catalog, a first-stage retriever and an optional second-stage
reranker, saved as one directory.

The CLI, the evaluation harness and the servers are thin layers over this class. Every deployment builds
it through one factory, `ToolScout.build`, from the pipeline's saved configuration (`toolscout.spec`): a
directory (`load`), and a PostgreSQL tenant (`from_tenant`: `load` of a directory indexed into PostgreSQL,
and every server replica).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .artifacts import DAMAGED_INDEX, DamagedFile, read_json_lines, write_artifact
from .defaults import DEFAULT_INTENTS, DEFAULT_RETRIEVER
from .deprecation import Deprecation, deprecation_of, rank_below_replacements
from .encoders.fast import TIER_NAMES, fast_query_kind, tier_of
from .errors import Conflict, FastQueriesUnavailable, InvalidRequest, NotFound, ToolScoutError, listed
from .feedback import FeedbackEvent, LearnResult, Usage, UsageLedger
from .hits import (CALIBRATED, Hit, HitPolicy, Hits, NameIndex, abstains, assemble_hits, checked_k, checked_queries,
                   warn_if_uncalibrated, warn_if_unknown)
from .intents import IntentMerge
from .learning import LearnedChannel, LearningSettings, Lesson, Scored, teaching_events
from .learning.channel import DEPTH as LEARNED_DEPTH
from .learning.scorecard import DEPTH as SCORED_DEPTH
from .learning.scorecard import UNRANKED, Ranks, ranks_of
from .learning.space import space_for
from .query import Query, as_queries
from .relevance import DEPTH as RELEVANCE_DEPTH
from .relevance import Calibration, dense_part, features_of, shipped_calibration
from .rerank.base import Reranker, kept_first_stage, load_reranker
from .results import Filter, Results
from .retrievers.base import Composite, Retriever, encoding_parts, load_retriever, make_retriever, task_encoders
from .spec import PIPELINE_FORMAT, PIPELINE_KIND, LeafSource, PipelineSpec, read_pipeline_config
from .tool import TextView, Tool, tools_by_id
from .version import __version__

if TYPE_CHECKING:
    from .pg_pipeline import TenantParts

DEFAULT_INTENT_MERGE = IntentMerge.from_dict(DEFAULT_INTENTS)  # what `from_tools` splits tasks with by default
FEEDBACK_FILE = "feedback.json"
LEARNING_FOLDER = "learning"
FORMAT_VERSION = PIPELINE_FORMAT
_REQUIRED: Any = object()  # `get` without a default: a missing tool is an error
logger = logging.getLogger(__name__)


class ReadWriteLock:
    """Many readers at once, or one writer, taking turns fairly. A waiting writer holds back readers that
    come after it, so a stream of searches cannot starve an update; and the readers waiting when a write
    ends all go before the next write, so a stream of writes cannot starve searches: a reader waits for at
    most the write under way and one waiting before it. Not reentrant: a thread must not take it twice."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0  # reading now
        self._writer = False  # writing now
        self._writers_waiting = 0
        self._readers_waiting = 0
        self._readers_due = 0  # waiting readers whose turn came (a write ended since they queued)
        self._writes_done = 0  # how many writes have ended: a waiting reader's turn comes with the next one

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            if self._writer or self._writers_waiting:
                self._wait_for_turn()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    def _wait_for_turn(self) -> None:
        """Queue behind the writes under way or waiting, until one ends (the lock's condition held)."""
        queued_at = self._writes_done
        self._readers_waiting += 1
        try:
            while self._writer or (self._writers_waiting and self._writes_done == queued_at):
                self._cond.wait()
        finally:
            self._readers_waiting -= 1
            if self._writes_done != queued_at:  # counted among the readers due when that write ended
                self._readers_due -= 1
                if not self._readers_due:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            got_it = False
            try:
                while self._writer or self._readers or self._readers_due:
                    self._cond.wait()
                got_it = True
            finally:
                self._writers_waiting -= 1
                if not got_it:  # interrupted while waiting: the readers queued behind this writer may go now
                    self._cond.notify_all()
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._writes_done += 1
                self._readers_due = self._readers_waiting  # their turn: before the next write
                self._cond.notify_all()


def _size_disagreement(retriever: Retriever, catalog_size: int) -> str | None:
    """How `retriever`, or one of its components (a hybrid's each hold the whole catalog), disagrees in size
    with a catalog of `catalog_size` tools; None when all agree."""
    parts = [("its retriever", retriever)]
    if isinstance(retriever, Composite):
        parts += [(f"its retriever's component {i} ({part.name})", part)
                  for i, part in enumerate(retriever.components)]
    for what, part in parts:
        if len(part) != catalog_size:
            return f"{what} holds {len(part)} tools but its catalog {catalog_size}"
    return None


class ToolScout:
    """Search a tool catalog with a task in plain language.

        scout = ToolScout.from_tools(tools, retriever="dense")
        hits = scout.search("book a flight to Paris", k=5)

    With `intents` (an `IntentMerge`, see `toolscout.intents`), a task that holds several requests is also
    searched request by request and the rankings merged; a one-request task is searched as without it.
    With a `reranker` (see `toolscout.rerank`), the first stage's top `reranker.depth` candidates (or k,
    when larger) go to the reranker, whose order and scores are the answer; it never adds or drops a tool.

    A tool that says it is deprecated ranks just below the tool it names as its replacement, when the
    catalog has that tool (`toolscout.deprecation`; `demote_deprecated = False` turns this off). Hits carry
    a calibrated `probability` when a calibration was fitted for this pipeline (`calibration`, found by
    `toolscout.relevance.shipped_calibration`; None otherwise).

    Writes (`add`, `remove`) and reads may come from different threads: searches run concurrently
    under a shared lock, a write takes it exclusively, and each search sees the catalog either before
    or after a write, never half of one. A write that fails part-way is undone: the scout is as it was.
    """

    def __init__(self, retriever: Retriever, tools: Sequence[Tool] = (), *, indexed: bool = False,
                 reranker: Reranker | None = None, intents: IntentMerge | None = None,
                 ledger: UsageLedger | None = None, learning: LearnedChannel | None = None):
        self.retriever = retriever
        self.reranker = reranker
        self.intents = intents
        self.ledger = ledger if ledger is not None else UsageLedger()  # what it was taught, by whom, when
        self.learning = learning if learning is not None else LearnedChannel(space_for(retriever))
        self._tools: dict[str, Tool] = {}
        self._lock = ReadWriteLock()
        self._disagreement: str | None = None  # why the retriever and the catalog no longer agree (`save` refuses)
        self._versions_read: dict[Path, str] = {}  # directory -> the version loaded or last saved there (`save`)
        self._replaying: tuple[float | None] | None = None  # (when the write was first made) while `replaying`
        if tools:
            self._tools = tools_by_id(tools, "the catalog")
            if not indexed:
                self.retriever.index(list(self._tools.values()))
        self.learning.catalog_holds(len(self._tools))  # what share of it nobody taught (toolscout.learning)
        self._names = NameIndex(self._tools.values())
        self._name_counts = Counter(t.name for t in self._tools.values())
        self._namespace_counts = Counter(t.namespace or "" for t in self._tools.values())  # a search's check
        self._deprecated: dict[str, Deprecation] = {}  # id -> what a deprecated tool says (replacement name)
        self._note_deprecations(self._tools.values())
        self.demote_deprecated = True
        self.saved_config: dict[str, Any] = {}  # config.json of the directory this was loaded from
        self._saved_tier: str | None = None  # the fast tier `save` records: use_fast_queries's, or as loaded
        self.calibration: Calibration | None = shipped_calibration(self.spec)
        # A query the reranker could not judge keeps the first stage's ranking (rerank/base.py), and with it
        # the probabilities the first stage's calibration gives.
        self._kept_calibration = None if reranker is None else shipped_calibration(replace(self.spec, reranker=None))
        calibrated = self.calibration is not None or self._kept_calibration is not None
        self._dense = dense_part(retriever) if calibrated else None  # what the features read

    # construction ------------------------------------------------------------------------
    @classmethod
    def from_tools(cls, tools: Iterable[Tool], retriever: str = DEFAULT_RETRIEVER, *,
                   model: str | None = None, encoder: Any = None, store: str | None = None,
                   view: TextView | None = None, reranker: Reranker | str | Path | None = None,
                   intents: IntentMerge | None = DEFAULT_INTENT_MERGE, **options: Any) -> "ToolScout":
        """Index `tools` with the retriever registered as `retriever` (default: toolscout's default
        pipeline, `toolscout.defaults.DEFAULT_RETRIEVER`).

        `model`: the encoder (a name `toolscout.encoders.resolve_model` knows, a path, or a `toolscout train`
        directory; default: toolscout's own); `encoder`: one already loaded (to share between indexes);
        `store`: where dense vectors live ("numpy", "faiss:HNSW32", or a PostgreSQL DSN); `view`: the text
        view retrievers read; `options`: other settings of the retriever (`--retriever NAME -o KEY=VALUE`).
        A setting the retriever does not take is refused by it. `reranker`: a Reranker, or the path of a
        trained reranker / saved reranker folder. `intents`: how multi-request tasks are split and merged
        (default: `toolscout.defaults.DEFAULT_INTENTS`; None: never)."""
        if isinstance(reranker, (str, Path)):
            reranker = load_reranker(reranker)
        if isinstance(intents, str):  # the spelling of the default before it was an IntentMerge
            warnings.warn('intents="default" is deprecated: leave intents out for the default', DeprecationWarning,
                          stacklevel=2)
            intents = DEFAULT_INTENT_MERGE
        named = {k: v for k, v in (("model", model), ("encoder", encoder), ("store", store), ("view", view))
                 if v is not None}
        return cls(make_retriever(retriever, **named, **options), list(tools), reranker=reranker, intents=intents)

    @classmethod
    def load(cls, path: str | Path, *, fast_queries: bool | str | None = None) -> "ToolScout":
        """The pipeline saved in `path`, encoding tasks the way it was saved (`use_fast_queries` before
        `save` records the tier with the index). `fast_queries` overrides that: "table" (or True) or
        "student" for that fast tier, False for the encoder itself, for this process only: a later `save`
        records the tier the directory had (a server's compaction must not turn its flag into the default).

        A directory written by `toolscout index --store postgresql://...` points at its database, which is
        the catalog: the pipeline is built from the table's pipeline spec and the tenant's rows, tools,
        vectors and learned state as they are now, as every server replica builds it (`from_tenant`)."""
        try:
            return cls._load(Path(path), fast_queries)
        except DamagedFile as exc:
            raise DamagedFile(f"{exc}; {DAMAGED_INDEX.format(path)}") from None

    @classmethod
    def _load(cls, path: Path, fast_queries: bool | str | None) -> "ToolScout":
        folder, config = read_pipeline_config(path)
        if config.get("postgres"):
            from .pg_pipeline import TenantParts

            tenant = TenantParts.open(config["postgres"])
            try:
                return cls.from_tenant(tenant, fast_queries=fast_queries)
            finally:
                tenant.release()
        tools = [Tool.from_record(row) for row in read_json_lines(folder / "tools.jsonl")]
        if isinstance(config.get("tools"), int) and config["tools"] != len(tools):  # cut at a line's end
            raise DamagedFile(f"{folder / 'tools.jsonl'}: holds {len(tools)} tools, but {config['tools']} were saved")
        ledger = UsageLedger.load(folder / FEEDBACK_FILE) if (folder / FEEDBACK_FILE).exists() else None
        learned = folder / LEARNING_FOLDER
        spec = PipelineSpec.read(folder, config)
        spec.check_saved(folder / "retriever")
        scout = cls.build(spec, tools, lambda _node, where: load_retriever(
                          folder / "retriever" / where), fast_queries=fast_queries, ledger=ledger,
                          learned=learned if learned.exists() else None, where=str(path))
        scout.saved_config = config
        if folder != path:  # a versioned directory: a save there must not discard a version saved since
            scout._versions_read[path.resolve()] = folder.name
        return scout

    @classmethod
    def build(cls, spec: PipelineSpec, tools: Sequence[Tool], leaf: LeafSource, *,
              fast_queries: bool | str | None = None, ledger: UsageLedger | None = None, learned: Path | None = None,
              where: str = "the pipeline") -> "ToolScout":
        """The one factory every deployment builds its pipeline with: the pipeline `spec` describes, over
        `tools` (already in its retrievers). `leaf(node, folder)` makes each first-stage retriever the spec
        names, with its indexed data: loaded from a directory's files, or made from a PostgreSQL tenant's
        rows; fusion, request splitting, the reranker and the fast tier come from the spec alone.
        `fast_queries` overrides the spec's tier for this process (see `load`). `ledger` and `learned` (a
        learned channel's folder): what a directory learned from use (a PostgreSQL tenant's is taught from
        its rows afterwards: `from_tenant`)."""
        retriever = spec.first_stage(leaf)
        learning = LearnedChannel.load(learned, space_for(retriever)) if learned is not None else None
        scout = cls(retriever, tools, indexed=True, reranker=spec.make_reranker(), ledger=ledger, learning=learning,
                    intents=IntentMerge.from_dict(spec.intents))
        if len(retriever) != len(scout):  # a hand-edited or mismatched directory
            raise DamagedFile(f"{where}: its retriever holds {len(retriever)} tools but its catalog has {len(scout)}")
        scout._teach_from_ledger()  # a directory saved before the channel, or learned with another encoder
        kind = spec.fast_queries if fast_queries is None else fast_query_kind(fast_queries)
        if kind:
            scout.use_fast_queries(kind)
        scout._saved_tier = spec.fast_queries
        return scout

    @classmethod
    def from_tenant(cls, tenant: "TenantParts", *, fast_queries: bool | str | None = None) -> "ToolScout":
        """The pipeline of a PostgreSQL tenant (`pg_pipeline.TenantParts`: its table's spec, its rows and its
        learned state), as every replica builds it."""
        scout = cls.build(tenant.spec, tenant.tools, tenant.leaf, fast_queries=fast_queries,
                          where=str(tenant.catalog.spec))
        scout.apply(lambda: None, joined=tenant.joined)
        tenant.learning.follow(scout)
        return scout

    @property
    def spec(self) -> PipelineSpec:
        """This pipeline's saved configuration (`toolscout.spec`): what `save` records, and what
        `toolscout index --store` records in the database."""
        return PipelineSpec.describe(self.retriever, self.intents, self.reranker, self._saved_tier)

    @property
    def fast_queries(self) -> str | None:
        """The fast tier that encodes tasks ("table" or "student", `use_fast_queries`), or None."""
        tiers = [tier_of(part.query_encoder) for part in encoding_parts(self.retriever)]
        return next((tier for tier in tiers if tier is not None), None)

    @property
    def task_encoders(self) -> list[str]:
        """Deprecated: `toolscout.retrievers.base.task_encoders(scout.retriever)`."""
        warnings.warn("ToolScout.task_encoders is deprecated; use toolscout.retrievers.base.task_encoders"
                      "(scout.retriever)", DeprecationWarning, stacklevel=2)
        return task_encoders(self.retriever)

    def use_fast_queries(self, kind: str = "table") -> "ToolScout":
        """A fast tier (`encoders/fast.py`): tasks are encoded by the static table ("table") or the query
        student ("student") distilled from the dense retriever's encoder, at some quality (docs/serving.md).
        Tool vectors and learning from feedback are unchanged. Raises FastQueriesUnavailable when the
        pipeline has no dense retriever or the tier cannot serve its encoder."""
        kind = fast_query_kind(kind) or "table"
        dense = encoding_parts(self.retriever)
        if not dense:
            raise FastQueriesUnavailable(f"{TIER_NAMES[kind]} encodes tasks for a dense retriever; this pipeline's "
                                         f"retriever is {self.retriever.name!r}")
        with self._lock.write():
            for part in dense:
                part.use_fast_queries(kind)
            self._saved_tier = kind
        return self

    def save(self, path: str | Path, *, extra_config: dict[str, Any] | None = None, overwrite: bool = False,
             held_lock: int | None = None) -> None:
        """Write the pipeline atomically: a crash mid-save leaves the previous save loadable.
        Searches go on while it writes; writes wait until it is done. `extra_config` adds keys to
        config.json (the server records its journal position there); `load` keeps them in `saved_config`.

        Nothing another writer saved is discarded silently (`artifacts.SaveRefused`): a directory a server
        serves is refused (write through its HTTP API, or stop it first; `held_lock`: the serve lock's file
        when the caller holds it itself), and so is one whose live version is no longer the one this scout
        loaded or last saved there (another scout saved it since) unless `overwrite`."""
        with self._lock.read():
            self._check_consistent(path)
            spec = self.spec
            config = {**(extra_config or {}),
                      "kind": PIPELINE_KIND, "format_version": FORMAT_VERSION, "toolscout": __version__,
                      "retriever": self.retriever.name, "tools": len(self._tools),
                      "reranker": self.reranker.name if self.reranker is not None else None,
                      "intents": spec.intents,
                      "fast_queries": spec.fast_queries,  # how tasks are encoded travels with the index
                      "pipeline": spec.to_dict(),  # how it ranks, as every deployment builds it (`toolscout.spec`)
                      "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            root = Path(path).resolve()
            read = None if overwrite else self._versions_read.get(root)
            with write_artifact(path, config, expected_version=read, held_lock=held_lock) as folder:
                with open(folder / "tools.jsonl", "w", encoding="utf-8") as fh:
                    for tool in self._tools.values():
                        fh.write(json.dumps(tool.to_record(), ensure_ascii=False) + "\n")
                self.retriever.save(folder / "retriever")
                if self.reranker is not None:
                    self.reranker.save(folder / "reranker")
                if self.ledger.events:
                    self.ledger.save(folder / FEEDBACK_FILE)
                if self.ledger.events or self.learning.settings != LearningSettings():
                    self.learning.save(folder / LEARNING_FOLDER)
            self._versions_read[root] = folder.name

    # catalog -----------------------------------------------------------------------------
    @property
    def tools(self) -> list[Tool]:
        with self._lock.read():
            return list(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, tool_id: str) -> bool:
        return tool_id in self._tools

    def unknown_namespaces(self, names: Iterable[str] | None) -> list[str]:
        """Those of `names` (a search's namespaces) that no tool is in: a typo, most likely, which would
        otherwise read as a search that found nothing."""
        if not names:
            return []
        return sorted(n for n in set(names) if self._namespace_counts.get(n, 0) <= 0)

    def name_count(self, name: str) -> int:
        """How many tools carry this name (more than one: an agent needs their ids)."""
        return self._name_counts.get(name, 0)

    def get(self, tool_id: str, default: Any = _REQUIRED) -> Tool:
        """The tool with this id; NotFound when there is none, unless a `default` is given (returned
        instead). One dict read: safe while writes go on."""
        tool = self._tools.get(tool_id)
        if tool is not None:
            return tool
        if default is _REQUIRED:
            raise NotFound(f"no tool with id {tool_id!r} in this catalog")
        return default

    def find(self, tool_id: str) -> Tool | None:
        """Deprecated: `get(tool_id, None)`."""
        warnings.warn("ToolScout.find is deprecated; use get(tool_id, None)", DeprecationWarning, stacklevel=2)
        return self.get(tool_id, None)

    def add(self, tools: Iterable[Tool], *, when: float | None = None) -> None:
        """Insert new tools or replace tools with the same id; only changed tools are re-encoded. `when`: the
        time new tools joined (default now): what was learned before then never weighed them, so it cannot
        lift a tool above them (`toolscout.learning`)."""
        batch = tools_by_id(tools)
        with self._lock.write():
            with self._undone_on_failure(batch):
                self.retriever.add(list(batch.values()))
            self.learning.tools_joined([t for t in batch if t not in self._tools], time.time() if when is None else when)
            self._take(batch.values())
            self.learning.catalog_holds(len(self._tools))

    def remove(self, ids: Iterable[str]) -> None:
        """Remove the tools with these ids, at once (a list of ids; NotFound, changing nothing, when one is
        not in the catalog). What was learned for them goes with them; `save` to keep the change."""
        ids = list(dict.fromkeys(listed(ids, "ids")))
        with self._lock.write():
            unknown = [i for i in ids if i not in self._tools]
            if unknown:
                raise NotFound(f"cannot remove unknown tool id(s) {unknown[:5]}")
            with self._undone_on_failure(ids):
                self.retriever.remove(ids)
            self._drop(ids)
            self.learning.tools_left(ids)
            for tool_id in ids:  # a deleted tool's feedback goes with it
                self.ledger.drop_tool(tool_id)
                self.learning.drop_tool(tool_id)
            self.learning.catalog_holds(len(self._tools))

    @contextmanager
    def _undone_on_failure(self, touched: Iterable[str]) -> Iterator[None]:
        """A write to the retriever that fails part-way (a hybrid's second component refusing what its first
        took) is undone: the tools `touched` are put back in the retriever as the catalog holds them, so the
        scout is as it was. When even that fails, the scout knows its parts disagree and `save` refuses it."""
        held = {tool_id: self._tools.get(tool_id) for tool_id in touched}
        try:
            yield
        except BaseException:
            try:
                self.retriever.remove([tool_id for tool_id, tool in held.items() if tool is None])
                self.retriever.add([tool for tool in held.values() if tool is not None])
            except Exception as exc:
                self._disagreement = f"a failed write could not be undone ({type(exc).__name__}: {exc})"
            raise

    def _check_consistent(self, path: str | Path) -> None:
        """Refuse to save a scout whose retriever and catalog disagree: the version it would write could not
        be loaded, and writing it would retire the good one `path` holds."""
        problem = self._disagreement or _size_disagreement(self.retriever, len(self._tools))
        if problem:
            raise Conflict(f"not saving to {path}: this scout is inconsistent ({problem}), and saving it would "
                           "replace what is there with an index that cannot be loaded; load the directory again")

    def apply(self, change: Callable[[], None], tools: Iterable[Tool] = (), removed: Iterable[str] = (),
              joined: Mapping[str, float] | None = None) -> None:
        """Take in a change the retriever learns of from elsewhere (a PostgreSQL replica following its
        change log, `serve/pg_replica.py`): under the write lock, `change()` updates the retriever, and the
        catalog takes `tools` (new ones, or replacing those with their ids) and drops `removed`, all in the
        one step a search sees. `joined`: when tools joined the catalog (as the database recorded it)."""
        batch = tools_by_id(tools)
        with self._lock.write():
            change()
            self._drop([tool_id for tool_id in removed if tool_id in self._tools])
            self.learning.tools_left(removed)
            self._take(batch.values())
            for tool_id, when in (joined or {}).items():
                self.learning.tools_joined([tool_id], when)
            self.learning.catalog_holds(len(self._tools))

    def _take(self, tools: Iterable[Tool]) -> None:
        """Tools into the catalog and its name indexes, replacing those with their ids (write lock held)."""
        for tool in tools:
            old = self._tools.get(tool.id)
            if old is not None:
                self._names.remove(old)
                self._name_counts[old.name] -= 1
                self._namespace_counts[old.namespace or ""] -= 1
            self._names.add(tool)
            self._name_counts[tool.name] += 1
            self._namespace_counts[tool.namespace or ""] += 1
            self._tools[tool.id] = tool
        self._note_deprecations(tools)

    def _note_deprecations(self, tools: Iterable[Tool]) -> None:
        for tool in tools:
            said = deprecation_of(tool)
            if said is None:
                self._deprecated.pop(tool.id, None)
            else:
                self._deprecated[tool.id] = said

    def _drop(self, ids: Iterable[str]) -> None:
        """Known tool ids out of the catalog and its name indexes (write lock held)."""
        for tool_id in ids:
            old = self._tools.pop(tool_id)
            self._names.remove(old)
            self._name_counts[old.name] -= 1
            self._namespace_counts[old.namespace or ""] -= 1
            self._deprecated.pop(tool_id, None)

    # learning from use ---------------------------------------------------------------------
    def learn(self, events: Iterable[FeedbackEvent | Mapping[str, Any]],
              ranks: Mapping[tuple[str, str], Ranks] | None = None) -> LearnResult:
        """Learn from tool-use feedback at once, with no retraining (`toolscout.learning`): each event is a
        task and the ids of the tools that served it (a FeedbackEvent, or a dict with query, tool_ids,
        source, outcome, time). Each event is scored first (where the ranking as served, untaught and at
        full weight put its tools), then recorded and taught. Unknown tool ids are ignored and reported.
        Searches go on while events are scored and requests embedded; the index changes in one step.
        `ranks`: what `measure` gave for these events on this state (a journal replays them: no search)."""
        now = time.time()
        events = [(e if isinstance(e, FeedbackEvent) else FeedbackEvent.from_dict(e)).at(now)
                  for e in listed(events, "learn", "a list of events")]
        teaching = teaching_events(events)
        asking = {e.query for e in teaching}  # read under the write lock below: decided once, before it
        with self._lock.read():
            if ranks is None:
                ranks = self.score(list(dict.fromkeys(e.query for e in teaching)))
            prepared = self.learning.prepare([e.query for e in teaching])
        with self._lock.write():
            before = self.learning.memory.tools
            result = self.ledger.add(events, known=self._tools, untaught={key: r[1] for key, r in ranks.items()},
                                     teachable=asking.__contains__)
            self.learning.score(self.score_records(teaching, ranks, before))
            self.learning.teach(self._lessons(result.learned), prepared)
            self._log_weights(self.learning.refresh_weights())
            result.frozen_at = self.learning.settings.frozen_at
        return result

    def measure(self, events: Sequence[FeedbackEvent]) -> dict[tuple[str, str], Ranks]:
        """The ranks `learn` would score `events` by now, for their own (query, tool) pairs only: a storage
        that journals them with the events replays them without searching again (the replay's cost was
        almost all those searches). Call with writes held off until `learn(events, ranks)`."""
        teaching = teaching_events(events)
        with self._lock.read():
            ranks = self.score(list(dict.fromkeys(e.query for e in teaching)))
        return {(e.query, t): ranks[e.query, t] for e in teaching for t in e.tool_ids if (e.query, t) in ranks}

    def holds_feedback_of(self, source: str) -> bool:
        """Whether anything `source` posted is kept (in the ledger, or scored): what `forget` would take back."""
        with self._lock.read():
            return self.ledger.holds(source) or any(r.source == source for r in self.learning.scorecard.records)

    def forget(self, source: str) -> list[str]:
        """Take back everything feedback from `source` taught: every tool ranks as if it had never posted.
        Returns the ids of the tools it had taught."""
        with self._lock.write():
            removed = self.ledger.forget(source)
            self.learning.unteach([(u.query, u.tool_id, u.source, u.time) for u in removed])
            self.learning.scorecard.forget(source)
            self._log_weights(self.learning.refresh_weights())
        return sorted({u.tool_id for u in removed})

    def holds_feedback_since(self, before: float) -> bool:
        """Whether anything is kept from `before` on (in the ledger, or scored): what `rollback` would take back."""
        with self._lock.read():
            return self.ledger.holds_since(before) or any(r.time >= before for r in self.learning.scorecard.records)

    def rollback_preview(self, before: float) -> list[Usage]:
        """What `rollback(before)` would take back, changing nothing."""
        with self._lock.read():
            return self.ledger.since(before)

    def rollback(self, before: float) -> list[Usage]:
        """Take back everything taught at or after `before` (seconds since the epoch): rankings are those of
        that time again (the catalog aside). Returns what was taken back."""
        with self._lock.write():
            removed = self.ledger.rollback(before)
            self.learning.unteach([(u.query, u.tool_id, u.source, u.time) for u in removed])
            self.learning.scorecard.rollback(before)
            self._log_weights(self.learning.refresh_weights())
        return removed

    def set_learning(self, *, weights: Mapping[str, float | None] | None = None, freeze: bool | None = None,
                     when: float | None = None) -> LearningSettings:
        """An operator's settings (`LearningSettings.updated`): `weights` per namespace ("*": all; None: back
        to automatic), `freeze` (True: learn nothing taught from `when`, default now, on; False: learn what
        was held back)."""
        with self._lock.write():
            old = self.learning.settings
            self.learning.settings = new = old.updated(weights, freeze, when)
            if old.frozen_at is not None and new.frozen_at is None:
                self.learning.teach(self._lessons([u for u in self.ledger.taught() if u.time >= old.frozen_at]))
            self._log_weights(self.learning.refresh_weights())
        return new

    def follow_learning(self, *, settings: LearningSettings | None = None, lessons: Sequence[tuple] = (),
                        key_of: Mapping[str, str] | None = None, records: Sequence[Scored] = ()) -> None:
        """Take in learning recorded elsewhere (a PostgreSQL replica following its database): with `settings`,
        start the channel afresh under them; then teach `lessons` ((key, vector, tool, source, untaught rank),
        vectors already made), remember `key_of` (request -> key) and add the scored `records`."""
        with self._lock.write():
            if settings is not None:
                self.learning = self.learning.afresh(settings)
            self.learning.restore(lessons, key_of or {}, records)
            self.learning.refresh_weights()

    def learning_report(self, brief: bool = False) -> dict[str, Any]:
        """How learning from use is doing (`LearnedChannel.report`)."""
        with self._lock.read():
            return self.learning.report(brief)

    def _lessons(self, usages: Sequence[Usage]) -> list[Lesson]:
        """What the channel is taught of `usages` (nothing taught while frozen, from the freeze on)."""
        frozen_at = self.learning.settings.frozen_at
        return [Lesson(u.query, u.tool_id, u.source, u.untaught_rank, u.time) for u in usages
                if frozen_at is None or u.time < frozen_at]

    def score(self, queries: list[str]) -> dict[tuple[str, str], Ranks]:
        """(query, tool) -> its ranks as served, untaught and learned at full weight (and whose lifts passed
        it), for every tool in the depth scored: an event's score before it is learned (call under the read
        lock, or with no writer)."""
        if not queries:
            return {}
        tasks = as_queries(queries)
        base = self._first_stage(tasks, SCORED_DEPTH, None)
        served, learned = base, base
        if self.learning.active:
            allows, near = self._allows(None), self.learning.nearest(tasks)  # one match serves both weights
            served, learned = (
                self.learning.rank(tasks, base, SCORED_DEPTH, allows, self._namespace_of,
                                   lifts=self.learning.lifts(tasks, allows, self._namespace_of, full, near=near))
                for full in (False, True))  # as served (the namespace's weight), and at full weight
        out: dict[tuple[str, str], Ranks] = {}
        for query, lists in zip(queries, zip(served, base, learned)):
            ranked = ranks_of(*(list(ids) for ids, _scores in lists), self._namespace_of)
            out.update(((query, tool), ranks) for tool, ranks in ranked.items())
        return out

    def score_records(self, events: Sequence[FeedbackEvent], ranks: Mapping[tuple[str, str], Ranks],
                      taught_before: set[str]) -> list[Scored]:
        """One record per known tool of each event, from its `ranks` (`score`). One dict read per tool:
        safe while writes go on."""
        return [Scored(e.time, e.source, tool.namespace or "", tool.id, e.query, tool.id in taught_before,
                       *ranks.get((e.query, tool.id), UNRANKED))
                for e in events for tool in (self._tools.get(t) for t in e.tool_ids) if tool is not None]

    def relearn(self, keep: Callable[[Usage], bool] = lambda _usage: True) -> None:
        """Teach the channel afresh what the ledger holds that `keep` accepts (a copy judged on held-back
        feedback learns from the rest only)."""
        with self._lock.write():
            scorecard = self.learning.scorecard
            self.learning = self.learning.afresh()
            self.learning.scorecard = scorecard
            self.learning.teach(self._lessons([u for u in self.ledger.taught() if keep(u)]))
            self.learning.refresh_weights()

    def carry_learning(self, old: "ToolScout") -> tuple[int, int]:
        """Take over what `old` (the index this one replaces: `toolscout index --out` over it) learned from
        feedback, for the tools this catalog still has: its ledger, each taught request's untaught rank
        measured again here, so that the channel is the one learning those events on this index gives; its
        settings and weight history; and the scores of its events, the evidence its automatic weights read.
        What taught tools not in this catalog is dropped, as deleting them would. Returns (kept, dropped):
        (tool, request) pairs. This index must have learned nothing yet."""
        if self.ledger.events or self.learning.active:
            raise ValueError("carry_learning: this index has learned from feedback already")
        with old._lock.read():
            ledger = copy.deepcopy(old.ledger)
            settings, records = old.learning.settings, list(old.learning.scorecard.records)
            history = list(old.learning.weight_history)
        with self._lock.write():
            dropped = ledger.keep_tools(self._tools)
            taught = ledger.taught()
            self.learning = self.learning.afresh(settings)
            self.learning.weight_history = history  # what happened to the old index's weights stays history
            ranks = self.score(list(dict.fromkeys(u.query for u in taught)))  # untaught: nothing learned yet
            ledger.remeasure(lambda u: ranks.get((u.query, u.tool_id), UNRANKED).untaught)
            self.ledger = ledger
            self.learning.score([r for r in records if r.tool in self._tools])
            self.learning.teach(self._lessons(ledger.taught()))
            self._log_weights(self.learning.refresh_weights())
        return len(taught), len(dropped)

    def _teach_from_ledger(self) -> None:
        """Teach the channel what the ledger holds when the channel knows none of it (a directory saved before
        learning was a channel of its own, or one whose encoder changed): requests are embedded again, and
        the untaught rank of entries that lack one is measured now."""
        taught = self.ledger.taught()
        if not taught or len(self.learning.memory):
            return
        missing = list(dict.fromkeys(u.query for u in taught if u.untaught_rank is None))
        ranks = self.score(missing)
        usages = [u if u.untaught_rank is not None else replace(u, untaught_rank=ranks.get((u.query, u.tool_id), (0, None))[1])
                  for u in taught]
        self.learning.teach(self._lessons(usages))
        self.learning.refresh_weights()

    @contextmanager
    def replaying(self, when: float | None) -> Iterator[None]:
        """Apply a journalled write again (`serve/directory.py`): a weight change it makes is history, kept
        at `when` (when the write was first made; None: not known), not news to log."""
        self._replaying = (when,)
        try:
            yield
        finally:
            self._replaying = None

    def _log_weights(self, changed: Mapping[str, tuple[float, float]]) -> None:
        """Keep the automatic weights' changes in the report's history, and log them (not while replaying)."""
        replay = self._replaying
        for entry in self.learning.note_weight_changes(changed, time.time() if replay is None else replay[0]):
            if replay is None:
                logger.warning("learning in namespace %r: weight %.2f -> %.2f (%s)", entry["namespace"] or "(none)",
                               entry["from"], entry["to"], entry["why"])

    def _allows(self, filter: Filter | None) -> Callable[[str], bool]:
        """Whether a tool the channel proposes may be returned: in the catalog and within `filter`."""
        def allows(tool_id: str) -> bool:
            tool = self._tools.get(tool_id)
            return tool is not None and (filter is None or filter.allows(tool_id, tool.namespace))
        return allows

    def _namespace_of(self, tool_id: str) -> str | None:
        tool = self._tools.get(tool_id)
        return None if tool is None else tool.namespace

    # search ------------------------------------------------------------------------------
    def retrieve(self, queries: Sequence[str | Query], k: int = 10, filter: Filter | None = None) -> Results:
        """Raw batched results (ids and scores), as the evaluation harness wants them."""
        queries = as_queries(queries)
        k = checked_k(k)
        with self._lock.read():
            return self._ranked(queries, k, filter)

    def _ranked(self, queries: list[Query], k: int, filter: Filter | None) -> Results:
        """First stage (request by request for multi-request tasks), what was learned from use, then the
        reranker over the top `depth` (caller holds the read lock)."""
        return self._ranked_and_lifted(queries, k, filter)[0].top(k)

    def _ranked_and_lifted(self, queries: list[Query], k: int, filter: Filter | None, gate: float | None = None
                           ) -> tuple[Results, list[dict[str, tuple[float, float]]] | None, list[bool]]:
        """`_ranked`, what learning lifted for each query (`LearnedChannel.lifts`; None when it is off), and
        which queries kept the first stage's ranking: the reranker could not judge them (`_reranked`), or
        `gate`, a min_probability decided on the first stage's ranking before reranking (`_passes_gate`), left them
        out of the reranking (they abstain); the ranking's `degraded` says why the reranker could not judge one."""
        depth = k if self.reranker is None else max(k, self.reranker.depth, self._kept_depth(k))
        lifts = None
        if not self.learning.active:
            candidates = self._first_stage(queries, depth, filter)
        else:
            base = self._first_stage(queries, max(depth, LEARNED_DEPTH), filter)
            allows = self._allows(filter)
            lifts = self.learning.lifts(queries, allows, self._namespace_of)
            candidates = self.learning.rank(queries, base, depth, allows, self._namespace_of, lifts=lifts)
        kept = [False] * len(queries)
        if self.reranker is not None:
            judge = [True] * len(queries) if gate is None else \
                self._passes_gate(queries, candidates, lifts, k, filter, gate)
            candidates, kept = self._reranked(queries, candidates, k, judge)
        return self._below_replacements(candidates, filter), lifts, kept

    def _reranked(self, queries: list[Query], candidates: Results, k: int,
                  judge: Sequence[bool]) -> tuple[Results, list[bool]]:
        """The reranker's ranking of the candidates of each query it is to `judge`, cut to k, and which
        queries kept the first stage's list (rerank/base.py): those not to judge, and those it could not. They
        keep it as deep as a search without the reranker ranks (`_kept_depth`, for the first stage's
        probabilities; `_ranked` cuts it to k): the reranker is handed its own depth of them, which may be
        shallower. Its Results' `degraded` says why it could not judge a query."""
        judged = candidates.top(max(k, self.reranker.depth))
        asked = [q for q, wanted in enumerate(judge) if wanted]
        lists, why = list(judged), [None] * len(queries)
        if asked:
            subset = Results(tuple(judged.ids[q] for q in asked), tuple(judged.scores[q] for q in asked))
            answer = self.reranker.rerank([queries[q].text for q in asked], subset, self._tools, self.retriever)
            for i, (q, ranked) in enumerate(zip(asked, answer)):
                lists[q], why[q] = ranked, answer.degraded_at(i)
        reranked = Results(tuple(ids for ids, _ in lists), tuple(scores for _, scores in lists),
                           tuple(why) if any(why) else None)
        kept = kept_first_stage(reranked, judged)
        deep = self._kept_depth(k)
        cut = [(first[0][:deep], first[1][:deep]) if was_kept else (ids[:k], scores[:k])
               for (ids, scores), first, was_kept in zip(reranked, candidates, kept)]
        return Results(tuple(ids for ids, _ in cut), tuple(scores for _, scores in cut), reranked.degraded), kept

    def _passes_gate(self, queries: list[Query], candidates: Results, lifts: Sequence[Mapping] | None, k: int,
                     filter: Filter | None, gate: float) -> list[bool]:
        """Per query, whether its first-stage ranking clears `gate` (a min_probability), read on the very
        list and probabilities a search that keeps that ranking shows (`_probabilities`), so a query abstains
        alike whether or not the reranker then answers; one that does not clear it costs no reranker call."""
        first = self._below_replacements(candidates.top(self._kept_depth(k)), filter)
        chances = self._probabilities(queries, first, lifts, [True] * len(queries))
        policy = HitPolicy(k, None, gate)
        return [not abstains(scores, p, policy) for (_ids, scores), p in zip(first, chances)]

    def _kept_depth(self, k: int) -> int:
        """How deep a query the reranker could not judge keeps the first stage's list: as deep as the first
        stage's calibration reads (RELEVANCE_DEPTH) when it has one, else k."""
        return k if self._kept_calibration is None else max(k, RELEVANCE_DEPTH)

    def _below_replacements(self, results: Results, filter: Filter | None) -> Results:
        """Each deprecated tool in `results` just below its replacement (`toolscout.deprecation`)."""
        if not self.demote_deprecated or not self._deprecated:
            return results
        allows = self._allows(filter)

        def successor(tool_id: str) -> str | None:
            return self._successor(tool_id, allows)

        ranked = [rank_below_replacements(ids, scores, successor) if any(t in self._deprecated for t in ids)
                  else (ids, scores) for ids, scores in results]
        return Results(tuple(ids for ids, _ in ranked), tuple(scores for _, scores in ranked), results.degraded)

    def replacements(self) -> dict[str, str | None]:
        """Each tool that says it is deprecated, with the id of the catalog tool that replaces it (None when
        it names none, or none the catalog has): what `demote_deprecated` acts on."""
        with self._lock.read():
            return {tool_id: None if said.replacement is None else
                    self._replacement_of(tool_id, said.replacement, lambda _t: True)
                    for tool_id, said in self._deprecated.items()}

    def _successor(self, tool_id: str, allows: Callable[[str], bool]) -> str | None:
        """The tool that replaces `tool_id` and a search may return (None: not deprecated, or none)."""
        said = self._deprecated.get(tool_id)
        return None if said is None or said.replacement is None else \
            self._replacement_of(tool_id, said.replacement, allows)

    def _replacement_of(self, tool_id: str, name: str, allows: Callable[[str], bool]) -> str | None:
        """The one tool `name` names that a search may return, preferring the deprecated tool's namespace
        (None when there is none, or several)."""
        found = [t for t in self._names.exact(name) if t != tool_id and allows(t)]
        namespace = self._tools[tool_id].namespace
        same = [t for t in found if self._tools[t].namespace == namespace]
        chosen = same or found
        return chosen[0] if len(chosen) == 1 else None

    def _first_stage(self, queries: list[Query], depth: int, filter: Filter | None) -> Results:
        """The untaught ranking: the retriever, request by request for multi-request tasks."""
        if self.intents is None:
            return self.retriever.search(queries, depth, filter)
        return self.intents.search(queries, depth, lambda qs, n: self.retriever.search(qs, n, filter))

    def search(self, query: str | Sequence[str], k: int = 5, *, namespaces: Iterable[str] | None = None,
               filter: Filter | None = None, min_score: float | None = None,
               min_probability: float | str | None = None, always_include: Iterable[str] = (),
               match_names: bool = True, explain: bool = False) -> Hits | list[Hits]:
        """The k best tools for `query`, best first; a list of queries gives one list per query (each a `Hits`:
        a list of Hit whose `degraded` says when a stage, the LLM reranker, could not rank the task).

        `namespaces` restricts results to tools in those namespaces (and so does `filter`; both apply).
        `min_score` is the abstention threshold: when the best retrieved tool scores below it, no
        retrieved tool is returned (a task no tool fits gets an empty list, not k weak matches).
        `min_probability` does the same on the best hit's calibrated probability: a number in [0, 1], or
        "calibrated" (`toolscout.hits.CALIBRATED`) for the threshold chosen with the calibration. A pipeline
        with no calibration gives no probabilities, and so never abstains on them: asking warns
        (`hits.UncalibratedWarning`; use `min_score` there); a reranked one whose first stage has one
        abstains on it, before reranking (`abstention_calibration`).
        `match_names`: a query that is a tool's name, exactly or nearly (`get_weather`, `getWeather`,
        `weather.get_weather`, one typo), ranks that tool first, whatever the threshold (`match="name"`).
        `always_include`: tool ids returned after the ranked ones, not counted in k (`match="always"`);
        filters still apply to them. Unknown ids there, and namespaces no tool is in, warn
        (`hits.UnknownNamesWarning`; `unknown_namespaces`). `explain`: each hit's `matched` lists
        the query's words found in its tool's text view. (`toolscout.hits` has the policy.)
        """
        queries = checked_queries(query)
        warn_if_uncalibrated(min_probability, self.abstention_calibration)
        policy = HitPolicy(checked_k(k), min_score, min_probability,
                           tuple(dict.fromkeys(listed(always_include, "always_include"))),
                           bool(match_names), bool(explain))
        flt = Filter.restrict(filter, namespaces)
        warn_if_unknown(self.unknown_namespaces(flt and flt.namespaces),
                        [i for i in policy.always_include if i not in self._tools])
        hits = self.hits(queries, flt, policy)
        return hits[0] if isinstance(query, (str, Query)) else hits

    def hits(self, queries: Sequence[Query], filter: Filter | None, policy: HitPolicy) -> list[Hits]:
        """`search` of queries and a policy already checked (`hits.checked_queries`, `checked_k`): what a
        service that checked them where they came in calls, so nothing is checked or focused twice. The
        ranking, name matches and tools all come from one read of the catalog."""
        policy = replace(policy, min_probability=self._threshold(policy.min_probability))
        # a reranked pipeline without probabilities of its own abstains on its first stage's, before reranking;
        # a query that does not clear them keeps that ranking and its probabilities, so it abstains below
        gate = policy.min_probability if self.calibration is None and self._kept_calibration is not None else None
        with self._lock.read():
            depth = policy.k if self.calibration is None else max(policy.k, RELEVANCE_DEPTH)
            results, lifts, kept = self._ranked_and_lifted(queries, depth, filter, gate)
            chances = self._probabilities(queries, results, lifts, kept)
            results = results.top(policy.k)
            source = _CatalogSource(self, filter)
            return [Hits(assemble_hits(q, ids, scores, self._named(q.text, filter) if policy.match_names else [],
                                       policy, source, p), results.degraded_at(i))
                    for i, (q, (ids, scores), p) in enumerate(zip(queries, results, chances))]

    @property
    def abstention_calibration(self) -> Calibration | None:
        """The calibration `min_probability` abstains on: the pipeline's own, or, for a reranked pipeline with
        none, its first stage's, read before reranking (`_passes_gate`; docs/scores.md). None: it never does."""
        return self.calibration if self.calibration is not None else self._kept_calibration

    def _threshold(self, min_probability: float | str | None) -> float | None:
        """`min_probability` as a number: "calibrated" is the calibration's threshold (None without one)."""
        if min_probability is None:
            return None
        if min_probability == CALIBRATED:
            calibration = self.abstention_calibration
            return None if calibration is None else calibration.threshold
        if isinstance(min_probability, str) or not 0.0 <= float(min_probability) <= 1.0:
            raise InvalidRequest(f"min_probability must be a number from 0 to 1 or {CALIBRATED!r}, got "
                                 f"{min_probability!r}")
        return float(min_probability)

    def _probabilities(self, queries: list[Query], results: Results, lifts: Sequence[Mapping] | None,
                       kept: Sequence[bool]) -> list[Any]:
        """Each ranking's calibrated probabilities (`toolscout.relevance`), or None per query without them (a
        query that `kept` the first stage's ranking has the first stage's). A tool that learning lifted for the
        task (`lifts`) has at least its learned probability, the deployment's own evidence that it serves such
        tasks (and the probabilities still never rise down the list)."""
        calibrations = [self._kept_calibration if was_kept else self.calibration for was_kept in kept]
        if self._dense is None or all(c is None for c in calibrations):
            return [None] * len(queries)
        rows = features_of(self._dense, queries, results)
        out = [None if c is None else c.probabilities(r) for c, r in zip(calibrations, rows)]
        for p, (ids, _scores), lifted in zip(out, results, lifts or ()):
            if lifted and p is not None:
                learned = np.array([lifted[t].probability if t in lifted else 0.0 for t in ids])
                p[:] = np.minimum.accumulate(np.maximum(p, learned))
        return out

    def _named(self, query: str, filter: Filter | None) -> list[str]:
        """The tools `query` names, within `filter`. A deprecated tool whose replacement the search may
        return counts only when the query names it exactly: "read a file" is near `read_file`'s name, and a
        near match must not put the tool the catalog says not to use above its replacement."""
        allows = self._allows(filter)
        named = [tid for tid in self._names.lookup(query) if allows(tid)]
        if not self.demote_deprecated or not any(tid in self._deprecated for tid in named):
            return named
        exact = set(self._names.exact(query))
        return [tid for tid in named if tid in exact or self._successor(tid, allows) is None]


class _CatalogSource:
    """`HitSource` over a pipeline's own catalog (its caller holds the read lock)."""

    def __init__(self, scout: ToolScout, filter: Filter | None):
        self.scout, self.filter = scout, filter

    def tools(self, ids: Sequence[str]) -> dict[str, Tool]:
        found = {tid: self.scout._tools.get(tid) for tid in ids}
        return {tid: tool for tid, tool in found.items()
                if tool is not None and (self.filter is None or self.filter.allows(tid, tool.namespace))}

    def scores(self, query: Query, ids: Sequence[str]) -> dict[str, float]:
        """Each tool's score alone (a filter of its id only), as the retriever would rank it."""
        out = {}
        for tid in ids:
            res = self.scout.retriever.search([query], 1, Filter.make(ids=[tid]))
            out[tid] = float(res.scores[0][0]) if len(res.scores[0]) else 0.0
        return out

    def lexical_reading(self) -> tuple[TextView, Any]:
        from .retrievers.bm25 import lexical_reading

        return lexical_reading(self.scout.retriever)
