"""A pipeline's saved configuration (`PipelineSpec`): how it ranks, apart from where its tools, vectors and
learned state live.

A deployment is one saved pipeline configuration plus a storage backend. `ToolScout.save` writes the spec
into the directory's `config.json`; `toolscout index --store` and `toolscout migrate` record it in the
PostgreSQL index table's configuration (`store/pg_config.py`); and every deployment builds its pipeline from
it through one factory, `ToolScout.build`. Only the retrievers' indexed data comes from the backend: a
directory's files, or a tenant's rows (`toolscout.pg_pipeline`).

What it holds:
- `retriever`: the first stage as a tree of nodes `{"name", "settings", "components"}`: each retriever's
  `settings()` (what its own `config.json` records besides indexed data, less where its vectors are stored),
  and a hybrid's components in order;
- `intents`: how multi-request tasks are split and merged (`IntentMerge.to_dict`; None: never);
- `reranker`: the second stage's own `config.json` (a reference to its model directory or LLM endpoint), or None;
- `fast_queries`: the fast tier that encodes tasks ("table", "student"), or None.

Learned state, and the operator's learning settings, are the learning channel's own (`toolscout.learning`):
each backend keeps them beside the catalog, per tenant, and they change while the pipeline serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from .artifacts import CONFIG, read_config, read_json
from .retrievers.base import Composite, Retriever, retriever_class

PIPELINE_KIND = "toolscout.pipeline"
# the format version of a pipeline directory's config.json. 2: the feedback ledger keeps each event's time and
# untaught rank and the learned channel each lesson; a toolscout that reads up to 1 misread them (a traceback
# in feedback.json), and now says to upgrade instead. Format 1 directories are read as before. 3: a text view
# may read descriptions as plain text (`TextView.descriptions`), which a toolscout reading up to 2 failed on
# with a TypeError; formats 1 and 2 are read as before (their views read descriptions as written).
PIPELINE_FORMAT = 3


def read_pipeline_config(folder: str | Path) -> tuple[Path, dict[str, Any]]:
    """A pipeline directory's live version folder and config, checked: its kind, and a format this toolscout
    reads (every reader of a pipeline directory comes here, so none refuses a format the others read)."""
    return read_config(folder, kind=PIPELINE_KIND, max_format=PIPELINE_FORMAT)


# what a retriever's config.json records about where its vectors are stored: the backend's, never the spec's
STORAGE_SETTINGS = ("store", "store_kind")
_CONFIG_KEYS = ("kind", "format_version", "retriever", "components")  # a config.json's frame, not settings

# builds one leaf of the first stage: (its node, its folder inside the retriever's, e.g. "component1")
LeafSource = Callable[[Mapping[str, Any], str], Retriever]


@dataclass(frozen=True)
class PipelineSpec:
    """See the module doc."""

    retriever: dict
    intents: dict | None = None
    reranker: dict | None = None
    fast_queries: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"retriever": self.retriever, "intents": self.intents, "reranker": self.reranker,
                "fast_queries": self.fast_queries}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PipelineSpec":
        return cls(dict(data["retriever"]), data.get("intents"), data.get("reranker"), data.get("fast_queries"))

    @classmethod
    def describe(cls, retriever: Retriever, intents: Any = None, reranker: Any = None,
                 fast_queries: str | None = None) -> "PipelineSpec":
        """The spec of a pipeline made of these parts (`intents`: an IntentMerge or its dict; `reranker`: a
        Reranker or its config)."""
        from .rerank.base import reranker_config

        if reranker is not None and not isinstance(reranker, Mapping):
            reranker = reranker_config(reranker)
        if intents is not None and not isinstance(intents, Mapping):
            intents = intents.to_dict()
        return cls(node_of(retriever), None if intents is None else dict(intents),
                   None if reranker is None else dict(reranker), fast_queries)

    @classmethod
    def read(cls, folder: Path, config: Mapping[str, Any]) -> "PipelineSpec":
        """The spec of the pipeline directory version `folder` (its `config` read): as saved, or, for a
        directory saved before specs were, as its files describe it."""
        if config.get("pipeline"):
            return cls.from_dict(config["pipeline"])
        reranker = folder / "reranker" / "config.json"
        return cls(_node_of_folder(folder / "retriever"), config.get("intents"),
                   read_json(reranker) if reranker.exists() else None, config.get("fast_queries"))

    def first_stage(self, leaf: LeafSource) -> Retriever:
        """The first stage this spec describes: each leaf made by `leaf`, composites made here from their
        settings (so a directory's and a database's hybrid fuse alike)."""
        return _build(self.retriever, "", leaf)

    def make_reranker(self) -> Any:
        """The reranker the spec refers to, loaded (None when there is none)."""
        from .rerank.base import reranker_from_config

        return None if self.reranker is None else reranker_from_config(self.reranker)

    def check_saved(self, folder: Path) -> None:
        """Read the `config.json` of each composite of the first stage saved under `folder` (a directory's
        `retriever/`): loading needs none of them (the spec has their settings), but an older toolscout reads
        them, and one that is damaged is a damaged directory, to be told now rather than ignored."""
        for where in _composites(self.retriever, ""):
            read_json(folder / where / CONFIG)

    def leaves(self) -> list["Leaf"]:
        """Every leaf of the first stage, in order."""
        return list(_leaves(self.retriever, "", ""))


@dataclass(frozen=True)
class Leaf:
    """A first-stage retriever that is no composite: `folder` is where a directory keeps it inside
    `retriever/` ("" for the retriever itself, "component1", ...); `where` names it for people."""

    folder: str
    where: str
    node: dict


def differences(there: Any, here: Any, path: str = "") -> list[str]:
    """Where two specs (as dicts) differ, one line per setting: "path: there's value, here's value"."""
    return [f"{where}: {a!r} there, {b!r} here" for where, a, b in changes(there, here, path)]


def changes(there: Any, here: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Where two specs (as dicts) differ, one (path, there's value, here's value) per setting."""
    if isinstance(there, Mapping) and isinstance(here, Mapping):
        return [change for key in sorted(set(there) | set(here), key=str)
                for change in changes(there.get(key), here.get(key), f"{path}.{key}".lstrip("."))]
    if isinstance(there, list) and isinstance(here, list) and len(there) == len(here) and path.endswith("components"):
        return [change for i, (a, b) in enumerate(zip(there, here)) for change in changes(a, b, f"{path}[{i}]")]
    return [] if there == here else [(path, there, here)]


