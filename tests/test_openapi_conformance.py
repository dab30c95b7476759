"""The HTTP API does what its OpenAPI document says, checked by Schemathesis against real servers on
loopback (a pipeline directory and a PostgreSQL store): every operation, all checks (no 5xx, documented
status codes, headers and response bodies, schema-valid requests accepted and schema-violating ones
refused, Allow on 405, auth that is not ignored), in the examples, coverage, fuzzing and stateful phases (the
PostgreSQL server without the coverage phase: see its test).

The seed is fixed so that a run is repeatable; TOOLSCOUT_SCHEMATHESIS_EXAMPLES raises the examples per
operation for a deeper run (the default keeps the file near a minute on two cores). The settings that
differ from Schemathesis' defaults, each with its reason, are in tests/schemathesis.toml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pgtest import new_table, postgres_uri, spec
from servers import start_server, stop

from toolscout import ToolScout

pytestmark = pytest.mark.slow  # starts servers and PostgreSQL, runs Schemathesis

TOKEN = "conformance-token"
CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = int(os.environ.get("TOOLSCOUT_SCHEMATHESIS_EXAMPLES", "8"))


def schemathesis(url: str, *extra: str, examples: int = EXAMPLES) -> str:
    cli = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    assert cli, "schemathesis is a test dependency (pip install -e '.[all]', as scripts/setup.sh does)"
    run = subprocess.run([cli, "--config-file", str(CONFIG), "run", f"{url}/openapi.json", "--checks", "all",
                          "--max-examples", str(examples), "--seed", "20261124", "--output-truncate", "true",
                          "--warnings", "off", *extra], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    return run.stdout


def passed(output: str) -> int:
    """How many generated cases the run reports (all of them passed: the exit status says so)."""
    line = next(line for line in output.splitlines() if "generated" in line and "passed" in line)
    generated, passed_ = (int(word) for word in line.replace(",", " ").split() if word.isdigit())
    assert generated == passed_, line
    return generated


@pytest.fixture
def directory_server(tmp_path, tools, encoder):
    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever="dense", encoder=encoder).save(folder)
    proc, url = start_server([str(folder)], token=TOKEN)
    yield url
    stop(proc)


def test_directory_server_conforms_to_its_openapi_document(directory_server):
    output = schemathesis(directory_server, "-H", f"Authorization: Bearer {TOKEN}")
    assert passed(output) > 15 * EXAMPLES  # every operation was exercised, not just a few


def test_without_a_token_every_write_is_refused_as_documented(directory_server):
    # the same checks without credentials on every operation that is not a GET (the GETs are the reads the
    # run above covers): POST /search answers, writes get the documented 401 (ignored_auth would fail a
    # write that went through)
    # (the coverage phase's boundary cases were run with credentials above; here random cases suffice)
    output = schemathesis(directory_server, "--exclude-method", "GET", "--phases", "examples,fuzzing",
                          examples=max(2, EXAMPLES // 2))
    assert passed(output) > 0


def test_postgres_server_conforms_to_its_openapi_document(tools, encoder):
    from toolscout.postgres import index_catalog
    from toolscout.store.pgvector import PgVectorStore

    store_spec = spec(postgres_uri(), new_table())
    index_catalog(PgVectorStore.from_spec(store_spec, encoder.dim), tools, encoder)
    proc, url = start_server(["--store", store_spec], token=TOKEN)
    try:
        # PostgreSQL text cannot hold U+0000: that store refuses it with a 422 naming the field
        # (test_pg_serve.py), so the schema-valid strings generated here leave it out. The coverage phase's
        # boundary cases test the request layer, which is the directory server's (run above, where that
        # phase is three quarters of the time); what reaches the store here is twice the random cases.
        assert passed(schemathesis(url, "-H", f"Authorization: Bearer {TOKEN}", "--generation-allow-x00", "false",
                                   "--phases", "examples,fuzzing,stateful", examples=2 * EXAMPLES)) > 30 * EXAMPLES
    finally:
        stop(proc)
