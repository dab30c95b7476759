"""Learning from use: which tools served which requests, as an agent platform reports it.

A `FeedbackEvent` is a task and the ids of the tools that served it, with an optional `source` (the
client that reports it) and `outcome`. The `UsageLedger` decides what of it the retrievers learn:

- only successful uses teach (`outcome` "success" or none given); a "failure" is recorded and counted but
  teaches nothing: it says the tool did not serve, not which tool would have;
- a request of nothing but numbers, dates and addresses (the learner's `teaches_anything` says which) is
  recorded and counted but teaches nothing: it says which instance, not what is asked;
- identical repeats count once per source: the same (source, task, tool) a second time adds nothing;
- one source can add at most `per_source_cap` requests to any one tool: past that, its events are
  acknowledged and counted but move nothing, so no single client can drag a tool toward its requests
  beyond that bound, however much it posts;
- `forget(source)` takes back everything a source taught, exactly: the learned state is always derived
  from the per-source entries in source order, never from a running total, so after a source is
  forgotten every tool is as if that source had never posted.

The ledger holds texts only, each taught entry with the time it was taught (so learning can be rolled back
to a point in time) and where the untaught ranking put the tool for it (the self-measurement the learned
channel's calibration reads, `toolscout.learning`). What the pipeline derives from it (the requests' vectors)
lives in the learned channel.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from .artifacts import read_json
from .errors import SURROGATE_HINT, SURROGATE_PROBLEM, InvalidRequest, holds_lone_surrogate, is_blank
from .tool import Tool

OUTCOMES = ("success", "failure")
DEFAULT_SOURCE = "default"
MAX_QUERY_CHARS = 20_000
MAX_TOOLS_PER_EVENT = 64
PER_SOURCE_CAP = 1000  # requests one source may add to one tool (see the module doc; docs/learning.md)
_SPACES = re.compile(r"\s+")


LATEST_TIME = 253402300799.0  # the last second of the year 9999: the latest time a calendar shows


@dataclass(frozen=True)
class FeedbackEvent:
    """A task and the tools that served it. `source`: who reports it (its influence can be taken back as
    a whole); `outcome`: "success" (the default when omitted) or "failure"."""

    query: str
    tool_ids: tuple[str, ...]
    source: str = DEFAULT_SOURCE
    outcome: str | None = None
    time: float | None = None  # when it happened (seconds since the epoch); None: when it is learned

    def __post_init__(self) -> None:
        if not isinstance(self.query, str) or is_blank(self.query):
            raise InvalidRequest("feedback: 'query' must be a non-empty string")
        if len(self.query) > MAX_QUERY_CHARS:
            raise InvalidRequest(f"feedback: 'query' is longer than {MAX_QUERY_CHARS} characters")
        ids = (self.tool_ids,) if isinstance(self.tool_ids, str) else tuple(self.tool_ids)
        if not ids or not all(isinstance(t, str) and t for t in ids) or len(ids) > MAX_TOOLS_PER_EVENT:
            raise InvalidRequest(f"feedback: 'tool_ids' must list 1 to {MAX_TOOLS_PER_EVENT} tool ids")
        object.__setattr__(self, "tool_ids", tuple(dict.fromkeys(ids)))
        if not isinstance(self.source, str) or not self.source or len(self.source) > 200:
            raise InvalidRequest("feedback: 'source' must be a non-empty string of at most 200 characters")
        for name, text in (("query", self.query), ("source", self.source), *(("tool_ids", t) for t in ids)):
            if holds_lone_surrogate(text):  # no encoder, ledger or journal takes one: refused before it is learned
                raise InvalidRequest(f"feedback: {name!r}: {SURROGATE_PROBLEM}; {SURROGATE_HINT}")
        if self.outcome is not None and self.outcome not in OUTCOMES:
            raise InvalidRequest(f"feedback: 'outcome' must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")
        if self.time is not None and (isinstance(self.time, bool) or not isinstance(self.time, (int, float))
                                      or not 0 <= self.time <= LATEST_TIME):
            raise InvalidRequest(f"feedback: 'time' must be seconds since the epoch, got {self.time!r}")

    @property
    def teaches(self) -> bool:
        return self.outcome != "failure"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"query": self.query, "tool_ids": list(self.tool_ids), "source": self.source}
        if self.outcome is not None:
            out["outcome"] = self.outcome
        if self.time is not None:
            out["time"] = self.time
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FeedbackEvent":
        if not isinstance(data, Mapping):
            raise InvalidRequest("feedback: each event must be an object with 'query' and 'tool_ids'")
        unknown = set(data) - {"query", "tool_ids", "source", "outcome", "time"}
        if unknown:
            raise InvalidRequest(f"feedback: unknown field(s) {sorted(unknown)}; known: query, tool_ids, source, "
                                 "outcome, time")
        if not isinstance(data.get("tool_ids"), (list, tuple)):  # a bare string is one id to a Python caller, not here
            raise InvalidRequest(f"feedback: 'tool_ids' must be a list of tool ids, got {data.get('tool_ids')!r:.80}")
        return cls(data.get("query"), data["tool_ids"], data.get("source") or DEFAULT_SOURCE,
                   data.get("outcome"), data.get("time"))

    def at(self, when: float) -> "FeedbackEvent":
        """The event with its time set, unless it has one."""
        return self if self.time is not None else replace(self, time=float(when))


@dataclass(frozen=True)
class Usage:
    """One request that taught one tool, from one source; when, and where the untaught ranking had put the
    tool for it (None: past the depth scored, or not known). Two usages are the same by tool, source and
    request."""

    tool_id: str
    source: str
    query: str
    time: float = field(default=0.0, compare=False)
    untaught_rank: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Scored:
    """One (event, tool) scored before it was learned (`toolscout.learning.scorecard`): where the ranking as
    served, the untaught ranking and learning at full weight put the tool (None: past the depth scored), and
    whose lifts passed it."""

    time: float
    source: str
    namespace: str
    tool: str
    query: str
    taught_before: bool
    served: int | None
    untaught: int | None
    learned: int | None
    # the namespaces of the tools learning (at full weight) moved above this one: whose lifts cost it its place
    passed_by: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed_by": list(self.passed_by)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Scored":
        return cls(float(data["time"]), str(data["source"]), str(data.get("namespace") or ""), str(data["tool"]),
                   str(data.get("query", "")), bool(data["taught_before"]), data.get("served"),
                   data.get("untaught"), data.get("learned"), tuple(str(n) for n in data.get("passed_by") or ()))


@dataclass
class LearnResult:
    """What a batch of feedback did: `learned` (tool, request) pairs recorded to teach the retrievers (now,
    or when learning is unfrozen: `frozen_at`, learning's freeze when they were recorded, holds back those
    dated from it on); `duplicates` repeats already counted; `capped` past the per-source cap; `failures`
    events with outcome "failure"; `incidental` (tool, request) pairs whose request is nothing but numbers,
    dates and addresses (recorded, teach nothing); `unknown` tool ids not in the catalog (ignored)."""

    events: int = 0
    learned: list[Usage] = field(default_factory=list)
    duplicates: int = 0
    capped: int = 0
    failures: int = 0
    unknown: list[str] = field(default_factory=list)
    incidental: int = 0
    frozen_at: float | None = None

    @property
    def held_by_freeze(self) -> int:
        """(tool, request) pairs recorded but not taught: learning is frozen; they teach once it is unfrozen."""
        return sum(1 for u in self.learned if self.frozen_at is not None and u.time >= self.frozen_at)

    @property
    def taught(self) -> int:
        """(tool, request) pairs teaching the retrievers now."""
        return len(self.learned) - self.held_by_freeze

    def absorb(self, other: "LearnResult") -> None:
        """Add `other`'s counts to these (a log learned in batches, told as one)."""
        self.events += other.events
        self.learned += other.learned
        self.duplicates += other.duplicates
        self.capped += other.capped
        self.failures += other.failures
        self.incidental += other.incidental
        self.unknown += other.unknown
        self.frozen_at = other.frozen_at if other.frozen_at is not None else self.frozen_at

    def note(self) -> str | None:
        """What a reader of the counts must know (None: nothing): held-back pairs were recorded, not learned."""
        if not self.held_by_freeze:
            return None
        return (f"learning is frozen: these events were recorded but not learned; their {self.held_by_freeze} (tool, "
                "request) pairs are held back (counted in held_by_freeze, not in learned) and teach once learning is "
                "unfrozen (toolscout learning unfreeze, or POST /learning {\"freeze\": false})")

    def to_dict(self) -> dict[str, Any]:
        """What every answer to feedback says (HTTP's POST /feedback, MCP's record_tool_use): the unknown ids
        each once (the first 20), and how often events named them."""
        return {"events": self.events, "learned": self.taught, "held_by_freeze": self.held_by_freeze,
                "duplicates": self.duplicates, "capped": self.capped, "failures": self.failures,
                "incidental": self.incidental, "unknown_tools": list(dict.fromkeys(self.unknown))[:20],
                "unknown_tool_mentions": len(self.unknown), "note": self.note()}


