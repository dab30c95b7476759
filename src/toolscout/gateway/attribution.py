"""Which search a forwarded call answers: the rule that turns the calls a gateway forwards into feedback.

A session's searches are remembered, newest last, each for the next `window` calls of that session. A call
is attributed to one of them, and becomes the feedback event (that search's task, the called tool):

- "holding" (the default): the newest remembered search whose results held the called tool; when none held
  it, nothing: a call of a tool the agent's searches did not show says nothing about what they were for
  (an agent that searched for "move a file" and then called `get-sum` taught "move a file" nothing);
- "latest": the newest remembered search, whatever it returned (opt-in: it credits unrelated calls);
- "off": calls teach nothing (explicit `record_tool_use` and `/feedback` still do).

A session is one client's: its MCP session, else its token (docs/gateway.md), so one client's calls only
ever teach that client's searches. A host whose gateway attached to another (bridge.py) brings the searches
it made through the previous owner of the index to the next one (`resume`): still its own, under its own
session. How the window was chosen, on simulated agents over the train splits:
docs/gateway.md.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Iterable

RULES = ("holding", "latest", "off")
DEFAULT_RULE = "holding"
DEFAULT_WINDOW = 8
MAX_SESSIONS = 10_000
SEARCHES_KEPT = 8


@dataclass
class _Search:
    task: str
    found: frozenset[str]
    calls: int = 0


@dataclass
class _Session:
    searches: deque = field(default_factory=lambda: deque(maxlen=SEARCHES_KEPT))


class CallAttribution:
    """See the module doc. Sessions are kept for the `MAX_SESSIONS` most recently active."""

    def __init__(self, rule: str = DEFAULT_RULE, window: int = DEFAULT_WINDOW):
        if rule not in RULES:
            raise ValueError(f"unknown attribution rule {rule!r}; known: {', '.join(RULES)}")
        if window < 1:
            raise ValueError(f"the attribution window must be at least one call, got {window}")
        self.rule, self.window = rule, window
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._lock = threading.Lock()

    def searched(self, session: str, task: str, found: Iterable[str]) -> None:
        """`session` searched for `task` and was shown the tools `found`."""
        if self.rule == "off":
            return
        with self._lock:
            self._session(session).searches.append(_Search(task, frozenset(found)))

    def resume(self, session: str, searches: Iterable[tuple[str, Iterable[str], int]]) -> None:
        """`session`'s searches as another gateway saw them, oldest first: (task, tools found, calls since); they
        replace what this one remembers of the session (a host attached to the previous owner of the index goes
        on here, and its next calls answer the searches it made there)."""
        if self.rule == "off":
            return
        with self._lock:
            kept = self._session(session).searches
            kept.clear()
            kept.extend(_Search(task, frozenset(found), max(0, calls)) for task, found, calls in searches)

    def called(self, session: str, tool_id: str) -> str | None:
        """The task `session`'s call of `tool_id` served, by the rule; None when no remembered search fits."""
        if self.rule == "off":
            return None
        with self._lock:
            state = self._sessions.get(session)
            if state is None:
                return None
            self._sessions.move_to_end(session)
            live = [s for s in state.searches if s.calls < self.window]
            for search in state.searches:
                search.calls += 1
            if not live:
                return None
            if self.rule == "holding":
                holding = [s for s in live if tool_id in s.found]
                return holding[-1].task if holding else None
            return live[-1].task

    def _session(self, session: str) -> _Session:
        state = self._sessions.get(session)
        if state is None:
            state = self._sessions[session] = _Session()
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session)
        return state
