"""The retriever contract and the registry that maps names to retriever classes."""

from __future__ import annotations

import collections.abc
import inspect
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from ..artifacts import read_config, write_json
from ..encoders.contract import CachesQueries, QueryEncoder
from ..errors import InvalidRequest
from ..query import Query
from ..registry import lookup
from ..results import Filter, Results
from ..tool import TextView, Tool

RETRIEVER_KIND = "toolscout.retriever"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Accepts:
    """The settings a retriever's constructor takes, so that the CLI (and anything else that builds
    retrievers by name) passes each one only what it understands.

    `model`: a `model=` encoder name or path, or a model directory; `trained_by`: the `toolscout train`
    method whose directories `model=` may name (None: plain encoders only); `store`: `store=` (numpy,
    faiss:..., a PostgreSQL DSN); `view`: `view=` (a TextView, kept as its `view`: how it reads a tool);
    `encoder`: an already loaded `encoder=`, so one encoder can serve many indexes (an evaluation over
    several sets loads it once);
    `needs_trained_model`: it is its method only with a `trained_by` directory (mlc refuses to start
    without one; tool2vec without one, and without usage given in code, ranks by descriptions alone), so
    an evaluation or a refiner's first stage without one is refused."""

    model: bool = False
    trained_by: str | None = None
    needs_trained_model: bool = False
    store: bool = False
    view: bool = False
    encoder: bool = False


@runtime_checkable
class Retriever(Protocol):
    """A first stage: scores every tool of its catalog for a query.

    `add` inserts or replaces tools by id (an update), re-encoding only what changed; `remove` drops ids.
    `save(folder)` writes plain files plus a `config.json`; the class's `load(folder)` reads them back.
    `settings()` is what that `config.json` records besides the indexed data (the pipeline's saved
    configuration, `toolscout.spec`, is made of them).
    """

    name: str
    accepts: Accepts

    def index(self, tools: Sequence[Tool]) -> None:
        """Make `tools` the whole catalog (what was indexed before is dropped)."""

    def add(self, tools: Sequence[Tool]) -> None:
        """Insert tools, or replace those whose id is already indexed."""

    def remove(self, ids: Sequence[str]) -> None:
        """Drop `ids` from the catalog; unknown ids are ignored."""

    def search(self, queries: Sequence[Query | str], k: int = 10, filter: Filter | None = None) -> Results:
        """The k best tools for each query (`toolscout.query`: plain strings read as `Query.of` reads
        them), best first, restricted by `filter`."""

    def __len__(self) -> int:
        """How many tools are indexed."""

    def save(self, folder: Path) -> None:
        """Write the index into `folder` (plain files and a `config.json` naming the retriever)."""

    def settings(self) -> dict[str, Any]:
        """How it ranks, as plain JSON: what its `config.json` records besides the indexed data."""

    @classmethod
    def load(cls, folder: Path) -> "Retriever":
        """The retriever `save` wrote into `folder`."""


# Optional abilities: small protocols, checked with isinstance (never by probing for an attribute).

@runtime_checkable
class Composite(Protocol):
    """A retriever that fuses others (the hybrid)."""

    components: list[Retriever]


@runtime_checkable
class HasEncoder(Protocol):
    """A retriever built on an `encoder` (dense and its kin, and a classifier over a fine-tuned encoder):
    what retraining starts from."""

    encoder: Any


@runtime_checkable
class Encoding(HasEncoder, Protocol):
    """A retriever that embeds tools and tasks with an `encoder` and keeps the tool vectors in a `store`
    (dense, and the retrievers built on it): what the fast query tiers and first-stage vectors need.
    `query_encoder` encodes tasks instead of the encoder once a fast tier is in use (else None)."""

    store: Any
    query_encoder: QueryEncoder | None

    def use_fast_queries(self, kind: str = "table") -> None:
        """Encode tasks with that fast tier of the encoder (`encoders/fast.py`)."""


def parts(retriever: Retriever) -> list[Retriever]:
    """The retrievers a first stage is made of: a composite's components, else the retriever itself."""
    return list(retriever.components) if isinstance(retriever, Composite) else [retriever]


def encoding_parts(retriever: Retriever) -> list[Encoding]:
    """The parts of a first stage that embed with an encoder (the dense ones)."""
    return [part for part in parts(retriever) if isinstance(part, Encoding)]


def forget_task_vectors(retriever: Retriever) -> None:
    """Empty the query caches of what encodes a first stage's tasks, so that its next searches encode them:
    an encoder shared with another pipeline would otherwise hand this one the vectors of tasks the other
    already searched (an evaluation times each system as it would run alone)."""
    for part in encoding_parts(retriever):
        for encoder in (part.encoder, part.query_encoder):
            if isinstance(encoder, CachesQueries):
                encoder.query_cache.clear()