def node_of(retriever: Retriever) -> dict[str, Any]:
    """A first stage as a spec's tree (see the module doc)."""
    node = {"name": retriever.name, "settings": _without_storage(retriever.settings())}
    if isinstance(retriever, Composite):
        node["components"] = [node_of(part) for part in retriever.components]
    return node


def _without_storage(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k not in STORAGE_SETTINGS}


def _node_of_folder(folder: Path) -> dict[str, Any]:
    config = read_json(folder / "config.json")
    node = {"name": config["retriever"],
            "settings": _without_storage({k: v for k, v in config.items() if k not in _CONFIG_KEYS})}
    if "components" in config:
        node["components"] = [_node_of_folder(folder / f"component{i}") for i in range(len(config["components"]))]
    return node


def _build(node: Mapping[str, Any], where: str, leaf: LeafSource) -> Retriever:
    if "components" not in node:
        return leaf(node, where)
    parts = [_build(child, f"{where}/component{i}".lstrip("/"), leaf) for i, child in enumerate(node["components"])]
    return retriever_class(node["name"])(parts, **node["settings"])


def _composites(node: Mapping[str, Any], folder: str):
    """The folders (inside `retriever/`) of the composites in `node`'s tree."""
    if "components" in node:
        yield folder
        for i, child in enumerate(node["components"]):
            yield from _composites(child, f"{folder}/component{i}".lstrip("/"))


def _leaves(node: Mapping[str, Any], folder: str, where: str):
    if "components" not in node:
        yield Leaf(folder, where or "the retriever", dict(node))
        return
    for i, child in enumerate(node["components"]):
        inner = f"component {i} of the {node['name']}" + (f", {where}" if where else "")
        yield from _leaves(child, f"{folder}/component{i}".lstrip("/"), inner)
