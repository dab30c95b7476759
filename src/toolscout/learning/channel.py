"""Learning from use as a channel of its own: the catalog's ranking stays as the catalog made it, and what
feedback taught moves a tool up only where the deployment's own evidence says it is likelier to be needed.

For a task, the untaught ranking (the first stage, `base`) gives each tool a probability from its rank,
and the taught requests nearest to the task give each tool they taught a probability from its similarity
(both fitted by `calibration.py` on this deployment's feedback). A taught tool moves above another tool
when its learned probability is higher than the other's untaught one, and only from `GATE` up, times the
weight learning has in its namespace. Which learned probability, and which gate, depends on the tool
it would pass:

- passing a tool the deployment was taught too, it is the probability of its table (the nearest taught
  request's tools have a table of their own: which of the taught tools a task needs, the nearest request
  tells best);
- passing a tool nobody taught, it is the cautious one, the table of every near tool, only for the
  three tools nearest the task (those the table counted) and only from `CAUTIOUS_GATE` up. The nearest
  request's table is fitted on tasks whose tools were taught, so it cannot know how many tasks need a
  tool nobody taught: after a burst of a few tools' traffic it is sure of them for every task near them.
  The cautious table expects a task to need a tool nobody taught at least as often as the share of the
  catalog nobody taught (`catalog_holds`): traffic confined to part of the catalog cannot say how often.

So:

- a task unlike every taught request ranks exactly as untaught; so does every task while little is taught
  (few requests fit a calibration that says little, whose probabilities stay under the gate);
- a tool nobody used yet keeps its place below nothing learned without the cautious evidence that the
  taught tool is the likelier one, and a tool added after learning is found as it would be in an untaught
  index (evidence older than a tool never passes it);
- a tool that matches everything is a hub: its requests sit near many other tools' requests, which the
  calibration counts as misses, so similarity to them earns less.

A lifted tool's score is the untaught score of the rank its probability earns (interpolated; above the
top, the top score raised by the difference), capped by the score of the tool above it, so scores still
read as the first stage's and stay in order.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from ..artifacts import ArtifactError, DamagedFile, load_array, read_json, read_json_lines, write_json
from ..errors import InvalidRequest
from ..query import Query
from ..results import Results
from .calibration import NEIGHBOUR_TOOLS, Calibration
from .incidental import teachable
from .memory import RequestMemory, dormancy
from ..feedback import Scored
from .scorecard import Scorecard
from .space import RequestSpace

GATE = 0.3  # the least learned probability that may lift a tool (chosen on train-split validation)
CAUTIOUS_GATE = 0.4  # the least cautious probability that may pass a tool nobody taught (the same)
DEPTH = 30  # untaught candidates read per task when something is learned
HISTORY = 1000  # automatic weight changes kept for the report
LEARNING_KIND = "toolscout.learning"
FORMAT_VERSION = 2  # 2: each lesson's time and untaught rank (1: a count per source)


@dataclass(frozen=True)
class LearningSettings:
    """What an operator set: `weights` per namespace ("*": every namespace without its own; unset: the
    automatic weight), `frozen_at` (learn nothing taught at or after this time until unfrozen)."""

    weights: dict[str, float] = field(default_factory=dict)
    frozen_at: float | None = None

    def to_dict(self) -> dict:
        return {"weights": dict(sorted(self.weights.items())), "frozen_at": self.frozen_at}

    def updated(self, weights: Mapping[str, float | None] | None = None, freeze: bool | None = None,
                when: float | None = None) -> "LearningSettings":
        """These settings with `weights` set (None for a namespace: automatic again) and frozen (at `when`,
        unless already frozen) or unfrozen. What an operator may set is checked here, for every caller."""
        check_settings(weights, freeze)
        merged = dict(self.weights)
        for namespace, weight in (weights or {}).items():
            if weight is None:
                merged.pop(namespace, None)
            else:
                merged[namespace] = float(weight)
        frozen_at = self.frozen_at
        if freeze is True and frozen_at is None:
            frozen_at = float(when if when is not None else time.time())
        elif freeze is False:
            frozen_at = None
        return LearningSettings(merged, frozen_at)

    @classmethod
    def from_dict(cls, data: dict | None) -> "LearningSettings":
        data = data or {}
        return cls({str(k): float(v) for k, v in (data.get("weights") or {}).items()}, data.get("frozen_at"))


def check_settings(weights: object, freeze: object) -> None:
    """What an operator may set: weights from 0 to 1 (None: automatic) per namespace, and freeze true or false."""
    if weights is not None and not isinstance(weights, Mapping):
        raise InvalidRequest(f"learning weights: give an object of namespace to weight, got {type(weights).__name__}")
    for namespace, weight in (weights or {}).items():
        if not isinstance(namespace, str) or "\x00" in namespace:  # PostgreSQL cannot store a NUL either
            raise InvalidRequest(f"learning weights: {namespace!r} is not a namespace")
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                                   or not 0.0 <= weight <= 1.0):  # NaN fails it too
            raise InvalidRequest(f"learning weight for namespace {namespace!r} must be between 0 and 1 (or null "
                                 f"for automatic), got {weight!r}")
    if freeze is not None and not isinstance(freeze, bool):
        raise InvalidRequest(f"learning freeze: true or false, got {freeze!r}")


class Lift(NamedTuple):
    """What learning says of one tool for one task (module doc)."""

    probability: float  # that the task needs it: what it passes a taught tool with
    cautious: float  # the same from every near tool's table: what it passes a tool nobody taught with (0: none)
    since: float  # when its evidence was last taught


@dataclass(frozen=True)
class Lesson:
    """One request teaching one tool, as the channel keeps it."""

    request: str
    tool: str
    source: str
    untaught_rank: int | None
    time: float = 0.0


class LearnedChannel:
    """See the module doc. Writes are serialised by the pipeline (its write lock); `rank` may run from many
    threads at once between writes."""

    def __init__(self, space: RequestSpace, settings: LearningSettings | None = None):
        self.space = space
        self.settings = settings or LearningSettings()
        self.memory = RequestMemory(space.dim)
        self.scorecard = Scorecard()
        self.key_of: dict[str, str] = {}  # request as sent -> its key in memory (what it teaches)
        self.joined: dict[str, float] = {}  # tool -> when it joined the catalog (absent: before any learning)
        self.weight_history: list[dict] = []  # the automatic weights' changes, oldest first (`note_weight_changes`)
        self._automatic: dict[str, float] = {}

    def afresh(self, settings: LearningSettings | None = None, space: RequestSpace | None = None
               ) -> "LearnedChannel":
        """An empty channel in this space (or `space`: a new first stage's), under `settings` (these by
        default). When tools joined stays: it is a fact of the catalog, not something learned, and a tool
        added after learning keeps its place."""
        channel = LearnedChannel(space or self.space, settings or self.settings)
        channel.joined = dict(self.joined)
        channel.memory.catalog_size = self.memory.catalog_size  # a fact of the catalog too
        channel.weight_history = list(self.weight_history)  # what happened stays history
        return channel

    # state ---------------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return len(self.memory) > 0

    @property
    def calibration(self) -> Calibration:
        return self.memory.calibration

    def weight(self, namespace: str | None) -> float:
        ns = namespace or ""
        overrides = self.settings.weights
        if ns in overrides:
            return overrides[ns]
        if "*" in overrides:
            return overrides["*"]
        return self._automatic.get(ns, 1.0)

    def weights(self) -> dict[str, dict[str, float | str]]:
        """namespace -> {weight, how: set | automatic}, for every namespace with records or a setting."""
        names = sorted(set(self._automatic) | {k for k in self.settings.weights if k != "*"})
        return {ns: {"weight": round(self.weight(ns), 4),
                     "how": "set" if ns in self.settings.weights or "*" in self.settings.weights else "automatic"}
                for ns in names}

    def refresh_weights(self) -> dict[str, tuple[float, float]]:
        """Recompute the automatic weights; namespace -> (before, after) for those that changed."""
        new = self.scorecard.weights()
        changed = {ns: (self._automatic.get(ns, 1.0), w) for ns, w in new.items()
                   if abs(self._automatic.get(ns, 1.0) - w) > 1e-9}
        self._automatic = new
        return changed

    def note_weight_changes(self, changed: Mapping[str, tuple[float, float]], when: float | None) -> list[dict]:
        """Keep what `refresh_weights` changed, at `when` (None: not known, a journal written before times
        were), in the history the report shows; the last HISTORY changes are kept. Returns the new entries."""
        entries = [{"time": when, "namespace": ns, "from": round(old, 4), "to": round(new, 4),
                    "why": "learned rankings were worse than untaught on recent events" if new < old
                    else "learned rankings recovered"} for ns, (old, new) in sorted(changed.items())]
        self.weight_history = (self.weight_history + entries)[-HISTORY:]
        return entries

    def key(self, request: str) -> str:
        """What a request teaches (`incidental.teachable`), case and spacing ignored."""
        known = self.key_of.get(request)
        if known is not None:
            return known
        return _key_of(teachable(request))

    # writing -------------------------------------------------------------------------------------
    def prepare(self, requests: Iterable[str], made: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The vectors of `requests`' keys neither in memory nor in `made` (made outside the write lock). A
        space blind to case embeds a request as written (its teachable part), which for a task just
        searched that it all teaches is the vector its search made; any other space embeds the key, so
        a vector never depends on which spelling came first."""
        case_blind = self.space.case_blind
        written: dict[str, str] = {}  # key -> the text embedded for it
        for request in requests:
            key = self.key(request)
            if key not in written and key not in self.memory.row_of and key not in (made or {}):
                as_written = teachable(request)
                # a key restored from an older reduction may not be this text's: then the key itself
                written[key] = as_written if case_blind and _key_of(as_written) == key else key
        return dict(zip(written, self.space.requests(list(written.values())))) if written else {}

    def teach(self, lessons: Sequence[Lesson], prepared: dict[str, np.ndarray] | None = None) -> None:
        if not lessons:
            return
        keys = {lesson.request: self.key(lesson.request) for lesson in lessons}
        vectors = dict(prepared or {})
        vectors.update(self.prepare(keys, vectors))
        self.key_of.update(keys)
        self.memory.add([(keys[l.request], vectors.get(keys[l.request]), l.tool, l.source, l.untaught_rank, l.time)
                         for l in lessons])

    def restore(self, lessons: Sequence[tuple[str, np.ndarray | None, str, str, int | None, float]],
                key_of: dict[str, str], records: Iterable[Scored] = ()) -> None:
        """Take in learning as it was recorded: (key, vector, tool, source, untaught rank, time) per lesson,
        what each request reduced to, and the scores."""
        self.key_of.update(key_of)
        if lessons:
            self.memory.add(list(lessons))
        self.scorecard.add(records)

    def unteach(self, lessons: Iterable[tuple[str, str, str, float]]) -> None:
        """(request, tool, source, time) taken back."""
        self.memory.remove([(self.key(request), tool, source, when) for request, tool, source, when in lessons])

    def drop_tool(self, tool: str) -> None:
        self.memory.remove([(key, t, None, None) for key, tools in list(self.memory.taught.items())
                            for t in tools if t == tool])
        self.scorecard.drop_tool(tool)

    # ranking -------------------------------------------------------------------------------------
    def rank(self, queries: Sequence[Query], base: Results, k: int, allows: Callable[[str], bool],
             namespace_of: Callable[[str], str | None], full_weight: bool = False,
             lifts: Sequence[Mapping[str, Lift]] | None = None) -> Results:
        """The untaught ranking `base` (one list per query, at least DEPTH deep when it can be) with what was
        learned (module doc), cut to `k`. `lifts`: what `lifts` gave for these queries (computed when None)."""
        calibration = self.calibration
        if lifts is None:
            lifts = self.lifts(queries, allows, namespace_of, full_weight, calibration)
        ids_out, scores_out = [], []
        for (ids, scores), lifted in zip(base, lifts):
            ranked_ids, ranked_scores = _merge(list(ids), np.asarray(scores, dtype=np.float64), dict(lifted),
                                               calibration, self.joined, self.memory.rows_of_tool, k)
            ids_out.append(np.asarray(ranked_ids, dtype=object))
            scores_out.append(np.asarray(ranked_scores, dtype=np.float32))
        return Results(tuple(ids_out), tuple(scores_out))

    def nearest(self, queries: Sequence[Query]) -> list[list[tuple[str, float, float]]]:
        """For each query, the tools its nearest taught requests taught (`RequestMemory.nearest_tools`)."""
        return self.memory.nearest_tools(self.space.tasks(queries))

    def lifts(self, queries: Sequence[Query], allows: Callable[[str], bool],
              namespace_of: Callable[[str], str | None], full_weight: bool = False,
              calibration: Calibration | None = None,
              near: Sequence[list[tuple[str, float, float]]] | None = None) -> list[dict[str, Lift]]:
        """For each query, the tools what was learned lifts for it, with what learning says of each. `near`:
        what `nearest` gave for these queries (computed when None)."""
        calibration = calibration or self.calibration
        near = self.nearest(queries) if near is None else near
        return [self._lifted(tools, calibration, allows, namespace_of, full_weight) for tools in near]

    def _lifted(self, tools: list[tuple[str, float, float]], calibration: Calibration, allows, namespace_of,
                full_weight: bool) -> dict[str, Lift]:
        """The tools that pass the gate. `tools` is most similar first: the first one's similarity is the
        nearest taught request's, whether or not the caller may see its tools (the calibration counted every
        tool)."""
        out: dict[str, Lift] = {}
        top = tools[0][1] if tools else 0.0
        for place, (tool, similarity, since) in enumerate(tools):
            if not allows(tool):
                continue
            weight = 1.0 if full_weight else self.weight(namespace_of(tool))
            p = calibration.learned(similarity, nearest=similarity >= top) * weight
            if p >= GATE:
                # the cautious table counted each anchor's three nearest tools: further ones have no cautious
                # probability (many tools at a middling similarity would each pass the tools nobody taught)
                near_enough = place < NEIGHBOUR_TOOLS
                cautious = calibration.learned(similarity, nearest=False) * weight if near_enough else 0.0
                out[tool] = Lift(p, cautious if cautious >= CAUTIOUS_GATE else 0.0, since)
        return out

    def tools_joined(self, ids: Iterable[str], when: float) -> None:
        """Tools new to the catalog at `when`: evidence taught before then was never weighed against them."""
        for tool_id in ids:
            self.joined[tool_id] = float(when)

    def tools_left(self, ids: Iterable[str]) -> None:
        for tool_id in ids:
            self.joined.pop(tool_id, None)

    def catalog_holds(self, tools: int | None) -> None:
        """The catalog holds `tools` tools (None: not known): the share of it nobody taught is what the
        cautious table expects of a task at least (`RequestMemory._new_tool_share`)."""
        self.memory.set_catalog_size(tools)

    # self-measurement -------------------------------------------------------------------------------
    def score(self, records: Iterable[Scored]) -> None:
        self.scorecard.add(records)

    def report(self, brief: bool = False) -> dict:
        """What `/learning` and `toolscout learning report` show (`brief`: what `/health` shows: no figures)."""
        tools_taught = len(self.memory.tools)
        out = {"requests": len(self.memory), "tools_taught": tools_taught, "events_scored": len(self.scorecard),
               "dormant": dormancy(tools_taught), "frozen_at": self.settings.frozen_at, "weights": self.weights()}
        if brief:
            return out
        return {**out, "weight_history": list(self.weight_history), "calibration": self.calibration.to_dict(),
                "measured": self.scorecard.report()}

    # persistence ---------------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        keys = sorted(self.memory.row_of)
        write_json(folder / "config.json", {"kind": LEARNING_KIND, "format_version": FORMAT_VERSION,
                                            "space": self.space.name, "settings": self.settings.to_dict(),
                                            "weight_history": self.weight_history,
                                            "scored": len(self.scorecard)})  # what a load checks it read
        np.save(folder / "vectors.npy", self.memory.vectors[[self.memory.row_of[k] for k in keys]]
                if keys else np.zeros((0, self.space.dim), np.float32))
        taught = [[key, tool, {source: [list(lesson) for lesson in lessons]
                               for source, lessons in sorted(entry.lessons.items())}]
                  for key in keys for tool, entry in sorted(self.memory.taught[key].items())]
        write_json(folder / "memory.json", {"keys": keys, "taught": taught, "key_of": self.key_of,
                                            "joined": self.joined})
        with open(folder / "scorecard.jsonl", "w", encoding="utf-8") as fh:
            for record in self.scorecard.records:
                fh.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, folder: Path, space: RequestSpace) -> "LearnedChannel":
        """The channel saved in `folder`. Its memory comes back empty when its vectors were made in another
        space (a new encoder), or were saved in format 1, which kept one time and rank per request and tool
        (taking a lesson back could not restore the one before it): the pipeline teaches it again from its
        ledger, which holds each event's."""
        config = read_json(folder / "config.json")
        if config.get("kind") != LEARNING_KIND or int(config.get("format_version", 0)) > FORMAT_VERSION:
            raise ArtifactError(f"{folder}: not a learned channel this toolscout can read")
        channel = cls(space, LearningSettings.from_dict(config.get("settings")))
        channel.weight_history = list(config.get("weight_history") or [])  # none before it was kept
        channel.scorecard.add([Scored.from_dict(row) for row in read_json_lines(folder / "scorecard.jsonl")])
        if config.get("scored", len(channel.scorecard)) != len(channel.scorecard):  # cut at a line's end
            raise DamagedFile(f"{folder / 'scorecard.jsonl'}: holds {len(channel.scorecard)} scores, but "
                              f"{config['scored']} were saved")
        memory = read_json(folder / "memory.json")
        channel.joined = {t: float(w) for t, w in memory.get("joined", {}).items()}
        if config.get("space") != space.name or int(config.get("format_version", 1)) < FORMAT_VERSION:
            return channel
        vectors = dict(zip(memory["keys"], load_array(folder / "vectors.npy")))
        channel.restore([(key, vectors[key], tool, source, rank, when) for key, tool, sources in memory["taught"]
                         for source, lessons in sources.items() for when, rank in lessons], memory["key_of"])
        channel.refresh_weights()
        return channel


