"""Tool-use feedback in the PostgreSQL store, with the same rules as the local ledger (`toolscout.feedback`):

- `toolscout_feedback` holds one row per (tenant, source, tool, task): a repeat conflicts with its row
  and counts once; `learned` says whether the row teaches (false: over the source's per-tool cap);
- `toolscout_usage` holds, per (tenant, tool, source), the sum of the taught requests' embeddings and
  their number: the cap is checked against it, and a tool's vector is `feedback.blend` of its own vector
  (kept in `base_embedding` while it is taught) and these sums in source order;
- the tool row's `usage` column holds the taught requests' words (source order, then arrival), which the
  row's tsvector covers; replicas read the requests themselves (`learned_requests`) for their BM25.

`store` in every function is the tenant's catalog or vector store (`pgvector.PgTenant`: its table, tenant
and statements). The functions that change rows run inside the caller's write transaction (which has
bumped the tenant's version and will log the changed ids), so a search sees feedback applied wholly or
not at all. The blend's `usage_prior` and the cap `feedback_cap` are the index table's settings
(`pg_config.IndexConfig`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np

from ..feedback import PER_SOURCE_CAP, USAGE_PRIOR, FeedbackEvent, LearnResult, Usage, blend, normalized
from .base import as_array


def settings(conn, table: str) -> tuple[float, int]:
    """(usage prior, per-source cap) of index table `table`."""
    row = conn.execute("SELECT config FROM toolscout_indexes WHERE tbl = %s", [table]).fetchone()
    config = (row[0] if row else None) or {}
    return float(config.get("usage_prior") or USAGE_PRIOR), int(config.get("feedback_cap") or PER_SOURCE_CAP)


def learn(store, conn, events: Sequence[FeedbackEvent], vectors: Mapping[Usage, np.ndarray]) -> LearnResult:
    """Record `events` (`vectors`: the embedding of every request they may teach) and move the vectors of
    the tools they teach."""
    prior, cap = settings(conn, store.table)
    ids = sorted({t for e in events for t in e.tool_ids})
    present = {r[0] for r in conn.execute(store._sql("SELECT id FROM {t} WHERE tenant = %s AND id = ANY(%s) "
                                                     "ORDER BY id FOR UPDATE"), [store.tenant, ids]).fetchall()}
    result, reported = LearnResult(), Counter()
    for event in events:
        result.events += 1
        result.failures += not event.teaches
        for tool_id in event.tool_ids:
            if tool_id not in present:
                result.unknown.append(tool_id)
                continue
            reported[tool_id] += 1
            if event.teaches:
                _teach(store, conn, Usage(tool_id, event.source, event.query), vectors, cap, result)
    conn.execute("INSERT INTO toolscout_feedback_totals AS f (tbl, tenant, events, failures) VALUES (%s, %s, %s, %s) "
                 "ON CONFLICT (tbl, tenant) DO UPDATE SET events = f.events + EXCLUDED.events, "
                 "failures = f.failures + EXCLUDED.failures", [store.table, store.tenant, result.events, result.failures])
    with conn.cursor() as cur:
        cur.executemany(store._sql("UPDATE {t} SET reported = reported + %s WHERE tenant = %s AND id = %s"),
                        [(n, store.tenant, tool_id) for tool_id, n in sorted(reported.items())])
    reblend(store, conn, sorted({u.tool_id for u in result.learned}), prior)
    return result


def _teach(store, conn, usage: Usage, vectors: Mapping[Usage, np.ndarray], cap: int, result: LearnResult) -> None:
    key = hashlib.sha256(normalized(usage.query).encode("utf-8")).hexdigest()
    inserted = conn.execute(
        "INSERT INTO toolscout_feedback (tbl, tenant, source, tool_id, query_key, query, learned) "
        "VALUES (%s, %s, %s, %s, %s, %s, false) ON CONFLICT DO NOTHING RETURNING seq",
        [store.table, store.tenant, usage.source, usage.tool_id, key, usage.query]).fetchone()
    if inserted is None:
        result.duplicates += 1
        return
    row = conn.execute("SELECT n, vsum FROM toolscout_usage WHERE tbl = %s AND tenant = %s AND tool_id = %s "
                       "AND source = %s FOR UPDATE", [store.table, store.tenant, usage.tool_id, usage.source]).fetchone()
    if row is not None and row[0] >= cap:
        result.capped += 1
        return
    vector = np.asarray(vectors[usage], dtype=np.float32)
    total = vector.copy() if row is None else as_array(row[1]) + vector
    conn.execute("INSERT INTO toolscout_usage (tbl, tenant, tool_id, source, n, vsum) VALUES (%s, %s, %s, %s, 1, %s) "
                 "ON CONFLICT (tbl, tenant, tool_id, source) DO UPDATE SET n = toolscout_usage.n + 1, "
                 "vsum = EXCLUDED.vsum", [store.table, store.tenant, usage.tool_id, usage.source, total])
    conn.execute("UPDATE toolscout_feedback SET learned = true WHERE tbl = %s AND tenant = %s AND seq = %s",
                 [store.table, store.tenant, inserted[0]])
    result.learned.append(usage)


def forget(store, conn, source: str) -> list[str]:
    """Take back everything `source` taught; the ids of the tools it had taught."""
    prior, _cap = settings(conn, store.table)
    ids = [r[0] for r in conn.execute("SELECT DISTINCT tool_id FROM toolscout_feedback WHERE tbl = %s AND tenant = %s "
                                      "AND source = %s ORDER BY tool_id", [store.table, store.tenant, source])]
    for table in ("toolscout_feedback", "toolscout_usage"):
        conn.execute(f"DELETE FROM {table} WHERE tbl = %s AND tenant = %s AND source = %s",
                     [store.table, store.tenant, source])
    reblend(store, conn, ids, prior)
    return ids


def reblend(store, conn, ids: Sequence[str], prior: float | None = None) -> None:
    """Make the vectors, `base_embedding` and `usage` words of tools `ids` what their feedback says: a
    taught tool's vector blends its own vector with its sums; an untaught one is its own vector again."""
    if not ids:
        return
    prior = settings(conn, store.table)[0] if prior is None else prior
    rows = conn.execute(store._sql("SELECT id, embedding, base_embedding FROM {t} WHERE tenant = %s AND id = ANY(%s) "
                                   "ORDER BY id FOR UPDATE"), [store.tenant, list(ids)]).fetchall()
    sums: dict[str, list[np.ndarray]] = {}
    for tool_id, _source, vsum in conn.execute(
            "SELECT tool_id, source, vsum FROM toolscout_usage WHERE tbl = %s AND tenant = %s AND tool_id = ANY(%s) "
            "ORDER BY tool_id, source", [store.table, store.tenant, list(ids)]):
        sums.setdefault(tool_id, []).append(as_array(vsum))
    words = dict(conn.execute(
        "SELECT tool_id, string_agg(query, ' ' ORDER BY source, seq) FROM toolscout_feedback WHERE tbl = %s "
        "AND tenant = %s AND tool_id = ANY(%s) AND learned GROUP BY tool_id",
        [store.table, store.tenant, list(ids)]).fetchall())
    updates = []
    for tool_id, embedding, base in rows:
        own = as_array(base if base is not None else embedding)
        taught = tool_id in sums
        updates.append((blend(own, sums[tool_id], prior) if taught else own, own if taught else None,
                        words.get(tool_id, "") if taught else "", store.tenant, tool_id))
    with conn.cursor() as cur:
        cur.executemany(store._sql("UPDATE {t} SET embedding = %s, base_embedding = %s, usage = %s "
                                   "WHERE tenant = %s AND id = %s"), updates)


