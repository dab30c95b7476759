"""How a PostgreSQL index table is configured: the pipeline every process serving it builds, and the encoder,
text view and summary weight its vectors were made with (kept in the table's row of `toolscout_indexes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..feedback import PER_SOURCE_CAP
from ..tool import TextView
from .pgvector import PgStoreError, PgTenantRows

SEARCH_MODES = ("dense", "hybrid")


@dataclass(frozen=True)
class IndexConfig:
    """What every process serving an index table must agree on. `pipeline`: the pipeline they all build
    (`toolscout.spec.PipelineSpec.to_dict()`; None for tables indexed before it was recorded, whose servers
    built the default hybrid or dense alone, as `search` says, splitting tasks as `intents` says). The rest
    describes the table's vectors, as its pipeline's dense retriever makes them: `model`: the encoder name or
    path (resolved by `encoder_for`); `view`: the text view (TextView.to_dict); `summary_weight`: how much of
    the name + description summary is in each vector (DenseRetriever; 0 for tables written before it
    existed); `encoding`: exact or onnx-int8. `search` (dense or hybrid) and `intents` (`IntentMerge`
    settings) are kept in step with `pipeline` for older servers. `feedback_cap`: requests one feedback
    source may teach one tool (`toolscout.feedback`)."""

    model: str
    view: dict
    search: str = "dense"
    summary_weight: float = 0.0
    intents: dict | None = None
    feedback_cap: int = PER_SOURCE_CAP
    encoding: str = "exact"  # what made the vectors: "exact" (float32) or "onnx-int8"; queries are encoded alike
    pipeline: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "view": self.view, "search": self.search, "summary_weight": self.summary_weight,
                "intents": self.intents, "feedback_cap": self.feedback_cap,
                "encoding": self.encoding, "pipeline": self.pipeline}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "IndexConfig":
        if not data.get("model"):
            raise PgStoreError("this index table has no catalog configuration yet: index a catalog into it "
                               "(toolscout index CATALOG --out DIR --store postgresql://...) or migrate a local "
                               "index directory (toolscout migrate DIR --store postgresql://...)")
        return cls(data["model"], dict(data.get("view") or {}), data.get("search", "dense"),
                   float(data.get("summary_weight", 0.0)), data.get("intents"),
                   int(data.get("feedback_cap") or PER_SOURCE_CAP),
                   data.get("encoding", "exact"), data.get("pipeline"))


def check_same_reading(table: str, stored_view: dict | None, view: dict | None) -> None:
    """Refuse vectors made reading tool descriptions otherwise than the table's (`TextView.descriptions`),
    saying so: a table indexed before descriptions were read as plain text keeps reading them as written."""
    there, here = TextView.from_dict(stored_view), TextView.from_dict(view)
    if there.descriptions != here.descriptions:
        raise PgStoreError(f"index table {table!r} reads tool descriptions {there.descriptions} (its vectors were "
                           f"made so), and these vectors read them {here.descriptions}: one table has one reading. "
                           "Use another table for them (add ?table=NAME to the store spec), or index the catalog "
                           "itself (toolscout index CATALOG --store ...), which keeps the table's reading")


def check_compatible(catalog: PgTenantRows, config: IndexConfig, stored: dict[str, Any] | None = None) -> None:
    """Refuse to mix encoders, text views or summary weights in one index table (their vectors are not
    comparable). `catalog`: the tenant's catalog (or store) about to be written; `stored`: the table's
    configuration when the caller has just read it. (Whether the table's pipeline is the same is
    `toolscout.postgres`'s check: it knows pipelines.)"""
    if config.search not in SEARCH_MODES:
        raise ValueError(f"unknown search mode {config.search!r}; use one of {', '.join(SEARCH_MODES)}")
    stored = catalog.database.config() if stored is None else stored
    if not stored.get("model"):
        return
    check_same_reading(catalog.table, stored.get("view"), config.view)
    if (stored["model"] != config.model or TextView.from_dict(stored.get("view")) != TextView.from_dict(config.view)
            or float(stored.get("summary_weight", 0.0)) != config.summary_weight
            or stored.get("encoding", "exact") != config.encoding):
        raise PgStoreError(f"index table {catalog.table!r} holds vectors of model {stored['model']!r} (view "
                           f"{stored.get('view')}, summary weight {stored.get('summary_weight', 0.0)}, encoding "
                           f"{stored.get('encoding', 'exact')}); this catalog uses {config.model!r} (view {config.view}, "
                           f"summary weight {config.summary_weight}, encoding {config.encoding}). Use another table "
                           "for it: add ?table=NAME to the store spec")
