"""Which indexed tools an upstream's listing lets go, and which namespaces a gateway may prune.

- `OwnListings`: the catalog is this gateway's alone (its index directory, which it locks). A listing is the
  whole truth about its server: a tool it no longer lists goes (and what feedback taught it), and so do the
  tools of a server taken out of the config.
- `SharedListings`: gateway replicas on one PostgreSQL tenant (`toolscout gateway --store`), each connected to
  the upstreams itself. Each replica records its latest listing of each server (`store/pg_gateway.py`), and
  a tool goes only when no live replica's listing holds it: replicas whose servers list different tools (a
  stdio server started per replica, an HTTP one being redeployed) keep the union, rather than each deleting
  what the other added (a deleted tool loses what feedback taught it). A replica is live while it beats
  (every `HEARTBEAT_S`; gone after `LIVE_S` without a beat, or at once when it stops). Listings of one server
  are written one at a time across replicas (an advisory lock), so the second replica finds the first's rows
  and embeds nothing.
  A server's tools go (with what feedback taught them) only once no replica whose config names it has been
  alive for `KEEP_SERVER_S`: each beat records the servers its replica's config names, listed or not (one
  whose command is broken, or disabled, too). A replica that stops, restarts, pauses or misses its beats while
  the database is away is no server taken out of the config. Tools of namespaces no gateway's config named
  (written into the tenant by `toolscout index` or the HTTP API) are never pruned by a gateway. A replica
  whose beat finds it was late (no beat for `LIVE_S`: the others may have let go of what only it listed)
  lists its servers again at once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
from typing import Any, ContextManager, Iterable, Sequence

LIVE_S = 60.0  # a replica that has not beaten for this long no longer keeps tools listed
HEARTBEAT_S = 15.0
KEEP_SERVER_S = 7 * 86_400.0  # how long a server no live replica's config names keeps its tools and learning


class OwnListings:
    """See the module doc."""

    heartbeat_every: float | None = None  # nothing to beat for
    gone_because = "servers no longer in the config"  # what `prunable` namespaces are, as the log says it

    def writing(self, namespace: str) -> ContextManager[None]:
        return contextlib.nullcontext()

    def keep(self, namespace: str, ids: Sequence[str]) -> set[str]:
        """The indexed ids of `namespace` that stay after this listing of it (`ids`)."""
        return set(ids)

    def prunable(self, indexed: Iterable[str], configured: Iterable[str]) -> list[str]:
        """Of the namespaces with indexed tools, those whose tools go: no upstream in the config serves them."""
        return sorted(set(indexed) - set(configured))

    def heartbeat(self, configured: Iterable[str]) -> bool:
        """Whether this gateway was taken for gone since its last beat (never: no one else reads its catalog)."""
        return False

    def close(self) -> None:
        return None


class SharedListings:
    """See the module doc. `state`: the tenant's `store.pg_gateway.PgGatewayState`."""

    heartbeat_every: float | None = HEARTBEAT_S

    def __init__(self, state: Any, *, replica: str | None = None, live_s: float = LIVE_S,
                 keep_server_s: float = KEEP_SERVER_S):
        self.state, self.live_s, self.keep_server_s = state, live_s, keep_server_s
        self.gone_because = f"servers no replica's config has named for {_span(keep_server_s)}"
        self._beaten = False
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        # one listing written at a time in this process: each holds a pooled connection for its lock, and the
        # pool must keep one for the write itself
        self._writing = threading.Lock()

    @contextlib.contextmanager
    def writing(self, namespace: str):
        with self._writing, self.state.namespace_lock(namespace):
            yield

    def keep(self, namespace: str, ids: Sequence[str]) -> set[str]:
        return self.state.record_listing(self.replica, namespace, ids, self.live_s)

    def prunable(self, indexed: Iterable[str], configured: Iterable[str]) -> list[str]:
        named = self.state.named_namespaces(self.keep_server_s)
        return sorted(ns for ns in set(indexed) - set(configured) if ns in named and not named[ns])

    def heartbeat(self, configured: Iterable[str]) -> bool:
        """This replica is alive and names the servers `configured`; whether it had been taken for gone (no beat
        for `live_s`, or its records forgotten) since its last beat, so that tools only it listed may have gone."""
        late = self.state.heartbeat(self.replica, list(configured), self.live_s)
        late, self._beaten = late and self._beaten, True  # the first beat finds nothing of its own: not late
        return late

    def close(self) -> None:
        self.state.retire(self.replica)


def _span(seconds: float) -> str:
    for unit, size in (("day", 86_400), ("hour", 3_600)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}{'' if seconds == size else 's'}"
    return f"{seconds:g} s"
