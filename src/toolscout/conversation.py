"""Tasks written as chat transcripts: find the latest user turn, and give recent turns the weight.

An agent often hands toolscout the conversation so far rather than one request:

    User: Can you move my appointment with Dr. Kim to March 26th?
    AI: Done.
    User: Can you also check my health data for the past week?
    AI: Sure, what is your user ID?

The tool needed is the one for the latest request (here: health data), but a reading of the whole
transcript is dominated by whatever the earlier turns talked about, and the more of them there are, the
more they dominate. The latest turn alone is not enough either: it is often a follow-up ("My user ID is
J46801") whose meaning lives in the turns just before it. So search reads a transcript by recency:
- an encoder's query vector is the normalised sum of two unit vectors, the transcript's recent part
  (`recent_turns`: its latest turns, up to `RECENT_CHARS`) and its tail (the last user turn and the
  replies after it): q = (e(recent) + w·e(tail)) / ‖e(recent) + w·e(tail)‖, with w = `LATEST_TURN_WEIGHT`
  = 1 (equal weight: no tuned constant). Without the cut, the encoder's window would keep the
  transcript's oldest turns and drop its newest;
- BM25 weighs each word by the turn it is in (`turn_weights`): the latest turn's words count twice, the
  turn before it half, and each earlier one half of the one after it (`EARLIER_TURN_DECAY`), so ten turns
  about the weather do not outvote the one request to send an email.
A text that is not a transcript with at least two turns is read as it is.

A transcript is recognised by lines that start with a speaker label, case-insensitive: `User:`,
`Human:`, `Customer:` for the user; `AI:`, `Assistant:`, `System:`, `Bot:`, `Agent:`, `Tool:`,
`Function:` for the rest. A user turn with nothing after its label (a prompt template's open
`User:` line) is not the latest turn; the last one with words is.

The two constants were chosen on transcripts built from the train splits of four dev sets (earlier
requests of other tools before the one to rank; `benchmarks/transcripts.py`); apibank's real
dialogues are the check.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

LATEST_TURN_WEIGHT = 1.0
RECENT_CHARS = 400  # what of a transcript its recent-part vector reads (about 90 word pieces)
EARLIER_TURN_DECAY = 0.5  # BM25: each user turn back counts this much of the turn after it

_USER = r"user|human|customer"
_OTHER = r"ai|assistant|system|bot|agent|tool|function"
_TURN = re.compile(rf"^[ \t]*(?:{_USER}|{_OTHER})[ \t]*:", re.IGNORECASE | re.MULTILINE)
_USER_TURN = re.compile(rf"^[ \t]*(?:{_USER})[ \t]*:", re.IGNORECASE | re.MULTILINE)


def latest_turn(text: str) -> str | None:
    """The last user turn that says something, and everything after it, when `text` is a transcript of
    two or more turns and that turn is not its first line; otherwise None (the text is one request)."""
    if len(_TURN.findall(text)) < 2:
        return None
    spoken = [m for m in _USER_TURN.finditer(text) if _turn_words(text, m.end())]
    if not spoken or spoken[-1].start() == _TURN.search(text).start():
        return None  # no user turn, or the only one opens the text: the tail would be the whole text
    return text[spoken[-1].start():].strip()


def _turn_words(text: str, after_label: int) -> str:
    """What a turn says: from its label to the next speaker label (or the end), stripped."""
    following = _TURN.search(text, after_label)
    return text[after_label:following.start() if following else len(text)].strip()


def user_turns(text: str) -> list[str]:
    """`text` cut before each user turn that says something, oldest first: each user turn with the replies
    after it, and what comes before the first one (a system prompt) as a piece of its own, older than every
    turn. A text without user turns is one piece."""
    starts = [m.start() for m in _USER_TURN.finditer(text) if _turn_words(text, m.end())]
    if not starts:
        return [text]
    if text[:starts[0]].strip():
        starts.insert(0, 0)
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]


def turn_weights(text: str) -> list[tuple[str, float]]:
    """The pieces of a task with the weight its words get in lexical scoring (module doc): a text that is not
    a transcript is one piece of weight 1; a transcript's pieces (`user_turns`) weigh 2 for the latest user
    turn, then 1/2, 1/4, ... going back (a system prompt counts as the oldest). Speaker labels are removed."""
    if latest_turn(text) is None:
        return [(text, 1.0)]
    turns = user_turns(text)
    last = len(turns) - 1
    return [(without_speaker_labels(turn), 2.0 if i == last else EARLIER_TURN_DECAY ** (last - i))
            for i, turn in enumerate(turns)]


def recent_turns(text: str, limit: int | None = None) -> str:
    """What an encoder reads as a transcript's context: its latest whole turns while they fit in `limit`
    characters (default `RECENT_CHARS`; `focus`). When the latest user turn and its replies alone are
    longer, that is only the replies that fit (the latest turn's own vector, which is added, still reads the
    turn). A text that is not a transcript is returned whole."""
    if latest_turn(text) is None:
        return text
    return focus(text, RECENT_CHARS if limit is None else limit)[0]


def without_speaker_labels(text: str) -> str:
    """`text` with the speaker labels at its line starts removed (for lexical scoring)."""
    return _TURN.sub("", text)


def emphasise_latest_turn(vectors: np.ndarray, tails: Sequence[str | None], encode: Callable[[list[str]], np.ndarray],
                          weight: float = LATEST_TURN_WEIGHT) -> np.ndarray:
    """Query vectors with each transcript's latest turn mixed in (module doc). `vectors` are the queries'
    unit vectors; `tails` their latest turns (None: not a transcript; `Query.latest_turn`); `encode` embeds
    a list of texts to unit rows. Rows without a tail are returned as they are."""
    if weight <= 0 or len(tails) == 0:
        return vectors
    found = [(i, tail) for i, tail in enumerate(tails) if tail is not None]
    if not found:
        return vectors
    rows = [i for i, _ in found]
    mixed = vectors[rows] + weight * encode([tail for _, tail in found])
    norms = np.linalg.norm(mixed, axis=1, keepdims=True)
    out = np.array(vectors, dtype=np.float32, copy=True)
    out[rows] = mixed / np.maximum(norms, 1e-12)
    return out


# --------------------------------------------------------------------------------- long tasks

FOCUS_CHARS = 2000  # what a search reads of a task at most: MiniLM reads 256 word pieces (~1,000-1,500
# characters), and BM25 reads the same text, so a longer task only costs time
_BLOB = re.compile(r"\S{200,}")  # base64 images, encoded files, minified code: no words to search by


def focus(text: str, limit: int = FOCUS_CHARS) -> tuple[str, bool]:
    """The part of a long task that search reads, and whether anything was cut.

    Runs of 200 or more characters without white space (an image in base64, an encoded file) are dropped.
    What is left, if longer than `limit`: a chat transcript keeps its latest turns (the latest user turn
    and what follows it, then earlier turns while they fit), since the tool needed is the newest
    request's; any other text keeps its beginning, cut at a word boundary."""
    if len(text) <= limit and not _BLOB.search(text):
        return text, False
    text = _BLOB.sub(" ", text).strip()
    if len(text) <= limit:
        return text, True
    starts = [m.start() for m in _TURN.finditer(text)]
    if latest_turn(text) is not None and len(starts) > 1:
        kept = len(text)
        for start in reversed(starts):  # whole turns from the end, while they fit
            if len(text) - start > limit and kept < len(text):
                break
            kept = start
        text = text[kept:]
        if len(text) <= limit:
            return text.strip(), True
    head = text[:limit]
    if not (text[limit].isspace() or head[-1].isspace()) and any(c.isspace() for c in head):  # no half word
        head = head.rsplit(None, 1)[0]
    return head.strip(), True
