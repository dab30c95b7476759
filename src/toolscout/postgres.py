"""Whole tool catalogs in the PostgreSQL store: index one (re-embedding only tools whose text changed),
copy a local pipeline directory in (no re-embedding), switch how a table ranks, and find the store a
pipeline directory was indexed into. The table's configuration itself is `store/pg_config.py`.

Both whole-catalog writes record the pipeline they were given (`toolscout.spec`) as the table's: every
server of every tenant of the table builds that pipeline (`ToolScout.from_tenant`). A pipeline the store
cannot serve is refused, naming the setting (`pg_pipeline.check_servable`), and so is one that is not the
pipeline the table already serves (one table, one pipeline: use another table for another one).

Both write the tenant's catalog as one replace (`PgCatalog.write(replace=True)`, store/pg_catalog.py):
readers see the old catalog until the new one is complete, and a crash leaves the old one.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from .artifacts import read_json, read_json_lines, write_artifact
from .defaults import DEFAULT_INTENTS, DEFAULT_RETRIEVER
from .errors import MissingDependency, ToolScoutError
from .feedback import PER_SOURCE_CAP, FeedbackEvent, UsageLedger
from .intents import IntentMerge
from .learning.channel import LearningSettings
from .pg_pipeline import check_servable, dense_settings, index_config, table_spec, with_search
from .retrievers.base import make_retriever
from .retrievers.dense import embed_tools, encoding_of, vector_hash
from .spec import PIPELINE_FORMAT, PIPELINE_KIND, PipelineSpec, differences, read_pipeline_config
from .store.local import load_store
from .store.pg_config import SEARCH_MODES, IndexConfig, check_compatible, check_same_reading
from .store.pg_catalog import PgCatalog
from .store.pgvector import NeedVectors, PgRow, PgSpec, PgStoreError, PgVectorStore, redact
from .tool import TextView, Tool, tool_text, tools_by_id
from .version import __version__

logger = logging.getLogger(__name__)


@dataclass
class CatalogReport:
    tools: int
    embedded: int
    version: int
    summary_weight: float = 0.0
    # a migrated directory's learning: what it teaches, as events to teach the tenant (`UsageLedger.taught_events`),
    # and how many events it recorded in all (failures, repeats and requests past a cap teach nothing)
    feedback: list[FeedbackEvent] = field(default_factory=list)
    feedback_recorded: int = 0
    learning_settings: LearningSettings = field(default_factory=LearningSettings)  # the directory's operator's
    taught_kept: int = 0  # taught (tool, request) pairs of the tools the new catalog kept (they stay),
    taught_dropped: int = 0  # and of the tools it left out (gone with them)
    pipeline: PipelineSpec | None = None  # what the table serves the catalog with (`index_catalog`)
    removed: int = 0  # tools the tenant held that the new catalog does not (`index_catalog`)

    @property
    def unchanged(self) -> int:
        """Tools that kept their stored vector (their text view unchanged)."""
        return self.tools - self.embedded

    def counts(self) -> str:
        """What the write did, in words: '3 embedded, 196 unchanged, 2 removed', each part only when not zero."""
        parts = [(self.embedded, "embedded"), (self.unchanged, "unchanged"), (self.removed, "removed")]
        return ", ".join(f"{n} {what}" for n, what in parts if n) or "nothing to embed or remove"


def index_catalog(catalog: PgCatalog | PgVectorStore, tools: Sequence[Tool], encoder,
                  pipeline: PipelineSpec | None = None, *, view: TextView | None = None,
                  summary_weight: float | None = None, batch_size: int = 64, progress: bool = False) -> CatalogReport:
    """Make `tools` the whole catalog of `catalog`'s tenant (a PgCatalog, or a PgVectorStore: its tenant's
    catalog), served with `pipeline`. Tools whose text view is unchanged keep their stored vector.

    `pipeline`: the pipeline every server of the table builds (`ToolScout.spec` of the pipeline to serve);
    its one dense retriever must use `encoder`, whose vectors it makes with its view and summary weight.
    Default: the table's own, for a table that has a catalog and unless `view` or `summary_weight` are given;
    else the default pipeline (`ToolScout.from_tools`'s) over `encoder`, with `view` and `summary_weight`
    (default: the table's, else the dense retriever's default for `encoder`)."""
    if pipeline is not None and (view is not None or summary_weight is not None):
        raise ValueError("a pipeline's view and summary weight are its dense retriever's settings: give them there")
    catalog = PgCatalog.of(catalog)
    stored = catalog.database.config()
    pipeline = with_table_reading(pipeline or default_pipeline(encoder, stored, view, summary_weight), stored)
    check_servable(pipeline)
    config = index_config(pipeline, stored.get("feedback_cap") or PER_SOURCE_CAP)
    if (config.model, config.encoding) != (encoder.name, encoding_of(encoder)):
        raise ValueError(f"the pipeline's dense retriever embeds with {config.model!r} ({config.encoding}), but "
                         f"the encoder given is {encoder.name!r} ({encoding_of(encoder)})")
    check_compatible(catalog, config, stored)
    check_pipeline(catalog, pipeline, stored)
    view = TextView.from_dict(config.view)
    by_id = tools_by_id(tools, "the catalog")
    texts = {t.id: tool_text(t, view) for t in tools}
    hashes = {t.id: vector_hash(t, view, texts[t.id], config.summary_weight) for t in tools}
    stored_hashes = catalog.hashes()
    embed = [tid for tid in by_id if stored_hashes.get(tid) != hashes[tid]]

    def encode(ids: list[str], show_progress: bool) -> dict:
        return encode_rows(encoder, [by_id[i] for i in ids], view, texts, config.summary_weight, batch_size,
                           show_progress)

    vectors = encode(embed, progress)
    for _attempt in range(2):
        rows = [PgRow(t.id, t.namespace, vectors.get(t.id), texts[t.id], hashes[t.id], t.to_record()) for t in tools]
        try:
            outcome = catalog.write(rows, replace=True, config=config.to_dict())
            return _replaced(outcome, len(tools), len(vectors), config.summary_weight, pipeline)
        except NeedVectors as exc:  # a stored vector changed or vanished meanwhile: embed those too
            vectors.update(encode([i for i in exc.ids if i not in vectors], False))
    raise PgStoreError("the catalog kept changing while it was being indexed; retry")


def default_pipeline(encoder, stored: dict[str, Any], view: TextView | None = None,
                     summary_weight: float | None = None) -> PipelineSpec:
    """`index_catalog`'s pipeline when it is given none (see there); `stored`: the table's configuration."""
    indexed = bool(stored.get("model"))
    if indexed and view is None and summary_weight is None and stored["model"] == encoder.name:
        return table_spec(IndexConfig.from_dict(stored))  # (another encoder: refused as such, check_compatible)
    if summary_weight is None and indexed:
        summary_weight = float(stored.get("summary_weight", 0.0))
    retriever = make_retriever(DEFAULT_RETRIEVER, encoder=encoder, view=view, summary_weight=summary_weight)
    return PipelineSpec.describe(retriever, IntentMerge.from_dict(DEFAULT_INTENTS))


def with_table_reading(spec: PipelineSpec, stored: dict[str, Any]) -> PipelineSpec:
    """`spec` with its first stage reading tool descriptions as the table's vectors were made (`stored`: the
    table's configuration; `TextView.descriptions`). One table has one text view: a table indexed before
    descriptions were read as plain text goes on reading them as written, for every tenant, until its
    catalogs are indexed into a new table."""
    if not stored.get("model"):
        return spec
    reading = TextView.from_dict(stored.get("view")).descriptions
    data = copy.deepcopy(spec.to_dict())
    moved = False
    for leaf in PipelineSpec.from_dict(data).leaves():  # the leaves' nodes are `data`'s own
        settings = leaf.node.get("settings") or {}
        view = TextView.from_dict(settings["view"]) if isinstance(settings.get("view"), dict) else None
        if view is not None and view.descriptions != reading:
            settings["view"] = replace(view, descriptions=reading).to_dict()
            moved = True
    if not moved:
        return spec
    logger.warning("the index table reads tool descriptions %s, as its vectors were made: kept (index into a new "
                   "table, ?table=NAME, for another reading)", reading)
    return PipelineSpec.from_dict(data)


def check_pipeline(catalog: PgCatalog, pipeline: PipelineSpec, stored: dict[str, Any]) -> None:
    """Refuse to write a catalog served with `pipeline` into a table that serves another one (`stored`: the
    table's configuration): each of the table's servers builds one pipeline for all its tenants."""
    if not stored.get("model"):
        return
    check_same_reading(catalog.table, stored.get("view"), dense_settings(pipeline).get("view"))
    changed = differences(table_spec(IndexConfig.from_dict(stored)).to_dict(), pipeline.to_dict())
    if changed:
        # `migrate --search` switches the first stage between dense and hybrid (with that one's defaults)
        switch = any(line.startswith("retriever.name:") for line in changed)
        remedy = ("index this one into another table (add ?table=NAME to the store spec), or index it with the "
                  "table's settings" + (", or switch the table's first stage for every tenant (toolscout migrate "
                                        "--store DSN --search dense|hybrid)" if switch else ""))
        raise PgStoreError(f"index table {catalog.table!r} serves every tenant with another pipeline than this one: "
                           f"{'; '.join(changed[:6])} (each: the table's setting 'there', this index's 'here'). "
                           f"One table serves one pipeline: {remedy}")


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
    return _replaced(outcome, len(tools), 0, config.summary_weight)


def _replaced(outcome, tools: int, embedded: int, summary_weight: float,
              pipeline: PipelineSpec | None = None) -> CatalogReport:
    """The report of a whole-catalog replace (`outcome`: its `WriteOutcome`)."""
    return CatalogReport(tools, embedded, outcome.version, summary_weight, pipeline=pipeline,
                         removed=len(outcome.deleted), taught_kept=outcome.taught_kept,
                         taught_dropped=outcome.taught_dropped)


def migrate_directory(folder: str | Path, spec: str | PgSpec, *, search: str | None = None) -> CatalogReport:
    """Copy the catalog of a local index directory (written by `toolscout index` / `ToolScout.save`) into
    the PostgreSQL store `spec`: its tools, text views, content hashes and the vectors as they are (no
    re-embedding), replacing the tenant's catalog, and its pipeline as the table's (`search`: switched to
    dense or hybrid search first, `with_search`). A pipeline the store cannot serve is refused."""
    live, pipeline, retriever_dir, rconf = migration_source(folder, search)
    tools = [Tool.from_record(row) for row in read_json_lines(live / "tools.jsonl")]
    vectors = _stored_vectors(folder, retriever_dir, rconf, tools)
    hashes_file = retriever_dir / "hashes.json"
    spec = spec if isinstance(spec, PgSpec) else PgSpec.parse(spec)
    catalog = PgCatalog.from_spec(spec, int(vectors.shape[1]))
    try:
        stored = catalog.database.config()
        table_config = index_config(pipeline, stored.get("feedback_cap") or PER_SOURCE_CAP)
        check_pipeline(catalog, pipeline, stored)
        report = index_catalog_vectors(catalog, tools, vectors, table_config, TextView.from_dict(table_config.view),
                                       read_json(hashes_file) if hashes_file.exists() else None)
    finally:
        catalog.close()
    ledger = UsageLedger.load(live / "feedback.json") if (live / "feedback.json").exists() else UsageLedger()
    report.feedback, report.feedback_recorded = ledger.taught_events(), ledger.events
    learned = live / "learning" / "config.json"  # the pipeline's LEARNING_FOLDER (`LearnedChannel.save`)
    if learned.exists():
        report.learning_settings = LearningSettings.from_dict(read_json(learned).get("settings"))
    return report


def migration_source(folder: str | Path, search: str | None = None) -> tuple[Path, PipelineSpec, Path, dict]:
    """What `migrate_directory` copies from `folder`, checked before anything is written anywhere: the live
    snapshot, its pipeline (switched to `search`), its dense retriever's folder and config. Refuses a directory
    indexed into PostgreSQL already, a pipeline the store cannot serve, and approximate vector stores."""
    live, config = read_pipeline_config(folder)
    if config.get("postgres"):
        raise PgStoreError(f"{folder}: is indexed into PostgreSQL already ({config['postgres']}); index its catalog "
                           "again with toolscout index CATALOG --store DSN")
    pipeline = PipelineSpec.read(live, config)
    check_servable(pipeline, f"the pipeline of {folder}")
    if search:
        pipeline = with_search(pipeline, search)
    dense = next(leaf for leaf in pipeline.leaves() if leaf.node["name"] == "dense")
    retriever_dir = live / "retriever" / dense.folder
    rconf = read_json(retriever_dir / "config.json")
    if rconf.get("store_kind", "numpy") != "numpy":
        raise PgStoreError(f"{folder}: its dense vectors are in a {rconf['store_kind']} store (approximate search), "
                           "and PostgreSQL servers search them exactly (up to 100,000 tools, then pgvector's HNSW "
                           "graph): re-index the catalog with --store numpy, or straight into PostgreSQL "
                           "(toolscout index CATALOG --store DSN)")
    return live, pipeline, retriever_dir, rconf


def _stored_vectors(folder: str | Path, retriever_dir: Path, rconf: dict, tools: Sequence[Tool]):
    """The dense vectors a directory's retriever holds, one row per tool of `tools`."""
    local = load_store(retriever_dir / "store", rconf["store"])
    if set(local.ids) != {t.id for t in tools}:
        raise PgStoreError(f"{folder}: its vector store and tools.jsonl hold different tools; rebuild it")
    return local.get([t.id for t in tools])


@dataclass
class SearchSwitch:
    """What `set_search_mode` did to a table: the first stage its servers built before and build now, and the
    tenants it serves (every one of them ranks with the new first stage)."""
    before: dict[str, Any]
    after: dict[str, Any]
    tenants: list[str]

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def default_hybrid(self) -> dict[str, Any]:
        """The hybrid `--search hybrid` makes of the table's dense retriever alone (a hybrid switched to dense
        is not kept anywhere)."""
        return as_stored(with_search(with_search(PipelineSpec(self.after), "dense"), "hybrid").retriever)


def set_search_mode(database, search: str) -> SearchSwitch:
    """Switch how every server of an index table ranks (its pipeline's first stage: dense alone, or hybrid,
    `with_search`); takes effect when they start. A hybrid switched to dense is not kept: switched back, the
    table serves the default hybrid."""
    if search not in SEARCH_MODES:
        raise ValueError(f"unknown search mode {search!r}; use one of {', '.join(SEARCH_MODES)}")
    stored = database.config()
    config = IndexConfig.from_dict(stored)  # raises when nothing is indexed yet
    before = table_spec(config)
    pipeline = with_search(before, search)
    database.set_config({**stored, **index_config(pipeline, config.feedback_cap).to_dict()})
    return SearchSwitch(as_stored(before.retriever), as_stored(pipeline.retriever), list(database.tenants()))


def as_stored(node: dict[str, Any]) -> dict[str, Any]:
    """A spec (or one of its nodes) as the table's configuration holds it: JSON (tuples read back as lists), so
    that a spec built in this process compares equal to the one the table records."""
    return json.loads(json.dumps(node))


def configured_tables(spec: str | PgSpec) -> list[str]:
    """The index tables of `spec`'s database that record their catalog's configuration (what serving one needs),
    sorted: `spec`'s own is among them once it is configured; the others are what a mistyped ?table= meant."""
    spec = spec if isinstance(spec, PgSpec) else PgSpec.parse(spec)
    try:
        import psycopg
    except ImportError:
        raise MissingDependency("psycopg", "the PostgreSQL store", extra="postgres") from None
    try:
        with psycopg.connect(spec.dsn, autocommit=True, connect_timeout=30) as conn:
            if conn.execute("SELECT to_regclass('toolscout_indexes')").fetchone()[0] is None:
                return []
            rows = conn.execute("SELECT tbl FROM toolscout_indexes WHERE config ->> 'model' <> '' "
                                "ORDER BY tbl").fetchall()
    except psycopg.OperationalError as exc:
        raise PgStoreError(f"cannot connect to {redact(spec.dsn)}: {str(exc).strip()}") from None
    return [table for (table,) in rows]


def require_catalog(spec: str | PgSpec, command: str) -> None:
    """Refuse `command` (learning, approvals) on a tenant of `spec` that has no catalog (`PgCatalog.require_catalog`),
    before anything is loaded or changed. `index` and a gateway make a new tenant's catalog, and do not ask."""
    catalog = PgCatalog.from_spec(spec)
    try:
        catalog.require_catalog(command)
    finally:
        catalog.close()


def missing_catalogs(spec: str | PgSpec, tenants: Sequence[str] = ()) -> list[str]:
    """What a server of `spec` should warn of at start: each of the spec's tenant and `tenants` (those its tokens
    are bound to) that has no catalog (`PgCatalog.missing_catalog`)."""
    catalog = PgCatalog.from_spec(spec)
    try:
        known = catalog.database.tenants()  # one read for them all
        notes = (catalog.for_tenant(tenant).missing_catalog(known)
                 for tenant in dict.fromkeys([catalog.tenant, *tenants]))
        return [note for note in notes if note is not None]
    finally:
        catalog.close()


def configure_new_table(spec: str | PgSpec, encoder, pipeline: PipelineSpec) -> bool:
    """Record `pipeline` as the pipeline of `spec`'s index table (its tenant's catalog empty), unless the table
    records one already: under an advisory lock, so processes starting together on a new database configure it
    once. Whether the table's vectors are now `encoder`'s (False: another process configured it otherwise)."""
    catalog = PgCatalog.from_spec(spec, encoder.dim)
    key = [f"toolscout.configure.{catalog.table}"]
    try:
        with catalog.database.connection(bounded=False) as conn:  # the lock waits while another process indexes
            conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", key)
            try:
                stored = catalog.database.config()
                if stored.get("model"):
                    return (stored["model"], stored.get("encoding", "exact")) == (encoder.name, encoding_of(encoder))
                index_catalog(catalog, [], encoder, pipeline)
                return True
            finally:
                conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", key)
    finally:
        catalog.close()


def write_pointer(out: str | Path, store: PgSpec, pipeline: PipelineSpec, tools: int, *,
                  held_lock: int | None = None) -> None:
    """Make `out` a pipeline directory that points at a tenant's catalog in PostgreSQL: it records the store
    (without its password) and the pipeline, and holds no data (`ToolScout.load`, `toolscout search` and
    `toolscout serve` read the database)."""
    config = {"kind": PIPELINE_KIND, "format_version": PIPELINE_FORMAT, "toolscout": __version__,
              "postgres": store.to_string(), "retriever": pipeline.retriever["name"], "tools": tools,
              "reranker": (pipeline.reranker or {}).get("reranker"), "intents": pipeline.intents,
              "fast_queries": pipeline.fast_queries, "pipeline": pipeline.to_dict(),
              "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with write_artifact(out, config, held_lock=held_lock):  # the caller's hold of `out`'s serve lock, if any
        pass


def recorded_spec(folder: str | Path | None) -> str | None:
    """The PostgreSQL store spec a pipeline directory was indexed into (None for a local index)."""
    if folder is None:
        return None
    try:
        _live, config = read_pipeline_config(folder)
    except ToolScoutError:  # not (yet) a pipeline directory: the local service says what is wrong
        return None
    return config.get("postgres")
