"""Multi-request tasks: the rule-based splitter on hand-worked cases, and the merge of rankings."""

import numpy as np
import pytest

from toolscout.intents import IntentMerge, opens_request, split_intents
from toolscout.results import Results


@pytest.mark.parametrize("task, intents", [
    ("find a flight to Rome, book the cheapest hotel near the station and add both to my calendar",
     ["find a flight to Rome", "book the cheapest hotel near the station", "add both to my calendar"]),
    ("Please retrieve the attendance record of employee number 36. Then, retrieve the rehabilitation plan for "
     "patient Ej4bR6LkH. Finally, track the progress of John Smith's physical therapy sessions.",
     ["Please retrieve the attendance record of employee number 36",
      "Then, retrieve the rehabilitation plan for patient Ej4bR6LkH",
      "Finally, track the progress of John Smith's physical therapy sessions"]),
    ("Check the weather in Oslo and send me an email with the forecast",
     ["Check the weather in Oslo", "send me an email with the forecast"]),
    ("Convert 100 USD to EUR; then also get the AAPL stock quote",
     ["Convert 100 USD to EUR", "then also get the AAPL stock quote"]),
    ("Submit a ticket for the printer at IP address 192.168.10.6. Also check ticket gDigAX6tNT",
     ["Submit a ticket for the printer at IP address 192.168.10.6", "Also check ticket gDigAX6tNT"]),
])
def test_several_requests_are_split(task, intents):
    assert split_intents(task) == intents


@pytest.mark.parametrize("task", [
    "search and replace in a file",  # one word before "and": one action
    "salt and pepper",
    "buy salt and pepper at the store",  # "pepper" is no action
    "find restaurants and bars in Paris",
    "What's the weather in Oslo?",
    "Book a table for two at 7 pm, near the station",  # "near" opens no request
    "Ask Dr. Kim about the results of my blood test",  # "Dr." ends no sentence
    "The price is 3.5 dollars. OK",  # a fragment of fewer than three words joins its neighbour
    "User: book a flight to Rome.\nAI: Done.\nUser: Then book a hotel near the station, and send me both",
])
def test_one_request_is_not_split(task):
    assert split_intents(task) == [task]


def test_what_opens_a_request():
    assert opens_request("please send it") and opens_request("also check the logs") and opens_request("can you help")
    assert not opens_request("pepper") and not opens_request("near the station") and not opens_request("")


def fixed_search(table):
    """search(queries, k) answering from a dict query text -> [(id, score), ...], recording the texts
    searched."""
    calls = []

    def search(queries, k):
        texts = [q.text for q in queries]
        calls.append((texts, k))
        return Results.from_lists([[i for i, _s in table[q]][:k] for q in texts],
                                  [[s for _i, s in table[q]][:k] for q in texts])

    return search, calls


def test_a_single_request_is_searched_exactly_as_before():
    search, calls = fixed_search({"weather in Oslo": [("w", 0.9), ("x", 0.2)]})
    got = IntentMerge().search(["weather in Oslo"], 5, search)
    assert calls == [(["weather in Oslo"], 5)]  # no extra queries, the caller's k
    assert list(got.ids[0]) == ["w", "x"] and got.scores[0].tolist() == pytest.approx([0.9, 0.2])


def test_max_merge_ranks_by_the_best_score_against_the_task_or_any_request():
    task = "check the weather in Oslo and send me an email"
    table = {task: [("weather", 0.50), ("calendar", 0.40), ("mail", 0.30)],
             "check the weather in Oslo": [("weather", 0.80), ("calendar", 0.10)],
             "send me an email": [("mail", 0.70), ("calendar", 0.20)],
             "weather in Oslo": [("weather", 0.9), ("calendar", 0.3), ("mail", 0.1), ("x", 0.0)]}
    search, calls = fixed_search(table)
    got = IntentMerge(merge="max", depth=10).search([task, "weather in Oslo"], 3, search)
    # the multi-request task and its two requests go in one batch with the other query, at the merge depth
    assert calls == [([task, "check the weather in Oslo", "send me an email", "weather in Oslo"], 10)]
    assert list(got.ids[0]) == ["weather", "mail", "calendar"]
    assert got.scores[0].tolist() == pytest.approx([0.80, 0.70, 0.40])
    assert list(got.ids[1]) == ["weather", "calendar", "mail"]  # the one-request query: its own top 3


def test_rrf_merge_by_hand():
    task = "check the weather in Oslo and send me an email"
    table = {task: [("a", 3.0), ("b", 2.0)], "check the weather in Oslo": [("b", 1.0), ("c", 0.5)],
             "send me an email": [("c", 9.0)]}
    search, _calls = fixed_search(table)
    got = IntentMerge(merge="rrf", rrf_k=1, intent_weight=0.5).search([task], 3, search)
    # a: 1/2; b: 1/3 + 0.5/2 = 0.5833; c: 0.5/3 + 0.5/2 = 0.4167
    assert list(got.ids[0]) == ["b", "a", "c"]
    assert got.scores[0].tolist() == pytest.approx([1 / 3 + 0.25, 0.5, 0.5 / 3 + 0.25], abs=1e-6)
    assert isinstance(got.ids[0], np.ndarray)


def test_the_pipeline_merges_requests_and_leaves_one_request_tasks_alone(tools):
    from toolscout import ToolScout

    plain = ToolScout.from_tools(tools, retriever="bm25", intents=None)
    split = ToolScout.from_tools(tools, retriever="bm25", intents=IntentMerge(merge="max", depth=20))
    single = ["weather forecast for Paris", "search and replace in a file", "book a flight and a hotel room"]
    for query in single:  # one request each: the very same ranking and scores
        a, b = plain.retrieve([query], 5), split.retrieve([query], 5)
        assert list(a.ids[0]) == list(b.ids[0]) and a.scores[0].tolist() == b.scores[0].tolist()
    task = "check the weather forecast for Paris and send an email to my team"
    parts = split_intents(task)
    assert parts == ["check the weather forecast for Paris", "send an email to my team"]
    # oracle: the best BM25 score of each tool against the task or either request, searched separately
    best = {}
    for text in [task, *parts]:
        ids, scores = plain.retriever.search([text], 20)[0]
        for tid, score in zip(ids, scores):
            best[tid] = max(best.get(tid, float("-inf")), float(score))
    want = sorted(best, key=lambda t: -best[t])[:3]
    got = split.retrieve([task], 3)
    assert list(got.ids[0]) == want and got.scores[0].tolist() == pytest.approx([best[t] for t in want])
    assert {"weather.get_forecast", "mail.send"} <= set(got.ids[0])


def test_the_merge_settings_are_saved_with_the_pipeline(tools, tmp_path):
    from toolscout import ToolScout

    ToolScout.from_tools(tools, retriever="bm25", intents=IntentMerge("rrf", 0.5, 10, 30)).save(tmp_path / "a")
    assert ToolScout.load(tmp_path / "a").intents == IntentMerge("rrf", 0.5, 10, 30)
    ToolScout.from_tools(tools, retriever="bm25", intents=None).save(tmp_path / "b")
    assert ToolScout.load(tmp_path / "b").intents is None
