"""Per-query metrics: hand-worked cases, and agreement with ranx on a realistic random run."""

import math

import numpy as np
import pytest

from toolscout.eval import completeness_at_k, mrr_at_k, ndcg_at_k, precision_at_k, query_metrics, recall_at_k

D2, D3 = 1 / math.log2(3), 1 / math.log2(4)  # discounts of ranks 2 and 3


# ------------------------------------------------------------------------------------ hand-worked

def test_one_of_two_gold_at_rank_two():
    ranked, gold = ["a", "b", "c"], {"b", "d"}
    assert ndcg_at_k(ranked, gold, 3) == pytest.approx(D2 / (1 + D2))
    assert recall_at_k(ranked, gold, 3) == 0.5
    assert completeness_at_k(ranked, gold, 3) == 0.0
    assert mrr_at_k(ranked, gold, 3) == 0.5
    assert precision_at_k(ranked, gold, 3) == pytest.approx(1 / 3)


def test_all_gold_found_but_not_first():
    ranked, gold = ["x", "g1", "y", "g2"], ["g1", "g2"]
    # DCG = 1/log2 3 + 1/log2 5; ideal = 1 + 1/log2 3
    assert ndcg_at_k(ranked, gold, 4) == pytest.approx((D2 + 1 / math.log2(5)) / (1 + D2))
    assert completeness_at_k(ranked, gold, 4) == 1.0
    assert completeness_at_k(ranked, gold, 3) == 0.0  # g2 falls outside the top 3
    assert recall_at_k(ranked, gold, 3) == 0.5
    assert mrr_at_k(ranked, gold, 1) == 0.0
    assert mrr_at_k(ranked, gold, 2) == 0.5


def test_ideal_dcg_is_cut_at_k():
    # three gold ids but k=2: a perfect top 2 is a perfect nDCG, recall still 2/3, never complete
    ranked, gold = ["g1", "g2", "g3"], {"g1", "g2", "g3"}
    assert ndcg_at_k(ranked, gold, 2) == pytest.approx(1.0)
    assert recall_at_k(ranked, gold, 2) == pytest.approx(2 / 3)
    assert completeness_at_k(ranked, gold, 2) == 0.0


def test_empty_and_short_rankings():
    assert query_metrics([], {"a"}, 10) == {"ndcg@10": 0.0, "recall@10": 0.0, "completeness@10": 0.0, "mrr@10": 0.0}
    assert precision_at_k(["a"], {"a"}, 5) == 0.2  # the denominator stays k


def test_repeated_id_counts_once():
    assert ndcg_at_k(["a", "a", "b"], {"a", "b"}, 3) == pytest.approx((1 + D3) / (1 + D2))
    assert recall_at_k(["a", "a"], {"a", "b"}, 2) == 0.5


def test_numpy_rankings_are_accepted():
    ranked = np.asarray(["a", "b"], dtype=object)
    assert mrr_at_k(ranked, {"b"}, 10) == 0.5


@pytest.mark.parametrize("fn", [ndcg_at_k, recall_at_k, completeness_at_k, mrr_at_k, precision_at_k, query_metrics])
def test_empty_gold_is_an_error(fn):
    with pytest.raises(ValueError, match="gold"):
        fn(["a"], set(), 10)


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="k must be"):
        recall_at_k(["a"], {"a"}, 0)


# ------------------------------------------------------------------------------------ against ranx

N_QUERIES, N_TOOLS, RUN_DEPTH, KS = 200, 80, 30, (1, 5, 10)


@pytest.fixture(scope="module")
def random_run():
    """200 queries with 1–4 gold tools each, rankings of 30 distinct tools with distinct scores; gold
    tools are pulled towards the top so that every k sees hits, misses and partial hits."""
    rng = np.random.default_rng(7)
    tools = [f"t{i:03d}" for i in range(N_TOOLS)]
    rankings, golds = {}, {}
    for q in range(N_QUERIES):
        gold = list(rng.choice(tools, size=rng.integers(1, 5), replace=False))
        order = list(rng.permutation(tools))
        for g in gold:  # move most gold ids to a random early position
            if rng.random() < 0.8:
                order.remove(g)
                order.insert(int(rng.integers(0, 6)), g)
        qid = f"q{q:03d}"
        rankings[qid], golds[qid] = [str(t) for t in order[:RUN_DEPTH]], {str(g) for g in gold}
    return rankings, golds


@pytest.fixture(scope="module")
def ranx_scores(random_run):
    from ranx import Qrels, Run, evaluate

    rankings, golds = random_run
    qrels = Qrels({q: {g: 1 for g in gold} for q, gold in golds.items()})
    run = Run({q: {t: float(RUN_DEPTH - i) for i, t in enumerate(ranked)} for q, ranked in rankings.items()})
    names = [f"{m}@{k}" for k in KS for m in ("ndcg", "recall", "mrr", "precision", "hit_rate")]
    evaluate(qrels, run, names, return_mean=False)
    return run.scores  # metric -> {query id: score}


@pytest.mark.slow  # ranx compiles its metrics with numba
@pytest.mark.parametrize("k", KS)
def test_metrics_match_ranx(random_run, ranx_scores, k):
    rankings, golds = random_run
    for qid, ranked in rankings.items():
        gold = golds[qid]
        ours = query_metrics(ranked, gold, k)
        assert ours[f"ndcg@{k}"] == pytest.approx(ranx_scores[f"ndcg@{k}"][qid], abs=1e-9)
        assert ours[f"recall@{k}"] == pytest.approx(ranx_scores[f"recall@{k}"][qid], abs=1e-9)
        assert ours[f"mrr@{k}"] == pytest.approx(ranx_scores[f"mrr@{k}"][qid], abs=1e-9)
        assert precision_at_k(ranked, gold, k) == pytest.approx(ranx_scores[f"precision@{k}"][qid], abs=1e-9)
        # ranx has no completeness: it is "recall is 1", and for one gold tool it is ranx's hit rate
        assert ours[f"completeness@{k}"] == float(ranx_scores[f"recall@{k}"][qid] == 1.0)
        if len(gold) == 1:
            assert ours[f"completeness@{k}"] == ranx_scores[f"hit_rate@{k}"][qid]
        # the single-metric functions agree with the one-pass query_metrics
        assert ndcg_at_k(ranked, gold, k) == ours[f"ndcg@{k}"]
        assert recall_at_k(ranked, gold, k) == ours[f"recall@{k}"]
        assert completeness_at_k(ranked, gold, k) == ours[f"completeness@{k}"]
        assert mrr_at_k(ranked, gold, k) == ours[f"mrr@{k}"]


def test_random_run_is_not_degenerate(random_run):
    """The comparison above means something only if the run mixes complete, partial and empty hits."""
    rankings, golds = random_run
    completeness = [completeness_at_k(rankings[q], golds[q], 5) for q in rankings]
    recall = [recall_at_k(rankings[q], golds[q], 5) for q in rankings]
    assert 0.2 < np.mean(completeness) < 0.8
    assert any(0 < r < 1 for r in recall) and any(r == 0 for r in recall)
    assert sum(len(g) > 1 for g in golds.values()) > 50


def test_completeness_by_hand_on_random_queries(random_run):
    rankings, golds = random_run
    for qid in ("q000", "q001", "q002", "q003"):
        top5 = rankings[qid][:5]
        expected = 1.0 if all(g in top5 for g in golds[qid]) else 0.0
        assert completeness_at_k(rankings[qid], golds[qid], 5) == expected