def learned_requests(store, ids: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
    """(tool id, source, request) of every request feedback taught, to the tools `ids` (None: any), in the
    order they arrived: what a replica's BM25 learns (`serve/pg_replica.py`)."""
    where, params = "tbl = %s AND tenant = %s AND learned", [store.table, store.tenant]
    if ids is not None:
        where, params = where + " AND tool_id = ANY(%s)", params + [list(ids)]
    with store.database.connection() as conn:
        return conn.execute(f"SELECT tool_id, source, query FROM toolscout_feedback WHERE {where} ORDER BY seq",
                            params).fetchall()


def taught_ids(store, conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT tool_id FROM toolscout_usage WHERE tbl = %s AND tenant = %s "
                                       "ORDER BY tool_id", [store.table, store.tenant])]


def drop_tools(store, conn, ids: Sequence[str]) -> None:
    """A deleted tool's feedback goes with it."""
    if ids:
        for table in ("toolscout_feedback", "toolscout_usage"):
            conn.execute(f"DELETE FROM {table} WHERE tbl = %s AND tenant = %s AND tool_id = ANY(%s)",
                         [store.table, store.tenant, list(ids)])


def after_replace(store, conn) -> None:
    """After a whole-catalog replace: drop the feedback of tools that are gone, blend the rest again."""
    conn.execute(store._sql("DELETE FROM toolscout_feedback f WHERE f.tbl = %s AND f.tenant = %s AND NOT EXISTS "
                            "(SELECT 1 FROM {t} t WHERE t.tenant = f.tenant AND t.id = f.tool_id)"),
                 [store.table, store.tenant])
    conn.execute(store._sql("DELETE FROM toolscout_usage u WHERE u.tbl = %s AND u.tenant = %s AND NOT EXISTS "
                            "(SELECT 1 FROM {t} t WHERE t.tenant = u.tenant AND t.id = u.tool_id)"),
                 [store.table, store.tenant])
    reblend(store, conn, taught_ids(store, conn))


def summary(store, tool_id: str) -> dict[str, int]:
    with store.database.connection() as conn:
        learned, sources = conn.execute("SELECT coalesce(sum(n), 0), count(*) FROM toolscout_usage WHERE tbl = %s "
                                        "AND tenant = %s AND tool_id = %s", [store.table, store.tenant, tool_id]).fetchone()
        row = conn.execute(store._sql("SELECT reported FROM {t} WHERE tenant = %s AND id = %s"),
                           [store.tenant, tool_id]).fetchone()
    return {"learned": int(learned), "sources": int(sources), "reported": int(row[0]) if row else 0}


def totals(store) -> dict[str, Any]:
    with store.database.connection() as conn:
        row = conn.execute("SELECT events, failures FROM toolscout_feedback_totals WHERE tbl = %s AND tenant = %s",
                           [store.table, store.tenant]).fetchone()
        sources = conn.execute("SELECT source, sum(n) FROM toolscout_usage WHERE tbl = %s AND tenant = %s "
                               "GROUP BY source ORDER BY source", [store.table, store.tenant]).fetchall()
    events, failures = (int(row[0]), int(row[1])) if row else (0, 0)
    return {"events": events, "failures": failures, "sources": {s: int(n) for s, n in sources}}
