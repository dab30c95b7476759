"""Text table and bar chart of evaluation reports."""

from pathlib import Path

import pytest

from toolscout.eval import evaluate, format_table, plot_reports
from toolscout.retrievers.bm25 import BM25Retriever

FIXTURES = Path(__file__).parent / "fixtures" / "eval"


class BM25System:
    def __init__(self, tools, k1=1.5):
        self.retriever = BM25Retriever(k1=k1)
        self.retriever.index(tools)

    def retrieve(self, queries, k):
        return self.retriever.search(queries, k)


@pytest.fixture(scope="module")
def reports():
    sets = [FIXTURES / "alpha", FIXTURES / "beta"]
    return [evaluate(sets, BM25System, k=2, name="bm25", progress=False),
            evaluate(sets, lambda tools: BM25System(tools, k1=0.9), k=2, name="bm25-k1", progress=False)]


def test_table_for_one_system(reports):
    text = format_table(reports[:1])
    lines = text.splitlines()
    for name in ("alpha", "beta", "mean", "latency p50 ms", "latency p99 ms", "queries/s", "ndcg@2", "completeness@2"):
        assert any(name in line for line in lines), name
    alpha_row = next(line for line in lines if "alpha" in line and "toolscout" not in line)
    assert "81.25" in alpha_row  # recall@2 of alpha, worked out in test_eval_runner
    assert "87.50" in alpha_row  # mrr@2
    mean_row = next(line for line in lines if line.strip("│┃ ").startswith("macro mean (2 sets)"))
    # macro means of the hand-worked figures in test_eval_runner: recall@2 (81.25 + 93.75) / 2,
    # completeness@2 (75.00 + 87.50) / 2
    assert "87.50" in mean_row and "81.25" in mean_row
    assert "16 in all" in mean_row  # alpha's 8 queries and beta's 8 labelled ones: a total, not the mean's weight
    assert "\x1b[" not in text  # plain text, no terminal colour codes


def test_table_compares_systems_and_categories(reports):
    text = format_table(reports, metrics=["ndcg@2", "recall@2"], per_category=True)
    assert "bm25-k1" in text and "completeness@2" not in text
    assert "travel" in text and "unknown" in text  # per-category rows of alpha


def test_plot_is_a_png(reports, tmp_path):
    path = plot_reports(reports, tmp_path / "plots" / "ndcg.png", metric="ndcg@2")
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 1024


def test_plot_unknown_metric(reports, tmp_path):
    with pytest.raises(ValueError, match="ndcg@2"):
        plot_reports(reports, tmp_path / "x.png")  # default ndcg@10, but these reports are at k=2
