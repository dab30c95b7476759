"""Tools that say they are deprecated, the tool that replaces each, and the rule that ranks a deprecated
tool just below its replacement.

A tool is deprecated when its definition says so:
- MCP annotations `{"deprecated": true}` (or a message, which may name the replacement), or a top-level
  `"deprecated"` in `Tool.raw`: the OpenAPI parser puts an operation's `deprecated: true` there (the
  operation itself is kept deeper, under `raw["operation"]`);
- its own description: it opens with "Deprecated" (`DEPRECATED: use read_text_file instead.`,
  `[Deprecated] ...`), a sentence does (`Read a file. DEPRECATED: Use read_text_file instead.`), or it says
  "this tool (function, endpoint, operation, method, API, command) is deprecated". A *parameter* said to be
  deprecated (`PublicIp (string) - Deprecated.`) does not make its tool deprecated.

The replacement is the name given with "use X instead", "in favo(u)r of X", "superseded by X",
"replaced by X" or "use X" in the same text. The rule applies only where that name is a tool of the same
catalog (`rank_below_replacements`): a deprecated tool whose replacement the catalog lacks ranks as it did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from .tool import Tool

_NAME = r"[`'\"]?([A-Za-z_][\w.\-/:]*[\w])[`'\"]?"
_OPENS = re.compile(r"^\W{0,3}deprecated\b", re.IGNORECASE)
_SENTENCE_OPENS = re.compile(r"(?:^|[.!?]\s+|\n\s*)\W{0,3}deprecated\b", re.IGNORECASE)
_SAYS = re.compile(r"\b(?:this|the)\s+(?:tool|function|endpoint|operation|method|api|command)\s+"
                   r"(?:is|has been)\s+(?:now\s+)?deprecated\b", re.IGNORECASE)
_REPLACEMENT = [re.compile(pattern, re.IGNORECASE) for pattern in (
    rf"\buse\s+(?:the\s+)?{_NAME}(?:\s+(?:tool|function|endpoint|operation|method|command))?\s+instead\b",
    rf"\bin\s+favou?r\s+of\s+(?:the\s+)?{_NAME}",
    rf"\b(?:superseded|replaced)\s+by\s+(?:the\s+)?{_NAME}",
    rf"\buse\s+(?:the\s+)?{_NAME}",
)]


@dataclass(frozen=True)
class Deprecation:
    """A tool's word that it is deprecated; `replacement`: the name it gives for its successor, or None."""

    replacement: str | None = None


def deprecation_of(tool: Tool) -> Deprecation | None:
    """What `tool`'s definition says of its deprecation (see the module doc), or None when it says nothing."""
    said = _said_in_definition(tool.raw)
    description = tool.description or ""
    if said is None and not (_OPENS.search(description) or _SENTENCE_OPENS.search(description)
                             or _SAYS.search(description)):
        return None
    for text in (said or "", description):
        name = replacement_named(text)
        if name is not None and name not in (tool.name, tool.id):
            return Deprecation(name)
    return Deprecation()


def _said_in_definition(raw: Any) -> str | None:
    """"" or the message when the original definition marks the tool deprecated (MCP annotations, OpenAPI)."""
    if not isinstance(raw, Mapping):
        return None
    annotations = raw.get("annotations")
    for flag in ((annotations or {}).get("deprecated") if isinstance(annotations, Mapping) else None,
                 raw.get("deprecated")):
        if flag is True:
            return ""
        if isinstance(flag, str) and flag.strip():
            return flag
    return None


def replacement_named(text: str) -> str | None:
    """The tool name `text` gives as the replacement ("use X instead", "in favour of X"...), or None."""
    for pattern in _REPLACEMENT:
        found = pattern.search(text)
        if found:
            return found.group(1).rstrip(".:/-")
    return None


def rank_below_replacements(ids: np.ndarray, scores: np.ndarray,
                            replacement: Callable[[str], str | None]) -> tuple[np.ndarray, np.ndarray]:
    """One ranking (best first) with each deprecated tool just below its replacement: `replacement(id)` is
    the id of the tool that replaces `id` (in the catalog and allowed here), or None for a tool that is not
    deprecated or has none. A replacement ranked lower, or not at all, takes the deprecated tool's place and
    score; the deprecated tool follows, scored halfway to the next one. The list keeps its length."""
    order, values = list(ids), [float(s) for s in scores]
    length = len(order)
    position = 0
    while position < len(order):
        successor = replacement(order[position])
        if successor is None or successor in order[:position]:
            position += 1
            continue
        if successor in order:
            at = order.index(successor)
            del order[at], values[at]
        order.insert(position, successor)
        values.insert(position, values[position])
        after = values[position + 2] if position + 2 < len(values) else values[position]
        values[position + 1] = (values[position] + after) / 2.0
        position += 2
    return np.asarray(order[:length], dtype=object), np.asarray(values[:length], dtype=np.float32)
