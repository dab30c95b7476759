"""benchmarks/peers.py end to end on a tiny fixture catalog: toolscout's BM25 in toolscout's own environment and
the plain bm25s peer in the peers' environment (.venv-peers; the test skips without it). The report's scores
are checked against hand-worked values and against toolscout.eval.metrics applied, here, to the rankings."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from toolscout.eval.metrics import query_metrics

pytestmark = pytest.mark.slow  # runs the peers' benchmark in their environment

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "peers"
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
SYSTEMS = ("toolscout-bm25", "bm25s")

# Hand-worked: where each test query's gold tools must rank, whatever the BM25 flavour. q1: only t0 shares
# a word with the query. q2: t1 holds both "invoice" and "pdf", the gold t2 only "invoice", so t2 is 2nd.
# q3: t4 holds "weather" and "forecast", t3 only "weather"; both are gold. q4 is scored, not hand-worked.
HAND_RANKS = {"q1": {"t0": 1}, "q2": {"t2": 2}, "q3": {"t4": 1, "t3": 2}}
HAND_NDCG = {"q1": 1.0, "q2": 1 / math.log2(3), "q3": 1.0}


def load_module(name: str):
    """A benchmarks/ script as a module (registered under its name: its dataclasses need that)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


@pytest.fixture(scope="module")
def peers():
    return load_module("peers")


@pytest.fixture(scope="module")
def report(peers, tmp_path_factory):
    if not PEERS_PYTHON.exists():
        pytest.skip(f"needs the peers' environment at {PEERS_PYTHON} (bash scripts/setup_peers.sh)")
    out = tmp_path_factory.mktemp("peers") / "report.json"
    peers.main(["--data", str(FIXTURE), "--systems", ",".join(SYSTEMS), "--trained-on", "",
                "--json", str(out)])
    return json.loads(out.read_text())


def child_rankings(peers, system: str, tmp_path: Path) -> list[list[str]]:
    """Run one system's child directly, as peers.py does, and read its rankings."""
    bench = peers.load_set(FIXTURE / "tiny", None)
    task, out = tmp_path / "task.json", tmp_path / "out.json"
    task.write_text(json.dumps(peers.child_task([bench])))
    python = sys.executable if not peers.SYSTEMS[system].peer else str(PEERS_PYTHON)
    subprocess.run([python, str(peers.CHILD), system, str(task), str(out)], check=True,
                   env=peers.child_env(peers.SYSTEMS[system].peer), timeout=300)
    return json.loads(out.read_text())["sets"]["tiny"]["rankings"]


def test_children_never_see_labels(peers):
    bench = peers.load_set(FIXTURE / "tiny", None)
    assert [q["id"] for q in bench["queries"]] == ["q1", "q2", "q3", "q4"]  # the test split only
    assert "labels" not in json.dumps(peers.child_task([bench]))
    assert [t["name"] for t in bench["tools"]][-1] == "get_weather_2"  # a repeated name made unique


@pytest.mark.parametrize("system", SYSTEMS)
def test_scores_match_hand_worked_values_and_the_metrics(peers, report, system, tmp_path):
    result = report["systems"][system]
    assert "error" not in result, result.get("error")
    bench = peers.load_set(FIXTURE / "tiny", None)
    rankings = child_rankings(peers, system, tmp_path)
    by_id = dict(zip((q["id"] for q in bench["queries"]), rankings, strict=True))
    for qid, ranks in HAND_RANKS.items():
        assert {tool: by_id[qid].index(tool) + 1 for tool in ranks} == ranks, (qid, by_id[qid])
        labels = next(q["labels"] for q in bench["queries"] if q["id"] == qid)
        assert query_metrics(by_id[qid], set(labels), 10)["ndcg@10"] == pytest.approx(HAND_NDCG[qid])
    per_query = [query_metrics(r, set(q["labels"]), 10) for r, q in zip(rankings, bench["queries"], strict=True)]
    scores = result["sets"]["tiny"]
    for metric in ("ndcg@10", "recall@10", "completeness@10"):
        assert scores[metric] == pytest.approx(100 * sum(m[metric] for m in per_query) / len(per_query))
    assert scores["queries"] == 4
    assert len(result["latency_ms"]) == 3 and result["peak_rss_mb"] > 0


def test_the_table_has_a_row_per_system_and_the_ones_that_cannot_run(peers, report):
    table = peers.markdown(report)
    for system in SYSTEMS:
        assert f"| {peers.SYSTEMS[system].label} |" in table
    for label in peers.CANNOT_RUN:
        assert f"| {label} |" in table
