"""Tool-use feedback in the PostgreSQL store, with the same rules as the local ledger (`toolscout.feedback`)
and what every replica's learned channel (`toolscout.learning`) is built from:

- `toolscout_feedback` holds one row per (tenant, source, tool, task): a repeat conflicts with its row and
  counts once; `learned` says whether the row teaches (false: over the source's per-tool cap); each taught
  row keeps when it was taught, the untaught rank of its tool for it, and its request's key (what it
  teaches, `LearnedChannel.key`);
- `toolscout_requests` holds each key's vector, made once by the process that recorded it;
- `toolscout_scored` holds the self-measurement of every event (`learning/scorecard.py`);
- `toolscout_learning` holds the tenant's learning settings and its epoch: anything that takes learning
  back (a source forgotten, a rollback, a tool deleted, new settings) bumps the epoch, and replicas then
  build their channel again; new feedback rows are taken in by their sequence numbers.

Tool vectors are never moved by feedback. `store` in every function is the tenant's catalog or vector store
(`pgvector.PgTenantRows`); the functions that change rows run inside the caller's write transaction (which has
bumped the tenant's version and will log it), so a search sees feedback applied wholly or not at all.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..feedback import PER_SOURCE_CAP, FeedbackEvent, LearnResult, Scored, Usage, normalized
from .base import as_array
from .pg_deadline import bounded_for


@dataclass(frozen=True)
class Taught:
    """A taught row as a replica reads it."""

    seq: int
    key: str | None
    tool: str
    source: str
    query: str
    time: float
    untaught_rank: int | None


def feedback_cap(conn, table: str) -> int:
    row = conn.execute("SELECT config FROM toolscout_indexes WHERE tbl = %s", [table]).fetchone()
    return int(((row[0] if row else None) or {}).get("feedback_cap") or PER_SOURCE_CAP)


def learn(store, conn, events: Sequence[FeedbackEvent], keys: Mapping[str, str],
          untaught: Mapping[tuple[str, str], int | None], vectors: Mapping[str, np.ndarray],
          scored: Sequence[Scored]) -> LearnResult:
    """Record `events` (their times set): `keys` maps each request that teaches anything (the learner's rule)
    to what it teaches, `vectors` the new keys' vectors, `untaught` (request, tool) to the tool's untaught
    rank, `scored` the events' scores."""
    cap = feedback_cap(conn, store.table)
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
            if event.teaches and event.query not in keys:
                result.incidental += 1
            elif event.teaches:
                usage = Usage(tool_id, event.source, event.query, float(event.time or 0.0),
                              untaught.get((event.query, tool_id)))
                _teach(store, conn, usage, keys[event.query], cap, result)
    _store_vectors(store, conn, vectors)
    _store_scored(store, conn, scored)
    conn.execute("INSERT INTO toolscout_feedback_totals AS f (tbl, tenant, events, failures) VALUES (%s, %s, %s, %s) "
                 "ON CONFLICT (tbl, tenant) DO UPDATE SET events = f.events + EXCLUDED.events, "
                 "failures = f.failures + EXCLUDED.failures", [store.table, store.tenant, result.events, result.failures])
    with conn.cursor() as cur:
        cur.executemany(store._sql("UPDATE {t} SET reported = reported + %s WHERE tenant = %s AND id = %s"),
                        [(n, store.tenant, tool_id) for tool_id, n in sorted(reported.items())])
    return result


def _teach(store, conn, usage: Usage, key: str, cap: int, result: LearnResult) -> None:
    query_key = hashlib.sha256(normalized(usage.query).encode("utf-8")).hexdigest()
    inserted = conn.execute(
        "INSERT INTO toolscout_feedback (tbl, tenant, source, tool_id, query_key, query, learned, taught_at, "
        "untaught_rank, request_key) VALUES (%s, %s, %s, %s, %s, %s, false, %s, %s, %s) ON CONFLICT DO NOTHING "
        "RETURNING seq", [store.table, store.tenant, usage.source, usage.tool_id, query_key, usage.query,
                          usage.time, usage.untaught_rank, key]).fetchone()
    if inserted is None:
        result.duplicates += 1
        return
    taught = conn.execute("SELECT count(*) FROM toolscout_feedback WHERE tbl = %s AND tenant = %s AND tool_id = %s "
                          "AND source = %s AND learned", [store.table, store.tenant, usage.tool_id,
                                                          usage.source]).fetchone()[0]
    if taught >= cap:
        result.capped += 1
        return
    conn.execute("UPDATE toolscout_feedback SET learned = true WHERE tbl = %s AND tenant = %s AND seq = %s",
                 [store.table, store.tenant, inserted[0]])
    result.learned.append(usage)


def _store_vectors(store, conn, vectors: Mapping[str, np.ndarray]) -> None:
    if vectors:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO toolscout_requests (tbl, tenant, key, embedding) VALUES (%s, %s, %s, %s) "
                            "ON CONFLICT DO NOTHING",
                            [(store.table, store.tenant, key, np.asarray(v, dtype=np.float32))
                             for key, v in sorted(vectors.items())])


