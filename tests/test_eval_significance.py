"""Paired bootstrap: the two extremes, agreement with the normal approximation, determinism, pairing."""

import math

import numpy as np
import pytest

from toolscout.eval import BootstrapResult, EvalReport, SetReport, paired_bootstrap
from toolscout.eval.significance import paired_bootstrap_per_set


def make_report(name, per_set, metric="ndcg@10"):
    """A report holding given 0–1 per-query scores: {set name: (query ids, scores)}."""
    sets = {}
    for set_name, (ids, scores) in per_set.items():
        scores = np.asarray(scores, dtype=float)
        sets[set_name] = SetReport(set_name, len(ids), {metric: 100 * scores.mean()}, {metric: scores}, list(ids),
                                   {}, [1.0] * len(ids))
    return EvalReport(name, 10, sets, [1.0] * sum(len(v[0]) for v in per_set.values()), 0.0)


def ids(prefix, n):
    return [f"{prefix}{i}" for i in range(n)]


@pytest.fixture(scope="module")
def noisy_pair():
    """B is 2 points better on average, with a lot of per-query noise, over two sets."""
    rng = np.random.default_rng(1)
    a1, a2 = rng.random(400), rng.random(300)
    b1 = np.clip(a1 + 0.02 + rng.normal(0, 0.2, 400), 0, 1)
    b2 = np.clip(a2 + 0.02 + rng.normal(0, 0.2, 300), 0, 1)
    a = make_report("a", {"s1": (ids("q", 400), a1), "s2": (ids("q", 300), a2)})
    b = make_report("b", {"s1": (ids("q", 400), b1), "s2": (ids("q", 300), b2)})
    return a, b


def test_identical_reports_give_zero_difference_and_p_one(noisy_pair):
    a, _ = noisy_pair
    result = paired_bootstrap(a, a, n_resamples=2000)
    assert isinstance(result, BootstrapResult)
    assert result.diff == 0 and result.ci_low == 0 and result.ci_high == 0
    assert result.p_two_sided == result.p_one_sided == 1.0  # every resampled difference is 0
    assert not result.significant()


def test_better_on_every_query_is_significant():
    rng = np.random.default_rng(2)
    a_scores = rng.random(50) * 0.9
    a = make_report("a", {"s": (ids("q", 50), a_scores)})
    b = make_report("b", {"s": (ids("q", 50), a_scores + 0.05)})
    result = paired_bootstrap(a, b, n_resamples=5000)
    assert result.diff == pytest.approx(5.0)
    assert result.p_one_sided == pytest.approx(1 / 5001)  # the +1 correction: never exactly 0
    assert result.p_two_sided == pytest.approx(2 / 5001)  # twice the smaller tail
    assert result.significant(0.01)
    # the reverse: A better on every query. "B better" certainly not; "B differs" just as surely as before
    reverse = paired_bootstrap(b, a, n_resamples=5000)
    assert reverse.p_one_sided == 1.0 and reverse.p_two_sided == pytest.approx(2 / 5001) and reverse.significant(0.01)


def test_agrees_with_the_normal_approximation(noisy_pair):
    a, b = noisy_pair
    result = paired_bootstrap(a, b, n_resamples=10000, seed=3)
    diff = 100 * np.concatenate([b.sets[s].per_query["ndcg@10"] - a.sets[s].per_query["ndcg@10"] for s in ("s1", "s2")])
    se = diff.std(ddof=1) / math.sqrt(len(diff))
    assert result.n_queries == 700
    assert result.diff == pytest.approx(diff.mean())
    assert result.mean_b - result.mean_a == pytest.approx(result.diff)
    assert result.ci_low == pytest.approx(diff.mean() - 1.96 * se, abs=0.15 * se)
    assert result.ci_high == pytest.approx(diff.mean() + 1.96 * se, abs=0.15 * se)
    normal_p = 0.5 * math.erfc(diff.mean() / se / math.sqrt(2))  # P(Z > mean / se)
    assert result.p_one_sided == pytest.approx(normal_p, abs=0.01)
    assert result.p_two_sided == pytest.approx(2 * normal_p, abs=0.02)  # P(|Z| > |mean| / se)


