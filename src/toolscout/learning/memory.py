"""The requests feedback taught, as vectors: what a new task is matched against, and what the deployment's
calibration (`calibration.py`) is fitted on.

One row per distinct request (its key: the request as `incidental.teachable` keeps it, case and spacing
ignored), holding its vector and, per tool it taught, the sources that taught it and where the untaught
ranking had put that tool for it. Tools taught by no source leave; a row with no tool left is freed.

Anchors: the `ANCHORS` keys with the smallest hashes (a pure function of which keys are held, so every
replica and every replay picks the same ones, and taking a source back leaves the anchors it would have had)
play new tasks for the calibration. For each anchor and each taught tool, `best` holds the highest
similarity between the anchor and another request that taught the tool; additions raise it in place, a
tool that loses a request is recomputed over the requests it still has.
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from .calibration import EMPTY, NEIGHBOUR_TOOLS, RANK_EDGES, SIM_BINS, BinCounts, fit, rank_bucket, sim_bins

ANCHORS = 800  # requests that play new tasks for the calibration (chosen on train-split validation)
MIN_TOOLS = 5  # taught tools below which similarity earns nothing (see `_refit`)
FEW_TOOLS = 20  # taught tools up to which leave-one-out has too few other tools to count misses on
NEIGHBOUR_ROWS = 50  # nearest requests read for a task: the tools they taught are its learned candidates
_MISSING = -np.inf
_SLACK = 16  # extra candidates the float32 scan passes on, so rounding cannot change which rows are nearest
_TASK_CHUNK = 64  # tasks matched at once (a scan of every remembered request each)


def _similarities(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b.T in float64, rounded to 1e-9: the same pair gives the same similarity whichever product it was
    computed in (float32 products of different shapes round differently, and the anchors' state must not
    depend on the order requests came in)."""
    return np.round(a.astype(np.float64) @ b.astype(np.float64).T, 9)


def _pair_similarities(candidates: np.ndarray, tasks: np.ndarray) -> np.ndarray:
    """candidates[t, i] . tasks[t] for every task t and its candidates i, in float64 rounded to 1e-9 as
    `_similarities` (each pair's sum runs over the dimensions alone, whatever the shapes around it)."""
    return np.round(np.einsum("tid,td->ti", candidates.astype(np.float64), tasks.astype(np.float64)), 9)


def dormancy(tools_taught: int | None) -> str | None:
    """Why learning can lift nothing yet (fewer than MIN_TOOLS tools taught: `_refit`), None once it can.
    `tools_taught` None: the count is not the caller's to see (a namespace-limited token), so it is left out."""
    if tools_taught is not None and tools_taught >= MIN_TOOLS:
        return None
    so_far = "" if tools_taught is None else f": {tools_taught} so far"
    return f"learning lifts nothing until {MIN_TOOLS} tools are taught{so_far}"


def untaught_share(tools_taught: int, catalog_size: int | None) -> float:
    """The share of a catalog of `catalog_size` tools that no request taught (0 when its size is not known)."""
    if not catalog_size:
        return 0.0
    return min(1.0, max(0.0, 1.0 - tools_taught / catalog_size))


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.sha1(key.encode("utf-8")).digest()[:8], "big")


@dataclass
class Taught:
    """One tool a request taught: per source, each lesson's time and where the untaught ranking put the tool
    then. What is derived from them (the last time taught; the untaught rank of the earliest lesson, ties by
    source) does not depend on the order lessons came in, and is recomputed when one is taken back: the
    entry is what it would have been had that lesson never come."""

    lessons: dict[str, list[tuple[float, int | None]]] = field(default_factory=dict)
    untaught_rank: int | None = None
    last_taught: float = 0.0  # when it was last taught (the catalog it was weighed against is that day's)
    _earliest: tuple[float, str] | None = None

    @property
    def sources(self) -> dict[str, int]:
        return {source: len(taught) for source, taught in self.lessons.items()}

    def teach(self, source: str, when: float, rank: int | None) -> None:
        when = float(when)
        self.lessons.setdefault(source, []).append((when, rank))
        self.last_taught = max(self.last_taught, when)
        if self._earliest is None or (when, source) < self._earliest:
            self._earliest, self.untaught_rank = (when, source), rank

    def take_back(self, source: str | None, when: float | None) -> None:
        """One lesson of `source` (the one taught at `when`, else its latest; source None: every lesson)."""
        if source is None:
            self.lessons.clear()
        elif source in self.lessons:
            taught = self.lessons[source]
            times = [t for t, _rank in taught]
            del taught[times.index(when) if when in times else times.index(max(times))]
            if not taught:
                del self.lessons[source]
        every = [(t, s, rank) for s, taught in self.lessons.items() for t, rank in taught]
        self.last_taught = max((t for t, _s, _rank in every), default=0.0)
        first = min(every, key=lambda lesson: lesson[:2], default=None)
        self._earliest, self.untaught_rank = (first[:2], first[2]) if first else (None, None)


