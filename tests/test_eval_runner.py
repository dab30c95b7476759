"""`evaluate` end to end: real BM25 over two small benchmark folders, metrics checked by hand.

The fixture sets (tests/fixtures/eval) were written so that BM25's top 2 is clear-cut. At k=2 the
1-based ranks of the gold tools found, per test query, are:

  alpha  a1 [1] of 1 (pooled: [2], gamma's weather alerts outranks it)   a2 [1] of 2   a3 [] of 1
         a4 [1] of 1   a5 [1, 2] of 2   a6 [1] of 1   a7 [1] of 1   a8 [1] of 1
  beta   b1 [1] of 1   b2 [1, 2] of 2   b3 [1, 2] of 2   b4 [1, 2] of 2   b5 [1] of 1
         b6 [2] of 1   b7 [2] of 2   b8 [1] of 1       (b9 has no labels: skipped)

gamma_corpus has tools only: skipped in own-corpus mode, a distractor in pooled mode.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from toolscout.benchmark_sets import load_benchmark
from toolscout.eval import EvalReport, evaluate, query_metrics
from toolscout.retrievers.bm25 import BM25Retriever

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
SETS = [FIXTURES / "alpha", FIXTURES / "beta", FIXTURES / "gamma_corpus"]

D2 = 1 / math.log2(3)  # discount of rank 2
HALF = 1 / (1 + D2)  # nDCG of one of two gold tools, found at rank 1
SECOND_OF_TWO = D2 / (1 + D2)  # nDCG of one of two gold tools, found at rank 2


class BM25System:
    """The system under test: the real BM25 retriever behind the `retrieve` interface evaluate expects."""

    def __init__(self, tools):
        self.retriever = BM25Retriever()
        self.retriever.index(tools)

    def retrieve(self, queries, k):
        return self.retriever.search(queries, k)


@pytest.fixture(scope="module")
def own():
    return evaluate(SETS, BM25System, k=2, name="bm25", progress=False)


@pytest.fixture(scope="module")
def pooled():
    return evaluate(SETS, BM25System, k=2, name="bm25", pooled=True, progress=False)


def points(values):
    return 100 * sum(values) / len(values)


BETA = {
    "ndcg@2": points([1, 1, 1, 1, 1, D2, SECOND_OF_TWO, 1]),
    "recall@2": points([1, 1, 1, 1, 1, 1, 0.5, 1]),
    "completeness@2": points([1, 1, 1, 1, 1, 1, 0, 1]),
    "mrr@2": points([1, 1, 1, 1, 1, 0.5, 0.5, 1]),
}
ALPHA_OWN = {
    "ndcg@2": points([1, HALF, 0, 1, 1, 1, 1, 1]),
    "recall@2": points([1, 0.5, 0, 1, 1, 1, 1, 1]),
    "completeness@2": points([1, 0, 0, 1, 1, 1, 1, 1]),
    "mrr@2": points([1, 1, 0, 1, 1, 1, 1, 1]),
}
ALPHA_POOLED = {**ALPHA_OWN, "ndcg@2": points([D2, HALF, 0, 1, 1, 1, 1, 1]), "mrr@2": points([0.5, 1, 0, 1, 1, 1, 1, 1])}


def assert_metrics(actual, expected):
    assert set(actual) == set(expected)
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value, abs=1e-9), key


def test_own_corpus_metrics_by_hand(own):
    assert list(own.sets) == ["alpha", "beta"]
    assert own.sets["alpha"].n_queries == 8 and own.sets["beta"].n_queries == 8
    assert_metrics(own.sets["alpha"].metrics, ALPHA_OWN)
    assert_metrics(own.sets["beta"].metrics, BETA)
    assert_metrics(own.mean, {key: (ALPHA_OWN[key] + BETA[key]) / 2 for key in BETA})


def test_pooled_metrics_by_hand(pooled):
    assert_metrics(pooled.sets["alpha"].metrics, ALPHA_POOLED)
    assert_metrics(pooled.sets["beta"].metrics, BETA)
    # the pooled corpus really is the union: a distractor from the corpus-only folder ranks first
    assert pooled.sets["alpha"].rankings[0] == ["gamma_weather_alerts", "alpha_weather_forecast"]


def test_rankings_and_per_query_scores(own):
    alpha = own.sets["alpha"]
    assert alpha.query_ids == [f"a{i}" for i in range(1, 9)]
    assert alpha.rankings[1] == ["alpha_book_hotel", "alpha_book_flight"]  # a2: search_flights fell to rank 3
    assert alpha.rankings[2] == []  # a3: no word in common with any tool
    # per-query values are the metrics of the stored rankings, in query order, 0–1
    queries = {q.id: q for q in load_benchmark(FIXTURES / "alpha").split("test")}
    for i, (qid, ranked) in enumerate(zip(alpha.query_ids, alpha.rankings)):
        for key, value in query_metrics(ranked, set(queries[qid].labels), 2).items():
            assert alpha.per_query[key][i] == value
    assert isinstance(alpha.per_query["ndcg@2"], np.ndarray)
    assert alpha.per_query["recall@2"].tolist() == [1, 0.5, 0, 1, 1, 1, 1, 1]


def test_by_category_uses_first_gold_tool(own):
    cats = own.sets["alpha"].by_category
    # a1, a6 weather; a2, a5 travel; a3, a7 finance; a8 home; a4's tool has no category
    assert {c: v["queries"] for c, v in cats.items()} == {"weather": 2, "travel": 2, "finance": 2, "home": 1, "unknown": 1}
    assert cats["travel"]["ndcg@2"] == pytest.approx(100 * (HALF + 1) / 2)
    assert cats["finance"]["mrr@2"] == pytest.approx(50.0)
    assert cats["unknown"]["completeness@2"] == 100.0


def test_skipped_sets_and_queries_are_reported(own, pooled):
    assert "gamma_corpus" not in own.sets
    for report in (own, pooled):
        assert any("gamma_corpus" in w and "skipped" in w for w in report.warnings)
        assert any("beta" in w and "no labels" in w for w in report.warnings)
    assert pooled.config["sets"]["gamma_corpus"]["tools"] == 4


def test_latency_and_build_time(own, pooled):
    for report in (own, pooled):
        assert len(report.latency_ms) == 16 and all(ms > 0 for ms in report.latency_ms)
        assert report.latency_ms == report.sets["alpha"].latency_ms + report.sets["beta"].latency_ms
        assert 0 < report.p50_ms <= report.p99_ms <= max(report.latency_ms)
        assert report.throughput_qps == pytest.approx(16 / (sum(report.latency_ms) / 1000))
        assert report.build_s > 0
    assert all(s.build_s > 0 for s in own.sets.values())
    assert own.build_s == pytest.approx(sum(s.build_s for s in own.sets.values()))
    assert all(s.build_s is None for s in pooled.sets.values())  # one shared index: report.build_s


def test_json_has_exactly_the_cli_shape(tmp_path):
    report = evaluate(SETS[:2], BM25System, name="bm25", progress=False)  # default k=10
    data = report.to_json()
    required = {"sets", "mean", "latency_ms"}
    assert required <= set(data) <= required | {"system", "k", "throughput_qps", "build_s", "warnings", "degraded"}
    assert data["warnings"] == report.warnings == ["beta: skipped 1 test queries with no labels (first: 'b9')"]
    assert data["degraded"] == {}  # BM25 alone: no stage that could fail
    metric_keys = {"ndcg@10", "recall@10", "completeness@10", "mrr@10"}
    assert set(data["sets"]) == {"alpha", "beta"}
    for row in data["sets"].values():
        assert set(row) == metric_keys | {"queries"}
        assert row["queries"] == 8
        assert all(0 <= row[m] <= 100 for m in metric_keys)
    assert set(data["mean"]) == metric_keys
    assert set(data["latency_ms"]) == {"p50", "p99"}
    assert data["system"] == "bm25" and data["k"] == 10
    path = report.save_json(tmp_path / "out" / "eval.json")
    assert json.loads(path.read_text()) == json.loads(json.dumps(data))
    assert not list(path.parent.glob(".*tmp"))  # the atomic write left nothing behind


def test_accepts_loaded_sets_and_caps_queries():
    sets = [load_benchmark(p) for p in SETS[:2]]
    report = evaluate(sets, BM25System, k=2, max_queries=3, progress=False)
    assert [s.n_queries for s in report.sets.values()] == [3, 3]
    assert report.sets["alpha"].query_ids == ["a1", "a2", "a3"]
    assert report.sets["alpha"].metrics["recall@2"] == pytest.approx(points([1, 0.5, 0]))


def test_train_split():
    report = evaluate(SETS[:2], BM25System, k=2, split="train", progress=False)
    assert [s.query_ids for s in report.sets.values()] == [["a9", "a10"], ["b10"]]


def test_errors_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="no set has labelled queries"):
        evaluate([SETS[2]], BM25System, progress=False)
    with pytest.raises(ValueError, match="no set has labelled queries"):
        evaluate(SETS, BM25System, split="dev", progress=False)
    with pytest.raises(TypeError, match="retrieve"):
        evaluate(SETS[:1], lambda tools: BM25Retriever(), progress=False)  # a bare retriever
    clash = load_benchmark(SETS[0])
    clash.name = "alpha_copy"
    with pytest.raises(ValueError, match="alpha_weather_forecast.*unique"):
        evaluate([SETS[0], clash], BM25System, pooled=True, progress=False)
    with pytest.raises(ValueError, match="named 'alpha'"):
        evaluate([SETS[0], SETS[0]], BM25System, progress=False)


def test_what_a_system_warns_while_it_indexes_a_set_is_kept_naming_the_set():
    """An MLC head that knows none of a set's tools warns while the set is indexed: that went to the console
    (or nowhere), not to report.warnings. What the filters hide (a library's DeprecationWarning) stays out."""
    import warnings

    class Warns(BM25System):
        def __init__(self, tools):
            super().__init__(tools)
            warnings.warn(f"knows {len(tools)} tools")
            warnings.warn("an old API", DeprecationWarning)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # as Python's defaults do outside __main__
        report = evaluate(SETS[:2], Warns, k=2, name="sys", progress=False)
        pooled = evaluate(SETS[:2], Warns, k=2, name="sys", pooled=True, progress=False)
    skipped = "beta: skipped 1 test queries with no labels (first: 'b9')"
    assert report.warnings == [skipped, "sys: alpha: knows 10 tools", "sys: beta: knows 10 tools"]
    assert pooled.warnings == [skipped, "sys: pooled corpus: knows 20 tools"]


def test_a_query_id_twice_is_refused_naming_file_and_both_lines(tmp_path):
    """Two rows with one id were accepted: per_query then held two rows under it, and a comparison, which pairs
    the queries of two systems by id, could not tell them apart."""
    folder = tmp_path / "dup"
    folder.mkdir()
    (folder / "tools.jsonl").write_text((SETS[0] / "tools.jsonl").read_text())
    tool = json.loads((SETS[0] / "tools.jsonl").read_text().splitlines()[0])["id"]
    rows = [{"id": "q1", "query": "first", "labels": [tool]}, {"id": "q2", "query": "second", "labels": [tool]},
            {"id": "q1", "query": "third", "labels": [tool], "split": "train"}]
    (folder / "queries.jsonl").write_text(json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))
    with pytest.raises(ValueError) as refused:
        load_benchmark(folder)
    assert str(refused.value) == (f"{folder / 'queries.jsonl'}:4: duplicate query id 'q1', already on line 1; query "
                                  "ids are unique in a set (reports and comparisons pair queries by id)")


