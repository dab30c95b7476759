"""Cutting the connection to a PostgreSQL database that stopped answering.

libpq waits for an answer as long as it takes. A database that stops without closing its sockets (a process
or virtual machine frozen, a host whose kernel still acknowledges what is sent) never answers, so a request
waiting on it hung for good, and so did every request behind it. A block of database work is given a
deadline (`Deadlines.watching`); one thread per process shuts the connection's socket down when a deadline
passes. The waiting statement then fails at once, the connection is broken, and the pool replaces it
(`PgDatabase.connection` tells the caller the database did not answer in time: a 503 naming it)."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from typing import Any, Iterator

BOUNDED_ROWS = 1000  # work on at most this many rows is a request's, and bounded; larger work grows with the data


def bounded_for(rows: int | None) -> bool:
    """Whether database work on `rows` rows (None: all of a tenant's) is bounded by the answer timeout: a
    request's work is; loading or writing a whole catalog or feedback log grows with it, and is not."""
    return rows is not None and rows <= BOUNDED_ROWS


class Watch:
    """One block of work on connection `conn`, due by `due` (time.monotonic()); `cut` once its deadline passed
    and the connection was shut down."""

    __slots__ = ("conn", "due", "seconds", "done", "cut")

    def __init__(self, conn: Any, seconds: float):
        self.conn, self.seconds = conn, seconds
        self.due = time.monotonic() + seconds
        self.done = self.cut = False


class Deadlines:
    """The deadlines of one process's database work (see the module doc), watched by one daemon thread,
    started on first use. A finished block is dropped from the heap lazily, when it reaches the top."""

    def __init__(self):
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()  # ties on `due` never compare two Watches
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, conn: Any, seconds: float | None) -> Iterator[Watch | None]:
        """Within the block, `conn` is cut if the block outlasts `seconds` (None: no deadline)."""
        if seconds is None:
            yield None
            return
        watch = Watch(conn, seconds)
        with self._cond:
            heapq.heappush(self._due, (watch.due, next(self._order), watch))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="toolscout-pg-deadlines", daemon=True)
                self._thread.start()
            elif self._due[0][2] is watch:  # the earliest deadline now: the thread's wait must end sooner
                self._cond.notify()
        try:
            yield watch
        finally:
            with self._cond:  # under the lock: a connection is never cut after its block has ended
                watch.done = True

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._due and self._due[0][2].done:
                    heapq.heappop(self._due)
                if not self._due:
                    self._cond.wait()
                    continue
                left = self._due[0][0] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                watch = heapq.heappop(self._due)[2]
                watch.cut = True
                shut_down(watch.conn)


def shut_down(conn: Any) -> None:
    """Shut the socket of psycopg connection `conn` down in both directions: a read waiting on it returns at
    once (end of stream) and libpq marks the connection broken. The descriptor stays libpq's to close."""
    with contextlib.suppress(Exception):  # already closed, or no socket: nothing is waiting on it then
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


DEADLINES = Deadlines()  # one watcher thread for every pool in the process
