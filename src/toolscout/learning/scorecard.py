"""Every deployment measures its own learning: each event is scored before it is learned.

For every tool an event says served its task, three ranks are recorded before anything is learned from it:
where the ranking as served put the tool (`served`, learning at the weight in force), where the untaught
ranking put it (`untaught`), and where learning at full weight would have (`learned`). Ranks past the depth
scored are None. From these records come the running figures (mean reciprocal rank, top-1 and top-5 rates),
per namespace, split by whether the tool had been taught before the event, and the automatic weight. A
namespace's weight scales the lifts of its tools, so it is judged on the records those lifts touched: its
tools' records, except where learning cost a tool its place, which speak against the namespaces of the tools
that passed it (`answers_for`; the tool's own namespace did it no harm). When learning at full weight ranks
the last `WINDOW` such records worse than the untaught ranking does, beyond doubt (the paired difference of
reciprocal ranks below zero by more than two standard errors), its weight in that namespace goes down (to 0
when even that bound is a loss of `TOLERANCE` in mean reciprocal rank), and back up when it recovers. Noise
does not move it: a stream that switches from one tool's tasks to another's makes a short window look better
or worse by chance. The weight is a function of the records held; a source taken back takes its records
along (the others keep the ranks they were scored with).

A repeat (the same request, up to case and spaces, scored before for the same tool) is ranked first by what
its earlier copy taught, whatever learning does to other tasks: real traffic repeats a few requests most of the
time, so figures over every record measure memorisation. Repeats are reported on their own, and the
automatic weight reads first-seen records only (`first_seen`), so that a repeated request cannot hide harm.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, NamedTuple, Sequence

from ..feedback import Scored, normalized

WINDOW = 1000  # recent (event, tool) records per namespace the automatic weight reads
MIN_EVENTS = 50  # fewer recent events than this: too little to judge, full weight
TOLERANCE = 0.05  # mean reciprocal rank lost (learned vs untaught) at which the weight reaches 0
DEPTH = 100  # ranks scored


class Ranks(NamedTuple):
    """Where a task's rankings put one tool before an event about it was learned, and the namespaces of the
    tools learning at full weight moved above it (`passed_by`)."""

    served: int | None
    untaught: int | None
    learned: int | None
    passed_by: tuple[str, ...] = ()


UNRANKED = Ranks(None, None, None)


def ranks_of(served: Sequence[str], untaught: Sequence[str], learned: Sequence[str],
             namespace_of: Callable[[str], str | None]) -> dict[str, Ranks]:
    """Each tool's `Ranks` in one task's three rankings (1-based; absent: past the depth)."""
    positions = [{t: r for r, t in enumerate(ids, 1)} for ids in (served, untaught, learned)]
    out = {}
    for tool in set().union(*positions):
        ranks = [p.get(tool) for p in positions]
        out[tool] = Ranks(*ranks, _passed_by(tool, ranks[1], ranks[2], positions[1], learned, namespace_of))
    return out


def _passed_by(tool: str, untaught: int | None, learned: int | None, untaught_at: dict[str, int],
               learned_ids: Sequence[str], namespace_of: Callable[[str], str | None]) -> tuple[str, ...]:
    """The namespaces of the tools above `tool` at full weight that the untaught ranking had below it (or
    not at all): the lifts that cost it its place (none when it lost none)."""
    if untaught is None or (learned is not None and learned <= untaught):
        return ()
    above = learned_ids[:learned - 1] if learned is not None else learned_ids
    return tuple(sorted({namespace_of(t) or "" for t in above if untaught_at.get(t, untaught + 1) > untaught}))


def answers_for(record: Scored) -> tuple[str, ...]:
    """The namespaces whose weight a record speaks to: where learning cost the tool its place, those whose
    lifts passed it (their weight is what moved them); otherwise the tool's own (its lift, or none). A loss
    scored before records kept who passed the tool (no `passed_by`; a loss always has a passer) speaks to
    none: charging it to the tool's own namespace would keep that namespace's weight down."""
    if _reciprocal(record.learned) < _reciprocal(record.untaught):
        return record.passed_by
    return (record.namespace,)


def _reciprocal(rank: int | None) -> float:
    return 1.0 / rank if rank else 0.0


def figures(records: Sequence[Scored]) -> dict[str, Any]:
    """Mean reciprocal rank, top-1 and top-5 rates of the served, untaught and full-weight rankings."""
    out: dict[str, Any] = {"events": len(records)}
    for name in ("served", "untaught", "learned"):
        ranks = [getattr(r, name) for r in records]
        n = max(1, len(ranks))
        out[name] = {"mrr": round(sum(1.0 / r for r in ranks if r) / n, 4),
                     "top1": round(sum(1 for r in ranks if r == 1) / n, 4),
                     "top5": round(sum(1 for r in ranks if r and r <= 5) / n, 4)}
    return out


def automatic_weight(recent: Sequence[Scored]) -> float:
    """The weight learning earns from the namespace's recent records (module doc)."""
    if len(recent) < MIN_EVENTS:
        return 1.0
    gains = [_reciprocal(r.learned) - _reciprocal(r.untaught) for r in recent]
    mean = sum(gains) / len(gains)
    spread = (sum((g - mean) ** 2 for g in gains) / (len(gains) - 1)) ** 0.5
    upper = mean + 2.0 * spread / len(gains) ** 0.5  # what learning gains at best, given the noise
    # in hundredths: a change too small to print is no change (and logs nothing)
    return 1.0 if upper >= 0 else max(0.0, round(1.0 + upper / TOLERANCE, 2))


