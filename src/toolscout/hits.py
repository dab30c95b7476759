"""What a search returns, and the one policy that turns a ranking into that answer.

A ranking (ids and scores from a retriever or a database) becomes the hits a caller sees in three steps,
the same for the Python API, the local server and the PostgreSQL server:

1. tools the query *names* (`NameIndex`: `get_weather`, `getWeather`, one typo) come first, `match="name"`;
2. then the ranked tools, unless the search abstains: the best score is below `min_score`, or the chance
   that one of the best `ABSTAIN_DEPTH` ranked tools is relevant (from their calibrated probabilities,
   `eval.calibration.any_relevant`) is below `min_probability` (a task no tool fits gets no ranked tools
   rather than k weak ones), up to k hits in all;
3. then the `always_include` ids, after the k (`match="always"`).

With `explain`, each hit also carries the query's words that its tool's text view contains (`matched_words`).
Each ranked hit carries its calibrated `probability` when the pipeline has one (`toolscout.relevance`);
`min_probability=CALIBRATED` asks for the threshold shipped with that calibration (the pipeline resolves
it before the hits are assembled).

Where the tools and the scores of tools the ranking did not return come from is the storage's business
(`HitSource`); the order of the steps is decided here only.
"""

from __future__ import annotations

import difflib
import math
import numbers
import operator
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Protocol, Sequence

from .errors import SURROGATE_HINT, SURROGATE_PROBLEM, InvalidRequest, holds_lone_surrogate, is_blank, listed
from .eval.calibration import any_relevant
from .query import Query
from .results import Degraded
from .tool import TextView, Tool, split_identifier, tool_text

MATCHES = ("retrieval", "name", "always")
CALIBRATED = "calibrated"  # min_probability: the threshold chosen with the pipeline's calibration
# what a pipeline without calibration cannot do (said by ToolScout.search, and by a service at start and swap)
NO_CALIBRATION = ("has no calibration (only the default pipeline ships one, docs/scores.md): hits carry no "
                  "probability, and no search abstains on probability (min_probability is off)")


class UnknownNamesWarning(UserWarning):
    """A search named namespaces no tool is in, or `always_include` ids no tool has: most likely a typo,
    which would otherwise read as a search that found nothing there."""


def warn_if_unknown(namespaces: Sequence[str], ids: Sequence[str]) -> None:
    """Warn, naming them, of a search's `namespaces` no tool is in and `always_include` `ids` no tool has."""
    import warnings

    if namespaces:
        warnings.warn(f"namespaces {list(namespaces)} hold no tool (a typo?): the search finds nothing there "
                      "(ToolScout.unknown_namespaces says which, before a search)", UnknownNamesWarning, stacklevel=3)
    if ids:
        warnings.warn(f"always_include: no tool has the id(s) {list(ids)[:5]}; ignored", UnknownNamesWarning,
                      stacklevel=3)


class UncalibratedWarning(UserWarning):
    """A search asked to abstain on probability (`min_probability`) of a pipeline that has no calibration."""


def warn_if_uncalibrated(min_probability: float | str | None, calibration: Any) -> None:
    """Warn (once per calling line, as Python shows warnings) when `min_probability` is asked of a pipeline
    whose `abstention_calibration` is None: it would silently never abstain."""
    if min_probability is not None and calibration is None:
        import warnings

        warnings.warn(f"min_probability {min_probability!r}: this pipeline {NO_CALIBRATION}; abstain on the "
                      f"score with min_score instead", UncalibratedWarning, stacklevel=3)
# min_probability gates the chance that one of this many best ranked tools is relevant, not the best one's
# alone: near-twin tools (the same tool on three servers) split their probability, and one of them is
# still likely right. Five: the gateway's k; the ranking behind probabilities is at least ten deep.
ABSTAIN_DEPTH = 5


