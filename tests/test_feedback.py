"""Learning from use: the ledger's rules, the retrievers' live learning checked against the formulas by
hand, and the pipeline's learn / forget / save."""

import dataclasses

import numpy as np
import pytest

from toolscout import ToolScout
from toolscout.errors import InvalidRequest
from toolscout.feedback import USAGE_PRIOR, FeedbackEvent, Usage, UsageLedger, events_from_jsonl
from toolscout.retrievers.base import Encoding, parts

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
    # the usage field: files.read has [umbrella, need, drizzl, drizzl] (4 words), mail.send [umbrella] (1);
    # idf counts the 2 requests: umbrella is in both, drizzl in one
    n, k1, b, avgdl = 2, 1.5, 0.75, (4 + 1) / 2
    idf = {"umbrella": np.log(1 + (n - 2 + 0.5) / 2.5), "drizzl": np.log(1 + (n - 1 + 0.5) / 1.5)}

    def term(tf, length, word):
        return idf[word] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avgdl))

    rows, weight = scout.retriever.rows.row_of, scout.retriever.usage_weight
    once = 1 / (1 + scout.retriever.usage.evidence)  # each tool was taught by one request
    assert got[rows["files.read"]] == pytest.approx(weight * once * (term(1, 4, "umbrella") + term(2, 4, "drizzl")),
                                                    rel=1e-5)
    assert got[rows["mail.send"]] == pytest.approx(weight * once * term(1, 1, "umbrella"), rel=1e-5)
    assert np.count_nonzero(got) == 2
    scout.forget("a")
    assert np.array_equal(scout.retriever.scores("umbrella drizzle"), plain)


@pytest.mark.parametrize("taught", [1, 2, 6])
def test_bm25_usage_field_counts_in_proportion_to_the_requests_behind_it(tools, taught):
    """A tool taught by n requests scores n / (n + evidence) of its field: one request says little, and at
    full weight it let a tool taught once crowd out untaught ones (docs/learning.md)."""
    from toolscout.retrievers.bm25 import BM25Retriever

    events = [ev(f"umbrella drizzle {i}", "files.read", source=f"s{i}") for i in range(taught)]
    scores = {}
    for evidence in (0.0, 4.0):
        scout = ToolScout(BM25Retriever(usage_evidence=evidence), tools)
        scout.learn(events)
        scores[evidence] = scout.retriever.scores("umbrella drizzle")[scout.retriever.rows.row_of["files.read"]]
    assert scores[0.0] > 0
    assert scores[4.0] == pytest.approx(scores[0.0] * taught / (taught + 4.0), rel=1e-6)


def test_bm25_usage_idf_counts_requests_and_forgetting_a_source_leaves_what_the_others_taught(tools):
    """The idf of the usage field reads how many taught requests use a word: forgetting one source must
    leave exactly the field that the other sources alone build, and a deleted tool's requests go too."""
    queries = ["can you find the umbrella forecast", "drizzle forecast please", "umbrella"]
    others = [ev("can you find drizzle", "files.read", source="b"), ev("can you find an umbrella", "mail.send", source="b"),
              ev("forecast", "stocks.quote", source="b")]
    both = ToolScout.from_tools(tools, retriever="bm25")
    both.learn([ev("can you find umbrella forecast", "files.read"), ev("can you", "mail.send"),
                ev("   the of and  ", "files.read")] + others)  # stopwords only: teaches nothing
    only_b = ToolScout.from_tools(tools, retriever="bm25")
    only_b.learn(others)
    assert not np.array_equal(both.retriever.scores(queries[0]), only_b.retriever.scores(queries[0]))
    both.forget("a")
    for query in queries:
        assert np.array_equal(both.retriever.scores(query), only_b.retriever.scores(query))
    both.remove(["stocks.quote"])
    only_files_mail = ToolScout.from_tools([t for t in tools if t.id != "stocks.quote"], retriever="bm25")
    only_files_mail.learn(others[:2])
    rows, rows_ref = both.retriever.rows.row_of, only_files_mail.retriever.rows.row_of
    for query in queries:
        got, want = both.retriever.scores(query), only_files_mail.retriever.scores(query)
        assert {t: got[r] for t, r in rows.items()} == {t: want[r] for t, r in rows_ref.items()}


