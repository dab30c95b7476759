"""Docstrings → description, per-parameter text, return text and examples.

Three common styles are read: Google (`Args:` / `Returns:` / `Examples:` headers, `name (type): text`
entries), NumPy (`Parameters` underlined with dashes, `name : type` entries with indented text) and
reST fields (`:param name:`, `:param type name:`, `:returns:`). The description is the first paragraph
before any section; continuation lines are joined with single spaces.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

_PARAMS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "other parameters"}
_RETURNS = {"returns", "return", "yields", "yield"}
_EXAMPLES = {"example", "examples"}
_OTHER = {"raises", "note", "notes", "warning", "warnings", "see also", "references", "attributes", "todo"}
_KNOWN = _PARAMS | _RETURNS | _EXAMPLES | _OTHER
# Each pattern has one way to match a run of spaces: two adjacent quantifiers that could both take it
# (`[A-Za-z ]*?\s*:`, `\s*(...)?\s*:`) made a long run of spaces without the colon take quadratic time.
_GOOGLE_HEADER = re.compile(r"^([A-Za-z]+(?: +[A-Za-z]+)*)\s*:\s*$")
_DASHES = re.compile(r"^-{3,}\s*$")
_REST_FIELD = re.compile(r"^:(param|parameter|arg|argument|key|keyword|type|returns?|rtype|raises?|yields?)\b")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_]\w*)\s*(?:\(([^)]*)\)\s*)?:\s*(.*)$")
_NUMPY_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_]\w*)((?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s*(?::.*)?$")


@dataclass(frozen=True)
class Docstring:
    description: str = ""
    params: dict[str, str] = field(default_factory=dict)
    returns: str = ""
    examples: tuple[str, ...] = ()


def parse_docstring(doc: str) -> Docstring:
    sections = _split_sections(textwrap.dedent(doc).strip("\n").splitlines())
    params: dict[str, str] = {}
    returns, examples = "", []
    for (name, style), body in sections[1:]:
        if name in _PARAMS:
            params.update(_numpy_entries(body) if style == "numpy" else _google_entries(body))
        elif name in _RETURNS:
            returns = returns or _return_text(body, style)
        elif name in _EXAMPLES:
            text = textwrap.dedent("\n".join(body)).strip()
            if text:
                examples.append(text)
        elif name == "rest":
            rest_params, rest_returns = _rest_fields(body)
            params.update(rest_params)
            returns = returns or rest_returns
    return Docstring(_first_paragraph(sections[0][1]), params, returns, tuple(examples))


def _split_sections(lines: list[str]) -> list[tuple[tuple[str | None, str], list[str]]]:
    """[(section key, body lines)]; the first entry (None) is the text before any section."""
    sections: list[tuple[tuple[str | None, str], list[str]]] = [((None, ""), [])]
    i = 0
    while i < len(lines):
        line, stripped = lines[i], lines[i].strip()
        header = _GOOGLE_HEADER.match(stripped) if line == line.lstrip() else None
        if header and header.group(1).lower() in _KNOWN:
            sections.append(((header.group(1).lower(), "google"), []))
        elif (line == line.lstrip() and stripped.lower() in _KNOWN and i + 1 < len(lines)
              and _DASHES.match(lines[i + 1].strip())):
            sections.append(((stripped.lower(), "numpy"), []))
            i += 1  # skip the dashes
        elif _REST_FIELD.match(stripped) and sections[-1][0][0] != "rest":
            sections.append((("rest", "rest"), [line]))
        else:
            sections[-1][1].append(line)
        i += 1
    return sections


def _first_paragraph(lines: list[str]) -> str:
    paragraph: list[str] = []
    for line in lines:
        if not line.strip():
            if paragraph:
                break
            continue
        paragraph.append(line.strip())
    return " ".join(paragraph)


def _base_indent(body: list[str]) -> int:
    return min((len(x) - len(x.lstrip()) for x in body if x.strip()), default=0)


def _google_entries(body: list[str]) -> dict[str, str]:
    entries: dict[str, str] = {}
    base, current = _base_indent(body), None
    for line in body:
        if not line.strip():
            continue
        match = _GOOGLE_ENTRY.match(line.strip())
        if len(line) - len(line.lstrip()) == base and match:
            current = match.group(1)
            entries[current] = match.group(3).strip()
        elif current:
            entries[current] = f"{entries[current]} {line.strip()}".strip()
    return entries


def _numpy_entries(body: list[str]) -> dict[str, str]:
    entries: dict[str, list[str]] = {}
    base, names = _base_indent(body), []
    for line in body:
        if not line.strip():
            continue
        match = _NUMPY_ENTRY.match(line.strip())
        if len(line) - len(line.lstrip()) == base and match:
            names = [match.group(1)] + re.findall(r"[A-Za-z_]\w*", match.group(2) or "")
            for name in names:
                entries[name] = []
        else:
            for name in names:
                entries[name].append(line.strip())
    return {name: " ".join(text) for name, text in entries.items()}


def _return_text(body: list[str], style: str) -> str:
    lines = [x for x in body if x.strip()]
    if not lines:
        return ""
    if style == "numpy":  # `type` line(s) at the base indent, description indented under them
        base = _base_indent(lines)
        described = [x.strip() for x in lines if len(x) - len(x.lstrip()) > base]
        return " ".join(described) if described else " ".join(x.strip() for x in lines)
    text = " ".join(x.strip() for x in lines)
    typed = re.match(r"^([A-Za-z_][\w\[\],.| ]*?):\s+(.+)$", text)
    if typed and " " not in typed.group(1).replace(", ", ","):  # `bool: True if ...` → the text
        return typed.group(2)
    return text


def _rest_fields(body: list[str]) -> tuple[dict[str, str], str]:
    params: dict[str, str] = {}
    returns = ""
    fields: list[list[str]] = []
    for line in body:
        if _REST_FIELD.match(line.strip()):
            fields.append([line.strip()])
        elif fields and line.strip():
            fields[-1].append(line.strip())
    for parts in fields:
        head, _, text = " ".join(parts)[1:].partition(":")
        words = head.split()
        text = text.strip()
        if words[0] in ("param", "parameter", "arg", "argument", "key", "keyword") and len(words) >= 2:
            params[words[-1]] = text
        elif words[0] in ("returns", "return", "yields", "yield"):
            returns = returns or text
    return params, returns