def test_progress_bar_runs(capsys):
    report = evaluate(SETS[:1], BM25System, k=2, progress=True)
    assert isinstance(report, EvalReport) and report.sets["alpha"].n_queries == 8


def test_also_at_adds_smaller_cutoffs_from_the_same_rankings():
    """recall@2 and recall@3 from one top-3 ranking: gold {a, c}, ranking [a, b, c] → 1/2 and 2/2."""
    from toolscout.benchmark_sets import BenchmarkSet, Query
    from toolscout.eval.runner import evaluate
    from toolscout.results import Results
    from toolscout.tool import Tool

    tools = [Tool(t, t, f"tool {t}") for t in "abcd"]
    bench = BenchmarkSet("tiny", tools, [Query("q1", "task", ("a", "c"), split="test")])

    class Fixed:
        def retrieve(self, queries, k):
            return Results.from_lists([["a", "b", "c"][:k]], [[3.0, 2.0, 1.0][:k]])

    report = evaluate([bench], lambda _tools: Fixed(), k=3, also_at=[2], progress=False, warmup=0)
    metrics = report.sets["tiny"].metrics
    assert metrics["recall@3"] == 100.0 and metrics["recall@2"] == 50.0
    assert metrics["completeness@2"] == 0.0 and metrics["mrr@2"] == 100.0
    assert report.metric_keys[:4] == ("ndcg@3", "recall@3", "completeness@3", "mrr@3")
    assert "recall@2" in report.mean and report.mean["recall@2"] == 50.0
    with pytest.raises(ValueError, match="between 1 and k"):
        evaluate([bench], lambda _tools: Fixed(), k=3, also_at=[5], progress=False)
