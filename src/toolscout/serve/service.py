"""The one service core behind the HTTP API and the MCP server.

`ToolService.open(TARGET)` serves a pipeline directory (`serve/directory.py`: a snapshot plus a journal of
acknowledged writes) or a PostgreSQL index (`serve/pg_storage.py`: one catalog per tenant, shared by
every replica). The storage is the only thing that differs (`serve/storage.py`); every policy is here:

- who sees and writes what: every call takes a `Principal`. A principal restricted to some namespaces
  never sees, gets, lists or writes a tool outside them (a tool with no namespace counts as namespace
  ""); a principal bound to a tenant works on that tenant's catalog only;
- what a search returns: the request's filter within the principal's namespaces, the abstention
  thresholds on the best score and on the best hit's calibrated probability (the server's unless the
  request says otherwise), the server's always-included tools, and name matches (`toolscout.hits`
  assembles the hits);
- batching: single-query searches that arrive while others are being answered are coalesced
  (`SearchBatcher`): queries with the same options go through the encoder and the vector scan
  together, which is what lets two cores serve many concurrent clients.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from ..errors import Conflict, Forbidden, InvalidRequest, NotFound, ToolScoutError, is_blank
from ..feedback import DEFAULT_SOURCE, FeedbackEvent, LearnResult, checked_rollback_time, rolled_back
from ..hits import NO_CALIBRATION, Hit, HitPolicy, Hits, checked_k, checked_queries
from ..learning import check_settings, dormancy
from ..lru import LRU
from ..query import Query
from ..results import Filter
from ..tool import Tool, tools_by_id
from .batcher import SearchBatcher
from .errors import ServiceError, ServiceUnavailable
from .journal import COMPACT_EVERY
from .limits import FeedbackLimits
from .storage import Compacts, ProbesServer, Retrains, Storage, TenantStorage, WriteResult

if TYPE_CHECKING:
    from ..pipeline import ToolScout

_UNSET: Any = object()
logger = logging.getLogger(__name__)

__all__ = ["ToolService", "Principal", "ADMIN", "Reach", "WriteResult", "ServiceError", "ServiceUnavailable",
           "open_storage"]


@dataclass(frozen=True)
class Principal:
    """Who is calling: `namespaces` None means every namespace; `write` allows upserts and deletes.
    `tenant`: whose catalog the caller works on (None: the storage's default; only the PostgreSQL store
    holds several)."""

    name: str = "anonymous"
    namespaces: frozenset[str] | None = None
    write: bool = False
    tenant: str | None = None
    feedback: bool = False  # may post tool-use feedback (write implies it)
    source: str | None = None  # the feedback source this caller posts as (None: its name)

    @property
    def trusted(self) -> bool:
        """May write every namespace: an operator or the agent platform itself, which may label feedback
        with any source (everyone else posts as its own)."""
        return self.write and self.namespaces is None

    @property
    def feedback_source(self) -> str:
        return self.source or (DEFAULT_SOURCE if self.trusted else self.name)

    def sees_namespace(self, namespace: str | None) -> bool:
        return self.namespaces is None or (namespace or "") in self.namespaces

    def sees(self, tool: Tool) -> bool:
        return self.sees_namespace(tool.namespace)

    def seen_ids(self, scout: "ToolScout", ids: Iterable[str]) -> set[str]:
        """Those of `ids` that name a tool of `scout`'s catalog this principal may see."""
        return {i for i in set(ids) if (tool := scout.get(i, None)) is not None and self.sees(tool)}

    def authorize_write(self, tool: Tool, old: Tool | None) -> None:
        """Raise Forbidden unless this principal may write `tool` over `old` (the stored tool, or None)."""
        for held in (tool, old):  # the namespace it would go to, then the one it is in (a move writes both)
            if held is not None and not self.sees(held):
                where = "" if held is tool else " (where the stored tool is)"
                raise Forbidden(f"tool {tool.id!r}: namespace {held.namespace!r}{where} is outside what this token "
                                "may write")

    @property
    def filter(self) -> Filter | None:
        return Filter.make(namespaces=self.namespaces)


