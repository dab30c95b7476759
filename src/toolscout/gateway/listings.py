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
  and embeds nothing. A namespace no replica's config names is pruned only when some gateway listed it and
  no live replica lists it any more: tools written into the tenant by other means (`toolscout index`, the
  HTTP API) are never pruned by a gateway.
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


class OwnListings:
    """See the module doc."""

    heartbeat_every: float | None = None  # nothing to beat for

    def writing(self, namespace: str) -> ContextManager[None]:
        return contextlib.nullcontext()

    def keep(self, namespace: str, ids: Sequence[str]) -> set[str]:
        """The indexed ids of `namespace` that stay after this listing of it (`ids`)."""
        return set(ids)

    def prunable(self, indexed: Iterable[str], configured: Iterable[str]) -> list[str]:
        """Of the namespaces with indexed tools, those whose tools go: no upstream in the config serves them."""
        return sorted(set(indexed) - set(configured))

    def heartbeat(self) -> None:
        return None

    def close(self) -> None:
        return None


class SharedListings:
    """See the module doc. `state`: the tenant's `store.pg_gateway.PgGatewayState`."""

    heartbeat_every: float | None = HEARTBEAT_S

    def __init__(self, state: Any, *, replica: str | None = None, live_s: float = LIVE_S):
        self.state, self.live_s = state, live_s
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
        listed = self.state.listed_namespaces(self.live_s)
        return sorted(ns for ns in set(indexed) - set(configured) if ns in listed and not listed[ns])

    def heartbeat(self) -> None:
        self.state.heartbeat(self.replica)

    def close(self) -> None:
        self.state.retire(self.replica)