def normalized(query: str) -> str:
    """The form under which two reports of one task count as identical (case and spacing ignored)."""
    return _SPACES.sub(" ", query.strip().lower())


CLOCK_SKEW_S = 300.0  # a rollback time this far ahead of this machine's clock is still taken as meant


def checked_rollback_time(before: float, given: str, formats: str = "seconds since the epoch") -> float:
    """`before`, a time to roll learning back to, unless it is a mistake (InvalidRequest starting with
    `given`, the field and value as the caller wrote them, and naming the accepted `formats`): NaN is no time, a
    negative time takes back everything; one in the future (say, milliseconds since the epoch) takes back nothing."""
    now = time.time()
    if math.isnan(before):
        problem = "not a time"
    elif before < 0:
        problem = "a negative time, before 1970: it would take back everything"
    elif before > now + CLOCK_SKEW_S:
        problem = f"in the future ({_shown(before)}): it would take back nothing"
        if 1e9 <= before / 1000 <= now + CLOCK_SKEW_S:  # since 2001, in milliseconds
            problem += f" (milliseconds? {before / 1000:.0f} seconds would be {_shown(before / 1000)})"
    else:
        return before
    raise InvalidRequest(f"{given}: {problem}; give {formats}, at most now")


def rolled_back(pairs: Sequence[tuple[str, float]], frozen_at: float | None, dry_run: bool) -> dict[str, Any]:
    """What a rollback took back (or, `dry_run`, would): the (request, tool) pairs (`taken_back`), those
    learned and those only held by a freeze (never learned), and how many per source."""
    held = sum(1 for _source, when in pairs if frozen_at is not None and when >= frozen_at)
    sources: dict[str, int] = {}
    for source, _when in pairs:
        sources[source] = sources.get(source, 0) + 1
    return {"taken_back": len(pairs), "learned": len(pairs) - held, "held_by_freeze": held,
            "sources": dict(sorted(sources.items())), "dry_run": dry_run}


