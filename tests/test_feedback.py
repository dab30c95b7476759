"""Learning from use: the ledger's rules, the retrievers' live learning checked against the formulas by
hand, and the pipeline's learn / forget / save."""

import numpy as np
import pytest

from toolscout import ToolScout
from toolscout.errors import InvalidRequest
from toolscout.feedback import FeedbackEvent, Usage, UsageLedger, events_from_jsonl

RAIN = "will it rain in Bergen tomorrow"
SKY = "is the sky going to be cloudy over Oslo"


def ev(query, *tool_ids, source="a", outcome=None):
    return FeedbackEvent(query, tool_ids, source, outcome)


# ------------------------------------------------------------------------------------ ledger

def test_the_ledger_counts_repeats_once_caps_each_source_and_learns_nothing_from_failures():
    ledger = UsageLedger(per_source_cap=2)
    result = ledger.add([ev(RAIN, "w"), ev("  Will it RAIN in bergen   tomorrow ", "w"),  # the same task again
                         ev(SKY, "w", "x"), ev("third task for w", "w"),  # w's third from source a: capped
                         ev("third task for w", "w", source="b"),  # another source has its own cap
                         ev("this did not work", "w", outcome="failure")])
    assert [(u.tool_id, u.source, u.query) for u in result.learned] == [
        ("w", "a", RAIN), ("w", "a", SKY), ("x", "a", SKY), ("w", "b", "third task for w")]
    assert (result.events, result.duplicates, result.capped, result.failures) == (6, 1, 1, 1)
    assert ledger.usage("w") == [("a", [RAIN, SKY]), ("b", ["third task for w"])]
    assert ledger.summary("w") == {"learned": 3, "sources": 2, "reported": 6}
    # the capped request stays counted: posting it again is a repeat, not a new try at the cap
    assert ledger.add([ev("third task for w", "w")]).duplicates == 1
    assert ledger.forget("a") == ["w", "x"]
    assert ledger.usage("w") == [("b", ["third task for w"])] and ledger.usage("x") == []
    assert ledger.add([ev(RAIN, "w")]).learned == [Usage("w", "a", RAIN)]  # forgotten: may teach again


def test_the_ledger_round_trips_and_rejects_bad_events(tmp_path):
    ledger = UsageLedger(per_source_cap=1)
    ledger.add([ev(RAIN, "w"), ev(SKY, "w"), ev("x", "y", source="b", outcome="failure")])
    ledger.save(tmp_path / "f.json")
    again = UsageLedger.load(tmp_path / "f.json")
    assert again.taught() == ledger.taught() and again.summary("w") == ledger.summary("w")
    assert (again.events, again.failures, again.per_source_cap) == (3, 1, 1)
    assert again.add([ev(SKY, "w")]).duplicates == 1  # the capped key survives the round trip
    with pytest.raises(InvalidRequest, match="tool_ids"):
        FeedbackEvent("task", ())
    with pytest.raises(InvalidRequest, match="outcome"):
        FeedbackEvent("task", ("w",), outcome="meh")
    with pytest.raises(InvalidRequest, match="unknown field"):
        FeedbackEvent.from_dict({"query": "q", "tool_ids": ["w"], "tools": ["w"]})
    log = tmp_path / "log.jsonl"
    log.write_text('{"query": "q", "tool_ids": ["w"]}\n\n{"query": "", "tool_ids": ["w"]}\n')
    with pytest.raises(InvalidRequest, match=r"log.jsonl:3: feedback: 'query'"):
        events_from_jsonl(log)


# --------------------------------------------------------------------------------- retrievers

def test_dense_learning_follows_the_blend_by_hand_and_forgetting_restores_every_bit(tools, encoder):
    scout = ToolScout.from_tools(tools, retriever="dense", encoder=encoder)
    store = scout.retriever.store
    before = store.get([t.id for t in tools]).copy()
    prior = scout.retriever.learned.prior
    scout.learn([ev(RAIN, "stocks.quote", source="b"), ev(SKY, "stocks.quote", source="a")])
    own = before[[t.id for t in tools].index("stocks.quote")]
    a, b = encoder.encode_queries([SKY]), encoder.encode_queries([RAIN])
    mixed = prior * own / np.linalg.norm(own) + (a[0] + b[0])
    want = np.linalg.norm(own) * mixed / np.linalg.norm(mixed)
    np.testing.assert_allclose(store.get(["stocks.quote"])[0], want, atol=1e-6)
    others = [t.id for t in tools if t.id != "stocks.quote"]
    assert np.array_equal(store.get(others), before[[t.id != "stocks.quote" for t in tools]])  # untouched
    assert scout.search("is it raining in Bergen", k=1)[0].tool.id == "stocks.quote"
    scout.forget("a")
    only_b = prior * own / np.linalg.norm(own) + b[0]
    np.testing.assert_allclose(store.get(["stocks.quote"])[0], np.linalg.norm(own) * only_b / np.linalg.norm(only_b),
                               atol=1e-6)
    scout.forget("b")
    assert np.array_equal(store.get([t.id for t in tools]), before)