class Scorecard:
    """The records, in the order they were scored, and which of them are first seen (module doc). Not
    thread-safe: the pipeline serialises writes."""

    def __init__(self, records: Iterable[Scored] = ()):
        self.records: list[Scored] = []
        self.first_seen: list[bool] = []  # per record: its (tool, request) was scored for the first time
        self._pairs: list[tuple[str, str]] = []  # per record: (tool, normalised request), kept for `_keep`
        self._seen: set[tuple[str, str]] = set()
        self.add(records)

    def __len__(self) -> int:
        return len(self.records)

    def add(self, records: Iterable[Scored]) -> None:
        for record in records:
            self._append(record, (record.tool, normalized(record.query)))

    def _append(self, record: Scored, pair: tuple[str, str]) -> None:
        self.first_seen.append(pair not in self._seen)
        self._seen.add(pair)
        self._pairs.append(pair)
        self.records.append(record)

    def _keep(self, keep: Callable[[Scored], bool]) -> None:
        """Only the records `keep` accepts; a repeat whose earlier copy went is first seen again. Nothing is
        rebuilt when all stay (a tool deleted is dropped here once per tool, most of them never scored)."""
        kept = [(r, pair) for r, pair in zip(self.records, self._pairs) if keep(r)]
        if len(kept) == len(self.records):
            return
        self.records, self.first_seen, self._pairs, self._seen = [], [], [], set()
        for record, pair in kept:
            self._append(record, pair)

    def forget(self, source: str) -> None:
        self._keep(lambda r: r.source != source)

    def drop_tool(self, tool: str) -> None:
        self._keep(lambda r: r.tool != tool)

    def rollback(self, before: float) -> None:
        self._keep(lambda r: r.time < before)

    def namespaces(self) -> list[str]:
        """Those of the tools scored, and those whose lifts passed one (their weight is judged too)."""
        return sorted({ns for r in self.records for ns in (r.namespace, *r.passed_by)})

    def recent(self, namespace: str) -> list[Scored]:
        """The namespace's last WINDOW records: those of its tools."""
        found: list[Scored] = []
        for record in reversed(self.records):
            if record.namespace == namespace:
                found.append(record)
                if len(found) == WINDOW:
                    break
        return found[::-1]

    def answered_for(self) -> dict[str, list[Scored]]:
        """Per namespace, the last WINDOW first-seen records that speak to its weight (`answers_for`), in
        order: one pass over the records (the weights are refreshed after every batch learned)."""
        windows: dict[str, list[Scored]] = {ns: [] for ns in self.namespaces()}
        for record, first in zip(reversed(self.records), reversed(self.first_seen)):
            if not first:
                continue  # ranked first by its earlier copy: no evidence of what learning does to new tasks
            for ns in answers_for(record):
                if len(windows[ns]) < WINDOW:
                    windows[ns].append(record)
        return {ns: found[::-1] for ns, found in windows.items()}

    def weights(self) -> dict[str, float]:
        """namespace -> the automatic weight (namespaces no record speaks to are at full weight)."""
        return {ns: automatic_weight(found) for ns, found in self.answered_for().items()}

    def _split(self, records: Sequence[tuple[Scored, bool]]) -> dict[str, Any]:
        return {"all": figures([r for r, _ in records]), "first_seen": figures([r for r, first in records if first]),
                "repeats": figures([r for r, first in records if not first])}

    def report(self) -> dict[str, Any]:
        """Figures over every record, first-seen ones and repeats, and per namespace: those, recent, the
        records its weight reads, tools taught before / not."""
        paired = list(zip(self.records, self.first_seen))
        out: dict[str, Any] = {**self._split(paired), "namespaces": {}}
        for ns, weighed in self.answered_for().items():
            mine = [(r, first) for r, first in paired if r.namespace == ns]
            out["namespaces"][ns] = {**self._split(mine), "recent": figures(self.recent(ns)),
                                     "weighed": figures(weighed),
                                     "taught_before": figures([r for r, _ in mine if r.taught_before]),
                                     "new_tools": figures([r for r, _ in mine if not r.taught_before]),
                                     "automatic_weight": round(automatic_weight(weighed), 4)}
        return out
