"""The LLM reranker against a real OpenAI-compatible server on loopback (tests/fakellm.py)."""

import json
import math
import socket
import threading
import time
import warnings

import numpy as np
import pytest
from fakellm import FakeLLM, Reply, mentions, message_text

from toolscout.llm import LLMClient, LLMHTTPError, LLMReplyError, LLMSettings, LLMTimeoutError
from toolscout.rerank.base import Reranker, load_reranker
from toolscout.rerank.llm import EndpointBreaker, LLMReranker, answer_score
from toolscout.results import Results
from toolscout.tool import TextView, Tool, tool_text

TOOLS = {t.id: t for t in [
    Tool("w", "get_weather", "Weather forecast for a city."),
    Tool("f", "search_flights", "Search flights between two airports."),
    Tool("h", "book_hotel", "Reserve a hotel room in a city."),
    Tool("m", "send_email", "Send an email message to a recipient."),
]}
QUERY = "will it rain in Paris tomorrow"


def lp(l_true, l_false, first=None):
    """Chat-shape log-probabilities for a one-token answer with both words among the alternatives."""
    first = first or ("true" if l_true >= l_false else "false")
    spelling = {first.strip().lower(): first}  # the generated token is among its alternatives, as spelled
    return [{"token": first, "logprob": max(l_true, l_false), "bytes": None,
             "top_logprobs": [{"token": spelling.get("true", "true"), "logprob": l_true},
                              {"token": spelling.get("false", "false"), "logprob": l_false},
                              {"token": "maybe", "logprob": -9.0}]}]


def p_true(l_true, l_false):
    return 1.0 / (1.0 + math.exp(l_false - l_true))