ADMIN = Principal("admin", None, True)


@dataclass(frozen=True)
class Reach:
    """Which tools can be used now, where the catalog fronts other servers (the gateway says, through the
    `reach` callable a service is given). `namespaces`: the only namespaces search returns (None: any);
    `held`: ids search leaves out; `down`: namespaces whose server does not answer now, so their hits say
    `available: false` (None: availability is not tracked, and hits do not say)."""

    namespaces: frozenset[str] | None = None
    held: frozenset[str] = frozenset()
    down: frozenset[str] | None = None


EVERYWHERE = Reach()


LIVENESS = ("storage", "writes", "uptime_s", "snapshots")  # what /health shows a caller without a token
BRIEF_LEARNING = ("requests", "tools_taught", "events_scored", "dormant", "frozen_at", "weights")  # LearnedChannel.report(brief)


def _visible_totals(scout: "ToolScout", principal: Principal, namespaces: Mapping[str, Any]) -> dict[str, int]:
    """The learning report's totals over the tools `principal` may see: requests that taught one of them,
    those tools, and the events scored in their namespaces."""
    memory = scout.learning.memory
    seen = principal.seen_ids(scout, [*memory.tools, *(t for tools in memory.taught.values() for t in tools)])
    return {"requests": sum(1 for tools in memory.taught.values() if not seen.isdisjoint(tools)),
            "tools_taught": sum(1 for t in memory.tools if t in seen),
            "events_scored": sum(figures["all"]["events"] for figures in namespaces.values())}


