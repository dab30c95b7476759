"""Whole tool catalogs in the PostgreSQL store: index one (re-embedding only tools whose text changed),
copy a local pipeline directory in (no re-embedding), and find the store a pipeline directory was
indexed into. The table's configuration itself is `store/pg_config.py`.

Both write the tenant's catalog as one replace (`PgCatalog.write(replace=True)`, store/pg_catalog.py):
readers see the old catalog until the new one is complete, and a crash leaves the old one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .artifacts import read_config, read_json
from .defaults import DEFAULT_INTENTS, DEFAULT_PG_SEARCH
from .errors import ToolScoutError
from .pipeline import PIPELINE_KIND
from .retrievers.dense import default_summary_weight, embed_tools, encoding_of, vector_hash
from .store.pg_config import IndexConfig, check_compatible
from .store.pg_catalog import PgCatalog
from .store.pgvector import NeedVectors, PgRow, PgSpec, PgStoreError, PgVectorStore
from .tool import TextView, Tool, tool_text, tools_by_id


@dataclass
class CatalogReport:
    tools: int
    embedded: int
    version: int
    summary_weight: float = 0.0


def index_catalog(catalog: PgCatalog | PgVectorStore, tools: Sequence[Tool], encoder, view: TextView | None = None,
                  *, search: str = DEFAULT_PG_SEARCH, batch_size: int = 64, progress: bool = False,
                  summary_weight: float | None = None, intents: dict | None | str = "default") -> CatalogReport:
    """Make `tools` the whole catalog of `catalog`'s tenant (a PgCatalog, or a PgVectorStore: its tenant's
    catalog). Tools whose text view is unchanged keep their stored vector. `summary_weight`: as
    `DenseRetriever`'s (default: the table's, for a table that has a catalog already, else the retriever's
    default for `encoder`). `intents`: how servers treat multi-request tasks (`IntentMerge` settings;
    "default": the table's, else `toolscout.defaults.DEFAULT_INTENTS`)."""
    catalog, view = PgCatalog.of(catalog), view or TextView()
    stored_config = catalog.database.config()
    indexed = bool(stored_config.get("model"))
    if summary_weight is None:
        summary_weight = float(stored_config.get("summary_weight", 0.0)) if indexed \
            else default_summary_weight(encoder.name)
    if not summary_weight >= 0:
        raise ValueError(f"summary_weight must be >= 0, got {summary_weight}")
    if intents == "default":
        intents = stored_config.get("intents") if indexed else DEFAULT_INTENTS
    config = IndexConfig(encoder.name, view.to_dict(), search, float(summary_weight), intents,
                         encoding=encoding_of(encoder))
    check_compatible(catalog, config, stored_config)
    by_id = tools_by_id(tools, "the catalog")
    texts = {t.id: tool_text(t, view) for t in tools}
    hashes = {t.id: vector_hash(t, view, texts[t.id], config.summary_weight) for t in tools}
    stored = catalog.hashes()
    embed = [tid for tid in by_id if stored.get(tid) != hashes[tid]]

    def encode(ids: list[str], show_progress: bool) -> dict:
        return encode_rows(encoder, [by_id[i] for i in ids], view, texts, config.summary_weight, batch_size,
                           show_progress)

    vectors = encode(embed, progress)
    for _attempt in range(2):
        rows = [PgRow(t.id, t.namespace, vectors.get(t.id), texts[t.id], hashes[t.id], t.to_record()) for t in tools]
        try:
            outcome = catalog.write(rows, replace=True, config=config.to_dict())
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


def index_catalog_vectors(catalog: PgCatalog, tools: Sequence[Tool], vectors, config: IndexConfig,
                          view: TextView, hashes: dict[str, str] | None = None) -> CatalogReport:
    """Make `tools` the tenant's catalog with the given vectors (row i of `vectors` is tools[i])."""
    check_compatible(catalog, config)
    rows = []
    for tool, vector in zip(tools, vectors):
        text = tool_text(tool, view)
        rows.append(PgRow(tool.id, tool.namespace, vector, text,
                          (hashes or {}).get(tool.id) or vector_hash(tool, view, text, config.summary_weight),
                          tool.to_record()))
    outcome = catalog.write(rows, replace=True, config=config.to_dict())
    return CatalogReport(len(tools), 0, outcome.version, config.summary_weight)


def migrate_directory(folder: str | Path, spec: str | PgSpec, *, search: str | None = None) -> CatalogReport:
    """Copy the catalog of a local index directory (written by `toolscout index` / `ToolScout.save`) into
    the PostgreSQL store `spec`: its tools, text views, content hashes and the vectors as they are (no
    re-embedding), replacing the tenant's catalog. Dense and hybrid (BM25 + dense) pipelines migrate;
    a hybrid one is served hybrid (`search="hybrid"`: every replica runs BM25 and the dense part)."""
    from .benchmark import read_jsonl
    from .store.local import load_store

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
                               float(rconf.get("summary_weight", 0.0)), config.get("intents"),
                               encoding=rconf.get("encoding", "exact"))
    spec = spec if isinstance(spec, PgSpec) else PgSpec.parse(spec)
    catalog = PgCatalog.from_spec(spec, int(vectors.shape[1]))
    try:
        return index_catalog_vectors(catalog, tools, vectors, index_config, view, hashes)
    finally:
        catalog.close()


def recorded_spec(folder: str | Path | None) -> str | None:
    """The PostgreSQL store spec a pipeline directory was indexed into (None for a local index)."""
    if folder is None:
        return None
    try:
        _live, config = read_config(folder, kind=PIPELINE_KIND)
    except ToolScoutError:  # not (yet) a pipeline directory: the local service says what is wrong
        return None
    return config.get("postgres")
