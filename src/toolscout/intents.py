"""Tasks that hold several requests: split them into intents, retrieve for each, merge the rankings.

"Find a flight to Rome, book the cheapest hotel near the station and add both to my calendar" needs
three tools. One embedding (or one bag of words) of the whole task lands between them, and the tool of
the least prominent request often misses the top k. So a task that reads as several requests is also
searched request by request, and the rankings are merged (`IntentMerge.merge`):

    "max" (the default): score(t) = max(score_whole(t), intent_weight * max_i score_i(t))
    "rrf":               score(t) = 1 / (rrf_k + rank_whole(t)) + intent_weight * Σ_i 1 / (rrf_k + rank_i(t))

(a tool a ranking did not return gets nothing from it). A task that is one request is searched exactly as
before: no split, no merge, the same ranking and scores.

Splitting uses no model, only the shape of the text (`split_intents`):
- sentences (a full stop, question or exclamation mark, then a capital letter; not after a common
  abbreviation; a decimal number or an IP address is not a sentence end);
- within a sentence, clauses joined by ";", "then", or by "," / "and" when the next clause opens with an
  action ("book ...", "please send ...", "also check ...", "can you ..."), and the clause before it has
  at least two words. So "search and replace in a file" and "salt and pepper" stay one request: "search"
  is one word, and "pepper" is not an action.
- parts of fewer than `MIN_WORDS` words join the part before them; a chat transcript is left whole (its
  latest turn is weighed in elsewhere, `toolscout.conversation`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .conversation import latest_turn
from .query import Query, as_queries
from .results import Results

MIN_WORDS = 3
MAX_INTENTS = 6
MAX_CHARS = 2000  # longer texts (documents, whole conversations) are not split

# Verbs that open a request in tool-use tasks (imperative or after "can you" / "please").
ACTIONS = frozenset("""
add analyze analyse apply approve archive arrange ask assign attach book browse buy calculate call cancel change
check choose classify clean close collect combine compare compile compute confirm connect convert copy count
create decline delete deploy describe detect determine display download draft edit email enable estimate
evaluate explain export extract fetch file fill find fix follow forward generate get give grab identify import
inform install invite issue keep launch list locate log look make manage map mark measure merge monitor move
notify obtain open order organize organise pay pick play plot post predict prepare print provide publish
purchase put query rate read recommend record register reject remind remove rename renew reply report request
reserve reset resolve restart retrieve return review run save scan schedule search select sell send set share
show sign sort start stop store submit subscribe suggest summarize summarise sync take tell track transfer
translate turn unsubscribe update upload validate verify view visit watch write
""".split())
OPENERS = ("can you", "could you", "would you", "will you", "i need", "i want", "i would like", "i'd like",
           "let me know", "help me", "tell me", "show me", "give me", "please")
LEAD_INS = ("please", "also", "then", "and", "finally", "lastly", "next", "additionally", "furthermore",
            "moreover", "afterwards", "after that", "in addition", "besides", "plus", "kindly")
ABBREVIATIONS = frozenset("mr mrs ms dr st jr sr prof inc ltd co corp vs etc e.g i.e approx no fig dept est".split())

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_HARD_BREAK = re.compile(r"\s*;\s*|\s*\n+\s*|,?\s+and then\s+|,\s*then\s+", re.IGNORECASE)
_SOFT_BREAK = re.compile(r",\s*(?:and\s+)?|\s+and\s+", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z0-9']+")


def split_intents(text: str) -> list[str]:
    """The requests `text` holds, in order; a one-element list when it reads as one request."""
    if len(text) > MAX_CHARS or latest_turn(text) is not None:
        return [text]
    parts = [clause for sentence in _sentences(text) for clause in _clauses(sentence)]
    parts = _join_fragments([p.strip(" ,.;:!?") for p in parts if p.strip(" ,.;:!?")])
    if len(parts) < 2:
        return [text]
    return parts[:MAX_INTENTS]


def _sentences(text: str) -> list[str]:
    pieces, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        before = text[start:match.start()].rstrip("\"')]").rstrip(".!?").split()
        if before and before[-1].lower().rstrip(".") in ABBREVIATIONS:
            continue  # "Dr. Kim", "e.g. the"
        pieces.append(text[start:match.start()])
        start = match.end()
    pieces.append(text[start:])
    return [p for p in pieces if p.strip()]


def _clauses(sentence: str) -> list[str]:
    out = []
    for piece in _HARD_BREAK.split(sentence):
        out.extend(_soft_split(piece))
    return out


def _soft_split(piece: str) -> list[str]:
    """Split at "," / "and" only where an action follows and at least two words precede."""
    out, start = [], 0
    for match in _SOFT_BREAK.finditer(piece):
        before, after = piece[start:match.start()], piece[match.end():]
        if len(_WORD.findall(before)) >= 2 and opens_request(after):
            out.append(before)
            start = match.end()
    out.append(piece[start:])
    return out


def opens_request(text: str) -> bool:
    """True when `text` starts like a request: an action verb, maybe after a lead-in ("please", "also")."""
    lowered = text.strip().lower()
    for lead in LEAD_INS:  # "also please check" -> "check"
        if lowered.startswith(lead + " "):
            lowered = lowered[len(lead) + 1:].lstrip()
    if lowered.startswith(OPENERS):
        return True
    words = _WORD.findall(lowered)
    return bool(words) and words[0] in ACTIONS


def _join_fragments(parts: list[str]) -> list[str]:
    """Parts of fewer than MIN_WORDS words belong to the part before them (or after, for the first)."""
    out: list[str] = []
    for part in parts:
        if out and len(_WORD.findall(part)) < MIN_WORDS:
            out[-1] = f"{out[-1]} {part}"
        elif out and len(_WORD.findall(out[-1])) < MIN_WORDS:
            out[-1] = f"{out[-1]} {part}"
        else:
            out.append(part)
    return out


MERGES = ("max", "rrf")


@dataclass(frozen=True)
class IntentMerge:
    """How a multi-request task's rankings are merged (module doc). `depth`: how many tools each ranking
    contributes. `splitter`: text -> intents (the rule-based `split_intents`, or an LLM's)."""

    merge: str = "max"
    intent_weight: float = 1.0
    rrf_k: int = 60
    depth: int = 50
    late_chunk: bool = True
    splitter: Callable[[str], list[str]] = split_intents

    def __post_init__(self) -> None:
        if self.merge not in MERGES:
            raise ValueError(f"unknown intent merge {self.merge!r}; use one of {', '.join(MERGES)}")

    def to_dict(self) -> dict:
        return {"merge": self.merge, "intent_weight": self.intent_weight, "rrf_k": self.rrf_k, "depth": self.depth,
                "late_chunk": self.late_chunk}

    @classmethod
    def from_dict(cls, data: dict | None) -> "IntentMerge | None":
        if data is None:
            return None
        return cls(data.get("merge", "max"), float(data.get("intent_weight", 1.0)), int(data.get("rrf_k", 60)),
                   int(data.get("depth", 50)), bool(data.get("late_chunk", False)))  # saved before it: each alone

    def search(self, queries: Sequence[Query | str], k: int, search: Callable[[list[Query], int], Results]) -> Results:
        """`search(queries, k)` with every multi-request query also searched intent by intent and merged.
        Queries that are one request are answered by `search` itself, untouched."""
        queries = as_queries(queries)
        plans = [self._requests(q) for q in queries]
        if all(len(p) < 2 for p in plans):
            return search(list(queries), k)
        flat: list[Query] = []
        spans = []
        for query, intents in zip(queries, plans):
            spans.append((len(flat), len(flat) + 1 + (len(intents) if len(intents) > 1 else 0)))
            flat += [query] + (intents if len(intents) > 1 else [])
        found = search(flat, max(k, self.depth))
        ids, scores = [], []
        for start, end in spans:
            if end - start == 1:
                top_ids, top_scores = found[start]
                ids.append(top_ids[:k])
                scores.append(top_scores[:k])
                continue
            merged_ids, merged_scores = self._merge([found[i] for i in range(start, end)], k)
            ids.append(merged_ids)
            scores.append(merged_scores)
        return Results(tuple(ids), tuple(scores))

    def _requests(self, query: Query) -> list[Query]:
        """The query's requests; with `late_chunk`, each that is a stretch of the query's text remembers
        where (`Query.part`), so encoders pool it from the task's own forward pass (`encoders.late_chunk`)."""
        parts = self.splitter(query.text)
        if len(parts) < 2:  # one request: the query searches as it is
            return [query]
        return [query.part(p) if self.late_chunk else Query.of(p) for p in parts]

    def _merge(self, rankings: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """One ranking from the whole task's (first) and its requests' (ids, scores); ties keep the order
        in which tools were first met (the whole task's ranking first)."""
        fused: dict[str, float] = {}
        for position, (ids, scores) in enumerate(rankings):
            weight = 1.0 if position == 0 else self.intent_weight
            for rank, (tid, score) in enumerate(zip(ids[: self.depth], scores[: self.depth]), 1):
                if self.merge == "rrf":
                    fused[tid] = fused.get(tid, 0.0) + weight / (self.rrf_k + rank)
                else:
                    fused[tid] = max(fused.get(tid, -np.inf), float(score) * (1.0 if position == 0 else weight))
        ranked = sorted(fused.items(), key=lambda item: -item[1])[:k]
        return (np.asarray([t for t, _ in ranked], dtype=object),
                np.asarray([s for _, s in ranked], dtype=np.float32))