def _key_of(teachable_text: str) -> str:
    """What a request's teachable text is remembered under: case and spacing ignored."""
    return " ".join(teachable_text.lower().split())


def _merge(ids: list[str], scores: np.ndarray, lifted: dict[str, Lift], calibration: Calibration,
           joined: dict[str, float], taught: Mapping[str, object], k: int) -> tuple[list[str], list[float]]:
    """The untaught list with the lifted tools moved to where their probability earns (module doc): each goes
    just below the lowest tool above it that it may not pass: one more likely than its probability (its
    cautious one, for a tool not in `taught`), or one that joined the catalog after its evidence was taught.
    Scores stay in order."""
    position = {tool: i for i, tool in enumerate(ids)}
    base_p = [calibration.base(i + 1) for i in range(len(ids))]
    rising = {t: lift for t, lift in lifted.items()
              if lift.probability > (base_p[position[t]] if t in position else 0.0)}
    if not rising:
        return ids[:k], [float(s) for s in scores[:k]]
    order = [t for t in ids if t not in rising]
    keys = {t: base_p[position[t]] for t in order}
    below = len(ids)
    for tool, lift in sorted(rising.items(), key=lambda item: (-item[1].probability, position.get(item[0], below))):
        mine, at = position.get(tool, below), 0
        for i, other in enumerate(order):  # just below the last tool it may not pass
            earlier = position.get(other, below) < mine  # the untaught ranking put `other` above it
            if not (earlier or other in rising):
                continue
            likelier = keys[other] >= (lift.probability if other in taught else lift.cautious)
            if likelier or (earlier and joined.get(other, 0.0) > lift.since):
                at = i + 1
        order.insert(at, tool)
        keys[tool] = lift.probability
    out_scores, above = [], np.inf
    for tool in order[:k]:
        own = float(scores[position[tool]]) if tool in position else 0.0
        score = max(own, _score_for(keys[tool], base_p, scores)) if tool in rising else own
        above = min(above, score)
        out_scores.append(above)
    return order[:k], out_scores


def _score_for(p: float, base_p: list[float], scores: np.ndarray) -> float:
    """The untaught score of the rank probability `p` earns (interpolated between ranks)."""
    if not len(scores):
        return p
    if p >= base_p[0]:
        return float(scores[0]) * (1.0 + p - base_p[0])
    for i in range(1, len(base_p)):
        if p >= base_p[i]:
            span = base_p[i - 1] - base_p[i]
            t = (p - base_p[i]) / span if span > 0 else 1.0
            return float(scores[i] + t * (scores[i - 1] - scores[i]))
    return float(scores[-1])


