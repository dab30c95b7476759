"""A real PostgreSQL with pgvector for the tests of the PostgreSQL store and of the servers on it: the
`pgserver` package's server, started once per test process in a temporary directory and removed at exit.

pgserver, psycopg and pgvector are test dependencies (`pip install -e ".[all]"`, which scripts/setup.sh
runs): a missing package or a server that will not start is a broken install, and the tests that need
the database fail saying so. They never skip: CI must not pass without them."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import tempfile
import warnings
from pathlib import Path

import pytest

_tables = itertools.count()


@functools.cache
def _server():
    import pgserver

    return pgserver.get_server(tempfile.mkdtemp(prefix="toolscout-pg-"), cleanup_mode="delete")


def postgres_uri() -> str:
    """The server's URI (a unix socket in its temporary directory); fails the test when there is none."""
    with warnings.catch_warnings():  # pgserver's platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        return _postgres_uri()


def _postgres_uri() -> str:
    try:
        import pgserver  # noqa: F401
        import pgvector.psycopg  # noqa: F401
        import psycopg
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"the PostgreSQL tests need pgserver, psycopg and pgvector (pip install -e '.[all]', as "
                    f"scripts/setup.sh does): {exc}", pytrace=False)
    try:
        uri = _server().get_uri()
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except Exception as exc:
        pytest.fail(f"could not start PostgreSQL with pgvector from pgserver: {exc}", pytrace=False)
    return uri


def pg_ctl(data, command: str) -> None:
    """Start or stop ("start", "stop") a PostgreSQL of its own in the folder `data`, from another process: pgserver
    keeps one server object per process, and starting it again in this one would hand back the stopped one."""
    import subprocess
    import sys

    script = ("import sys, warnings; warnings.simplefilter('ignore'); import pgserver; "
              "from pgserver._commands import pg_ctl; d = sys.argv[1]; "
              "pgserver.get_server(d, cleanup_mode=None) if sys.argv[2] == 'start' "
              "else pg_ctl(['-w', '-m', 'fast', 'stop'], pgdata=d, user='pgserver')")
    done = subprocess.run([sys.executable, "-c", script, str(data), command], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"pg_ctl {command} failed ({done.returncode}): {done.stderr[-2000:]}"


def own_server_uri(data) -> str:
    """Start a PostgreSQL of its own in `data` (one a test may stop: `pg_ctl`), with pgvector; its URI."""
    import pgserver
    import psycopg

    pg_ctl(data, "start")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        uri = pgserver.get_server(str(data), cleanup_mode=None).get_uri()
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return uri


def signal_server(data, signum: int) -> None:
    """Send `signum` to the PostgreSQL of `own_server_uri(data)` and to every process it started (its
    backends): SIGSTOP freezes the database without closing a socket, SIGCONT wakes it."""
    postmaster = (Path(data) / "postmaster.pid").read_text().split()[0]
    backends = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _parent(pid) == postmaster]
    for pid in [int(postmaster), *backends]:
        with contextlib.suppress(ProcessLookupError):  # a backend that ended meanwhile
            os.kill(pid, signum)


def _parent(pid: str) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[1]  # after the command name, which may hold spaces: state, parent


def new_table() -> str:
    """A table name no other test uses (each test gets its own index table in the shared server)."""
    return f"ts{os.getpid()}_{next(_tables)}"


def spec(uri: str, table: str, tenant: str | None = None) -> str:
    extra = f"&table={table}" + (f"&tenant={tenant}" if tenant else "")
    return uri + (extra if "?" in uri else "?" + extra[1:])


def assert_same_ranking(got, want) -> None:
    """Two lists of hits rank the same tools in the same order with the same scores, up to float32's last
    digits: pgvector and numpy sum a float32 dot product in different orders, and rounding both to a fixed
    number of places split them wherever a score sat on a rounding boundary."""
    assert [h.tool.id for h in got] == [h.tool.id for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-5, abs=1e-6)
