"""Whole tool catalogs in the PostgreSQL store: index one (re-embedding only tools whose text changed),
copy a local index directory in (no re-embedding), and the index table's configuration that servers
read back (encoder, text view, search mode).

Both write the tenant's catalog as one replace (`PgVectorStore.write(replace=True)`): readers see the old
catalog until the new one is complete, and a crash leaves the old one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..artifacts import read_config, read_json
from ..retrievers.dense import default_summary_weight, embed_tools, vector_hash
from ..tool import TextView, Tool, tool_text
from .pgvector import NeedVectors, PgRow, PgSpec, PgStoreError, PgVectorStore

SEARCH_MODES = ("dense", "hybrid")
PIPELINE_KIND = "toolscout.pipeline"


@dataclass(frozen=True)
class IndexConfig:
    """What every process serving an index table must agree on. `model`: the encoder name or path
    (resolved by `encoder_for`); `view`: the text view (TextView.to_dict); `search`: dense or hybrid;
    `summary_weight`: how much of the name + description summary is in each vector (DenseRetriever;
    0 for tables written before it existed)."""

    model: str
    view: dict
    search: str = "dense"
    summary_weight: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "view": self.view, "search": self.search, "summary_weight": self.summary_weight}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "IndexConfig":
        if not data.get("model"):
            raise PgStoreError("this index table has no catalog configuration yet: index a catalog into it "
                               "(toolscout index CATALOG --out DIR --store postgresql://...) or migrate a local "
                               "index directory (toolscout migrate DIR --store postgresql://...)")
        return cls(data["model"], dict(data.get("view") or {}), data.get("search", "dense"),
                   float(data.get("summary_weight", 0.0)))


def check_compatible(store: PgVectorStore, config: IndexConfig, stored: dict[str, Any] | None = None) -> None:
    """Refuse to mix encoders, text views or summary weights in one index table (their vectors are not
    comparable). `stored`: the table's configuration when the caller has just read it."""
    if config.search not in SEARCH_MODES:
        raise ValueError(f"unknown search mode {config.search!r}; use one of {', '.join(SEARCH_MODES)}")
    stored = store.database.config() if stored is None else stored
    if not stored.get("model"):
        return
    if (stored["model"] != config.model or TextView.from_dict(stored.get("view")) != TextView.from_dict(config.view)
            or float(stored.get("summary_weight", 0.0)) != config.summary_weight):
        raise PgStoreError(f"index table {store.table!r} holds vectors of model {stored['model']!r} (view "
                           f"{stored.get('view')}, summary weight {stored.get('summary_weight', 0.0)}); this "
                           f"catalog uses {config.model!r} (view {config.view}, summary weight "
                           f"{config.summary_weight}). Use another table for it: add ?table=NAME to the store spec")
    if stored.get("search", "dense") != config.search:
        raise PgStoreError(f"index table {store.table!r} is served with {stored.get('search', 'dense')} search, "
                           f"this index asks for {config.search}: index with --retriever "
                           f"{'hybrid' if stored.get('search') == 'hybrid' else 'dense'}, use another table "
                           f"(?table=NAME), or switch the table: toolscout migrate --store DSN --search {config.search}")


def set_search_mode(database, search: str) -> None:
    """Switch how every server of an index table ranks (dense or hybrid); takes effect on restart."""
    if search not in SEARCH_MODES:
        raise ValueError(f"unknown search mode {search!r}; use one of {', '.join(SEARCH_MODES)}")
    config = database.config()
    if not config.get("model"):
        IndexConfig.from_dict(config)  # raises: nothing indexed yet
    database.set_config({**config, "search": search})


@dataclass
class CatalogReport:
    tools: int
    embedded: int
    version: int
    summary_weight: float = 0.0


def tool_doc(tool: Tool) -> dict[str, Any]:
    from ..pipeline import _tool_row

    return _tool_row(tool)


def index_catalog(store: PgVectorStore, tools: Sequence[Tool], encoder, view: TextView | None = None, *,
                  search: str = "dense", batch_size: int = 64, progress: bool = False,
                  summary_weight: float | None = None) -> CatalogReport:
    """Make `tools` the tenant's whole catalog. Tools whose text view is unchanged keep their stored vector.
    `summary_weight`: as `DenseRetriever`'s (default: the table's, for a table that has a catalog
    already, else the retriever's default for `encoder`)."""
    view = view or TextView()
    stored_config = store.database.config()
    if summary_weight is None:
        summary_weight = (float(stored_config.get("summary_weight", 0.0)) if stored_config.get("model")
                          else default_summary_weight(encoder.name))
    if not summary_weight >= 0:
        raise ValueError(f"summary_weight must be >= 0, got {summary_weight}")
    config = IndexConfig(encoder.name, view.to_dict(), search, float(summary_weight))
    check_compatible(store, config, stored_config)
    by_id = {t.id: t for t in tools}
    if len(by_id) != len(tools):
        raise ValueError("duplicate tool ids in the catalog")
    texts = {t.id: tool_text(t, view) for t in tools}
    hashes = {t.id: vector_hash(t, view, texts[t.id], config.summary_weight) for t in tools}
    stored = store.hashes()
    embed = [tid for tid in by_id if stored.get(tid) != hashes[tid]]

    def encode(ids: list[str], show_progress: bool) -> dict:
        return encode_rows(encoder, [by_id[i] for i in ids], view, texts, config.summary_weight, batch_size,
                           show_progress)

    vectors = encode(embed, progress)
    for _attempt in range(2):
        rows = [PgRow(t.id, t.namespace, vectors.get(t.id), texts[t.id], hashes[t.id], tool_doc(t)) for t in tools]
        try:
            outcome = store.write(rows, replace=True, config=config.to_dict())
            return CatalogReport(len(tools), len(vectors), outcome.version, config.summary_weight)
        except NeedVectors as exc:  # a stored vector changed or vanished meanwhile: embed those too
            vectors.update(encode([i for i in exc.ids if i not in vectors], False))
    raise PgStoreError("the catalog kept changing while it was being indexed; retry")