def _shown(seconds: float) -> str:
    when = datetime.fromtimestamp(min(seconds, LATEST_TIME), timezone.utc).isoformat(timespec="seconds")
    return when + (" or later" if seconds > LATEST_TIME else "")


def nothing_from(source: str) -> str:
    """What forgetting a source with no feedback stored says (it changes nothing)."""
    return f"source {source!r} has no feedback stored here (a typo?): nothing was taken back, nothing changed"


def learning_kept(where: Any, kept: int, dropped: int) -> str:
    """What a new catalog took over of what `where` (an index directory, or a PostgreSQL tenant) learned from
    feedback, in taught (tool, request) pairs: `kept`, and `dropped` with the tools it no longer holds."""
    return (f"kept what {where} learned from feedback: {kept} (tool, request) pairs; dropped {dropped} whose tool "
            "is no longer in the catalog")


def likely_renames(gone: Iterable[Tool], present: Iterable[Tool]) -> dict[str, str]:
    """{id of a tool `gone` from a catalog: id of the one tool `present` with its HTTP method and path}: an
    operation whose id changed (its operationId dropped or renamed, its API's title and so its namespace
    changed). A tool of the same namespace is preferred; where several are left, none is named."""
    by_route: dict[tuple[str, str], list[Tool]] = {}
    for tool in present:
        if tool.method and tool.path:
            by_route.setdefault((tool.method.upper(), tool.path), []).append(tool)
    renames: dict[str, str] = {}
    for tool in gone:
        candidates = by_route.get(((tool.method or "").upper(), tool.path or ""), [])
        same_namespace = [c for c in candidates if c.namespace == tool.namespace]
        picked = same_namespace or candidates
        if len(picked) == 1:
            renames[tool.id] = picked[0].id
    return renames


