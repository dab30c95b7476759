"""One task as every stage reads it: made once where a task comes in, and passed down as it is.

A task's meaning for search is settled here and nowhere else:
- what search reads of it (`conversation.focus`: a long task's latest turns or its beginning, blobs out);
- its latest user turn, when it is a chat transcript (`conversation.latest_turn`), which the encoders
  and BM25 weigh in, and the recent turns the encoders read as its context (`Query.context`);
- for a request cut from a longer task (`toolscout.intents`), the task and where in it: encoders that
  pool token vectors embed the request from the task's own forward pass (`encoders.late_chunk`).

`Query` is not a `str`, so nothing can drop the last two by turning it into text: code that wants the
words asks for `query.text`. Every stage accepts plain strings too (`as_queries`), read as `Query.of`
reads them, so a retriever or encoder called directly ranks a task exactly as the pipeline does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Hashable, Sequence

from .conversation import focus, latest_turn, recent_turns


@dataclass(frozen=True)
class Query:
    """`text`: what search reads; `latest_turn`: its latest user turn and what follows (None: not a
    transcript); `truncated`: whether focusing cut anything from the task as sent; `within`: for a request
    cut from a task, (task text, start, end) with `text == task[start:end]`."""

    text: str
    latest_turn: str | None = None
    truncated: bool = False
    within: tuple[str, int, int] | None = None

    @classmethod
    def of(cls, task: str) -> "Query":
        """A task as a caller sent it."""
        if not isinstance(task, str):
            raise TypeError(f"a task is text, got {type(task).__name__}")
        text, truncated = focus(task)
        return cls(text, latest_turn(text), truncated)

    def part(self, request: str) -> "Query":
        """A request cut from this task: it remembers where when the task's text contains it (its first
        occurrence), else it is a task of its own."""
        start = self.text.find(request) if request else -1
        if start < 0:
            return Query.of(request)
        return Query(request, latest_turn(request), False, (self.text, start, start + len(request)))

    @cached_property
    def context(self) -> str:
        """What an encoder embeds as the task itself: its text, or a transcript's recent turns
        (`conversation.recent_turns`; its latest turn weighs in besides)."""
        return self.text if self.latest_turn is None else recent_turns(self.text)

    @property
    def cache_key(self) -> Hashable:
        """What this query's vector depends on: its context and latest turn (which weighs in), or for a
        request the task and the span too (the same words cut from two tasks pool different token vectors)."""
        return (self.context, self.latest_turn) if self.within is None else ("part", *self.within)


def as_queries(queries: Sequence[str | Query]) -> list[Query]:
    """`queries` as `Query` objects (plain strings read as `Query.of` reads them). A lone string is refused:
    it would be read as a list of one-character tasks."""
    if isinstance(queries, (str, Query)):
        raise TypeError("takes a list of queries; wrap a single query in a list")
    return [q if isinstance(q, Query) else Query.of(q) for q in queries]
