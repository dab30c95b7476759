"""Learning from use: which tools served which requests, as an agent platform reports it.

A `FeedbackEvent` is a task and the ids of the tools that served it, with an optional `source` (the
client that reports it) and `outcome`. The `UsageLedger` decides what of it the retrievers learn:

- only successful uses teach (`outcome` "success" or none given); a "failure" is recorded and counted but
  teaches nothing: it says the tool did not serve, not which tool would have;
- identical repeats count once per source: the same (source, task, tool) a second time adds nothing;
- one source can add at most `per_source_cap` requests to any one tool: past that, its events are
  acknowledged and counted but move nothing, so no single client can drag a tool toward its requests
  beyond that bound, however much it posts;
- `forget(source)` takes back everything a source taught, exactly: the learned state is always derived
  from the per-source entries in source order, never from a running total, so after a source is
  forgotten every tool is as if that source had never posted.

The ledger holds texts only. Retrievers keep what they derive from them (a dense retriever the sums of
the requests' embeddings per tool and source, BM25 their words) and learn from `Usage` changes.

How a dense vector learns (`blend`), for a tool taught by requests q_1..q_n (unit embeddings, as queries
are embedded at search time) whose own vector is d:

    v = ‖d‖ · normalise( prior · d/‖d‖ + Σ_i q_i )

The direction is Tool2Vec's blend (the Tool2Vec paper): `prior` is how many requests the description is worth, so
the requests' weight grows with the evidence, and a much-used tool points at the mean of its requests.
The length stays ‖d‖, so the tool's scores stay on the scale of the others'.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import InvalidRequest

OUTCOMES = ("success", "failure")
DEFAULT_SOURCE = "default"
MAX_QUERY_CHARS = 20_000
MAX_TOOLS_PER_EVENT = 64
PER_SOURCE_CAP = 200  # requests one source may add to one tool (see the module doc)
USAGE_PRIOR = 2.0  # how many requests a tool's description is worth in `blend` (chosen on validation: docs/learning.md)
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class FeedbackEvent:
    """A task and the tools that served it. `source`: who reports it (its influence can be taken back as
    a whole); `outcome`: "success" (the default when omitted) or "failure"."""

    query: str
    tool_ids: tuple[str, ...]
    source: str = DEFAULT_SOURCE
    outcome: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.query, str) or not self.query.strip():
            raise InvalidRequest("feedback: 'query' must be a non-empty string")
        if len(self.query) > MAX_QUERY_CHARS:
            raise InvalidRequest(f"feedback: 'query' is longer than {MAX_QUERY_CHARS} characters")
        ids = (self.tool_ids,) if isinstance(self.tool_ids, str) else tuple(self.tool_ids)
        if not ids or not all(isinstance(t, str) and t for t in ids) or len(ids) > MAX_TOOLS_PER_EVENT:
            raise InvalidRequest(f"feedback: 'tool_ids' must list 1 to {MAX_TOOLS_PER_EVENT} tool ids")
        object.__setattr__(self, "tool_ids", tuple(dict.fromkeys(ids)))
        if not isinstance(self.source, str) or not self.source or len(self.source) > 200:
            raise InvalidRequest("feedback: 'source' must be a non-empty string of at most 200 characters")
        if self.outcome is not None and self.outcome not in OUTCOMES:
            raise InvalidRequest(f"feedback: 'outcome' must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")

    @property
    def teaches(self) -> bool:
        return self.outcome != "failure"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"query": self.query, "tool_ids": list(self.tool_ids), "source": self.source}
        if self.outcome is not None:
            out["outcome"] = self.outcome
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FeedbackEvent":
        if not isinstance(data, Mapping):
            raise InvalidRequest("feedback: each event must be an object with 'query' and 'tool_ids'")
        unknown = set(data) - {"query", "tool_ids", "source", "outcome"}
        if unknown:
            raise InvalidRequest(f"feedback: unknown field(s) {sorted(unknown)}; known: query, tool_ids, source, outcome")
        return cls(data.get("query"), data.get("tool_ids") or (), data.get("source") or DEFAULT_SOURCE,
                   data.get("outcome"))


@dataclass(frozen=True)
class Usage:
    """One request a retriever learns for one tool, from one source."""

    tool_id: str
    source: str
    query: str


@dataclass
class LearnResult:
    """What a batch of feedback did: `learned` (tool, request) pairs now teaching the retrievers;
    `duplicates` repeats already counted; `capped` past the per-source cap; `failures` events with
    outcome "failure"; `unknown` tool ids not in the catalog (ignored)."""

    events: int = 0
    learned: list[Usage] = field(default_factory=list)
    duplicates: int = 0
    capped: int = 0
    failures: int = 0
    unknown: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"events": self.events, "learned": len(self.learned), "duplicates": self.duplicates,
                "capped": self.capped, "failures": self.failures, "unknown_tools": self.unknown[:20]}


def blend(own: np.ndarray, sums: Sequence[np.ndarray], prior: float = USAGE_PRIOR) -> np.ndarray:
    """‖own‖ · normalise(prior · own/‖own‖ + Σ sums): the vector of a tool whose own vector is `own`,
    taught by requests whose embeddings add up to the `sums` (one per source, added in the order given)."""
    total = np.zeros_like(own, dtype=np.float32)
    for part in sums:
        total = total + part
    length = float(np.linalg.norm(own))
    mixed = prior * (own / max(length, 1e-12)) + total
    return (length * mixed / max(float(np.linalg.norm(mixed)), 1e-12)).astype(np.float32)


def normalized(query: str) -> str:
    """The form under which two reports of one task count as identical (case and spacing ignored)."""
    return _SPACES.sub(" ", query.strip().lower())


class UsageLedger:
    """Per tool and source, the distinct requests that taught it (at most `per_source_cap`), in arrival
    order; plus counts of everything reported. Not thread-safe: its owner serialises writes."""

    def __init__(self, per_source_cap: int = PER_SOURCE_CAP):
        if per_source_cap < 1:
            raise ValueError(f"per_source_cap must be at least 1, got {per_source_cap}")
        self.per_source_cap = per_source_cap
        self.entries: dict[str, dict[str, list[str]]] = {}  # tool -> source -> requests
        self._keys: set[tuple[str, str, str]] = set()  # (source, tool, normalized request) taught or capped
        self.events = 0  # events recorded, all outcomes
        self.failures = 0
        self.reported: dict[str, int] = {}  # tool -> events naming it (all outcomes, repeats included)

    # recording ----------------------------------------------------------------------------
    def add(self, events: Iterable[FeedbackEvent], known: Any = None) -> LearnResult:
        """Record `events`; the result's `learned` is what the retrievers should learn now. `known`: a
        container of the catalog's tool ids (None: every id is known)."""
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
                if event.teaches:
                    self._teach(tool_id, event, result)
        return result

    def _teach(self, tool_id: str, event: FeedbackEvent, result: LearnResult) -> None:
        key = (event.source, tool_id, normalized(event.query))
        if key in self._keys:
            result.duplicates += 1
            return
        self._keys.add(key)
        requests = self.entries.setdefault(tool_id, {}).setdefault(event.source, [])
        if len(requests) >= self.per_source_cap:
            result.capped += 1
            return
        requests.append(event.query)
        result.learned.append(Usage(tool_id, event.source, event.query))

    def forget(self, source: str) -> list[str]:
        """Take back everything `source` taught; the ids of the tools it had taught."""
        touched = []
        for tool_id, sources in list(self.entries.items()):
            if sources.pop(source, None) is not None:
                touched.append(tool_id)
                if not sources:
                    del self.entries[tool_id]
        self._keys = {key for key in self._keys if key[0] != source}
        return touched

    def drop_tool(self, tool_id: str) -> None:
        """A deleted tool's feedback goes with it."""
        self.entries.pop(tool_id, None)
        self.reported.pop(tool_id, None)
        self._keys = {key for key in self._keys if key[1] != tool_id}

    # reading ------------------------------------------------------------------------------
    def usage(self, tool_id: str) -> list[tuple[str, list[str]]]:
        """(source, requests) that teach `tool_id`, sources in sorted order."""
        return sorted(self.entries.get(tool_id, {}).items())

    def taught(self) -> list[Usage]:
        """Every (tool, source, request) that teaches, tools and sources sorted, requests in arrival order."""
        return [Usage(tool_id, source, query) for tool_id in sorted(self.entries)
                for source, queries in self.usage(tool_id) for query in queries]

    def summary(self, tool_id: str) -> dict[str, Any]:
        """What /tools/{id} shows: requests learned, sources, events reported for the tool."""
        sources = self.entries.get(tool_id, {})
        return {"learned": sum(len(q) for q in sources.values()), "sources": len(sources),
                "reported": self.reported.get(tool_id, 0)}

    def sources(self) -> dict[str, int]:
        """source -> requests it teaches (all tools)."""
        out: dict[str, int] = {}
        for sources in self.entries.values():
            for source, queries in sources.items():
                out[source] = out.get(source, 0) + len(queries)
        return dict(sorted(out.items()))

    # persistence --------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        data = {"per_source_cap": self.per_source_cap, "events": self.events, "failures": self.failures,
                "reported": self.reported, "entries": self.entries,
                "capped_keys": sorted(self._keys - _taught_keys(self.entries))}
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> "UsageLedger":
        data = json.loads(path.read_text(encoding="utf-8"))
        ledger = cls(int(data.get("per_source_cap", PER_SOURCE_CAP)))
        ledger.events, ledger.failures = int(data.get("events", 0)), int(data.get("failures", 0))
        ledger.reported = {k: int(v) for k, v in data.get("reported", {}).items()}
        ledger.entries = {t: {s: list(q) for s, q in sources.items()} for t, sources in data.get("entries", {}).items()}
        ledger._keys = _taught_keys(ledger.entries) | {tuple(k) for k in data.get("capped_keys", [])}
        return ledger


def _taught_keys(entries: Mapping[str, Mapping[str, Sequence[str]]]) -> set[tuple[str, str, str]]:
    return {(source, tool_id, normalized(q)) for tool_id, sources in entries.items()
            for source, queries in sources.items() for q in queries}


def events_from_jsonl(path: str | Path) -> list[FeedbackEvent]:
    """Feedback events from a JSONL log (one event object per line); errors name the file and line."""
    path = Path(path)
    events = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                events.append(FeedbackEvent.from_dict(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise InvalidRequest(f"{path}:{lineno}: not a JSON object ({exc.msg})") from None
            except InvalidRequest as exc:
                raise InvalidRequest(f"{path}:{lineno}: {exc}") from None
    return events
