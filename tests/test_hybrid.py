import numpy as np
import pytest

from toolscout import ToolScout
from toolscout.retrievers import make_retriever
from toolscout.retrievers.hybrid import HybridRetriever

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


def test_default_fusion_is_min_max_scores_weighted_one_to_one_and_a_half(tools, encoder):
    # the default (toolscout.defaults): each component's top-depth scores scaled to [0, 1] per query, then
    # summed with BM25 : dense = 1 : 1.5 -- worked out here from the components' own lists
    bm25, dense = make_retriever("bm25"), make_retriever("dense", encoder=encoder)
    hybrid = HybridRetriever([bm25, dense], depth=12)
    hybrid.index(tools)
    expected: dict[str, float] = {}
    for weight, comp in ((1.0, bm25), (1.5, dense)):
        ids, scores = comp.search([QUERY], 12)[0]
        norm = (scores - scores.min()) / (scores.max() - scores.min())
        for tid, s in zip(ids, norm):
            expected[tid] = expected.get(tid, 0.0) + weight * float(s)
    ranked = sorted(expected.items(), key=lambda kv: -kv[1])[:3]
    res = hybrid.search([QUERY], 3)
    assert res.ids[0][0] == "hotels.book"
    assert list(res.ids[0]) == [tid for tid, _ in ranked]
    assert res.scores[0] == pytest.approx([s for _, s in ranked], rel=1e-6)


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
        HybridRetriever(["bm25", "bm25"], fusion="max")
    with pytest.raises(ValueError, match="at least two"):
        HybridRetriever(["bm25"])