def test_deterministic_for_a_seed(noisy_pair):
    a, b = noisy_pair
    first = paired_bootstrap(a, b, n_resamples=3000, seed=5)
    assert paired_bootstrap(a, b, n_resamples=3000, seed=5) == first
    assert paired_bootstrap(a, b, n_resamples=3000, seed=6) != first


def test_queries_are_paired_by_id_not_position():
    a = make_report("a", {"s": (["q1", "q2", "q3"], [0.0, 0.5, 1.0])})
    b = make_report("b", {"s": (["q3", "q1", "q2"], [1.0, 0.0, 0.5])})  # same scores, other order
    assert paired_bootstrap(a, b, n_resamples=500).diff == 0.0
    assert paired_bootstrap(a, b, n_resamples=500).p_two_sided == 1.0


def test_per_set(noisy_pair):
    a, b = noisy_pair
    results = paired_bootstrap_per_set(a, b, n_resamples=2000)
    assert set(results) == {"s1", "s2"}
    assert results["s1"].n_queries == 400 and results["s2"].n_queries == 300
    for name, result in results.items():
        expected = 100 * (b.sets[name].per_query["ndcg@10"] - a.sets[name].per_query["ndcg@10"]).mean()
        assert result.diff == pytest.approx(expected)


def test_different_queries_are_an_error():
    a = make_report("a", {"s": (["q1", "q2"], [0.0, 1.0])})
    with pytest.raises(ValueError, match="different queries"):
        paired_bootstrap(a, make_report("b", {"s": (["q1", "q3"], [0.0, 1.0])}))
    with pytest.raises(ValueError, match="different sets"):
        paired_bootstrap(a, make_report("b", {"t": (["q1", "q2"], [0.0, 1.0])}))
    with pytest.raises(ValueError, match="recall@10"):
        paired_bootstrap(a, a, metric="recall@10")


def test_two_queries_by_hand():
    """B − A is 0 on one query and 100 points on the other: a resample of two draws has mean 0 (both the
    first, 1/4), 50 (1/2) or 100 (1/4), so the 95% interval is 0 to 100, P(mean ≤ 0) = 1/4 (one-sided p)
    and the two-sided p twice the smaller tail, 1/2."""
    a = make_report("a", {"s": (["q1", "q2"], [0.5, 0.0])})
    b = make_report("b", {"s": (["q1", "q2"], [0.5, 1.0])})
    result = paired_bootstrap(a, b, n_resamples=20000, seed=7)
    assert result.diff == 50.0 and (result.ci_low, result.ci_high) == (0.0, 100.0)
    assert result.p_one_sided == pytest.approx(0.25, abs=0.01)
    assert result.p_two_sided == pytest.approx(0.5, abs=0.02)


def test_a_worse_system_is_told_apart_and_the_p_agrees_with_the_interval(noisy_pair):
    """B 3 points worse: the interval lies below 0, so the two-sided p is small too (the one-sided "B is
    better" p near 1 was printed beside that interval, unlabelled). Against scipy's percentile interval."""
    scipy_stats = pytest.importorskip("scipy.stats")
    a, b = noisy_pair
    worse = make_report("w", {s: (a.sets[s].query_ids, np.clip(a.sets[s].per_query["ndcg@10"] - 0.03, 0, 1))
                              for s in ("s1", "s2")})
    result = paired_bootstrap(b, worse, n_resamples=2000, seed=1)
    assert result.ci_high < 0 and result.p_two_sided < 0.05 and result.significant()
    assert result.p_one_sided > 0.95
    diff = 100 * np.concatenate([worse.sets[s].per_query["ndcg@10"] - b.sets[s].per_query["ndcg@10"]
                                 for s in ("s1", "s2")])
    reference = scipy_stats.bootstrap((diff,), np.mean, n_resamples=2000, method="percentile", random_state=1)
    se = diff.std(ddof=1) / math.sqrt(len(diff))
    assert result.ci_low == pytest.approx(reference.confidence_interval.low, abs=0.15 * se)
    assert result.ci_high == pytest.approx(reference.confidence_interval.high, abs=0.15 * se)


def test_too_few_resamples_for_a_95_interval_are_refused(noisy_pair):
    a, b = noisy_pair
    with pytest.raises(ValueError, match="at least 40 for a 95% interval, got 39"):
        paired_bootstrap(a, b, n_resamples=39)
    assert paired_bootstrap(a, b, n_resamples=40).p_two_sided >= 2 / 41