def _store_scored(store, conn, scored: Sequence[Scored]) -> None:
    if scored:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO toolscout_scored (tbl, tenant, time, source, namespace, tool_id, query, "
                            "taught_before, served, untaught, learned, passed_by) VALUES (%s, %s, %s, %s, %s, %s, %s, "
                            "%s, %s, %s, %s, %s)",
                            [(store.table, store.tenant, r.time, r.source, r.namespace, r.tool, r.query,
                              r.taught_before, r.served, r.untaught, r.learned, list(r.passed_by)) for r in scored])


# taking back ------------------------------------------------------------------------------------
def holds(store, conn, source: str) -> bool:
    """Whether any feedback row or score of `source` is stored."""
    return any(conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE tbl = %s AND tenant = %s AND source = %s)",
                            [store.table, store.tenant, source]).fetchone()[0]
               for table in ("toolscout_feedback", "toolscout_scored"))


def forget(store, conn, source: str) -> list[str]:
    """Take back everything `source` taught; the ids of the tools it had taught."""
    ids = [r[0] for r in conn.execute("SELECT DISTINCT tool_id FROM toolscout_feedback WHERE tbl = %s AND tenant = %s "
                                      "AND source = %s ORDER BY tool_id", [store.table, store.tenant, source])]
    for table in ("toolscout_feedback", "toolscout_scored"):
        conn.execute(f"DELETE FROM {table} WHERE tbl = %s AND tenant = %s AND source = %s",
                     [store.table, store.tenant, source])
    bump_epoch(store, conn)
    return ids


def pairs_since(store, conn, before: float) -> list[tuple[str, float]]:
    """The (source, time) of each (request, tool) row taught (or held by a freeze) at or after `before`."""
    rows = conn.execute("SELECT source, taught_at FROM toolscout_feedback WHERE tbl = %s AND tenant = %s AND "
                        "taught_at >= %s AND learned", [store.table, store.tenant, before]).fetchall()
    return [(str(source), float(when)) for source, when in rows]


def holds_since(store, conn, before: float) -> bool:
    """Whether anything is stored from `before` on (feedback rows, capped ones too, or scores)."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM toolscout_feedback WHERE tbl = %s AND tenant = %s AND "
                        "taught_at >= %s) OR EXISTS (SELECT 1 FROM toolscout_scored WHERE tbl = %s AND tenant = %s "
                        "AND time >= %s)", [store.table, store.tenant, before] * 2).fetchone()[0]


def rollback(store, conn, before: float) -> list[tuple[str, float]]:
    """Take back everything taught at or after `before`; the (source, time) of the rows taught then."""
    removed = conn.execute("DELETE FROM toolscout_feedback WHERE tbl = %s AND tenant = %s AND taught_at >= %s "
                           "RETURNING learned, source, taught_at", [store.table, store.tenant, before]).fetchall()
    conn.execute("DELETE FROM toolscout_scored WHERE tbl = %s AND tenant = %s AND time >= %s",
                 [store.table, store.tenant, before])
    bump_epoch(store, conn)
    return [(str(source), float(when)) for learned, source, when in removed if learned]


def drop_tools(store, conn, ids: Sequence[str]) -> None:
    """A deleted tool's feedback goes with it."""
    if not ids:
        return
    gone = conn.execute("DELETE FROM toolscout_feedback WHERE tbl = %s AND tenant = %s AND tool_id = ANY(%s) "
                        "RETURNING 1", [store.table, store.tenant, list(ids)]).fetchall()
    conn.execute("DELETE FROM toolscout_scored WHERE tbl = %s AND tenant = %s AND tool_id = ANY(%s)",
                 [store.table, store.tenant, list(ids)])
    if gone:
        bump_epoch(store, conn)


def after_replace(store, conn) -> tuple[int, int]:
    """After a whole-catalog replace: the feedback of tools that are gone goes with them. (kept, dropped):
    the taught (tool, request) rows of the tools still there, and of those gone."""
    gone = ("f.tbl = %s AND f.tenant = %s AND NOT EXISTS "
            "(SELECT 1 FROM {t} t WHERE t.tenant = f.tenant AND t.id = f.tool_id)")
    dropped = conn.execute(store._sql(f"DELETE FROM toolscout_feedback f WHERE {gone} RETURNING learned"),
                           [store.table, store.tenant]).fetchall()
    conn.execute(store._sql(f"DELETE FROM toolscout_scored f WHERE {gone}"), [store.table, store.tenant])
    kept = conn.execute("SELECT count(*) FROM toolscout_feedback WHERE tbl = %s AND tenant = %s AND learned",
                        [store.table, store.tenant]).fetchone()[0]
    bump_epoch(store, conn)
    return int(kept), sum(1 for (learned,) in dropped if learned)


