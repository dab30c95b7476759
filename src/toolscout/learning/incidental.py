"""What a request teaches: what it asks for, not the names, numbers and places that happen to be in it.

"Remember that Alice likes tea" taught the memory tool; "send Alice an email" must not find it nearer for
sharing "Alice". Before a request is remembered, the words that only say *which* thing it is about are left
out: numbers (times, dates, amounts, ids), quoted strings, addresses (URLs, e-mails, paths), and capitalised
words the catalog never uses (names of people and places). A capitalised word the catalog knows ("GitHub",
"Slack") says which tool, and stays. Only remembered requests are reduced this way; a task searched is read
as it came, so a paraphrase with other names still finds what taught a tool.
"""

from __future__ import annotations

import re
from typing import Container

_ADDRESS = re.compile(r"(?:https?://|www\.)\S+|[\w.+-]+@[\w-]+\.[\w.-]+|(?:~|\.{1,2})?/[\w.~-]+(?:/[\w.~-]*)+")
_QUOTED = re.compile(r"\"[^\"]{1,200}\"|'[^']{1,200}'|`[^`]{1,200}`|“[^”]{1,200}”")
_NUMBER = re.compile(r"[+-]?\$?\d[\d,.:/-]*(?:am|pm|st|nd|rd|th|k|m|%|s)?\b", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
_SENTENCE_END = re.compile(r"[.!?:\n]\s*$")
_SPACES = re.compile(r"\s+")


def teachable(request: str, known: Container[str]) -> str:
    """`request` without its incidental words (module doc); `known`: the catalog's words, lowercase."""
    text = _ADDRESS.sub(" ", request)
    text = _QUOTED.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    return _SPACES.sub(" ", _without_unknown_names(text, known)).strip() or request.strip()


def _without_unknown_names(text: str, known: Container[str]) -> str:
    out, last = [], 0
    for match in _WORD.finditer(text):
        word = match.group(0)
        starts_sentence = not text[:match.start()].strip() or bool(_SENTENCE_END.search(text[:match.start()]))
        if word[0].isupper() and not starts_sentence and word.lower() not in known:
            out.append(text[last:match.start()])
            last = match.end()
    out.append(text[last:])
    return "".join(out)


def words(text: str) -> list[str]:
    """The lowercase words of a text, as `teachable` compares them with the catalog's."""
    return [w.lower() for w in _WORD.findall(text)]
