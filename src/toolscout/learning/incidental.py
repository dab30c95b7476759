"""What a request teaches: what it asks for, not the numbers and addresses that happen to be in it.

"Remind me at 9:30 to call 555-0134" and "remind me at noon to call the bank" ask for the same thing. Before a
request is remembered, what only says *which* instance it is about is left out: numbers (times, dates,
amounts, ids), quoted strings, and addresses (URLs, e-mails, paths). Names of people, places and products stay:
measured on the dev sets, leaving out capitalised words the catalog does not use cost a tenth of what
learning gained on toollens ("Tesla", "Bitcoin" say which tool as much as "stocks" does), and what keeps a
shared name from lifting an unrelated task is the calibration (`calibration.py`): a name shared by unrelated
requests does not make them near enough to count. Only remembered requests are reduced; a task searched is
read as it came.
"""

from __future__ import annotations

import re
from typing import Iterable, TypeVar

Event = TypeVar("Event")  # a `feedback.FeedbackEvent` (this module sits below it)

_ADDRESS = re.compile(r"(?:https?://|www\.)\S+|[\w.+-]+@[\w-]+\.[\w.-]+|(?:~|\.{1,2})?/[\w.~-]+(?:/[\w.~-]*)+")
_QUOTED = re.compile(r"\"[^\"]{1,200}\"|'[^']{1,200}'|`[^`]{1,200}`|“[^”]{1,200}”")
_NUMBER = re.compile(r"[+-]?\$?\d[\d,.:/-]*(?:am|pm|st|nd|rd|th|k|m|%|s)?\b", re.IGNORECASE)
_SPACES = re.compile(r"\s+")
_LETTER = re.compile(r"[^\W\d_]")  # a letter of any script


def teachable(request: str) -> str:
    """`request` without its incidental parts (module doc); the request itself when nothing else is left (one
    quoted string, or a request remembered before `teaches_anything` kept those of numbers alone out)."""
    return _without_incidentals(request) or request.strip()


def teaches_anything(request: str) -> bool:
    """Whether `request` has a word once its numbers and addresses are left out. One that is only numbers,
    dates and addresses ("555-0134 10:47 2026-11-11") says which instance, not what is asked: near nothing any
    task asks for, it would lift its tool for every task made of numbers. It teaches nothing. A request that
    is one quoted string still teaches what the quotes hold (agents pass tasks quoted)."""
    return _LETTER.search(_NUMBER.sub(" ", _ADDRESS.sub(" ", request))) is not None


def teaching_events(events: Iterable[Event]) -> list[Event]:
    """The events that teach (not failures, and not requests of only numbers, dates or addresses): those scored
    and learned, by every storage alike."""
    return [e for e in events if e.teaches and teaches_anything(e.query)]


def _without_incidentals(request: str) -> str:
    text = _ADDRESS.sub(" ", request)
    text = _QUOTED.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    return _SPACES.sub(" ", text).strip()
