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

_ADDRESS = re.compile(r"(?:https?://|www\.)\S+|[\w.+-]+@[\w-]+\.[\w.-]+|(?:~|\.{1,2})?/[\w.~-]+(?:/[\w.~-]*)+")
_QUOTED = re.compile(r"\"[^\"]{1,200}\"|'[^']{1,200}'|`[^`]{1,200}`|“[^”]{1,200}”")
_NUMBER = re.compile(r"[+-]?\$?\d[\d,.:/-]*(?:am|pm|st|nd|rd|th|k|m|%|s)?\b", re.IGNORECASE)
_SPACES = re.compile(r"\s+")


def teachable(request: str) -> str:
    """`request` without its incidental parts (module doc)."""
    text = _ADDRESS.sub(" ", request)
    text = _QUOTED.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    return _SPACES.sub(" ", text).strip() or request.strip()
