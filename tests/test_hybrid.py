import numpy as np
import pytest

from toolscout import ToolScout
from toolscout.retrievers import make_retriever
from toolscout.retrievers.hybrid import COSINE_FLOOR, HybridRetriever

QUERY = "book a room for two nights in Rome"


def test_rrf_fuses_the_components_rankings_exactly(tools, encoder):
    bm25, dense = make_retriever("bm25"), make_retriever("dense", encoder=encoder)
    hybrid = HybridRetriever([bm25, dense], weights=[1.0, 2.0], fusion="rrf", rrf_k=60, depth=12)
    hybrid.index(tools)
    expected: dict[str, float] = {}
    for weight, comp in ((1.0, bm25), (2.0, dense)):
        for rank, tid in enumerate(comp.search([QUERY], 12).ids[0], 1):
            expected[tid] = expected.get(tid, 0.0) + weight / (60 + rank)
    ranked = sorted(expected.items(), key=lambda kv: -kv[1])[:5]
    res = hybrid.search([QUERY], 5)
    assert list(res.ids[0]) == [tid for tid, _ in ranked]
    assert res.scores[0] == pytest.approx([s for _, s in ranked], rel=1e-6)


def fused_by_hand(components, query: str, depth: int, scale) -> list[tuple[str, float]]:
    """(tool, score) best first: each component's top-`depth` scores through `scale`, weighted and summed."""
    expected: dict[str, float] = {}
    for weight, comp in components:
        ids, scores = comp.search([query], depth)[0]
        for tid, s in zip(ids, scale(scores)):
            expected[tid] = expected.get(tid, 0.0) + weight * float(s)
    return sorted(expected.items(), key=lambda kv: -kv[1])


def test_default_fusion_divides_each_list_by_its_best_score_and_weighs_one_to_three(tools, encoder):
    # the default (toolscout.defaults): each component's scores divided by its best one per query, then
    # summed with BM25 : dense = 1 : 3 -- worked out here from the components' own lists
    bm25, dense = make_retriever("bm25"), make_retriever("dense", encoder=encoder)
    hybrid = HybridRetriever([bm25, dense], depth=12)
    hybrid.index(tools)
    ranked = fused_by_hand(((1.0, bm25), (3.0, dense)), QUERY, 12, lambda s: s / s.max())[:3]
    res = hybrid.search([QUERY], 3)
    assert res.ids[0][0] == "hotels.book"
    assert list(res.ids[0]) == [tid for tid, _ in ranked]
    assert res.scores[0] == pytest.approx([s for _, s in ranked], rel=1e-6)
    assert res.scores[0][0] <= 4.0 + 1e-6  # a tool best in both lists scores 1 + 3


def test_min_max_fusion_scales_each_list_to_the_unit_interval(tools, encoder):
    bm25, dense = make_retriever("bm25"), make_retriever("dense", encoder=encoder)
    hybrid = HybridRetriever([bm25, dense], weights=[1.0, 1.5], fusion="score", depth=12)
    hybrid.index(tools)
    ranked = fused_by_hand(((1.0, bm25), (1.5, dense)), QUERY, 12,
                           lambda s: (s - s.min()) / (s.max() - s.min()))[:3]
    res = hybrid.search([QUERY], 3)
    assert list(res.ids[0]) == [tid for tid, _ in ranked]
    assert res.scores[0] == pytest.approx([s for _, s in ranked], rel=1e-6)


def test_max_fusion_takes_nothing_from_a_list_without_a_positive_score():
    hybrid = HybridRetriever(["bm25", "bm25"], fusion="max")
    assert list(hybrid._contributions(np.array([4.0, 2.0, 1.0]))) == [1.0, 0.5, 0.25]
    assert list(hybrid._contributions(np.array([-0.1, -0.3]))) == [0.0, 0.0]


def test_max_fusion_divides_a_cosine_list_by_at_least_the_floor(tools, encoder):
    # a best cosine of 0.02 is no real match: the list counts as 0.02 / 0.1 of one (it was a full match,
    # and a tool at -0.05 scored -2.5 times one); BM25's scores (term matches) have no floor
    bm25, dense = make_retriever("bm25"), make_retriever("dense", encoder=encoder)
    hybrid = HybridRetriever([bm25, dense])
    assert hybrid._contributions(np.array([0.02, -0.05]), COSINE_FLOOR) == pytest.approx([0.2, -0.5])
    assert hybrid._contributions(np.array([0.5, 0.25]), COSINE_FLOOR) == pytest.approx([1.0, 0.5])
    hybrid.index(tools)
    # nonsense tasks (no term of any tool): the one least like any tool, as each encoding (int8, float32) has it
    nonsense = min(["qwxzv plork", "qwxzv", "ooo", "the the the"], key=lambda t: dense.search([t], 1)[0][1][0])
    dense_list = dense.search([nonsense], 12)[0][1]
    fused = hybrid.search([nonsense], 12)
    assert 0 < dense_list[0] < COSINE_FLOOR  # the nonsense task matches no term and no tool's meaning
    assert fused.scores[0][0] == pytest.approx(3.0 * dense_list[0] / COSINE_FLOOR, rel=1e-5)


def test_hybrid_pipeline_saves_loads_and_updates(tools, encoder, tmp_path):
    scout = ToolScout.from_tools(tools[:-1], retriever="hybrid", encoder=encoder)
    scout.add([tools[-1]])
    scout.save(tmp_path / "h")
    again = ToolScout.load(tmp_path / "h")
    a, b = scout.retrieve([QUERY, "read a file"], 5), again.retrieve([QUERY, "read a file"], 5)
    assert a.as_lists() == b.as_lists()
    assert np.allclose(np.concatenate(a.scores), np.concatenate(b.scores))
    assert again.search("read a file from disk", k=1)[0].tool.id == "files.read"
    again.remove(["files.read"])
    assert "files.read" not in again.retrieve(["read a file from disk"], 10).ids[0]


def test_hybrid_rejects_bad_configs():
    with pytest.raises(ValueError, match="fusion"):
        HybridRetriever(["bm25", "bm25"], fusion="minmax")
    with pytest.raises(ValueError, match="at least two"):
        HybridRetriever(["bm25"])
