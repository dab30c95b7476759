"""The fast tiers: what encodes a dense retriever's tasks instead of its encoder, for more searches per core.

- "table": the static word-piece table distilled from the encoder (`static.py`): a sum of rows, the
  cheapest by far, and the most quality lost;
- "student": the query student distilled from the encoder (`students.py`): a transformer with four of the
  six layers, cheaper than the encoder, and less quality lost.

What each costs and loses, measured: docs/serving.md.

Both leave the tools on the encoder's vectors and learning from feedback on the encoder. Each raises a
`FastQueriesUnavailable` that says why when it cannot serve an encoder.
"""

from __future__ import annotations

from typing import Any

from ..errors import FastQueriesUnavailable  # noqa: F401  (raised by the tiers; imported from here too)
from .static import StaticQueryEncoder, static_queries_for
from .students import query_student_for

KINDS = ("table", "student")
TIER_NAMES = {"table": "the static query table", "student": "the query student"}  # each tier, in a message


def fast_query_kind(value: bool | str | None) -> str | None:
    """The fast tier a setting names: None for none (False, None), "table" for True (the first fast tier,
    kept for callers that pass a flag), or one of `KINDS`."""
    if value is None or value is False:
        return None
    if value is True:
        return "table"
    if value not in KINDS:
        raise ValueError(f"unknown fast-queries tier {value!r}; use one of {', '.join(KINDS)}")
    return value


def fast_queries_for(encoder, kind: str):
    """What encodes `encoder`'s tasks in the fast tier `kind` (a `QueryEncoder`, `encoders/contract.py`)."""
    if fast_query_kind(kind) == "student":
        return query_student_for(encoder)
    return static_queries_for(encoder)


def tier_of(query_encoder: Any) -> str | None:
    """The fast tier a dense retriever's `query_encoder` is ("table", "student"), or None for the encoder."""
    if query_encoder is None:
        return None
    return "table" if isinstance(query_encoder, StaticQueryEncoder) else "student"


def task_encoder(encoder, query_encoder: Any = None) -> str:
    """What encodes tasks for a retriever whose tools `encoder` embeds, with its fast tier's
    `query_encoder` (None: the encoder itself): for a server's stats."""
    tier = tier_of(query_encoder)
    if tier is None:
        return str(encoder.name)
    if tier == "table":
        return f"static table of {encoder.name}"
    return f"{query_encoder.name} (query student of {encoder.name})"
