"""The retriever contract and the registry that maps names to retriever classes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from ..artifacts import read_config, write_json
from ..encoders.contract import QueryEncoder
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
    """A new retriever `name` with constructor `options`; a text view may be given as its dict (`-o view=JSON`)."""
    if isinstance(options.get("view"), Mapping):
        options["view"] = TextView.from_dict(options["view"])
    return retriever_class(name)(**options)


def write_retriever_config(folder: Path, name: str, **config) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", {"kind": RETRIEVER_KIND, "format_version": FORMAT_VERSION,
                                        "retriever": name, **config})


def load_retriever(folder: str | Path) -> Retriever:
    """Load any saved retriever; its config names the class."""
    path, config = read_config(folder, kind=RETRIEVER_KIND, max_format=FORMAT_VERSION)
    return retriever_class(config["retriever"]).load(path)