def renames_note(renames: Mapping[str, str], gone: Iterable[Tool], present: Iterable[Tool],
                 namespace_flag: bool = True) -> str | None:
    """What to tell of the feedback dropped with tools `gone` that `likely_renames` found again as `renames`:
    the renames (feedback is not carried across: the ids differ), and, with `namespace_flag` (the CLI), a
    namespace whose every such tool is now in another one: `--namespace` keeps the old ids. None: no rename."""
    if not renames:
        return None
    shown = ", ".join(f"{old!r} is now {new!r}" for old, new in list(renames.items())[:5])
    more = f" and {len(renames) - 5} more" if len(renames) > 5 else ""
    note = (f"likely renamed (the same HTTP method and path): {shown}{more}; their feedback is not carried over to "
            "the new ids")
    by_id = {tool.id: tool for tool in present}
    still = {tool.namespace for tool in present}
    moves: dict[str, set[str | None]] = {}
    for tool in gone:
        new = by_id.get(renames.get(tool.id, ""))
        moves.setdefault(tool.namespace or "", set()).add(new.namespace if new else None)
    for old, new in sorted(moves.items()):
        if namespace_flag and old and old not in still and len(new) == 1 and None not in new:
            note += (f"; namespace {old!r} is now {next(iter(new))!r} (the API's title changed?): index it with "
                     f"--namespace {old} to keep its ids, and with them what they learn")
    return note