class RequestMemory:
    """See the module doc. Not thread-safe: the pipeline serialises writes under its write lock."""

    def __init__(self, dim: int):
        self.dim = dim
        self.vectors = np.zeros((0, dim), dtype=np.float32)
        self.keys: list[str | None] = []  # row -> key (None: a free row)
        self.row_of: dict[str, int] = {}
        self.taught: dict[str, dict[str, Taught]] = {}  # key -> tool -> Taught
        self.rows_of_tool: dict[str, set[int]] = {}
        self._free: list[int] = []
        self.anchors: list[str] = []  # anchor keys, smallest hash first
        self._best = np.zeros((0, 0), dtype=np.float64)  # anchor x tool column
        self._column: dict[str, int] = {}
        self._hashes: dict[str, int] = {}
        self._tools_of_column: list[str] = []
        self.calibration = EMPTY
        self.catalog_size: int | None = None  # tools in the catalog (None: not known; `_new_tool_share`)

    def __len__(self) -> int:
        return len(self.row_of)

    @property
    def tools(self) -> set[str]:
        return set(self.rows_of_tool)

    # writing -------------------------------------------------------------------------------------
    def add(self, items: Sequence[tuple[str, np.ndarray | None, str, str, int | None, float]]) -> None:
        """(key, vector, tool, source, untaught rank, time) taught (the vector may be None for a key already
        held); then the anchors and the calibration follow."""
        new_pairs: list[tuple[int, str]] = []
        new_keys: list[str] = []
        for key, vector, tool, source, rank, when in items:
            row = self.row_of.get(key)
            if row is None:
                row = self._new_row(key, vector)
                new_keys.append(key)
            entry = self.taught[key].get(tool)
            if entry is None:
                entry = self.taught[key][tool] = Taught()
                self.rows_of_tool.setdefault(tool, set()).add(row)
                new_pairs.append((row, tool))
            entry.teach(source, when, rank)
        fresh = self._admit_anchors(new_keys)
        self._raise([i for i in range(len(self.anchors)) if i not in fresh], new_pairs)
        self._raise(sorted(fresh), self._all_pairs())
        self._refit()

    def remove(self, items: Iterable[tuple[str, str, str | None, float | None]]) -> None:
        """(key, tool, source, time) taken back once (source None: every source of that entry; time None: the
        source's latest lesson)."""
        emptied: set[str] = set()
        freed: list[str] = []
        for key, tool, source, when in items:
            entry = self.taught.get(key, {}).get(tool)
            if entry is None:
                continue
            entry.take_back(source, when)
            if entry.lessons:
                continue
            del self.taught[key][tool]
            row = self.row_of[key]
            self.rows_of_tool[tool].discard(row)
            if not self.rows_of_tool[tool]:
                del self.rows_of_tool[tool]
            emptied.add(tool)
            if not self.taught[key]:
                self._free_row(key)
                freed.append(key)
        if not emptied:
            return
        fresh = self._choose_anchors() if set(freed) & set(self.anchors) else set()
        for tool in emptied:
            self._best[:, self._col(tool)] = _MISSING
        stale = [i for i in range(len(self.anchors)) if i not in fresh]
        self._raise(stale, [(row, tool) for tool in sorted(emptied) for row in sorted(self.rows_of_tool.get(tool, ()))])
        self._raise(sorted(fresh), self._all_pairs())
        self._refit()

    def set_catalog_size(self, tools: int | None) -> None:
        """The catalog holds `tools` tools now (None: not known); the calibration follows, so it is a function
        of what is held and of the catalog, whatever order they changed in."""
        tools = None if tools is None else int(tools)
        if tools != self.catalog_size:
            self.catalog_size = tools
            if self.row_of:
                self._refit()

    def pairs(self) -> list[tuple[str, str, str, int]]:
        """Every (key, tool, source, times) held, sorted."""
        return sorted((key, tool, source, n) for key, tools in self.taught.items() for tool, entry in tools.items()
                      for source, n in entry.sources.items())

    def _all_pairs(self) -> list[tuple[int, str]]:
        return [(row, tool) for tool in sorted(self.rows_of_tool) for row in sorted(self.rows_of_tool[tool])]

    def _new_row(self, key: str, vector: np.ndarray | None) -> int:
        if vector is None:
            raise ValueError(f"no vector for the new request {key!r}")
        vector = np.asarray(vector, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(vector))
        if norm > 0 and abs(norm - 1.0) > 1e-6:  # a unit vector is kept as it is: its bits, wherever it is read
            vector = vector / norm
        if self._free:
            row = self._free.pop()
            self.keys[row] = key
        else:
            row = len(self.keys)
            self.keys.append(key)
            if row >= len(self.vectors):
                grown = np.zeros((max(64, 2 * len(self.vectors)), self.dim), dtype=np.float32)
                grown[: len(self.vectors)] = self.vectors
                self.vectors = grown
        self.vectors[row] = vector
        self.row_of[key] = row
        self.taught[key] = {}
        return row

    def _free_row(self, key: str) -> None:
        row = self.row_of.pop(key)
        del self.taught[key]
        self._hashes.pop(key, None)
        self.keys[row] = None
        self.vectors[row] = 0.0
        self._free.append(row)

    # matching ------------------------------------------------------------------------------------
    def nearest_tools(self, vectors: np.ndarray, rows: int = NEIGHBOUR_ROWS) -> list[list[tuple[str, float, float]]]:
        """For each task vector, the tools its `rows` nearest requests taught, each with its highest
        similarity and when that request last taught it, most similar first (ties by tool id). The scan is a
        float32 product; the candidates' similarities are then computed again exactly (`_pair_similarities`), so
        they do not depend on where a request sits in memory (a replica, or a memory that forgot a source,
        holds it elsewhere)."""
        vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
        if not self.row_of:
            return [[] for _ in range(len(vectors))]
        out = []
        for start in range(0, len(vectors), _TASK_CHUNK):  # chunks bound the scan and the candidates' copies
            part = vectors[start:start + _TASK_CHUNK]
            candidates = self._candidates(part, rows + _SLACK)
            exact = _pair_similarities(self.vectors[candidates], part)
            out.extend(self._taught_by(top, sims, rows) for top, sims in zip(candidates, exact))
        return out

    def _candidates(self, vectors: np.ndarray, wide: int) -> np.ndarray:
        """tasks x candidates: the rows the float32 scan finds nearest to each task, `wide` of them (every held
        row when fewer are held). Free rows are zero vectors, scored -inf: with at least `wide` rows held,
        none is among the candidates."""
        used, held = len(self.keys), len(self.row_of)
        if wide >= held:
            rows = np.fromiter(self.row_of.values(), dtype=np.int64, count=held)  # any order: `_taught_by` sorts
            return np.broadcast_to(rows, (len(vectors), held))
        scan = vectors @ self.vectors[:used].T  # tasks x rows
        if self._free:
            scan[:, self._free] = _MISSING
        return np.argpartition(scan, used - wide, axis=1)[:, used - wide:]  # the `wide` largest, unordered

    def _taught_by(self, top: np.ndarray, exact: np.ndarray, rows: int) -> list[tuple[str, float, float]]:
        """The tools the `rows` most similar of the candidate rows `top` taught (`exact`: their similarities),
        each at its highest similarity, most similar first (ties by tool id)."""
        keys = [self.keys[r] for r in top]
        order = sorted(range(len(top)), key=lambda i: (-exact[i], keys[i]))[:rows]
        best: dict[str, tuple[float, float]] = {}
        for i in order:
            for tool, entry in self.taught[keys[i]].items():
                if tool not in best:  # `order` is most similar first
                    best[tool] = (float(exact[i]), entry.last_taught)
        return sorted(((t, s, w) for t, (s, w) in best.items()), key=lambda item: (-item[1], item[0]))

    # anchors and calibration -----------------------------------------------------------------------
    def _admit_anchors(self, keys: list[str]) -> set[int]:
        """New keys join the anchors when their hash is among the ANCHORS smallest; the indexes of the anchors
        that are new (their similarities must be computed whole)."""
        if not keys:
            return set()
        largest = self._hash_of(self.anchors[-1]) if self.anchors else None
        if len(self.anchors) >= ANCHORS and all(self._hash_of(k) >= largest for k in keys):
            return set()
        return self._choose_anchors()

    def _choose_anchors(self) -> set[int]:
        """The ANCHORS keys with the smallest hashes; returns the indexes of those that were not anchors."""
        chosen = heapq.nsmallest(ANCHORS, self.row_of, key=self._hash_of)
        old = {key: i for i, key in enumerate(self.anchors)}
        best = np.full((len(chosen), self._best.shape[1]), _MISSING, dtype=np.float64)
        fresh = set()
        for i, key in enumerate(chosen):
            if key in old:
                best[i] = self._best[old[key]]
            else:
                fresh.add(i)
        self.anchors, self._best = chosen, best
        return fresh

    def _hash_of(self, key: str) -> int:
        found = self._hashes.get(key)
        if found is None:
            found = self._hashes[key] = key_hash(key)
        return found

    def _col(self, tool: str) -> int:
        col = self._column.get(tool)
        if col is None:
            col = self._column[tool] = len(self._tools_of_column)
            self._tools_of_column.append(tool)
            if col >= self._best.shape[1]:  # room for more tools, doubling
                grown = np.full((len(self.anchors), max(16, 2 * col)), _MISSING, dtype=np.float64)
                grown[:, : self._best.shape[1]] = self._best
                self._best = grown
        return col

    def _raise(self, anchors: Sequence[int], pairs: list[tuple[int, str]], chunk: int = 4096) -> None:
        """Raise the anchors' similarities by the (row, tool) pairs: best[a, tool] = max(best, sim(a, row))."""
        if not len(anchors) or not pairs:
            return
        anchors = np.asarray(anchors, dtype=np.int64)
        anchor_rows = np.asarray([self.row_of[self.anchors[a]] for a in anchors])
        cols = np.asarray([self._col(tool) for _row, tool in pairs])
        rows = np.asarray([row for row, _tool in pairs])
        order = np.argsort(cols, kind="stable")
        cols, rows = cols[order], rows[order]
        for start in range(0, len(rows), chunk):
            part_rows, part_cols = rows[start:start + chunk], cols[start:start + chunk]
            sims = _similarities(self.vectors[anchor_rows], self.vectors[part_rows])  # anchors x pairs
            sims[anchor_rows[:, None] == part_rows[None, :]] = _MISSING  # an anchor is not its own neighbour
            heads = np.flatnonzero(np.r_[True, part_cols[1:] != part_cols[:-1]])
            peak = np.maximum.reduceat(sims, heads, axis=1)  # anchors x distinct columns
            target = part_cols[heads]
            self._best[np.ix_(anchors, target)] = np.maximum(self._best[np.ix_(anchors, target)], peak)

    def _refit(self) -> None:
        """The calibration of what is held now. With fewer than MIN_TOOLS tools taught, requests near each
        other are requests of the same few tools whatever a task needs: leave-one-out cannot tell "similar
        means the same tool" from "every request is that tool's", so similarity earns nothing yet (a burst
        of one tool's traffic must not lift it for every task near it)."""
        neighbours, nearest = BinCounts.zeros(SIM_BINS), BinCounts.zeros(SIM_BINS)
        if len(self.rows_of_tool) >= MIN_TOOLS and self.anchors:
            ordered, ordered_similarities = self._anchors_candidates()
            columns, similarities = ordered[:, :NEIGHBOUR_TOOLS], ordered_similarities[:, :NEIGHBOUR_TOOLS]
            live = similarities > _MISSING
            bins = sim_bins(similarities[live])
            anchors, _ = np.nonzero(live)  # row-major, as the boolean index `[live]` reads them
            taught = np.asarray([float(self._tools_of_column[c] in self.taught[self.anchors[a]])
                                 for a, c in zip(anchors, columns[live])])  # did the anchor's own request teach it
            # the nearest request's tools: those at the anchor's highest similarity (one request's tools tie)
            first = (similarities >= similarities[:, :1])[live]
            for counts, chosen in ((neighbours, slice(None)), (nearest, first)):
                np.add.at(counts.trials, bins[chosen], 1.0)
                np.add.at(counts.hits, bins[chosen], taught[chosen])
            np.add.at(neighbours.trials, sim_bins(self._nearest_to_new_tools(ordered, ordered_similarities)),
                      self._new_tool_share())
        found = np.zeros(len(RANK_EDGES) + 1)
        for tools in self.taught.values():
            for entry in tools.values():
                found[rank_bucket(entry.untaught_rank)] += 1
        self.calibration = fit(neighbours, nearest, found, len(self.taught))

    def _nearest_to_new_tools(self, ordered: np.ndarray, similarities: np.ndarray) -> np.ndarray:
        """The similarities of the NEIGHBOUR_TOOLS taught tools nearest to each anchor once the anchor's own
        tools are left out (`ordered`: each anchor's nearest columns, best first, with their `similarities`):
        the anchor plays a task
        that needs a tool nobody taught yet, and each of them is a miss for the cautious table. Leave-one-out
        alone never sees such a task: every request it holds needs a taught tool, so where taught requests
        are few and far apart it learns that any request near another needs that one's tool."""
        out = []
        for a, (row, row_similarities) in enumerate(zip(ordered, similarities)):
            own = {self._column[t] for t in self.taught[self.anchors[a]] if t in self._column}
            out.append(row_similarities[[j for j, c in enumerate(row) if c not in own][:NEIGHBOUR_TOOLS]])
        found = np.concatenate(out) if out else np.zeros(0)
        return found[found > _MISSING]

    def _new_tool_share(self) -> float:
        """The weight of an anchor playing a task of a new tool against one playing a task of a taught tool:
        how often a request came for a tool nobody had taught yet (each taught tool's first request, among
        all (request, tool) pairs held), in full up to FEW_TOOLS taught tools and less beyond, and at least
        the share of the catalog's tools nobody taught (when the catalog's size is known). Traffic alone
        says much while each tool has few requests; with many tools taught, leave-one-out counts misses on
        their requests itself, and its full weight cost gains. But traffic confined to a part of the
        catalog says a new tool is almost never needed, while the tasks not seen yet may need any tool: the
        catalog's untaught share keeps the cautious table from being sure of a few taught tools for the
        tasks of the others (docs/learning.md)."""
        pairs = sum(len(tools) for tools in self.taught.values())
        tools = len(self.rows_of_tool)
        traffic = tools / pairs * min(1.0, FEW_TOOLS / tools) if pairs else 0.0
        return max(traffic, untaught_share(tools, self.catalog_size))

    def _anchors_candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """Each anchor's nearest tool columns (by its best similarity to each tool's requests), NEIGHBOUR_TOOLS
        and as many again as one request teaches in practice, in `nearest_tools`' order (ties by tool id), and
        their similarities, -inf where an anchor has fewer. All anchors in one pass: it runs on every event
        learned."""
        best = self._best[:, : len(self._tools_of_column)]
        width = min(NEIGHBOUR_TOOLS + 8, best.shape[1])
        candidates = np.argsort(-best, axis=1, kind="stable")[:, :width]
        similarities = np.take_along_axis(best, candidates, axis=1)
        order = np.lexsort((self._id_ranks()[candidates], -similarities), axis=1)
        return np.take_along_axis(candidates, order, axis=1), np.take_along_axis(similarities, order, axis=1)

    def _id_ranks(self) -> np.ndarray:
        """Each tool column's rank among the columns' tool ids (the tie-break of equal similarities)."""
        ranks = np.empty(len(self._tools_of_column), dtype=np.int64)
        ranks[np.argsort(np.asarray(self._tools_of_column, dtype=object), kind="stable")] = np.arange(len(ranks))
        return ranks
