"""What gateway replicas on one PostgreSQL tenant share besides its catalog (`toolscout gateway --store`):

- Tool definitions (`toolscout_definitions`): per tool id, the fingerprint first seen, the present one, its
  changes, and the digest an operator approved. Every change takes a new `stamp` from a sequence, so a replica
  reads only what changed since it last looked (one indexed query when nothing did). What a record holds, and
  how a listing changes it, is the gateway's (`gateway/definitions.py`): `observe` applies its `merge` to the
  stored records under a lock, so replicas that see the same change record it once.
- Listings (`toolscout_listings`): per upstream (namespace) and replica, the ids that replica last listed
  (`listed_at`; 'epoch' and no ids for a namespace its config names that it has not listed, and no ids once
  it stopped), and when it was last known alive (`at`, refreshed by `heartbeat`). The gateway lets a tool go
  only when no live replica's listing holds it, and a namespace's tools only when no replica that named it
  has been alive for days (`gateway/listings.py`), with one listing of a namespace written at a time across
  replicas (`namespace_lock`, an advisory lock).

`catalog` is the tenant's `PgCatalog` (or any `pgvector.PgTenantRows`): its pool, table and tenant.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping, Sequence

# A definition record's merge (`gateway/definitions.py`): (stored record or None, fingerprint seen) -> the record
# to store, or None when nothing changed.
Merge = Callable[["dict[str, Any] | None", "dict[str, str]"], "dict[str, Any] | None"]
_COLUMNS = ("first_seen", "first", "fields", "changes", "approved")


class PgGatewayState:
    """See the module doc."""

    def __init__(self, catalog: Any):
        self.catalog = catalog
        self.database, self.table, self.tenant = catalog.database, catalog.table, catalog.tenant

    def _key(self, what: str) -> str:
        return f"toolscout.gateway.{what}.{self.table}.{self.tenant}"

    # definitions -------------------------------------------------------------------------------
    def definitions_since(self, stamp: int) -> tuple[int, dict[str, dict[str, Any]]]:
        """(the newest stamp, id -> record) of the records changed after `stamp`."""
        with self.database.connection() as conn:
            rows = conn.execute("SELECT id, first_seen, first, fields, changes, approved, stamp "
                                "FROM toolscout_definitions WHERE tbl = %s AND tenant = %s AND stamp > %s",
                                [self.table, self.tenant, stamp]).fetchall()
        records = {row[0]: dict(zip(_COLUMNS, row[1:6])) for row in rows}
        return max([stamp] + [int(row[6]) for row in rows]), records

    def observe(self, seen: Mapping[str, dict[str, str]], merge: Merge) -> list[str]:
        """Apply `merge` to the stored record of each id in `seen` (its fingerprint), in one transaction under
        the tenant's definitions lock; the ids that had a record and got a new one (their definition changed)."""
        from psycopg.types.json import Jsonb

        changed = []
        with self.database.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [self._key("definitions")])
            stored = {row[0]: dict(zip(_COLUMNS, row[1:])) for row in conn.execute(
                "SELECT id, first_seen, first, fields, changes, approved FROM toolscout_definitions "
                "WHERE tbl = %s AND tenant = %s AND id = ANY(%s)", [self.table, self.tenant, list(seen)]).fetchall()}
            rows = []
            for tool_id, fields in seen.items():
                record = merge(stored.get(tool_id), fields)
                if record is not None:
                    changed += [tool_id] if tool_id in stored else []
                    rows.append((self.table, self.tenant, tool_id, record["first_seen"], record["first"],
                                 Jsonb(record["fields"]), Jsonb(record["changes"])))
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO toolscout_definitions (tbl, tenant, id, first_seen, first, fields, "
                                "changes) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (tbl, tenant, id) DO UPDATE "
                                "SET fields = EXCLUDED.fields, changes = EXCLUDED.changes, "
                                "stamp = nextval('toolscout_definitions_stamp')", rows)
        return changed

    def approve(self, digests: Mapping[str, str]) -> None:
        """Record each id's approved digest (one transaction)."""
        with self.database.connection() as conn, conn.transaction():
            with conn.cursor() as cur:
                cur.executemany("UPDATE toolscout_definitions SET approved = %s, "
                                "stamp = nextval('toolscout_definitions_stamp') "
                                "WHERE tbl = %s AND tenant = %s AND id = %s",
                                [(digest, self.table, self.tenant, tid) for tid, digest in digests.items()])

    # listings ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def namespace_lock(self, namespace: str) -> Iterator[None]:
        """Hold the lock on `namespace`'s listings (across replicas; released if this process dies)."""
        key = [self._key(f"listing.{namespace}")]
        with self.database.connection(bounded=False) as conn:  # held while the listing is indexed, however long
            conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", key)
            try:
                yield
            finally:
                conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", key)

    def record_listing(self, replica: str, namespace: str, ids: Sequence[str], live_s: float) -> set[str]:
        """Record `replica`'s listing of `namespace`; the ids that some listing of it by a replica alive within
        `live_s` seconds holds (this one's included)."""
        with self.database.connection() as conn, conn.transaction():
            conn.execute("INSERT INTO toolscout_listings (tbl, tenant, namespace, replica, ids) "
                         "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tbl, tenant, namespace, replica) "
                         "DO UPDATE SET ids = EXCLUDED.ids, listed_at = now(), at = now()",
                         [self.table, self.tenant, namespace, replica, list(ids)])
            rows = conn.execute("SELECT DISTINCT unnest(ids) FROM toolscout_listings WHERE tbl = %s AND tenant = %s "
                                "AND namespace = %s AND (replica = %s OR at > now() - make_interval(secs => %s))",
                                [self.table, self.tenant, namespace, replica, live_s]).fetchall()
        return {row[0] for row in rows}

    def named_namespaces(self, within_s: float) -> dict[str, bool]:
        """Every namespace a gateway has named (listed, or has in its config) in this tenant: whether a replica
        that named it was alive within `within_s` seconds."""
        with self.database.connection() as conn:
            rows = conn.execute("SELECT namespace, bool_or(at > now() - make_interval(secs => %s)) "
                                "FROM toolscout_listings WHERE tbl = %s AND tenant = %s GROUP BY namespace",
                                [within_s, self.table, self.tenant]).fetchall()
        return {namespace: bool(live) for namespace, live in rows}

    def heartbeat(self, replica: str, namespaces: Sequence[str], live_s: float,
                  forget_after_s: float = 86_400.0) -> bool:
        """`replica` is alive and names `namespaces` (a row each, with no ids until it lists one): its listings
        count. Whether it had been taken for gone: its rows older than `live_s`, or none left. Listings of
        replicas gone for `forget_after_s` are removed, but for the newest of each namespace (it says when a
        replica last named that namespace)."""
        key = [self.table, self.tenant, replica]
        with self.database.connection() as conn, conn.transaction():
            newest = conn.execute("SELECT max(at) > now() - make_interval(secs => %s) FROM toolscout_listings "
                                  "WHERE tbl = %s AND tenant = %s AND replica = %s", [live_s, *key]).fetchone()[0]
            conn.execute("UPDATE toolscout_listings SET at = now() WHERE tbl = %s AND tenant = %s AND replica = %s",
                         key)
            conn.execute("INSERT INTO toolscout_listings (tbl, tenant, namespace, replica, ids, listed_at) "
                         "SELECT %s, %s, unnest(%s::text[]), %s, '{}', 'epoch' ON CONFLICT DO NOTHING",
                         [self.table, self.tenant, list(namespaces), replica])
            conn.execute("DELETE FROM toolscout_listings l WHERE tbl = %s AND tenant = %s "
                         "AND at < now() - make_interval(secs => %s) AND EXISTS (SELECT 1 FROM toolscout_listings m "
                         "WHERE m.tbl = l.tbl AND m.tenant = l.tenant AND m.namespace = l.namespace AND m.at > l.at)",
                         [self.table, self.tenant, forget_after_s])
        return not newest

    def retire(self, replica: str) -> None:
        """`replica` stops: its listings no longer keep tools (their ids go; `at` stays, when it was last alive)."""
        with self.database.connection() as conn:
            conn.execute("UPDATE toolscout_listings SET ids = '{}' WHERE tbl = %s AND tenant = %s AND replica = %s",
                         [self.table, self.tenant, replica])