def test_bm25_usage_scores_cached_by_a_search_follow_later_writes(tools):
    """The usage field keeps each term's scores between writes: after a search has filled that cache,
    deleting an untaught tool (the rows below it move up), adding a tool and teaching one more request
    must each score exactly as an index built fresh in that state."""
    query = "umbrella drizzle forecast"
    extra = dataclasses.replace(tools[1], id="extra.tool", name="extra_tool")
    taught = [ev("umbrella drizzle", tools[-1].id), ev("drizzle forecast", tools[-2].id)]
    more = ev("umbrella forecast", "extra.tool")

    def same_as_fresh(catalog, events):
        fresh = ToolScout.from_tools(catalog, retriever="bm25")
        fresh.learn(events)
        got, want = scout.retriever.scores(query), fresh.retriever.scores(query)
        rows, rows_fresh = scout.retriever.rows.row_of, fresh.retriever.rows.row_of
        assert {t: got[r] for t, r in rows.items()} == {t: want[r] for t, r in rows_fresh.items()}
        assert all(got[rows[e.tool_ids[0]]] > 0 for e in events)  # the usage field is in play

    scout = ToolScout.from_tools(tools, retriever="bm25")
    scout.learn(taught)
    same_as_fresh(tools, taught)  # and fills the cache
    scout.remove([tools[0].id])
    same_as_fresh(tools[1:], taught)
    scout.add([extra])
    same_as_fresh(tools[1:] + [extra], taught)
    scout.learn([more])
    same_as_fresh(tools[1:] + [extra], taught + [more])


def test_a_tool_with_no_feedback_ranks_exactly_as_before_and_edits_keep_feedback(tools, encoder, tmp_path):
    scout = ToolScout.from_tools(tools, retriever="hybrid", encoder=encoder)
    queries = ["send an email to Ann", "what is the weather in Rome", "book a hotel room"]
    components = scout.retriever.components  # BM25 and dense: each learns by itself
    before = [c.search(queries, len(tools)) for c in components]
    scout.learn([ev(RAIN, "stocks.quote")])
    after = [c.search(queries, len(tools)) for c in components]
    for results_a, results_b in zip(before, after):  # every other tool keeps its score, bit for bit
        for (ids_a, s_a), (ids_b, s_b) in zip(results_a, results_b):
            scores_a = {t: s for t, s in zip(ids_a, s_a.tolist()) if t != "stocks.quote"}
            scores_b = {t: s for t, s in zip(ids_b, s_b.tolist()) if t != "stocks.quote"}
            assert scores_a == scores_b and scores_a  # (BM25 lists only the tools sharing a word)
    # an edit re-embeds the description and keeps the feedback; a delete drops it
    edited = scout.get("stocks.quote").with_changes(description="Share prices and market data.")
    scout.add([edited])
    assert scout.ledger.summary("stocks.quote")["learned"] == 1
    dense = next(part for part in parts(scout.retriever) if isinstance(part, Encoding))
    # the new description's vector (as a fresh index makes it), blended with the kept feedback
    own = ToolScout.from_tools([edited], retriever="dense", encoder=encoder).retriever.store.get(["stocks.quote"])[0]
    mixed = USAGE_PRIOR * own / np.linalg.norm(own) + encoder.encode_queries([RAIN])[0]
    np.testing.assert_allclose(dense.store.get(["stocks.quote"])[0], np.linalg.norm(own) * mixed / np.linalg.norm(mixed),
                               atol=1e-6)
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


# ------------------------------------------------------------------------- heavier learning (opt-in)

SAMPLE = __import__("pathlib").Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / \
    "apibank_sample"


def sample_with_feedback(encoder, retriever="hybrid"):
    from toolscout.benchmark import load_benchmark

    bench = load_benchmark(SAMPLE)
    options = {} if retriever == "bm25" else {"encoder": encoder}
    scout = ToolScout.from_tools(bench.tools, retriever=retriever, **options)
    scout.learn([FeedbackEvent(q.text, q.labels, "app") for q in bench.queries if q.labels])
    return scout