def plain_body(text):
    """A 200 reply carrying no log-probabilities at all (like a server that ignores `logprobs`)."""
    return json.dumps({"id": "x", "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                                                            "message": {"role": "assistant", "content": text}}]})


def by_tool(table):
    """A responder answering by which tool's name (as tool_text writes it) the prompt mentions."""
    def respond(request):
        text = message_text(request)
        for words, reply in table.items():
            if words in text:
                return reply
        return Reply("false", logprobs=lp(-5.0, -0.01))
    return respond


def settings_for(llm, **kw):
    kw.setdefault("timeout", 5.0)
    kw.setdefault("max_retries", 0)
    return LLMSettings(base_url=llm.url, model="m", **kw)


def candidates(*lists):
    return Results.from_lists(lists, [[10.0 - i for i in range(len(ids))] for ids in lists])


def test_score_is_p_true_from_the_first_tokens_logprobs():
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm, \
            LLMReranker(settings_for(llm)) as reranker:
        out = reranker.rerank([QUERY], candidates(["w"]), TOOLS)
        # exp(-0.1) / (exp(-0.1) + exp(-2.3)) = 1 / (1 + e^-2.2) = 0.90025
        assert list(out.ids[0]) == ["w"]
        assert out.scores[0][0] == pytest.approx(0.90025, abs=1e-4)
        request = llm.requests[0]
    assert request["max_tokens"] == 1 and request["temperature"] == 0.0
    assert request["logprobs"] is True and request["top_logprobs"] == 5
    prompt = message_text(request)
    assert QUERY in prompt and tool_text(TOOLS["w"]) in prompt and "true" in prompt and "false" in prompt
    assert reranker.stats.to_dict() == {"calls": 1, "queries": 1, "pairs": 1, "asked": 1, "logprob_scored": 1,
                                        "text_fallbacks": 0, "low_mass": 0, "errors": 0, "cached": 0, "failed_queries": 0}
    assert isinstance(reranker, Reranker) and reranker.name == "llm"


def test_reorders_each_query_by_p_true_and_keeps_exactly_its_candidates():
    table = {"get weather": Reply("true", logprobs=lp(-0.1, -2.3)),            # 0.9002
             "search flights": Reply("false", logprobs=lp(-1.0, -0.5)),        # 1/(1+e^0.5) = 0.3775
             "book hotel": Reply("true", logprobs=lp(-0.2, -1.8, first=" True")),  # 1/(1+e^-1.6) = 0.8320
             "send email": Reply("false", logprobs=lp(-1.0, -0.5))}            # 0.3775, ties with flights
    with FakeLLM(responder=by_tool(table)) as llm, LLMReranker(settings_for(llm)) as reranker:
        cands = candidates(["m", "f", "w", "h"], ["f", "m", "w"], [])
        out = reranker.rerank([QUERY, "weather please", "nothing"], cands, TOOLS)
        assert len(llm.requests) == 7
    assert list(out.ids[0]) == ["w", "h", "m", "f"]  # m before f: a tie keeps the first-stage order
    assert np.allclose(out.scores[0], [p_true(-0.1, -2.3), p_true(-0.2, -1.8), p_true(-1, -0.5), p_true(-1, -0.5)],
                       atol=1e-6)
    assert out.scores[0][1] == pytest.approx(0.8320, abs=1e-4) and out.scores[0][2] == pytest.approx(0.3775, abs=1e-4)
    assert list(out.ids[1]) == ["w", "f", "m"]
    assert len(out.ids[2]) == 0 and len(out) == 3
    assert reranker.stats.pairs == 7 and reranker.stats.logprob_scored == 7


def test_document_is_the_tool_text_cut_to_max_doc_chars():
    view = TextView(parameters=False, tags=False)
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm, \
            LLMReranker(settings_for(llm), max_doc_chars=12, view=view, top_logprobs=2) as reranker:
        reranker.rerank([QUERY], candidates(["f"]), TOOLS)
        prompt = message_text(llm.requests[0])
        assert llm.requests[0]["top_logprobs"] == 2
    full = tool_text(TOOLS["f"], view)  # "search flights\nSearch flights between two airports."
    assert full[:12] == "search fligh" and full[:12] in prompt and full[:13] not in prompt


def test_identical_pairs_in_one_call_are_asked_once():
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm, \
            LLMReranker(settings_for(llm)) as reranker:
        out = reranker.rerank([QUERY, QUERY, "other"], candidates(["w", "f"], ["f", "w"], ["w"]), TOOLS)
        assert len(llm.requests) == 3  # (QUERY, w), (QUERY, f), (other, w)
    assert [list(i) for i in out.ids] == [["w", "f"], ["f", "w"], ["w"]]  # all equal scores: first-stage order
    assert reranker.stats.pairs == 5 and reranker.stats.asked == 3


def test_pairs_run_concurrently_on_the_clients_pool():
    state = {"now": 0, "max": 0}
    lock = threading.Lock()

    def slow(req):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.15)
        with lock:
            state["now"] -= 1
        return Reply("true", logprobs=lp(-0.1, -2.3))

    with FakeLLM(responder=slow) as llm, LLMReranker(settings_for(llm, concurrency=3)) as reranker:
        reranker.rerank([QUERY, "q2"], candidates(["w", "f", "h"], ["m", "w", "f"]), TOOLS)
    assert 2 <= state["max"] <= 3  # overlapping requests, never more than the client's concurrency


def test_no_logprobs_scores_from_the_answer_text_and_warns_once():
    table = {"get weather": Reply(body=plain_body("True.")), "search flights": Reply(body=plain_body(" no")),
             "book hotel": Reply(body=plain_body("YES")), "send email": Reply(body=plain_body("false"))}
    with FakeLLM(responder=by_tool(table)) as llm, LLMReranker(settings_for(llm)) as reranker:
        with pytest.warns(UserWarning, match="no log-probabilities") as caught:
            out = reranker.rerank([QUERY], candidates(["f", "m", "w", "h"]), TOOLS)
        assert len([w for w in caught if "log-probabilities" in str(w.message)]) == 1
        assert list(out.ids[0]) == ["w", "h", "f", "m"] and list(out.scores[0]) == [1.0, 1.0, 0.0, 0.0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a second call on the same reranker warns no more
            again = reranker.rerank(["another query"], candidates(["m", "w"]), TOOLS)
    assert list(again.ids[0]) == ["w", "m"]
    stats = reranker.stats
    assert (stats.text_fallbacks, stats.logprob_scored, stats.errors) == (6, 0, 0)


def test_logprobs_without_either_word_fall_back_to_the_text_and_say_why():
    # the model answered "Yes": log-probabilities exist, but neither "true" nor "false" is among them
    yes = [{"token": "Yes", "logprob": -0.01, "top_logprobs": [{"token": "No", "logprob": -4.0}]}]
    with FakeLLM(responder=lambda req: Reply("Yes", logprobs=yes)) as llm, LLMReranker(settings_for(llm)) as reranker:
        with pytest.warns(UserWarning, match="gives log-probabilities, but in 1 of 1 pairs true and false together "
                                             "hold less than 50%.*0/1 from the answer text") as caught:
            out = reranker.rerank([QUERY], candidates(["w"]), TOOLS)
    assert not [w for w in caught if "no log-probabilities" in str(w.message)]
    stats = reranker.stats
    assert out.scores[0][0] == 1.0 and (stats.low_mass, stats.text_fallbacks, stats.logprob_scored) == (1, 0, 0)


def test_a_word_spelled_several_ways_is_scored_from_its_summed_probability():
    # true 0.30 ("true") + 0.25 ("True") + 0.20 (" true") = 0.75, false 0.10 + 0.10 = 0.20: P = 0.75 / 0.95
    spread = [{"token": "true", "logprob": math.log(0.30),
               "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in
                                (("true", 0.30), ("True", 0.25), (" true", 0.20), ("false", 0.10), ("False", 0.10))]}]
    with FakeLLM(responder=lambda req: Reply("true", logprobs=spread)) as llm, \
            LLMReranker(settings_for(llm)) as reranker, warnings.catch_warnings():
        warnings.simplefilter("error")
        out = reranker.rerank([QUERY], candidates(["w"]), TOOLS)
    assert out.scores[0][0] == pytest.approx(0.789474, abs=1e-6) and reranker.stats.logprob_scored == 1


def test_an_answer_that_is_neither_word_is_a_failed_pair_whatever_its_alternatives():
    # chatty models open with "maybe" or a code fence; "true" among their alternatives at 5 % is no verdict
    maybe = [{"token": "maybe", "logprob": math.log(0.9),
              "top_logprobs": [{"token": "maybe", "logprob": math.log(0.9)},
                               {"token": "true", "logprob": math.log(0.05)}]}]
    fence = [{"token": "```", "logprob": -0.0003,
              "top_logprobs": [{"token": "```", "logprob": -0.0003}, {"token": "true", "logprob": math.log(0.0003)}]}]
    table = {"get weather": Reply("maybe", logprobs=maybe), "send email": Reply("```", logprobs=fence)}
    with FakeLLM(responder=by_tool(table)) as llm, LLMReranker(settings_for(llm)) as reranker:
        with pytest.warns(UserWarning, match=r"2 of 3 pairs failed.*expected true or false"):
            out = reranker.rerank([QUERY], candidates(["f", "w", "m"]), TOOLS)
    assert list(out.ids[0]) == ["f", "w", "m"] and list(out.scores[0]) == [10.0, 9.0, 8.0]  # the first stage's list
    assert (reranker.stats.errors, reranker.stats.failed_queries, reranker.stats.logprob_scored) == (2, 1, 1)


def test_timeout_keeps_the_first_stage_order_for_that_query_only():
    table = {"get weather": Reply("true", logprobs=lp(-0.1, -2.3)),
             "search flights": Reply("false", logprobs=lp(-3.0, -0.1))}
    with FakeLLM(responder=by_tool(table)) as llm:
        llm.script(Reply("true", logprobs=lp(-0.1, -2.3), delay=1.0), when=mentions("slow query", "get weather"))
        with LLMReranker(settings_for(llm, timeout=0.3)) as reranker:
            with pytest.warns(UserWarning, match=r"1 of 4 pairs failed, so 1 of 2 queries keep their first-stage "
                                                 r"order; first error \(query 0, tool 'w'\).*no reply within") as rec:
                out = reranker.rerank(["slow query", QUERY], candidates(["f", "w"], ["f", "w"]), TOOLS)
    assert len([w for w in rec if "pairs failed" in str(w.message)]) == 1
    assert list(out.ids[0]) == ["f", "w"] and list(out.scores[0]) == [10.0, 9.0]  # the first stage's list, as it came
    assert list(out.ids[1]) == ["w", "f"] and out.scores[1][0] == pytest.approx(0.9002, abs=1e-4)
    assert (reranker.stats.errors, reranker.stats.failed_queries, reranker.stats.logprob_scored) == (1, 1, 3)


class Clock:
    """A monotonic clock the test moves by hand (the endpoint breaker's pause)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def timed_rerank(reranker, query, ids):
    start = time.monotonic()
    out = reranker.rerank([query], candidates(ids), TOOLS)
    return out, time.monotonic() - start


def test_a_hung_endpoint_costs_one_deadline_then_is_skipped_until_its_pause_ends():
    clock = Clock()
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3), delay=5.0)) as llm, \
            LLMReranker(LLMSettings(base_url=llm.url, model="m"), deadline=0.5) as reranker:  # timeout 60, 4 retries
        reranker.breaker = EndpointBreaker(30.0, clock=clock)
        with pytest.warns(UserWarning, match=r"4 of 4 pairs failed.*no reply within .*deadline cut it short"):
            out, took = timed_rerank(reranker, QUERY, ["f", "m", "w", "h"])
        assert took < 2.0  # before: 5 attempts of a 60 s timeout per pair
        assert list(out.ids[0]) == ["f", "m", "w", "h"] and list(out.scores[0]) == [10.0, 9.0, 8.0, 7.0]
        asked = llm.calls
        with pytest.warns(UserWarning, match=r"not asked: it failed .* skipped for 30 s"):
            out, took = timed_rerank(reranker, "another task", ["w", "f"])
        assert took < 0.5 and llm.calls == asked and list(out.ids[0]) == ["w", "f"]
        llm.responder = lambda req: Reply("true", logprobs=lp(-0.1, -2.3))  # the server recovers
        clock.now += 30.0
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out, _took = timed_rerank(reranker, "third task", ["f", "w"])
        assert llm.calls == asked + 2 and list(out.scores[0]) == pytest.approx([0.9002] * 2, abs=1e-4)


def test_a_refusing_endpoint_falls_back_within_the_deadline_and_is_used_again_once_up():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    clock = Clock()
    settings = LLMSettings(base_url=f"http://127.0.0.1:{port}/v1", model="m")  # defaults: 4 retries, 1 s backoff
    with LLMReranker(settings, deadline=1.0) as reranker:
        reranker.breaker = EndpointBreaker(30.0, clock=clock)
        with pytest.warns(UserWarning, match=r"cannot reach the server"):
            out, took = timed_rerank(reranker, QUERY, ["f", "m", "w", "h"])
        assert took < 3.0 and list(out.ids[0]) == ["f", "m", "w", "h"]  # before: 15 s of backoff per pair, 77 s
        with pytest.warns(UserWarning, match=r"not asked: it failed"):
            out, took = timed_rerank(reranker, "another task", ["w", "f"])
        assert took < 0.5
        with FakeLLM(responder=lambda req: Reply("false", logprobs=lp(-2.3, -0.1)), port=port) as llm:
            clock.now += 30.0
            out, _took = timed_rerank(reranker, "third task", ["f", "w"])
            assert llm.calls == 2 and list(out.scores[0]) == pytest.approx([1 - 0.9002] * 2, abs=1e-4)


def test_pairs_left_unsent_by_the_deadline_do_not_pause_an_endpoint_that_answered():
    # one slot, each answer takes 0.2 s, deadline 0.5 s: two pairs are judged, the third is cut short by the
    # deadline and the fourth is never sent; the endpoint answered, so the next search asks it again
    slow = lambda req: Reply("true", logprobs=lp(-0.1, -2.3), delay=0.2)  # noqa: E731
    with FakeLLM(responder=slow) as llm, \
            LLMReranker(settings_for(llm, concurrency=1), deadline=0.5) as reranker:
        with pytest.warns(UserWarning, match=r"pairs failed"):
            reranker.rerank([QUERY], candidates(["f", "m", "w", "h"]), TOOLS)
        asked = len(llm.requests)
        assert reranker.breaker.skip_reason() is None
        out = reranker.rerank(["another task"], candidates(["w"]), TOOLS)
        assert len(llm.requests) == asked + 1 and out.scores[0][0] == pytest.approx(0.9002, abs=1e-4)


def test_a_cached_reply_that_is_no_judgement_is_asked_again(tmp_path):
    with FakeLLM(responder=lambda req: Reply(body=plain_body("maybe"))) as llm, \
            LLMReranker(settings_for(llm, cache_dir=str(tmp_path / "cache"))) as reranker:
        with pytest.warns(UserWarning, match="'maybe'"):
            reranker.rerank([QUERY], candidates(["w"]), TOOLS)
        llm.responder = lambda req: Reply("true", logprobs=lp(-0.1, -2.3))  # the model answers properly now
        out = reranker.rerank([QUERY], candidates(["w"]), TOOLS)
        assert len(llm.requests) == 2 and out.scores[0][0] == pytest.approx(0.9002, abs=1e-4)
        again = reranker.rerank([QUERY], candidates(["w"]), TOOLS)  # the good reply is cached
        assert len(llm.requests) == 2 and again.scores[0][0] == pytest.approx(0.9002, abs=1e-4)


def test_a_paused_endpoint_still_answers_cached_pairs(tmp_path):
    clock = Clock()
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm, \
            LLMReranker(settings_for(llm, cache_dir=str(tmp_path / "cache")), deadline=0.3) as reranker:
        reranker.rerank([QUERY], candidates(["w", "f"]), TOOLS)
        reranker.breaker = EndpointBreaker(30.0, clock=clock)
        llm.responder = lambda req: Reply("true", logprobs=lp(-0.1, -2.3), delay=1.0)  # the endpoint hangs
        with pytest.warns(UserWarning, match=r"no reply within"):
            reranker.rerank(["a new task"], candidates(["w"]), TOOLS)
        assert reranker.breaker.skip_reason() is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = reranker.rerank([QUERY], candidates(["f", "w"]), TOOLS)
        assert len(llm.requests) == 3 and list(out.scores[0]) == pytest.approx([0.9002] * 2, abs=1e-4)
        with pytest.warns(UserWarning, match=r"not asked: it failed"):
            reranker.rerank(["a task never asked"], candidates(["w"]), TOOLS)


def test_on_error_raise_names_the_query_index_and_tool_id():
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm:
        llm.script(Reply(status=500, content="kaput"), when=mentions("second", "book hotel"))
        with LLMReranker(settings_for(llm), on_error="raise") as reranker:
            with pytest.raises(LLMHTTPError, match=r"query 1, tool 'h'.*HTTP 500.*kaput") as info:
                reranker.rerank(["first", "second"], candidates(["w", "f"], ["f", "h", "w"]), TOOLS)
    assert info.value.status == 500 and reranker.stats.errors == 1


def test_timeout_with_on_error_raise():
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3), delay=1.0)) as llm, \
            LLMReranker(settings_for(llm, timeout=0.2), on_error="raise") as reranker:
        with pytest.raises(LLMTimeoutError, match=r"query 0, tool 'm'"):
            reranker.rerank([QUERY], candidates(["m"]), TOOLS)


def test_http_500_without_retries_falls_back():
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm:
        llm.script(Reply(status=500), when=mentions("send email"))
        with LLMReranker(settings_for(llm)) as reranker, pytest.warns(UserWarning, match="HTTP 500"):
            out = reranker.rerank([QUERY, "q2"], candidates(["f", "m", "w"], ["h", "w"]), TOOLS)
        assert len(llm.requests) == 5  # max_retries=0: the failed pair was sent once
        assert reranker.client.stats.to_dict()["retries"] == 0
    assert list(out.ids[0]) == ["f", "m", "w"] and list(out.scores[0]) == [10.0, 9.0, 8.0]
    assert list(out.ids[1]) == ["h", "w"] and list(out.scores[1]) == pytest.approx([0.9002] * 2, abs=1e-4)
    assert (reranker.stats.errors, reranker.stats.failed_queries) == (1, 1)


def test_malformed_answer_is_a_failed_pair():
    with FakeLLM(responder=lambda req: Reply("false", logprobs=lp(-2.3, -0.1))) as llm:
        llm.script(Reply(body=plain_body("maybe")), when=mentions("book hotel"))
        with LLMReranker(settings_for(llm)) as reranker, pytest.warns(UserWarning, match="'maybe'"):
            out = reranker.rerank([QUERY], candidates(["h", "w"]), TOOLS)
        assert list(out.ids[0]) == ["h", "w"] and list(out.scores[0]) == [10.0, 9.0]
        assert (reranker.stats.errors, reranker.stats.text_fallbacks) == (1, 0)
        llm.script(Reply(body=plain_body("maybe")))
        with LLMReranker(settings_for(llm), on_error="raise") as strict:
            with pytest.raises(LLMReplyError, match=r"query 0, tool 'h'.*'maybe'.*true or false"):
                strict.rerank(["fresh"], candidates(["h"]), TOOLS)


def test_cache_answers_a_second_run_without_http(tmp_path):
    table = {"get weather": Reply("true", logprobs=lp(-0.1, -2.3)),
             "search flights": Reply("false", logprobs=lp(-1.0, -0.5))}
    with FakeLLM(responder=by_tool(table)) as llm:
        settings = settings_for(llm, cache_dir=str(tmp_path / "cache"))
        cands = candidates(["f", "w"], ["w", "f"])
        with LLMReranker(settings) as first:
            out1 = first.rerank([QUERY, "q2"], cands, TOOLS)
        assert len(llm.requests) == 4 and first.stats.cached == 0
        with LLMReranker(settings) as second:  # a new client: only the disk cache is shared
            out2 = second.rerank([QUERY, "q2"], cands, TOOLS)
        assert len(llm.requests) == 4  # no new HTTP request
    assert second.stats.cached == 4 and second.stats.logprob_scored == 4
    assert second.client.stats.to_dict()["cache_hits"] == 4
    assert out1.as_lists() == out2.as_lists() == [["w", "f"], ["w", "f"]]
    assert np.allclose(out1.scores[0], out2.scores[0])


def test_save_load_round_trip_never_writes_the_key(tmp_path, monkeypatch):
    view = TextView(tags=False, max_chars=900)
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm:
        settings = settings_for(llm, api_key="sk-secret-123", api_key_env="TS_TEST_RERANK_KEY", concurrency=2)
        with LLMReranker(settings, depth=12, view=view, max_doc_chars=300, top_logprobs=3) as reranker:
            reranker.save(tmp_path / "rr")
        text = (tmp_path / "rr" / "config.json").read_text()
        assert "sk-secret-123" not in text and "api_key_env" in text
        config = json.loads(text)
        assert config["kind"] == "toolscout.reranker" and config["reranker"] == "llm"
        assert config["depth"] == 12 and config["max_doc_chars"] == 300 and config["on_error"] == "fallback"

        monkeypatch.setenv("TS_TEST_RERANK_KEY", "sk-from-env")
        with load_reranker(tmp_path / "rr", depth=7, on_error="raise") as loaded:
            assert isinstance(loaded, LLMReranker)
            assert (loaded.depth, loaded.max_doc_chars, loaded.on_error, loaded.top_logprobs) == (7, 300, "raise", 3)
            assert loaded.view == view and loaded.settings.concurrency == 2 and loaded.settings.base_url == llm.url
            assert loaded.settings.api_key == "sk-from-env"
            out = loaded.rerank([QUERY], candidates(["w"]), TOOLS)
        assert out.scores[0][0] == pytest.approx(0.9002, abs=1e-4)
        assert llm.requests[-1]["_headers"]["authorization"] == "Bearer sk-from-env"
        with LLMReranker.load(tmp_path / "rr", model="other") as renamed:
            assert renamed.settings.model == "other" and renamed.depth == 12


def test_from_settings_file_reads_the_key_from_the_env(tmp_path, monkeypatch):
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm:
        path = tmp_path / "llm.json"
        path.write_text(json.dumps({"base_url": llm.url, "model": "judge", "api_key_env": "TS_TEST_RERANK_KEY2",
                                    "max_retries": 0, "timeout": 5}))
        monkeypatch.setenv("TS_TEST_RERANK_KEY2", "sk-file-env")
        with LLMReranker.from_settings_file(path, depth=5) as reranker:
            reranker.rerank([QUERY], candidates(["w"]), TOOLS)
        assert reranker.depth == 5
        assert llm.requests[0]["model"] == "judge"
        assert llm.requests[0]["_headers"]["authorization"] == "Bearer sk-file-env"


def test_the_key_is_read_as_expand_reads_it_and_the_hints_name_the_rerankers_settings(tmp_path, monkeypatch):
    """The reranker read only a variable named by api_key_env, so with the documented default variable set it
    sent no key, and its 401 hint named --api-key-env, a flag search and serve do not have."""
    monkeypatch.delenv("TOOLSCOUT_LLM_API_KEY", raising=False)
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm:
        path = tmp_path / "llm.yaml"
        path.write_text(f"base_url: {llm.url}\nmodel: m\nmax_retries: 0\n")
        llm.script(Reply(status=401, content="no key"))
        with LLMReranker.from_settings_file(path) as keyless, pytest.warns(UserWarning) as caught:
            keyless.rerank([QUERY], candidates(["w"]), TOOLS)
        said = " ".join(str(w.message) for w in caught)
        assert "HTTP 401" in said and "reads the environment variable TOOLSCOUT_LLM_API_KEY" in said
        assert "api_key_env in the llm: config" in said and "--api-key-env" not in said
        monkeypatch.setenv("TOOLSCOUT_LLM_API_KEY", "sk-default-var")
        with LLMReranker.from_settings_file(path) as reranker:
            reranker.rerank([QUERY], candidates(["w"]), TOOLS)
            reranker.save(tmp_path / "rr")
        assert llm.requests[-1]["_headers"]["authorization"] == "Bearer sk-default-var"
        with load_reranker(tmp_path / "rr") as loaded:  # an index's reranker, as search and serve load it
            loaded.rerank(["another task"], candidates(["w"]), TOOLS)
        assert llm.requests[-1]["_headers"]["authorization"] == "Bearer sk-default-var"
        assert "sk-default-var" not in (tmp_path / "rr" / "config.json").read_text()

        monkeypatch.delenv("TOOLSCOUT_LLM_API_KEY")
        path.write_text(f"base_url: {llm.url}\nmodel: m\napi_key: sk-in-file\n")
        with LLMReranker.from_settings_file(path) as in_file:
            with pytest.warns(UserWarning, match=r"api_key is not saved .* environment variable TOOLSCOUT_LLM_API_KEY"):
                in_file.save(tmp_path / "rr2")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path.write_text(f"base_url: http://127.0.0.1:{port}/v1\nmodel: m\nmax_retries: 0\n")
    with LLMReranker.from_settings_file(path) as unreachable, pytest.warns(UserWarning) as caught:
        unreachable.rerank([QUERY], candidates(["w"]), TOOLS)
    said = " ".join(str(w.message) for w in caught)
    assert "check base_url in the llm: config" in said and "--base-url" not in said


def test_a_key_given_on_purpose_beats_the_environment_and_an_index_sends_only_the_key_it_names(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLSCOUT_LLM_API_KEY", "sk-for-another-service")
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm:
        path = tmp_path / "llm.yaml"
        path.write_text(f"base_url: {llm.url}\nmodel: m\nmax_retries: 0\n")
        with LLMReranker.from_settings_file(path, api_key="sk-given") as given:  # --rerank-option api_key=
            given.rerank([QUERY], candidates(["w"]), TOOLS)
        assert llm.requests[-1]["_headers"]["authorization"] == "Bearer sk-given"
        with LLMReranker.from_settings_file(path) as indexed:  # the default variable, read when indexing ...
            indexed.save(tmp_path / "named")
        saved = json.loads((tmp_path / "named" / "config.json").read_text())["settings"]
        assert saved["api_key_env"] == "TOOLSCOUT_LLM_API_KEY"  # ... is named in the index for its searches
        with LLMReranker.load(tmp_path / "named", api_key="sk-explicit") as loaded:
            loaded.rerank([QUERY], candidates(["w"]), TOOLS)
        assert llm.requests[-1]["_headers"]["authorization"] == "Bearer sk-explicit"

        monkeypatch.delenv("TOOLSCOUT_LLM_API_KEY")
        with LLMReranker.from_settings_file(path) as keyless:  # no key when indexing: the index names none
            keyless.save(tmp_path / "keyless")
        monkeypatch.setenv("TOOLSCOUT_LLM_API_KEY", "sk-for-another-service")
        with load_reranker(tmp_path / "keyless") as loaded:
            loaded.rerank([QUERY], candidates(["w"]), TOOLS)
        assert "authorization" not in llm.requests[-1]["_headers"]


def test_a_given_client_is_used_and_saved_without_a_key(tmp_path):
    with FakeLLM(responder=lambda req: Reply("true", logprobs=lp(-0.1, -2.3))) as llm, \
            LLMClient(llm.url, "m", api_key="sk-client", max_retries=0) as client:
        reranker = LLMReranker(client=client)
        reranker.rerank([QUERY], candidates(["w"]), TOOLS)
        reranker.save(tmp_path / "c")
        assert llm.requests[0]["_headers"]["authorization"] == "Bearer sk-client"
    text = (tmp_path / "c" / "config.json").read_text()
    assert "sk-client" not in text and json.loads(text)["settings"]["model"] == "m"


def test_bad_arguments_are_clear_errors():
    settings = LLMSettings(base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(ValueError, match="on_error must be one of fallback, raise, got 'ignore'"):
        LLMReranker(settings, on_error="ignore")
    with pytest.raises(ValueError, match="settings"):
        LLMReranker()
    with pytest.raises(ValueError, match="depth"):
        LLMReranker(settings, depth=0)
    reranker = LLMReranker(settings)
    with pytest.raises(ValueError, match="2 queries but candidates for 1"):
        reranker.rerank(["a", "b"], candidates(["w"]), TOOLS)
    with pytest.raises(KeyError, match="'zz' of query 0"):
        reranker.rerank(["a"], candidates(["zz"]), TOOLS)
    reranker.close()


def test_answer_score_ignores_case_spaces_and_punctuation():
    assert [answer_score(t) for t in ("true", " True.", "YES!", "yes", "False", "no.", " NO\n")] == \
        [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert answer_score("maybe") is None and answer_score("") is None and answer_score("not true") is None