class ToolService:
    """Search and edit a catalog, safely from many threads. See the module doc."""

    def __init__(self, storage: Storage, *, min_score: float | None = None,
                 min_probability: float | str | None = None, always_include: Sequence[str] = (),
                 batch_workers: int = 2, limits: FeedbackLimits | None = None, cache_size: int = 10_000,
                 reach: Callable[[], Reach] | None = None):
        self.storage = storage
        self.reach = reach or (lambda: EVERYWHERE)
        # answers by (catalog version, options, task): a write or feedback bumps the version, so an answer
        # from before it is never served after it
        self.answers = LRU(cache_size)
        self.limits = limits or FeedbackLimits()
        self._retrain_lock = threading.Lock()
        self._retrain_state: dict[str, Any] = {"state": "never"}
        self.min_score = min_score
        self.min_probability = min_probability  # a probability, "calibrated" (the calibration's own) or None
        self.always_include = tuple(always_include)
        self.started_at = time.time()
        self._closed = False
        self._batcher = SearchBatcher(self._search_many, batch_workers) if batch_workers > 0 else None
        if min_probability is not None:
            self._say_if_uncalibrated()

    def _say_if_uncalibrated(self) -> None:
        """A probability threshold on a pipeline with no calibration abstains on nothing: say so at start,
        not by answers that never abstain."""
        try:
            scout = self.storage.tenant(None).pipeline(fresh=False)
        except ToolScoutError:  # the store cannot say now (a database not answering): its searches will
            return
        if scout.abstention_calibration is None:
            logger.warning("min_probability %r: this pipeline %s", self.min_probability, NO_CALIBRATION)

    # lifecycle -----------------------------------------------------------------------------
    @classmethod
    def open(cls, target: str | Path, *, fsync: bool = True, compact_every: int = COMPACT_EVERY, encoder: Any = None,
             max_stale_s: float = 1.0, feedback_cap: int | None = None, fast_queries: bool | str | None = None,
             **options: Any) -> "ToolService":
        """Serve `target`: a PostgreSQL store spec (postgresql://...) or a pipeline directory (`open_storage`
        says what its options do); `options` (min_score, min_probability, always_include, batch_workers,
        limits, reach) go to the service."""
        storage = open_storage(target, fsync=fsync, compact_every=compact_every, encoder=encoder,
                               max_stale_s=max_stale_s, feedback_cap=feedback_cap, fast_queries=fast_queries)
        return cls(storage, **options)

    def close(self, compact: bool = True) -> None:
        """Stop the search workers and release the storage (`compact=False`: no final snapshot)."""
        if self._closed:
            return
        self._closed = True
        if self._batcher is not None:
            self._batcher.close()
        self.storage.close(compact=compact)

    def __enter__(self) -> "ToolService":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # search --------------------------------------------------------------------------------
    def search(self, query: str | Sequence[str], k: int = 5, *, principal: Principal = ADMIN,
               namespaces: Iterable[str] | None = None, ids: Iterable[str] | None = None,
               exclude_ids: Iterable[str] = (), min_score: float | None = _UNSET,
               min_probability: float | str | None = _UNSET, always_include: Iterable[str] = (),
               match_names: bool = True, explain: bool = False) -> Hits | list[Hits]:
        """`ToolScout.search` within what `principal` may see. `min_score` and `min_probability` default to
        the service's abstention thresholds (pass None for none); `always_include` adds to the service's list.
        A task may come as a `Query` (`hits.checked_queries`, where a caller focused it already)."""
        queries = checked_queries(query)  # the one check of the tasks, and their one focusing
        options = self._options(k, principal, namespaces, ids, exclude_ids, (min_score, min_probability),
                                always_include, match_names, explain)
        if isinstance(query, (str, Query)):
            return self._answer(options, queries[0]).result()
        return self._search_many(options, queries)

    def search_future(self, query: str | Query, k: int = 5, *, principal: Principal = ADMIN,
                      namespaces: Iterable[str] | None = None, ids: Iterable[str] | None = None,
                      exclude_ids: Iterable[str] = (), min_score: float | None = _UNSET,
                      min_probability: float | str | None = _UNSET, always_include: Iterable[str] = (),
                      match_names: bool = True, explain: bool = False) -> Future | None:
        """`search` of one query without blocking: a Future of its hits, answered in a batch with other
        callers' concurrent queries (what the HTTP API's event loop awaits). None when this service does
        not batch searches (then call `search`, in a thread)."""
        if self._batcher is None or self._closed:
            return None
        (task,) = checked_queries([query])
        options = self._options(k, principal, namespaces, ids, exclude_ids, (min_score, min_probability),
                                always_include, match_names, explain)
        return self._answer(options, task)

    async def search_async(self, query: str | Query, k: int = 5, **options: Any) -> Hits:
        """`search` of one query, awaited in an asyncio event loop (what the MCP servers and the gateway
        await): the batcher's Future, so no thread waits on it; in a worker thread when this service does
        not batch. `options` as `search` takes them."""
        future = self.search_future(query, k, **options)
        if future is not None:
            return await asyncio.wrap_future(future)
        import anyio.to_thread  # the serve extra's; only a service without a batcher gets here

        return await anyio.to_thread.run_sync(lambda: self.search(query, k, **options))

    def _answer(self, options: tuple, query: Query) -> Future:
        """A Future of one query's hits: from the answers cache when this catalog version answered it
        before, else from the batcher (or computed here when there is none), then cached."""
        key = None
        if self.storage.versions_are_local:  # else reading the version costs a round trip: no answer cache
            key = (self.storage.tenant(options[0]).current_version(), options, query)
            cached = self.answers.get(key)
            if cached is not None:
                future: Future = Future()
                future.set_result(cached)
                return future
        if self._batcher is not None and not self._closed:
            future = self._batcher.submit_future(options, query)
        else:
            future = Future()
            future.set_result(self._search_many(options, [query])[0])
        if key is not None:
            future.add_done_callback(lambda done: self._remember(key, done))
        return future

    def _remember(self, key: tuple, done: Future) -> None:
        # a degraded answer (the LLM reranker failed) is not kept: the next search asks the stage again
        if not done.cancelled() and done.exception() is None and done.result().degraded is None:
            self.answers.put(key, done.result())

    def _options(self, k, principal, namespaces, ids, exclude_ids, thresholds, always_include, match_names,
                 explain) -> tuple:
        """Everything one search asks, as a hashable key (searches with equal keys are batched together; the
        answers cache is keyed by it too, so what `reach` says now is part of it). `thresholds`: the request's
        (min_score, min_probability), each _UNSET for the service's."""
        reach = self.reach()
        flt = Filter.make(namespaces=principal.namespaces, ids=ids, exclude_ids=set(exclude_ids) | reach.held)
        flt = Filter.restrict(Filter.restrict(flt, namespaces), reach.namespaces)
        min_score, min_probability = thresholds
        min_score = self.min_score if min_score is _UNSET else min_score
        min_probability = self.min_probability if min_probability is _UNSET else min_probability
        always = tuple(dict.fromkeys(self.always_include + tuple(always_include)))
        policy = HitPolicy(checked_k(k), min_score, min_probability, always, bool(match_names), bool(explain))
        return (principal.tenant, flt, policy, reach.down)

    def _search_many(self, options: tuple, queries: Sequence[Query]) -> list[Hits]:
        tenant, flt, policy, down = options
        answers = self.storage.tenant(tenant).pipeline().hits(list(queries), flt, policy)  # checked: not again
        for hits in answers:  # callers read a coarse reason (`Degraded.to_dict`); the error in full is logged
            if hits.degraded is not None:
                logger.warning("search: the %s could not rank a task: %s", hits.degraded.stage,
                               hits.degraded.described)
        if down is None:
            return answers
        return [Hits([replace(h, available=(h.tool.namespace or "") not in down) for h in hits], hits.degraded)
                for hits in answers]

    # catalog reads: straight from the tenant's pipeline -----------------------------------------
    def _tenant(self, principal: Principal) -> TenantStorage:
        return self.storage.tenant(principal.tenant)

    def get(self, tool_id: str, principal: Principal = ADMIN, *, held_first: bool = False) -> Tool:
        """The tool with this id; NotFound if there is none *that principal may see*. `held_first`: looked up
        in the pipeline this process holds before the storage is asked (`TenantStorage.held`): a gateway
        routes calls so (what routing reads of a tool, its namespace, is what its server listed)."""
        tenant = self._tenant(principal)
        held = tenant.held() if held_first else None
        tool = held.get(tool_id, None) if held is not None else None
        if tool is None:
            tool = tenant.pipeline().get(tool_id, None)
        if tool is None or not principal.sees(tool):
            raise NotFound(f"no tool with id {tool_id!r}")
        return tool

    def list(self, principal: Principal = ADMIN, namespace: str | None = None, offset: int = 0,
             limit: int = 100) -> tuple[int, list[Tool]]:
        """(number of visible tools matching, one page of them, ordered by id)."""
        tools = [t for t in self._tenant(principal).pipeline().tools
                 if principal.sees(t) and (namespace is None or (t.namespace or "") == namespace)]
        tools.sort(key=lambda t: t.id)
        return len(tools), tools[offset:offset + limit]

    def namespaces(self, principal: Principal = ADMIN) -> dict[str, int]:
        """Each namespace the caller may see, with its tool count ("": tools with no namespace)."""
        counts = Counter((t.namespace or "") for t in self._tenant(principal).pipeline().tools)
        return {ns: n for ns, n in sorted(counts.items()) if principal.sees_namespace(ns)}

    def unknown_namespaces(self, names: Iterable[str] | None, principal: Principal = ADMIN) -> list[str]:
        """Those of `names` (a search's namespaces) that hold no tool the caller may see: a typo, most likely,
        which would otherwise read as a search that found nothing (one the caller may not see reads the same)."""
        if not names:  # every search asks: one without namespaces costs nothing
            return []
        unknown = set(self._tenant(principal).pipeline(fresh=False).unknown_namespaces(names))
        return sorted(n for n in set(names) if n in unknown or not principal.sees_namespace(n))

    def unknown_ids(self, ids: Iterable[str], principal: Principal = ADMIN) -> list[str]:
        """Those of `ids` (a search's ids and always_include) that name no tool the caller may see: a typo,
        most likely, which would otherwise read as a search that found nothing, or a tool silently left out."""
        ids = set(ids)
        if not ids:  # every search asks: one without ids costs nothing
            return []
        return sorted(ids - principal.seen_ids(self._tenant(principal).pipeline(fresh=False), ids))

    @property
    def tools(self) -> list[Tool]:
        """Every tool of the default tenant's catalog, by id, whoever asks (filter with `Principal.sees`)."""
        return sorted(self.storage.tenant(None).pipeline().tools, key=lambda t: t.id)

    def name_is_shared(self, name: str, principal: Principal = ADMIN) -> bool:
        """True when more than one tool in the caller's catalog has this name (agents need a qualified one)."""
        return self._tenant(principal).pipeline(fresh=False).name_count(name) > 1

    def version(self, principal: Principal = ADMIN) -> int:
        """The catalog version (bumped by every write) the caller's next read sees."""
        return self._tenant(principal).version()

    def __len__(self) -> int:
        return len(self.storage.tenant(None).pipeline())

    # writes --------------------------------------------------------------------------------
    def upsert(self, tools: Iterable[Tool], principal: Principal = ADMIN) -> WriteResult:
        """Insert or replace tools by id; durable when this returns. Unchanged tools cost nothing."""
        batch = list(tools_by_id(tools, "one request").values())
        self._check_can_write(principal)  # who may write comes before what is written
        for tool in batch:  # Tool allows it, so that an index stored with one still loads and can delete it
            if is_blank(tool.id) or is_blank(tool.name):
                raise InvalidRequest(f"tool {tool.id!r}: its id and its name need a character other than whitespace")
        return self._tenant(principal).upsert(batch, principal.authorize_write)

    def delete(self, ids: Iterable[str], principal: Principal = ADMIN) -> WriteResult:
        """Remove tools by id; NotFound (naming them) if any is unknown or not visible, and then nothing
        is removed. Durable when this returns."""
        ids = list(dict.fromkeys(ids))
        self._check_can_write(principal)
        return self._tenant(principal).delete(ids, principal.sees_namespace)

    # feedback ------------------------------------------------------------------------------
    def feedback(self, events: Iterable[FeedbackEvent | Mapping[str, Any]], principal: Principal = ADMIN) -> LearnResult:
        """Record tool-use feedback and learn from it at once (`toolscout.feedback`), within what the
        caller may do: it needs feedback (or write) permission, may name only tools it can see (others
        count as unknown), posts as its own source unless trusted, and within the per-source limits."""
        if not (principal.write or principal.feedback):
            raise Forbidden(f"token {principal.name!r} may not post feedback")
        events = [self._feedback_event(e, principal) for e in events]
        if not events:
            return LearnResult()
        tenant = self._tenant(principal)
        pipeline = tenant.pipeline()
        refuse_before_a_freeze(events, pipeline.learning.settings.frozen_at)
        self.limits.admit(principal.tenant, events, tenant.feedback_totals()["sources"])
        visible = principal.seen_ids(pipeline, (t for e in events for t in e.tool_ids))
        kept = [replace(e, tool_ids=ids) for e in events if (ids := tuple(t for t in e.tool_ids if t in visible))]
        result = tenant.learn(kept) if kept else LearnResult()
        result.events, result.frozen_at = len(events), pipeline.learning.settings.frozen_at
        result.unknown = [t for e in events for t in e.tool_ids if t not in visible] + result.unknown
        return result

    @staticmethod
    def _feedback_event(event: FeedbackEvent | Mapping[str, Any], principal: Principal) -> FeedbackEvent:
        """The event as `principal` may post it: without a source it is the caller's; only a trusted
        caller names another."""
        if not isinstance(event, FeedbackEvent):
            event = FeedbackEvent.from_dict(event)
        if event.source == DEFAULT_SOURCE:
            event = replace(event, source=principal.feedback_source)
        if event.source != principal.feedback_source and not principal.trusted:
            raise Forbidden(f"token {principal.name!r} posts feedback as source {principal.feedback_source!r}, "
                            f"not {event.source!r}")
        return event

    def check_feedback_times(self, events: Sequence[FeedbackEvent], principal: Principal = ADMIN) -> None:
        """Refuse `events` as `feedback` would for the freeze, before any is recorded: a caller that sends them in
        batches (`toolscout learn LOG`) checks them all first, so a refused log writes nothing."""
        refuse_before_a_freeze(events, self._tenant(principal).pipeline().learning.settings.frozen_at)

    def forget(self, source: str, principal: Principal = ADMIN) -> list[str] | None:
        """Take back everything feedback from `source` taught (a trusted caller, or the source itself): the
        tools it had taught; None when no feedback of it is stored (`nothing_from` says so), and nothing changes."""
        if not (principal.trusted or (principal.feedback or principal.write) and source == principal.feedback_source):
            raise Forbidden(f"token {principal.name!r} may not delete the feedback of source {source!r}")
        return self._tenant(principal).forget(source)

    def learning(self, principal: Principal = ADMIN, brief: bool = False) -> dict[str, Any]:
        """How learning from use is doing (`toolscout.learning`): its settings, weights and calibration, and
        the deployment's own measurement of it, per namespace (only the caller's namespaces). `brief`: what
        /health shows, the totals and weights without the figures."""
        scout = self._tenant(principal).pipeline()
        if brief and self.sees_everything(principal):  # /health is polled: no figures computed to be dropped
            return scout.learning_report(brief=True)
        report = scout.learning_report()
        report["measured"]["namespaces"] = {ns: figures for ns, figures in report["measured"]["namespaces"].items()
                                            if principal.sees_namespace(ns)}
        report["weights"] = {ns: w for ns, w in report["weights"].items() if principal.sees_namespace(ns)}
        if "weight_history" in report:
            report["weight_history"] = [h for h in report["weight_history"] if principal.sees_namespace(h["namespace"])]
        if principal.namespaces is not None:  # the totals would tell of namespaces the caller cannot see
            report["measured"] = {"namespaces": report["measured"]["namespaces"]}  # all, first_seen, repeats...
            report.pop("calibration", None)  # fitted on every namespace's feedback
            report.update(_visible_totals(scout, principal, report["measured"]["namespaces"]))
            if report["dormant"]:  # the deployment's count of taught tools spans every namespace
                report["dormant"] = dormancy(None)
        return {k: report[k] for k in BRIEF_LEARNING} if brief else report

    def set_learning(self, principal: Principal = ADMIN, *, weights: Mapping[str, float | None] | None = None,
                     freeze: bool | None = None) -> dict[str, Any]:
        """An operator sets learning's weight per namespace (None: automatic again), or freezes / unfreezes it."""
        self._check_operator(principal, "change how the index learns")
        check_settings(weights, freeze)  # before the storage records anything
        return self._tenant(principal).set_learning(dict(weights or {}), freeze)

    def rollback_learning(self, before: float, principal: Principal = ADMIN, dry_run: bool = False) -> dict[str, Any]:
        """Take back everything learned (or held by a freeze) at or after `before` (seconds since the epoch):
        what was taken back (`rolled_back`). Nothing else changes; `dry_run`, or nothing to take back, changes
        nothing at all (not even the version)."""
        self._check_operator(principal, "roll learning back")
        tenant = self._tenant(principal)
        pairs = tenant.rollback(checked_rollback_time(float(before), f"before {before:g}"), dry_run)
        return rolled_back(pairs, tenant.pipeline().learning.settings.frozen_at, dry_run)

    def _check_operator(self, principal: Principal, action: str) -> None:
        if not principal.trusted:
            raise Forbidden(f"token {principal.name!r} may not {action}: that needs a token that may write every "
                            "namespace")
        if self._closed:
            raise ServiceError("the service is closed")

    def feedback_of(self, tool_id: str, principal: Principal = ADMIN) -> dict[str, int]:
        self.get(tool_id, principal)  # NotFound unless the caller may see it
        return self._tenant(principal).feedback_of(tool_id)

    def learned_of(self, tool_ids: Sequence[str]) -> dict[str, int]:
        """The operator's count of the requests feedback taught each of `tool_ids`, in one read (a gateway
        removing a server's tools logs what goes with them)."""
        return self._tenant(ADMIN).learned_of(tool_ids)

    def retrain(self, method: str, principal: Principal = ADMIN, *, background: bool = False,
                **options: Any) -> dict[str, Any]:
        """Heavier learning from the feedback so far (`toolscout.train.feedback`): train `method` (mlc,
        refiner or embed) and swap it in only when held-back feedback ranks better. A trusted caller only.
        `background`: return at once; `retraining()` reports how it went."""
        if not principal.trusted:
            raise Forbidden("retraining needs a token that may write every namespace")
        with self._retrain_lock:
            if self._retrain_state.get("state") == "running":
                raise Conflict("a retraining is already running")
            self._retraining_storage().check_retraining(method, **options)
            self._retrain_state = {"state": "running", "method": method, "started_at": time.time()}
            started = dict(self._retrain_state)  # a quick failure may replace it before this returns
        if not background:
            return self._run_retraining(method, options, raise_errors=True)
        threading.Thread(target=self._run_retraining, args=(method, options, False), name="toolscout-retrain",
                         daemon=True).start()
        return started

    def _run_retraining(self, method: str, options: dict[str, Any], raise_errors: bool) -> dict[str, Any]:
        try:
            result = self._retraining_storage().retrain(method, **options)
            state = {"state": "swapped" if result.improved else "kept", **result.to_dict()}
            if result.improved and result.scout.calibration is None:  # the calibration fits the old scores only
                state["warning"] = f"the {method} pipeline swapped in {NO_CALIBRATION}"
                if not raise_errors:  # in the background (a server): its log; a caller waiting reads the state
                    logger.warning("retraining: %s", state["warning"])
        except Exception as exc:  # the pipeline is unchanged; the error is the caller's, or in retraining()
            state = {"state": "failed", "method": method, "error": str(exc)}
            if raise_errors:
                self._finish_retraining(state)
                raise
            logger.exception("retraining with %s failed", method)
        return self._finish_retraining(state)

    def _finish_retraining(self, state: dict[str, Any]) -> dict[str, Any]:
        with self._retrain_lock:
            self._retrain_state = {**state, "finished_at": time.time()}
            return dict(self._retrain_state)

    def _retraining_storage(self) -> Retrains:
        if not isinstance(self.storage, Retrains):
            raise Conflict(f"heavier learning (--train) retrains a pipeline directory's models; a {self.storage.kind} "
                           "storage keeps one encoder per index table. Export the feedback, train with `toolscout "
                           "train`, and index the catalog into a new table with the trained model")
        return self.storage

    def retraining(self) -> dict[str, Any]:
        """How the last retraining went: state running / swapped / kept / failed, with its scores."""
        with self._retrain_lock:
            return dict(self._retrain_state)

    def compact(self) -> bool:
        """Fold the writes so far into a snapshot now (a directory); False when there is nothing to do (or
        nothing to fold: the database holds every write)."""
        return isinstance(self.storage, Compacts) and self.storage.compact()

    def _check_can_write(self, principal: Principal) -> None:
        if not principal.write:
            raise Forbidden("this token may not change the catalog")
        if self._closed:
            raise ServiceError("the service is closed")

    # operations ----------------------------------------------------------------------------
    @property
    def failed(self) -> str | None:
        """Why writes are refused (None while they are accepted)."""
        return self.storage.failed

    def describe(self) -> str:
        return self.storage.describe()

    def sees_everything(self, principal: Principal) -> bool:
        """Whether `principal` may read every namespace of the catalog the server's own figures describe
        (the default tenant's): only such a caller is shown figures that total over namespaces."""
        return principal.namespaces is None and self._tenant(principal) is self.storage.tenant(None)

    def stats(self, principal: Principal | None = ADMIN) -> dict[str, Any]:
        """Figures for /health and /metrics, as far as `principal` may see them (docs/serving.md, "What
        /health and /metrics show"). None (no caller a read would accept) gets the `LIVENESS` fields only; a
        caller limited to some namespaces (or bound to another tenant) gets those and the tool count, version
        and learning of what it may read: every other figure counts tools, writes, feedback or traffic of
        namespaces it may not read."""
        everything = self._stats()  # for every caller: reading it is what finds a database that does not answer
        if principal is not None and self.sees_everything(principal):
            return everything
        shown = {k: everything[k] for k in LIVENESS if k in everything}
        if principal is None:
            return shown
        return {**shown, "tools": sum(self.namespaces(principal).values()), "version": self.version(principal),
                "learning": self.learning(principal, brief=True)}

    def _stats(self) -> dict[str, Any]:
        """Every figure, of the default tenant's catalog: the catalog's size and version, and the storage's own."""
        if isinstance(self.storage, ProbesServer):  # a database known down: a 503 at once, not after a wait
            self.storage.check_answering()
        feedback = self.storage.tenant(None).feedback_totals()
        return {"tools": len(self), "version": self.version(), "storage": self.storage.kind,
                **self.storage.stats(), "uptime_s": round(time.time() - self.started_at, 3),
                "feedback_events": feedback["events"], "feedback_failures": feedback["failures"],
                "feedback_learned": sum(feedback["sources"].values()), "feedback_sources": len(feedback["sources"]),
                "min_score": self.min_score, "min_probability": self.min_probability,
                "writes": "failed: " + self.failed if self.failed else "ok",
                "search_batches": self._batcher.batches if self._batcher else None,
                "batched_queries": self._batcher.queries if self._batcher else None,
                "answer_cache_hits": self.answers.hits, "answer_cache_misses": self.answers.misses,
                "learning": self.storage.tenant(None).pipeline().learning_report(brief=True)}


