import json
import math

import numpy as np
import pytest

from toolscout.errors import UnknownName
from toolscout.results import Filter
from toolscout.retrievers import load_retriever, make_retriever
from toolscout.retrievers.bm25 import BM25Retriever, Tokenizer
from toolscout.tool import TextView, Tool, content_hash, tool_text


def test_unknown_retriever_lists_known_names():
    with pytest.raises(UnknownName, match="known: bm25, dense"):
        make_retriever("nope")


def test_tokenizer_stems_and_drops_stopwords():
    assert Tokenizer()("Booking the flights to Paris") == ["book", "flight", "pari"]
    assert Tokenizer(stemmer=None)("Booking the flights") == ["booking", "flights"]


def test_bm25_scores_match_hand_computed_lucene_formula():
    tools = [Tool("a", "apple", "banana"), Tool("b", "apple", "apple cherry"), Tool("c", "date", "")]
    r = BM25Retriever(view=TextView(parameters=False), stemmer=None)
    r.index(tools)
    # documents (name + description): [apple, banana], [apple, apple, cherry], [date]
    n, df, avgdl = 3, 2, (2 + 3 + 1) / 3
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))

    def lucene(tf, dl):
        return idf * tf / (tf + 1.5 * (1 - 0.75 + 0.75 * dl / avgdl))

    res = r.search(["apple"], k=3)
    assert list(res.ids[0]) == ["b", "a"]  # the date tool shares no term: not returned
    assert res.scores[0] == pytest.approx([lucene(2, 3), lucene(1, 2)], rel=1e-5)


def test_bm25_matches_bm25s_on_a_real_catalog(tools):
    import bm25s

    r = BM25Retriever()
    r.index(tools)
    reference = bm25s.BM25()
    reference.index([r.tokenizer(tool_text(t)) for t in tools], show_progress=False)
    for query in ["book a flight to Paris", "weather forecast in Berlin", "send an email to Bob"]:
        expected = reference.get_scores([t for t in r.tokenizer(query) if t in reference.vocab_dict])
        assert r.scores(query) == pytest.approx(expected, rel=1e-6)


def test_bm25_reads_a_snake_case_identifier_in_a_task_as_the_words_of_the_tool_it_names(tools):
    # the text view indexes the tool `send_email` as "send email": a task that writes the identifier finds
    # it (its token "send_email" matched nothing), and --explain shows the words it matched on
    from toolscout import ToolScout

    scout = ToolScout.from_tools(tools, retriever="bm25")
    hits = scout.search("use send_email please", k=3, explain=True)
    assert hits and hits[0].tool.name == "send_email" and hits[0].matched == ("send", "email")
    # and a description that names an identifier whole is still found by it (the split alone lost it)
    legacy = Tool("ops.purge", "purge", "Replaces the legacy flush_redis command.", namespace="ops")
    ops = ToolScout.from_tools([*tools, legacy, Tool("ops.flush_logs", "flush_logs", "Flush the logs.")],
                               retriever="bm25")
    assert "ops.purge" in [h.tool.id for h in ops.search("flush_redis", k=5)]


def test_bm25_finds_the_obvious_tools_and_honours_filters(tools):
    r = make_retriever("bm25")
    r.index(tools)
    assert r.search(["weather forecast for Rome"], 1).ids[0][0] == "weather.get_forecast"
    assert r.search(["book a hotel room"], 1).ids[0][0] == "hotels.book"
    res = r.search(["book a hotel room"], 5, Filter.make(namespaces=["mail", "calendar"]))
    assert all(tid.startswith(("mail.", "calendar.")) for tid in res.ids[0])


def test_bm25_add_update_remove_and_reload(tools, tmp_path):
    r = BM25Retriever()
    r.index(tools[:6])
    r.add([tools[6], tools[0].with_changes(description="Translate text between languages")])
    assert r.search(["translate languages"], 1).ids[0][0] == "weather.get_forecast"
    r.remove(["weather.get_forecast"])
    assert "weather.get_forecast" not in r.search(["translate languages weather"], 10).ids[0]
    r.save(tmp_path / "bm25")
    again = load_retriever(tmp_path / "bm25")
    for q in ["send email", "find emails in inbox", "flight booking"]:
        a, b = r.search([q], 5), again.search([q], 5)
        assert list(a.ids[0]) == list(b.ids[0]) and np.array_equal(a.scores[0], b.scores[0])