def test_bm25_usage_field_scores_by_hand(tools):
    scout = ToolScout.from_tools(tools, retriever="bm25")
    plain = scout.retriever.scores("umbrella drizzle")
    assert not plain.any()  # no tool mentions these words
    scout.learn([ev("umbrella needed drizzle drizzle", "files.read"), ev("umbrella", "mail.send")])
    got = scout.retriever.scores("umbrella drizzle")
    # the usage field: files.read has [umbrella, need, drizzl, drizzl] (4 words), mail.send [umbrella] (1)
    n, k1, b, avgdl = len(tools), 1.5, 0.75, (4 + 1) / 2
    idf = {"umbrella": np.log(1 + (n - 2 + 0.5) / 2.5), "drizzl": np.log(1 + (n - 1 + 0.5) / 1.5)}

    def term(tf, length, word):
        return idf[word] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avgdl))

    rows = scout.retriever.rows.row_of
    assert got[rows["files.read"]] == pytest.approx(term(1, 4, "umbrella") + term(2, 4, "drizzl"), rel=1e-5)
    assert got[rows["mail.send"]] == pytest.approx(term(1, 1, "umbrella"), rel=1e-5)
    assert np.count_nonzero(got) == 2
    scout.forget("a")
    assert np.array_equal(scout.retriever.scores("umbrella drizzle"), plain)


def test_a_tool_with_no_feedback_ranks_exactly_as_before_and_edits_keep_feedback(tools, encoder, tmp_path):
    scout = ToolScout.from_tools(tools, retriever="hybrid", encoder=encoder)
    queries = ["send an email to Ann", "what is the weather in Rome", "book a hotel room"]
    before = scout.retrieve(queries, 5)
    scout.learn([ev(RAIN, "stocks.quote")])
    after = scout.retrieve(queries, 5)
    for (ids_a, s_a), (ids_b, s_b) in zip(before, after):
        if "stocks.quote" not in set(ids_a) | set(ids_b):
            assert list(ids_a) == list(ids_b) and s_a.tolist() == s_b.tolist()
    # an edit re-embeds the description and keeps the feedback; a delete drops it
    edited = scout.get("stocks.quote").with_changes(description="Share prices and market data.")
    scout.add([edited])
    assert scout.ledger.summary("stocks.quote")["learned"] == 1
    dense = scout.retriever.components[1]
    own = dense.learned.own["stocks.quote"]  # the new description's vector ...
    fresh = ToolScout.from_tools([edited], retriever="dense", encoder=encoder).retriever.store.get(["stocks.quote"])
    np.testing.assert_allclose(own, fresh[0], atol=1e-6)
    mixed = dense.learned.prior * own / np.linalg.norm(own) + encoder.encode_queries([RAIN])[0]
    np.testing.assert_allclose(dense.store.get(["stocks.quote"])[0],  # ... blended with the kept feedback
                               np.linalg.norm(own) * mixed / np.linalg.norm(mixed), atol=1e-6)
    scout.save(tmp_path / "idx")
    loaded = ToolScout.load(tmp_path / "idx")
    assert loaded.retrieve([RAIN], 3).as_lists() == scout.retrieve([RAIN], 3).as_lists()
    assert loaded.ledger.summary("stocks.quote") == scout.ledger.summary("stocks.quote")
    loaded.remove(["stocks.quote"])
    assert loaded.ledger.summary("stocks.quote")["learned"] == 0
    assert "stocks.quote" not in loaded.retriever.components[1].learned


def test_mlc_refuses_live_learning_clearly():
    from toolscout.retrievers.mlc import MLCRetriever

    with pytest.raises(InvalidRequest, match="does not learn from feedback live"):
        MLCRetriever.learn(object.__new__(MLCRetriever), [Usage("t", "s", "q")])