# learning's settings and epoch ---------------------------------------------------------------------
def bump_epoch(store, conn, settings: dict | None = None) -> None:
    conn.execute("INSERT INTO toolscout_learning AS l (tbl, tenant, epoch, settings) VALUES (%s, %s, 1, %s) "
                 "ON CONFLICT (tbl, tenant) DO UPDATE SET epoch = l.epoch + 1, "
                 "settings = coalesce(%s::jsonb, l.settings)",
                 [store.table, store.tenant, json.dumps(settings or {}),
                  None if settings is None else json.dumps(settings)])


def learning_state(store) -> tuple[int, dict]:
    """(epoch, settings) of the tenant's learning."""
    with store.database.connection() as conn:
        row = conn.execute("SELECT epoch, settings FROM toolscout_learning WHERE tbl = %s AND tenant = %s",
                           [store.table, store.tenant]).fetchone()
    return (0, {}) if row is None else (int(row[0]), dict(row[1] or {}))


def taught_since(store, seq: int = 0) -> list[Taught]:
    """The rows that teach, recorded after sequence number `seq`, in order."""
    with store.database.connection(bounded=seq > 0) as conn:  # from the start: grows with the log
        rows = conn.execute("SELECT seq, request_key, tool_id, source, query, taught_at, untaught_rank "
                            "FROM toolscout_feedback WHERE tbl = %s AND tenant = %s AND learned AND seq > %s "
                            "ORDER BY seq", [store.table, store.tenant, seq]).fetchall()
    return [Taught(int(s), k, t, src, q, float(when), None if r is None else int(r)) for s, k, t, src, q, when, r in rows]


def request_vectors(store, keys: Sequence[str]) -> dict[str, np.ndarray]:
    if not keys:
        return {}
    with store.database.connection(bounded=bounded_for(len(keys))) as conn:
        rows = conn.execute("SELECT key, embedding FROM toolscout_requests WHERE tbl = %s AND tenant = %s "
                            "AND key = ANY(%s)", [store.table, store.tenant, list(keys)]).fetchall()
    return {key: as_array(vector) for key, vector in rows}


def scored_since(store, seq: int = 0) -> tuple[int, list[Scored]]:
    """(the newest sequence number, the scores recorded after `seq`, in order)."""
    with store.database.connection(bounded=seq > 0) as conn:  # from the start: grows with the log
        rows = conn.execute("SELECT seq, time, source, namespace, tool_id, query, taught_before, served, untaught, "
                            "learned, passed_by FROM toolscout_scored WHERE tbl = %s AND tenant = %s AND seq > %s "
                            "ORDER BY seq", [store.table, store.tenant, seq]).fetchall()
    records = [Scored(float(t), s, ns, tool, q, bool(tb), sv, ut, ln, tuple(by))
               for _seq, t, s, ns, tool, q, tb, sv, ut, ln, by in rows]
    return (int(rows[-1][0]) if rows else seq), records


# reading ----------------------------------------------------------------------------------------
def summary(store, tool_id: str) -> dict[str, int]:
    with store.database.connection() as conn:
        learned, sources = conn.execute("SELECT count(*), count(DISTINCT source) FROM toolscout_feedback WHERE "
                                        "tbl = %s AND tenant = %s AND tool_id = %s AND learned",
                                        [store.table, store.tenant, tool_id]).fetchone()
        row = conn.execute(store._sql("SELECT reported FROM {t} WHERE tenant = %s AND id = %s"),
                           [store.tenant, tool_id]).fetchone()
    return {"learned": int(learned), "sources": int(sources), "reported": int(row[0]) if row else 0}


def learned_of(store, tool_ids: Sequence[str]) -> dict[str, int]:
    """Requests feedback taught each of `tool_ids` (0: none), in one query."""
    with store.database.connection(bounded=bounded_for(len(tool_ids))) as conn:
        rows = conn.execute("SELECT tool_id, count(*) FROM toolscout_feedback WHERE tbl = %s AND tenant = %s "
                            "AND learned AND tool_id = ANY(%s) GROUP BY tool_id",
                            [store.table, store.tenant, list(tool_ids)]).fetchall()
    found = {tool_id: int(n) for tool_id, n in rows}
    return {tool_id: found.get(tool_id, 0) for tool_id in tool_ids}


def totals(store) -> dict[str, Any]:
    with store.database.connection() as conn:
        row = conn.execute("SELECT events, failures FROM toolscout_feedback_totals WHERE tbl = %s AND tenant = %s",
                           [store.table, store.tenant]).fetchone()
        sources = conn.execute("SELECT source, count(*) FROM toolscout_feedback WHERE tbl = %s AND tenant = %s "
                               "AND learned GROUP BY source ORDER BY source", [store.table, store.tenant]).fetchall()
    events, failures = (int(row[0]), int(row[1])) if row else (0, 0)
    return {"events": events, "failures": failures, "sources": {s: int(n) for s, n in sources}}