@dataclass(frozen=True)
class Hit:
    """One search result: the tool, its score (higher is better) and its 1-based rank.

    `match` says why the tool is there: "retrieval" (ranked by the retriever), "name" (the query named
    the tool, so it ranks first, scored at least as the best ranked tool) or "always" (listed in `always_include`). `matched`: the query's words
    found in the tool's text view, when the search asked to explain (None otherwise). `available`: whether
    the server that runs the tool answers now, where that is known (the gateway; None otherwise).
    `probability`: the calibrated probability that the tool is one the task needs (`toolscout.relevance`),
    comparable across tasks and catalogs; None when the pipeline has no calibration, or for a tool the
    ranking did not return (a name match or an always-included tool outside it). The score orders hits;
    the probability says how likely each is right.
    """

    tool: Tool
    score: float
    rank: int
    match: str = "retrieval"
    matched: tuple[str, ...] | None = None
    available: bool | None = None
    probability: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The hit as JSON, as every interface shows it (HTTP, MCP, `toolscout search --json`)."""
        tool = self.tool
        out = {"rank": self.rank, "id": tool.id, "name": tool.name, "namespace": tool.namespace,
               "score": round(float(self.score), 6), "match": self.match, "description": tool.description,
               "input_schema": tool.input_schema()}
        if tool.method:
            out["method"], out["path"] = tool.method, tool.path
        if self.matched is not None:
            out["matched"] = list(self.matched)
        if self.available is not None:
            out["available"] = self.available
        if self.probability is not None:
            out["probability"] = round(float(self.probability), 4)
        return out


class Hits(list):
    """One task's answer: its hits (a list of Hit, best first) and `degraded`, None or what a stage of the
    pipeline could not do for the task (`results.Degraded`: an LLM reranker that failed on it, so these are
    the first stage's hits). Every interface shows `degraded` beside the task's hits when it is set."""

    def __init__(self, hits: Iterable[Hit] = (), degraded: Degraded | None = None):
        super().__init__(hits)
        self.degraded = degraded

    def degraded_dict(self, detail: bool = False) -> dict[str, dict[str, str]]:
        """`{"degraded": {"stage", "reason"}}` when it is set, else {}: what an answer adds for the task.
        `detail`: add the stage's error in full ("detail"), for a local user only (the CLI)."""
        if self.degraded is None:
            return {}
        full = {"detail": self.degraded.described} if detail else {}
        return {"degraded": {**self.degraded.to_dict(), **full}}


@dataclass(frozen=True)
class HitPolicy:
    """What one search asks for beyond its ranking (see the module doc). `min_probability`: a probability,
    `CALIBRATED`, or None (no threshold)."""

    k: int
    min_score: float | None = None
    min_probability: float | str | None = None
    always_include: tuple[str, ...] = ()
    match_names: bool = True
    explain: bool = False

    def __post_init__(self) -> None:
        score = self.min_score  # NaN compares false with every score: it would be no threshold at all
        if score is not None and (isinstance(score, bool) or not isinstance(score, numbers.Real)
                                  or math.isnan(score)):  # an infinity compares as it says: kept
            raise InvalidRequest(f"min_score must be a number (not NaN), got {score!r}")


class HitSource(Protocol):
    """What the storage behind one search provides to `assemble_hits`, as of the read that ranked it."""

    def tools(self, ids: Sequence[str]) -> Mapping[str, Tool]:
        """The tools of those `ids` the search may return (they exist and pass its filter)."""
        ...

    def scores(self, query: Query, ids: Sequence[str]) -> Mapping[str, float]:
        """The retriever's scores of tools the ranking did not return (0.0 for one it does not match)."""
        ...

    def lexical_reading(self) -> tuple[TextView, Any]:
        """How the search read each tool's words: a text view and a BM25 tokenizer (what `explain` compares
        the query's words with; `retrievers.bm25.lexical_reading`)."""
        ...


def assemble_hits(query: Query, ids: Sequence[str], scores: Sequence[float], named: Sequence[str],
                  policy: HitPolicy, source: HitSource, probabilities: Sequence[float] | None = None) -> list[Hit]:
    """The hits of one query from its ranking (`ids`, `scores`, best first; `probabilities`: the ranked
    tools' calibrated probabilities, None without a calibration) and the ids it names (`named`, already
    within the search's filter). `explain` lists the words of the text search read."""
    retrieved = {tid: float(s) for tid, s in zip(ids, scores)}
    chance = {} if probabilities is None else {tid: float(p) for tid, p in zip(ids, probabilities)}
    chosen: dict[str, str] = dict.fromkeys(named[: policy.k], "name")
    if not abstains(scores, probabilities, policy):
        ranked = [tid for tid in retrieved if tid not in chosen][: policy.k - len(chosen)]
        chosen.update(dict.fromkeys(ranked, "retrieval"))
    for tid in policy.always_include:
        chosen.setdefault(tid, "always")
    tools = source.tools(list(chosen))
    unranked = [tid for tid in chosen if tid in tools and tid not in retrieved]
    extra = source.scores(query, unranked) if unranked else {}
    present = [(tid, match) for tid, match in chosen.items() if tid in tools]
    # a tool the task names comes first: its score is at least the best ranked tool's, so scores still order
    # the hits (a client that sorts by score keeps it first)
    best = max((retrieved[tid] for tid, match in present if match == "retrieval"), default=float("-inf"))

    def score(tid: str, match: str) -> float:
        own = retrieved[tid] if tid in retrieved else float(extra.get(tid, 0.0))
        return max(own, best) if match == "name" else own

    hits = [Hit(tools[tid], score(tid, match), rank, match, probability=chance.get(tid))
            for rank, (tid, match) in enumerate(present, 1)]
    return explained(query.text, hits, *source.lexical_reading()) if policy.explain else hits


def abstains(scores: Sequence[float], probabilities: Sequence[float] | None, policy: HitPolicy) -> bool:
    """Whether a search leaves out its ranked tools: nothing was ranked, or it is below a threshold
    (`min_score` on the best score; `min_probability` on the chance that one of the best `ABSTAIN_DEPTH`
    is relevant, where the ranking has probabilities)."""
    if policy.min_score is None and policy.min_probability is None:
        return False
    if not len(scores):
        return True
    if policy.min_score is not None and float(scores[0]) < policy.min_score:
        return True
    if policy.min_probability is None or probabilities is None:
        return False
    if isinstance(policy.min_probability, str):
        raise ValueError(f"min_probability {policy.min_probability!r} must be resolved to a number first")
    return any_relevant(probabilities[:ABSTAIN_DEPTH]) < policy.min_probability


def explained(query: str, hits: Sequence[Hit], view: TextView, tokenizer: Any) -> list[Hit]:
    """`hits`, each with the query words its tool's text (read through `view`, split and stemmed by the
    BM25 `tokenizer`) contains (`matched_words`)."""
    from .retrievers.bm25 import task_text

    words = tokenizer.words(task_text(query))
    terms = tokenizer.stems(words)
    return [replace(hit, matched=matched_words(words, terms, tokenizer(tool_text(hit.tool, view)))) for hit in hits]


def matched_words(words: Sequence[str], terms: Sequence[str], tool_terms: Iterable[str]) -> tuple[str, ...]:
    """The query `words` (as written, lowercased, once each, in order) whose BM25 term (`terms`, the same
    positions) is among `tool_terms`, the terms of a tool's text view."""
    present = set(tool_terms)
    return tuple(dict.fromkeys(word for word, term in zip(words, terms) if term in present))


class NameIndex:
    """Finds the tools a short query names: exactly (after normalising case, `_`, `-`, `.`, camelCase and
    spaces) a tool's name, title, id or `namespace.name`; or nearly its name or title (a typo or two:
    similarity >= `NEAR` between the squashed forms, candidates found through character trigrams)."""

    NEAR = 0.88
    MAX_WORDS = 6

    def __init__(self, tools: Iterable[Tool] = ()):
        self._exact: dict[str, dict[str, None]] = {}  # squashed key -> ids
        self._near: dict[str, dict[str, None]] = {}  # squashed name/title -> ids
        self._grams: dict[str, set[str]] = {}  # trigram -> squashed names/titles
        for tool in tools:
            self.add(tool)

    @staticmethod
    def squash(text: str) -> str:
        return "".join(split_identifier(text).lower().split())

    @staticmethod
    def _keys(tool: Tool) -> tuple[set[str], set[str]]:
        near = {NameIndex.squash(k) for k in (tool.name, tool.title) if k} - {""}
        exact = near | ({NameIndex.squash(k) for k in (tool.id, tool.qualified_name)} - {""})
        return exact, near

    @staticmethod
    def _trigrams(key: str) -> set[str]:
        padded = f"^{key}$"
        return {padded[i:i + 3] for i in range(len(padded) - 2)}

    def add(self, tool: Tool) -> None:
        exact, near = self._keys(tool)
        for key in exact:
            self._exact.setdefault(key, {})[tool.id] = None
        for key in near:
            self._near.setdefault(key, {})[tool.id] = None
            for gram in self._trigrams(key):
                self._grams.setdefault(gram, set()).add(key)

    def remove(self, tool: Tool) -> None:
        exact, near = self._keys(tool)
        for key in exact:
            _discard(self._exact, key, tool.id)
        for key in near:
            if _discard(self._near, key, tool.id):
                for gram in self._trigrams(key):
                    keys = self._grams.get(gram)
                    if keys is not None:
                        keys.discard(key)
                        if not keys:
                            del self._grams[gram]

    def exact(self, name: str) -> list[str]:
        """Ids of the tools whose name, title, id or `namespace.name` is `name` (after normalising)."""
        return list(self._exact.get(self.squash(name), ()))

    def lookup(self, query: str) -> list[str]:
        """Ids of the tools `query` names (best match first), or [] when it names none."""
        if len(query) > 200 or len(query.split()) > self.MAX_WORDS:  # a sentence, not a name: skip the work
            return []
        words = split_identifier(query).split()
        if not words or len(words) > self.MAX_WORDS:
            return []
        key = "".join(words).lower()
        if key in self._exact:
            return list(self._exact[key])
        if len(key) < 5:
            return []
        return self._near_matches(key)

    def _near_matches(self, key: str) -> list[str]:
        grams = self._trigrams(key)
        counts: dict[str, int] = {}
        for gram in grams:
            for candidate in self._grams.get(gram, ()):
                counts[candidate] = counts.get(candidate, 0) + 1
        best, best_ratio = [], self.NEAR
        for candidate, shared in counts.items():
            if shared * 2 < len(grams):
                continue
            ratio = difflib.SequenceMatcher(None, key, candidate).ratio()
            if ratio > best_ratio + 1e-9:
                best, best_ratio = [candidate], ratio
            elif abs(ratio - best_ratio) <= 1e-9:
                best.append(candidate)
        return list(dict.fromkeys(tid for candidate in sorted(best) for tid in self._near[candidate]))


def _discard(index: dict[str, dict[str, None]], key: str, tool_id: str) -> bool:
    """Remove `tool_id` under `key`; True when the key is left with no ids (and was dropped)."""
    ids = index.get(key)
    if ids is None:
        return False
    ids.pop(tool_id, None)
    if ids:
        return False
    del index[key]
    return True


def abstained(hits: Sequence[Hit]) -> bool:
    """Whether a search found nothing that fits its task: no hit but the always-included tools (what every
    surface reports as `abstained`)."""
    return not any(hit.match != "always" for hit in hits)


def checked_queries(query: str | Query | Sequence[str | Query]) -> list[Query]:
    """The tasks of one search, each as the `Query` every stage reads: a task sent as text must hold more
    than white space, and is focused here (`Query.of`), once. A `Query` was made from a checked task: it
    passes as it is, so a caller that needs `truncated` (the HTTP answer) focuses nothing twice."""
    queries = [query] if isinstance(query, (str, Query)) else listed(query, "query", "a task (str) or a list of tasks")
    for q in queries:
        if not isinstance(q, Query) and (not isinstance(q, str) or is_blank(q)):
            raise InvalidRequest("each query must be a string with something visible in it")
        if isinstance(q, str) and holds_lone_surrogate(q):  # no tokenizer or encoder takes one
            raise InvalidRequest(f"query {q!r}: {SURROGATE_PROBLEM}; {SURROGATE_HINT}")
    return [q if isinstance(q, Query) else Query.of(q) for q in queries]


def checked_k(k: int) -> int:
    try:
        if isinstance(k, bool):  # an index to Python (True is 1), but no caller means k=1 by it
            raise TypeError
        k = operator.index(k)
    except TypeError:
        raise InvalidRequest(f"k must be a whole number, got {k!r}") from None
    if k < 1:
        raise InvalidRequest(f"k must be at least 1, got {k}")
    return k