def test_dense_scores_are_cosines_of_the_text_view_plus_a_weighted_summary(tools, encoder):
    from toolscout.retrievers.dense import SUMMARY_WEIGHT, summary_view

    assert SUMMARY_WEIGHT == 0.3
    query = "what's the temperature outside right now in Lyon?"
    q = encoder.encode([query])[0]
    short = summary_view(TextView())
    full = encoder.encode([tool_text(t) for t in tools]) @ q
    summary = encoder.encode([tool_text(t, short) for t in tools]) @ q
    assert tool_text(tools[0], short) == "\n".join(tool_text(tools[0]).split("\n")[:2])  # name, description
    assert summary_view(TextView(description=False, category=True)) == TextView(  # never more than the view shows
        description=False, parameters=False, tags=False, profile_fields=(), descriptions="lead")
    for weight, expected_scores in ((None, (full + 0.3 * summary) / 1.3), (0.0, full),
                                    (2.0, (full + 2.0 * summary) / 3.0)):
        r = make_retriever("dense", encoder=encoder, summary_weight=weight)
        r.index(tools)
        res = r.search([query], 3)
        expected = sorted(range(len(tools)), key=lambda i: -float(expected_scores[i]))[:3]
        assert list(res.ids[0]) == [tools[i].id for i in expected]
        assert res.scores[0] == pytest.approx([float(expected_scores[i]) for i in expected], abs=1e-5)
        assert res.ids[0][0] == "weather.get_current"
    with pytest.raises(ValueError, match="summary_weight"):
        make_retriever("dense", encoder=encoder, summary_weight=-1)


def test_dense_index_saved_before_summaries_keeps_its_vectors(tools, encoder, tmp_path):
    r = make_retriever("dense", encoder=encoder, summary_weight=0.0)
    r.index(tools)
    r.save(tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    config.pop("summary_weight")  # what indexes written before the summary existed look like
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    again = load_retriever(tmp_path / "old")
    assert again.summary_weight == 0.0
    assert again.hashes == {t.id: content_hash(tool_text(t)) for t in tools}  # the hash format of older indexes
    again.add(tools)
    assert again.encoded_last == 0  # same hashes: nothing re-embedded
    summarised = make_retriever("dense", encoder=encoder)
    summarised.hashes, summarised.store = again.hashes, again.store
    summarised.add(tools)
    assert summarised.encoded_last == len(tools)  # a new weight means new vectors: all re-embedded


def test_a_pipeline_keeps_its_summary_weight_through_save_and_load(tools, encoder, tmp_path):
    from toolscout import ToolScout
    from toolscout.retrievers.dense import DenseRetriever

    scout = ToolScout(DenseRetriever(encoder=encoder, summary_weight=0.5), list(tools))
    scout.save(tmp_path / "idx")
    again = ToolScout.load(tmp_path / "idx")
    assert again.retriever.summary_weight == 0.5
    again.add(list(tools))
    assert again.retriever.encoded_last == 0  # same weight, same hashes: nothing re-embedded
    a, b = scout.retrieve(["send a mail"], 5), again.retrieve(["send a mail"], 5)
    assert a.as_lists() == b.as_lists()
    np.testing.assert_allclose(a.scores[0], b.scores[0], atol=1e-6)


def test_dense_re_embeds_only_changed_tools(tools, encoder, tmp_path):
    r = make_retriever("dense", encoder=encoder)
    r.index(tools)
    assert r.encoded_last == len(tools)
    r.add(tools[:3])  # unchanged
    assert r.encoded_last == 0
    r.add([tools[1].with_changes(description="Translate text between languages"), tools[2].with_changes(namespace="x")])
    assert r.encoded_last == 1  # the namespace move keeps its vector
    assert r.search(["translate this sentence to French"], 1).ids[0][0] == tools[1].id
    assert list(r.search(["flights"], 5, Filter.make(namespaces=["x"])).ids[0]) == [tools[2].id]
    r.save(tmp_path / "dense")
    again = load_retriever(tmp_path / "dense")
    assert again.encoded_last == 0 and len(again) == len(tools)
    a, b = r.search(["send a mail"], 5), again.search(["send a mail"], 5)
    assert list(a.ids[0]) == list(b.ids[0]) and np.array_equal(a.scores[0], b.scores[0])


def test_search_rejects_a_bare_string(tools):
    r = make_retriever("bm25")
    r.index(tools)
    with pytest.raises(TypeError, match="list of queries"):
        r.search("book a flight", 3)