def task_encoders(retriever: Retriever) -> list[str]:
    """What encodes tasks for each dense part of a first stage (`encoders.fast.task_encoder`): for a
    server's stats."""
    from ..encoders.fast import task_encoder

    return [task_encoder(part.encoder, part.query_encoder) for part in encoding_parts(retriever)]


# name -> "module:Class"; imported on first use so `import toolscout` stays light.
REGISTRY: dict[str, str] = {
    "bm25": "toolscout.retrievers.bm25:BM25Retriever",
    "dense": "toolscout.retrievers.dense:DenseRetriever",
    "tool2vec": "toolscout.retrievers.tool2vec:Tool2VecRetriever",
    "mlc": "toolscout.retrievers.mlc:MLCRetriever",
    "toolclip": "toolscout.retrievers.toolclip:ToolCLIPRetriever",
    "hybrid": "toolscout.retrievers.hybrid:HybridRetriever",
}


def retriever_class(name: str):
    return lookup("retriever", name, REGISTRY)


def make_retriever(name: str, **options) -> Retriever:
    """A new retriever `name` with constructor `options`; a text view may be given as its dict (`-o view=JSON`).
    A setting the retriever does not take, or a value of the wrong type, is an InvalidRequest naming it."""
    cls = retriever_class(name)
    if isinstance(options.get("view"), Mapping):
        options["view"] = TextView.from_dict(options["view"])
    check_settings(f"the {name} retriever", cls.__init__, options)
    return cls(**options)


def check_settings(what: str, constructor: Any, options: Mapping[str, Any]) -> None:
    """Refuse, before anything is built, the `options` that `constructor` does not name (unless it takes
    any keyword) and those whose values its annotations rule out: a value that is neither, passed on, failed
    deep in the build with a TypeError, or was saved with the index and failed every search after."""
    parameters = inspect.signature(constructor).parameters
    named = {n: p for n, p in parameters.items() if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        unknown = sorted(set(options) - set(named))
        if unknown:
            raise BadSetting(unknown[0], f"{what}: unknown setting(s) {', '.join(map(repr, unknown))}; it takes "
                                         f"{', '.join(sorted(named))}")
    check_types(what, constructor, options)


def check_types(what: str, annotated: Any, options: Mapping[str, Any], noun: str = "setting") -> None:
    """Refuse the `options` whose values the annotations of `annotated` (a function, or a class whose fields
    are its settings) rule out, naming the `noun`, its value and the type wanted: the one check of every
    named setting's type (retriever settings, trainer options)."""
    try:
        hints = typing.get_type_hints(annotated)
    except NameError:  # an annotation names what only a type checker imports: its types go unchecked
        hints = {}
    for key, value in options.items():
        if key in hints and not _fits(value, hints[key]):
            raise BadSetting(key, f"{what}: {noun} {key}={value!r} is not {_describe(hints[key])}")


class BadSetting(InvalidRequest):
    """A constructor setting that is unknown, or of the wrong type; `key` names it."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _fits(value: Any, hint: Any) -> bool:
    """Whether `value` can be what the annotation `hint` says (loosely: a container's items are not read)."""
    origin = typing.get_origin(hint)
    if hint is Any or isinstance(hint, typing.TypeVar):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:  # an int is a number too; a bool is not meant as one
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is str:  # a path object names a model or file as well as its text does
        return isinstance(value, (str, os.PathLike))
    kind = origin or hint
    if kind in (collections.abc.Sequence, list, tuple):
        return isinstance(value, (list, tuple))
    if kind in (collections.abc.Mapping, dict):
        return isinstance(value, Mapping)
    if kind in (bool, Path) or not isinstance(kind, type):
        return not isinstance(kind, type) or isinstance(value, kind)
    # an object of toolscout's (an encoder, a store, a view) may be any that behaves as one; what -o or a
    # JSON request can give (text, numbers, lists, objects) never is
    return not isinstance(value, (str, int, float, bool, list, tuple, Mapping))


def _describe(hint: Any) -> str:
    """The annotation `hint` in words, for an error."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in typing.get_args(hint))
    words = {float: "a number", int: "a whole number", str: "a string", bool: "true or false", type(None): "null"}
    if hint in words:
        return words[hint]
    kind = typing.get_origin(hint) or hint
    if kind in (collections.abc.Sequence, list, tuple):
        return "a list"
    if kind in (collections.abc.Mapping, dict):
        return "an object"
    return f"a {getattr(kind, '__name__', kind)}"


def write_retriever_config(folder: Path, name: str, **config) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", {"kind": RETRIEVER_KIND, "format_version": FORMAT_VERSION,
                                        "retriever": name, **config})


def load_retriever(folder: str | Path) -> Retriever:
    """Load any saved retriever; its config names the class."""
    path, config = read_config(folder, kind=RETRIEVER_KIND, max_format=FORMAT_VERSION)
    return retriever_class(config["retriever"]).load(path)
