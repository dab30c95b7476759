"""A PostgreSQL database that stops answering, told once in the log rather than at every reconnection attempt.

While the database is down, psycopg_pool warns at each attempt to reconnect (about 60 lines in 90 s, with
requests arriving, each starting another round of attempts): the server's log drowned in them. `Outage`, one
per connection pool, keeps its own pool's warnings out of the log (a filter on the `psycopg.pool` logger that
recognises the pool by its name, the first argument of those warnings) and logs one line when the pool cannot
connect and one when it connects again. It keeps why the last attempt failed (`cause`), which the 503 of a
request that got no connection gives after the database's name (`PgDatabase.connection`)."""

from __future__ import annotations

import logging
import threading
import time

POOL_LOGGER = "psycopg.pool"  # psycopg_pool's logger
logger = logging.getLogger(__name__)


class Outage:
    """Whether one connection pool can connect (see the module doc). `where`: the database as the log names
    it (without its password); `pool_name`: the pool's name (unique in the process: the filter matches it)."""

    def __init__(self, where: str, pool_name: str):
        self.where, self.pool_name = where, pool_name
        self.since: float | None = None  # when the pool first failed to connect (None: it connects)
        self.cause: str | None = None  # why its last attempt failed, psycopg's first line (None: it connects)
        self._lock = threading.Lock()

    def watch(self) -> None:
        logging.getLogger(POOL_LOGGER).addFilter(self)

    def unwatch(self) -> None:
        logging.getLogger(POOL_LOGGER).removeFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        """Drop this pool's warnings (a connection attempt failed, a round of attempts gave up): the outage
        they tell of is logged once instead. Anything else passes."""
        args = record.args if isinstance(record.args, tuple) else ()
        if record.levelno < logging.WARNING or not args or args[0] != self.pool_name:
            return True
        error = next((a for a in args if isinstance(a, BaseException)), None)
        self.down(str(error) if error is not None else None)  # None: a round of attempts gave up
        return False

    def down(self, reason: str | None) -> None:
        """The pool failed to connect, for `reason` (None: not told): logged if it connected until now."""
        with self._lock:
            if reason and reason.strip():
                self.cause = reason.strip().splitlines()[0]
            if self.since is not None:
                return
            self.since = time.monotonic()
        logger.warning("cannot connect to the PostgreSQL database %s (%s): requests are answered 503, naming it, "
                       "until it answers again; reconnecting meanwhile (each attempt's warning is left out of "
                       "the log)", self.where, self.cause or "no reason given")

    def up(self) -> None:
        """The pool made a connection: logged if it had failed to until now."""
        if self.since is None:  # the common case, every new connection: no lock taken
            return
        with self._lock:
            if self.since is None:
                return
            down_for, self.since, self.cause = time.monotonic() - self.since, None, None
        logger.warning("the PostgreSQL database %s answers again: connected after %.0f s of failed attempts",
                       self.where, down_for)