@pytest.mark.slow  # trains
@pytest.mark.usefixtures("torch_encoders")
def test_retraining_scores_both_pipelines_on_held_back_feedback_and_swaps_only_a_better_one(encoder, tmp_path):
    from toolscout.train.feedback import feedback_queries, held_back, retrain
    from toolscout.train.loop import TrainConfig, validation_ndcg

    scout = sample_with_feedback(encoder)
    before = scout.retrieve(["check my calendar for tomorrow"], 5).as_lists()
    result = retrain(scout, "mlc", tmp_path / "work", config=TrainConfig(max_steps=3, batch_size=8, progress=False),
                     probe_epochs=2, max_seq_length=32, validate_at_start=False)
    queries = feedback_queries(scout)
    test = [q for q in queries if held_back(q, 0.2)]
    assert (result.train_queries, result.holdout_queries) == (len(queries) - len(test), len(test))
    # oracle for the baseline: a fresh pipeline that learned only the requests not held back
    fresh = ToolScout.from_tools(scout.tools, retriever="hybrid", encoder=encoder)
    held = {q.text for q in test}
    fresh.learn([FeedbackEvent(u.query, (u.tool_id,), u.source) for u in scout.ledger.taught() if u.query not in held])
    assert result.baseline == pytest.approx(validation_ndcg(lambda t, k: fresh.retrieve(t, k), test), abs=1e-9)
    assert result.improved == (result.candidate > result.baseline)
    assert scout.retrieve(["check my calendar for tomorrow"], 5).as_lists() == before  # the original is untouched
    if result.improved:  # the swapped-in pipeline learned every request, under the original sources
        assert result.scout.ledger.taught() == scout.ledger.taught()
        assert result.scout.retriever.components[1].name == "mlc"


def test_a_retraining_is_swapped_in_with_the_writes_made_while_it_trained(encoder, tmp_path, monkeypatch):
    """The swap itself, with a stand-in trainer: a candidate that scores better replaces the pipeline, and
    a tool written (and feedback given) while it trained is in the new pipeline too; a worse one changes
    nothing."""
    import toolscout.train.feedback as heavy
    from toolscout.serve import ToolService
    from toolscout.tool import Tool

    folder = tmp_path / "idx"
    sample_with_feedback(encoder, retriever="bm25").save(folder)
    service = ToolService.open(folder, fsync=False)
    other = sample_with_feedback(encoder, retriever="bm25")  # "the trained pipeline": a distinct object

    def fake(scout, method, workdir=None, **options):  # writes land while "training" runs
        tool_id = f"late.tool{int(score)}"
        service.upsert([Tool(tool_id, "late_tool", "Arrived while the model trained.", namespace="late")])
        service.feedback([{"query": "a late request about zebras", "tool_ids": [tool_id]}])
        return heavy.Retrained(method, 50.0, score, 10, 3, str(tmp_path / "m"), other if score > 50 else None)

    monkeypatch.setattr(heavy, "retrain", fake)
    score = 40.0
    assert service.retrain("mlc")["state"] == "kept" and service.catalog.scout is not other
    score = 60.0
    state = service.retrain("mlc")
    assert state["state"] == "swapped" and service.catalog.scout is other
    assert other.get("late.tool60", None) is not None and other.ledger.summary("late.tool60")["learned"] == 1
    service.close()
    again = ToolService.open(folder)  # the swap was saved
    assert again.get("late.tool60").name == "late_tool" and again.feedback_of("late.tool60")["learned"] == 1
    again.close()


def test_cli_learn_imports_logs_forgets_sources_and_refuses_a_served_directory(encoder, tmp_path, capsys):
    import json

    from toolscout.cli import main

    folder = tmp_path / "idx"
    ToolScout.from_tools(sample_with_feedback(encoder, "bm25").tools, retriever="bm25").save(folder)
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(e) for e in [
        {"query": "put a meeting with Ann in my calendar", "tool_ids": ["apibank::AddMeeting"]},
        {"query": "put a meeting with Ann in my calendar", "tool_ids": ["apibank::AddMeeting"]},
        {"query": "remind me of the dentist", "tool_ids": ["apibank::AddReminder"], "source": "app-2"}]) + "\n")
    assert main(["learn", str(folder), str(log)]) == 0
    assert "3 events: 2 (tool, request) pairs learned, 1 repeats" in capsys.readouterr().err
    scout = ToolScout.load(folder)
    assert scout.ledger.sources() == {"app-2": 1, "import": 1}
    assert main(["learn", str(folder), "--forget", "app-2"]) == 0
    assert ToolScout.load(folder).ledger.sources() == {"import": 1}
    from toolscout.serve import ToolService

    with ToolService.open(folder):
        assert main(["learn", str(folder), str(log)]) == 1
    assert "another toolscout server is serving this directory" in capsys.readouterr().err