class UsageLedger:
    """Per tool and source, the distinct requests that taught it (at most `per_source_cap`), in arrival
    order, each a `Usage` with its time and untaught rank; plus counts of everything reported. Not
    thread-safe: its owner serialises writes."""

    def __init__(self, per_source_cap: int = PER_SOURCE_CAP):
        if per_source_cap < 1:
            raise ValueError(f"per_source_cap must be at least 1, got {per_source_cap}")
        self.per_source_cap = per_source_cap
        self.entries: dict[str, dict[str, list[Usage]]] = {}  # tool -> source -> what it taught, in order
        self._keys: set[tuple[str, str, str]] = set()  # (source, tool, normalized request) taught or capped
        self._capped: dict[tuple[str, str, str], float] = {}  # capped keys -> when
        self.events = 0  # events recorded, all outcomes
        self.failures = 0
        self.reported: dict[str, int] = {}  # tool -> events naming it (all outcomes, repeats included)

    # recording ----------------------------------------------------------------------------
    def add(self, events: Iterable[FeedbackEvent], known: Any = None,
            untaught: Mapping[tuple[str, str], int | None] | None = None,
            teachable: Callable[[str], bool] = lambda _request: True) -> LearnResult:
        """Record `events` (their times set); the result's `learned` is what is taught now. `known`: a
        container of the catalog's tool ids (None: every id is known); `untaught`: (request, tool) -> where
        the untaught ranking put the tool for the request (the event's score); `teachable`: whether a
        request asks for anything (the learner's rule; module doc)."""
        result = LearnResult()
        for event in events:
            result.events += 1
            self.events += 1
            if not event.teaches:
                self.failures += 1
                result.failures += 1
            for tool_id in event.tool_ids:
                if known is not None and tool_id not in known:
                    result.unknown.append(tool_id)
                    continue
                self.reported[tool_id] = self.reported.get(tool_id, 0) + 1
                if event.teaches and not teachable(event.query):
                    result.incidental += 1
                elif event.teaches:
                    rank = (untaught or {}).get((event.query, tool_id))
                    self._teach(Usage(tool_id, event.source, event.query, float(event.time or 0.0), rank), result)
        return result

    def _teach(self, usage: Usage, result: LearnResult) -> None:
        key = (usage.source, usage.tool_id, normalized(usage.query))
        if key in self._keys:
            result.duplicates += 1
            return
        self._keys.add(key)
        requests = self.entries.setdefault(usage.tool_id, {}).setdefault(usage.source, [])
        if len(requests) >= self.per_source_cap:
            self._capped[key] = usage.time
            result.capped += 1
            return
        requests.append(usage)
        result.learned.append(usage)

    def holds(self, source: str) -> bool:
        """Whether anything `source` posted is kept: what it taught, or requests past its cap."""
        return any(source in sources for sources in self.entries.values()) or any(
            key[0] == source for key in self._capped)

    def forget(self, source: str) -> list[Usage]:
        """Take back everything `source` taught; what it had taught."""
        return self._take_back(lambda u: u.source == source, lambda key, _when: key[0] == source)

    def rollback(self, before: float) -> list[Usage]:
        """Take back everything taught at or after `before` (seconds since the epoch); what that was."""
        return self._take_back(lambda u: u.time >= before, lambda _key, when: when >= before)

    def since(self, before: float) -> list[Usage]:
        """What `rollback(before)` would take back (taught, or held by a freeze), changing nothing."""
        return [u for sources in self.entries.values() for usages in sources.values() for u in usages
                if u.time >= before]

    def holds_since(self, before: float) -> bool:
        """Whether `rollback(before)` would change the ledger (taught pairs, or requests past a cap)."""
        return bool(self.since(before)) or any(when >= before for when in self._capped.values())

    def drop_tool(self, tool_id: str) -> list[Usage]:
        """A deleted tool's feedback goes with it; what it had been taught."""
        self.reported.pop(tool_id, None)
        return self._take_back(lambda u: u.tool_id == tool_id, lambda key, _when: key[1] == tool_id)

    def keep_tools(self, known: Any) -> list[Usage]:
        """Drop the feedback of every tool not in `known` (a container of tool ids: the catalog that replaces
        this ledger's); what those tools had been taught."""
        named = set(self.entries) | set(self.reported) | {key[1] for key in self._capped}
        return [usage for tool_id in sorted(named) if tool_id not in known for usage in self.drop_tool(tool_id)]

    def remeasure(self, rank_of: Callable[[Usage], int | None]) -> None:
        """Every taught entry's untaught rank measured again (`rank_of`), on a catalog that replaced the one it
        was measured on."""
        self.entries = {t: {s: [replace(u, untaught_rank=rank_of(u)) for u in usages] for s, usages in sources.items()}
                        for t, sources in self.entries.items()}

    def _take_back(self, taught: Callable[[Usage], bool], capped: Callable[[tuple, float], bool]) -> list[Usage]:
        removed: list[Usage] = []
        for tool_id in list(self.entries):
            sources = self.entries[tool_id]
            for source in list(sources):
                keep = [u for u in sources[source] if not taught(u)]
                removed += [u for u in sources[source] if taught(u)]
                if keep:
                    sources[source] = keep
                else:
                    del sources[source]
            if not sources:
                del self.entries[tool_id]
        gone = {key for key, when in self._capped.items() if capped(key, when)}
        for key in gone:
            del self._capped[key]
        self._keys -= gone | {(u.source, u.tool_id, normalized(u.query)) for u in removed}
        return removed

    # reading ------------------------------------------------------------------------------
    def usage(self, tool_id: str) -> list[tuple[str, list[Usage]]]:
        """(source, what it taught) for `tool_id`, sources in sorted order."""
        return sorted(self.entries.get(tool_id, {}).items())

    def taught(self) -> list[Usage]:
        """Every (tool, source, request) that teaches, tools and sources sorted, requests in arrival order."""
        return [usage for tool_id in sorted(self.entries) for _source, usages in self.usage(tool_id)
                for usage in usages]

    def taught_events(self) -> list[FeedbackEvent]:
        """What this ledger teaches, as feedback events that teach it again elsewhere (`toolscout migrate` of a
        directory into PostgreSQL): one per (tool, source, request), with its source and time (none when saved
        before times were kept), oldest first, so taking a source back or rolling back to a time works there."""
        usages = sorted(self.taught(), key=lambda usage: usage.time)  # stable: arrival order within a time
        return [FeedbackEvent(u.query, (u.tool_id,), source=u.source, time=u.time or None) for u in usages]

    def summary(self, tool_id: str) -> dict[str, Any]:
        """What /tools/{id} shows: requests learned, sources, events reported for the tool."""
        sources = self.entries.get(tool_id, {})
        return {"learned": sum(len(q) for q in sources.values()), "sources": len(sources),
                "reported": self.reported.get(tool_id, 0)}

    def sources(self) -> dict[str, int]:
        """source -> requests it teaches (all tools)."""
        out: dict[str, int] = {}
        for sources in self.entries.values():
            for source, usages in sources.items():
                out[source] = out.get(source, 0) + len(usages)
        return dict(sorted(out.items()))

    # persistence --------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        entries = {t: {s: [[u.query, u.time, u.untaught_rank] for u in usages] for s, usages in sources.items()}
                   for t, sources in self.entries.items()}
        data = {"format": 2, "per_source_cap": self.per_source_cap, "events": self.events,
                "failures": self.failures, "reported": self.reported, "entries": entries,
                "capped": [[*key, when] for key, when in sorted(self._capped.items())]}
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> "UsageLedger":
        data = read_json(path)
        ledger = cls(int(data.get("per_source_cap", PER_SOURCE_CAP)))
        ledger.events, ledger.failures = int(data.get("events", 0)), int(data.get("failures", 0))
        ledger.reported = {k: int(v) for k, v in data.get("reported", {}).items()}
        ledger.entries = {t: {s: [_stored_usage(t, s, item) for item in items] for s, items in sources.items()}
                          for t, sources in data.get("entries", {}).items()}
        capped = [(tuple(k), 0.0) for k in data.get("capped_keys", [])]  # saved before times were kept
        capped += [((c[0], c[1], c[2]), float(c[3])) for c in data.get("capped", [])]
        ledger._capped = dict(capped)
        ledger._keys = {(u.source, u.tool_id, normalized(u.query)) for u in ledger.taught()} | set(ledger._capped)
        return ledger


def _stored_usage(tool_id: str, source: str, item: Any) -> Usage:
    """A saved entry: [request, time, untaught rank], or a bare request (saved before times were kept)."""
    if isinstance(item, str):
        return Usage(tool_id, source, item)
    query, when, rank = item
    return Usage(tool_id, source, query, float(when), None if rank is None else int(rank))


def events_from_jsonl(path: str | Path) -> list[FeedbackEvent]:
    """Feedback events from a JSONL log (one event object per line); errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark some editors write is not an event
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise InvalidRequest(f"{path}: cannot read the feedback log: {exc.strerror or exc}") from None
    events = []
    for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 may sit inside a query
        if not line.strip():
            continue
        try:
            events.append(FeedbackEvent.from_dict(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"{path}:{lineno}: not a JSON object ({exc.msg})") from None
        except InvalidRequest as exc:
            raise InvalidRequest(f"{path}:{lineno}: {exc}") from None
    return events