def encode_rows(encoder, tools: Sequence[Tool], view: TextView, texts: dict[str, str], summary_weight: float,
                batch_size: int = 64, progress: bool = False) -> dict:
    """id -> dense vector of each tool (`texts`: id -> its text under `view`), as `DenseRetriever` makes it."""
    if not tools:
        return {}
    vectors = embed_tools(encoder, tools, view, [texts[t.id] for t in tools], summary_weight, batch_size, progress)
    return dict(zip([t.id for t in tools], vectors))


def index_catalog_vectors(store: PgVectorStore, tools: Sequence[Tool], vectors, config: IndexConfig,
                          view: TextView, hashes: dict[str, str] | None = None) -> CatalogReport:
    """Make `tools` the tenant's catalog with the given vectors (row i of `vectors` is tools[i])."""
    check_compatible(store, config)
    rows = []
    for tool, vector in zip(tools, vectors):
        text = tool_text(tool, view)
        rows.append(PgRow(tool.id, tool.namespace, vector, text,
                          (hashes or {}).get(tool.id) or vector_hash(tool, view, text, config.summary_weight),
                          tool_doc(tool)))
    outcome = store.write(rows, replace=True, config=config.to_dict())
    return CatalogReport(len(tools), 0, outcome.version, config.summary_weight)


def migrate_directory(folder: str | Path, spec: str | PgSpec, *, search: str | None = None) -> CatalogReport:
    """Copy the catalog of a local index directory (written by `toolscout index` / `ToolScout.save`) into
    the PostgreSQL store `spec`: its tools, text views, content hashes and the vectors as they are (no
    re-embedding), replacing the tenant's catalog. Dense and hybrid (BM25 + dense) pipelines migrate;
    a hybrid one is served with PostgreSQL full-text search in place of BM25 (`search="hybrid"`)."""
    from ..benchmark import read_jsonl
    from .local import load_store

    live, config = read_config(folder, kind=PIPELINE_KIND)
    retriever_dir = live / "retriever"
    rconf = read_json(retriever_dir / "config.json")
    name = rconf.get("retriever")
    default_search = "dense"
    if name == "hybrid":
        components = rconf.get("components", [])
        if "dense" not in components:
            raise PgStoreError(f"{folder}: a hybrid of {components} has no dense component to migrate")
        retriever_dir = retriever_dir / f"component{components.index('dense')}"
        rconf = read_json(retriever_dir / "config.json")
        default_search = "hybrid"
    elif name != "dense":
        raise PgStoreError(f"{folder}: its retriever is {name!r}; only dense and hybrid (BM25 + dense) indexes "
                           "migrate to PostgreSQL (re-index the catalog with --retriever dense)")
    if config.get("reranker"):
        raise PgStoreError(f"{folder}: has a reranker, which the PostgreSQL store does not serve yet")
    tools = [Tool.from_dict(row) for _n, row in read_jsonl(live / "tools.jsonl")]
    local = load_store(retriever_dir / "store", rconf["store"])
    if set(local.ids) != {t.id for t in tools}:
        raise PgStoreError(f"{folder}: its vector store and tools.jsonl hold different tools; rebuild it")
    vectors = local.get([t.id for t in tools])
    hashes_file = retriever_dir / "hashes.json"
    hashes = read_json(hashes_file) if hashes_file.exists() else None
    view = TextView.from_dict(rconf.get("view"))
    index_config = IndexConfig(rconf["model"], view.to_dict(), search or default_search,
                               float(rconf.get("summary_weight", 0.0)))
    spec = spec if isinstance(spec, PgSpec) else PgSpec.parse(spec)
    store = PgVectorStore.from_spec(spec, int(vectors.shape[1]))
    try:
        return index_catalog_vectors(store, tools, vectors, index_config, view, hashes)
    finally:
        store.close()


def recorded_spec(folder: str | Path | None) -> str | None:
    """The PostgreSQL store spec a pipeline directory was indexed into (None for a local index)."""
    if folder is None:
        return None
    from ..errors import ToolScoutError

    try:
        _live, config = read_config(folder, kind=PIPELINE_KIND)
    except ToolScoutError:  # not (yet) a pipeline directory: the local service says what is wrong
        return None
    return config.get("postgres")