STORAGE_OPTIONS = ("fsync", "compact_every", "encoder", "max_stale_s", "feedback_cap", "fast_queries")


def open_storage(target: str | Path, *, fsync: bool = True, compact_every: int = COMPACT_EVERY, encoder: Any = None,
                 max_stale_s: float = 1.0, feedback_cap: int | None = None,
                 fast_queries: bool | str | None = None) -> Storage:
    """The storage of `target`, for a `ToolService`: a PostgreSQL store spec (postgresql://...) or a pipeline
    directory. `fsync` and `compact_every` apply to a directory; `encoder` (an already loaded one) and
    `max_stale_s` to PostgreSQL; `feedback_cap` (requests one feedback source may teach one tool) is recorded
    with the catalog; `fast_queries` ("table" or True, or "student") encodes tasks with that fast tier distilled
    from the index's encoder (`encoders/fast.py`), False with the encoder itself, None as a directory was saved
    (PostgreSQL: the encoder). These are `STORAGE_OPTIONS`."""
    from ..store.pgvector import is_postgres_spec

    if is_postgres_spec(target):
        from .pg_storage import PgStorage

        storage = PgStorage.open(str(target), encoder=encoder, max_stale_s=max_stale_s, fast_queries=fast_queries)
    else:
        from .directory import DirectoryStorage

        storage = DirectoryStorage.open(target, fsync=fsync, compact_every=compact_every, fast_queries=fast_queries)
    if feedback_cap is not None:
        storage.set_feedback_cap(feedback_cap)
    return storage


def refuse_before_a_freeze(events: Sequence[FeedbackEvent], frozen_at: float | None) -> None:
    """A freeze holds back what is taught from its time on; an event dated before it (a log imported later)
    would be learned at once, which is not what an operator who froze learning means. (The HTTP and MCP
    routes stamp each event as it arrives; a caller that dates its events is refused.)"""
    older = sum(1 for e in events if frozen_at is not None and e.time is not None and e.time < frozen_at)
    if older:
        when = datetime.fromtimestamp(frozen_at, timezone.utc).isoformat()
        raise InvalidRequest(f"learning is frozen since {when}, and {older} of these events are dated before it, "
                             "so they would be learned at once: unfreeze first (toolscout learning unfreeze), or "
                             "send them later")


def unknown_namespaces(service: ToolService, names: list[str] | None, principal: Principal,
                       added: dict[str, Any]) -> list[str]:
    """The namespaces a search named that hold no tool the caller may see, less a gateway's servers that are
    starting or down (`not_searchable` says why those found nothing)."""
    told = {entry["server"] for entry in added.get("not_searchable") or ()}
    return [name for name in service.unknown_namespaces(names, principal) if name not in told]
