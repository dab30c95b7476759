"""Query generation: pick validation, near-duplicate removal, polish, benchmark output, the CLI."""

import argparse
import json
from pathlib import Path

import pytest
from fakellm import FakeLLM, Reply, mentions

from toolscout.benchmark_sets import load_benchmark
from toolscout.cli.generate import add_parsers as add_generate_parsers
from toolscout.cli.generate import cmd_generate
from toolscout.generate import GenerateConfig, NearDuplicateIndex, check_pick, generate_queries, similarity
from toolscout.generate.dedupe import shingles
from toolscout.generate.pipeline import parse_polish, shown_names
from toolscout.llm import LLMClient
from toolscout.tool import Tool

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"
NAMES = {"get_forecast": "weather.forecast", "send_email": "mail.send", "search_flights": "flights.search"}
CATALOG = {"get_forecast", "send_email", "search_flights", "book_hotel", "weather.forecast", "mail.send",
           "flights.search", "hotels.book"}


def pick(tools, query="Email Bob the forecast for Oslo"):
    return json.dumps({"tools": tools, "query": query})


@pytest.mark.parametrize("reply, reason", [
    ("not json at all", "invalid_json"),
    ('{"tools": "get_forecast", "query": "x"}', "invalid_json"),
    (pick(["get_forecast", "translate_text"]), "unknown_tool"),      # hallucinated
    (pick(["get_forecast", "book_hotel"]), "not_offered"),           # in the catalog, not in the sample
    (pick(["get_forecast"]), "wrong_count"),
    (pick(["get_forecast", "send_email", "search_flights"]), "wrong_count"),
    (pick(["get_forecast", "Get_Forecast"]), "duplicate_tool"),
    (pick(["get_forecast", "send_email"], "  "), "empty_query"),
    (pick(["get_forecast", "send_email"], "call get_forecast then send_email to Bob"), "mentions_tool_name"),
])
def test_invalid_picks_are_rejected_with_a_reason(reply, reason):
    assert check_pick(reply, NAMES, CATALOG, 2, 2)[0] == reason


def test_a_valid_pick_maps_names_to_ids_case_insensitively():
    reason, labels, names, query = check_pick(pick(["Send_Email", "weather.forecast"], "Email Bob  the forecast"),
                                              NAMES, CATALOG, 2, 5)
    assert reason is None and labels == ("mail.send", "weather.forecast") and query == "Email Bob the forecast"


def test_shown_names_use_ids_where_names_collide():
    sample = [Tool("a.search", "search"), Tool("b.search", "search"), Tool("c", "book")]
    assert shown_names(sample) == {"a.search": "a.search", "b.search": "b.search", "book": "c"}


def test_similarity_by_hand_and_near_duplicate_index():
    assert shingles("AB-cd") == {"ab ", "b c", " cd"}
    assert similarity("abcd", "abce") == pytest.approx(1 / 3)   # {abc, bcd} vs {abc, bce}
    assert similarity("Find flights!", "find   FLIGHTS") == 1.0
    index = NearDuplicateIndex(threshold=0.7)
    assert index.add("Find flights from Paris to Rome next Friday and book the cheapest one")
    assert not index.add("Find flights from Paris to Rome next Friday and book the cheapest")  # 0.94
    assert index.add("What is the weather in Boston tomorrow?")
    assert index.add("Book a table for 2 at an Italian restaurant tonight")
    assert index.add("Book a table for two at an Italian place tonight")  # 0.55: a different request
    assert len(index) == 4 and not index.add("   ")


def test_near_duplicate_index_agrees_with_brute_force():
    import random

    rng = random.Random(3)
    words = "book flight hotel rome paris weather email bob send read file stock price tomorrow".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 7))) for _ in range(150)]
    index = NearDuplicateIndex(threshold=0.6)
    kept: list[frozenset] = []
    agree = 0
    for text in texts:
        grams = shingles(text)
        brute_duplicate = any(len(grams & k) / len(grams | k) >= 0.6 for k in kept)
        added = index.add(text)
        assert not (added is False and not brute_duplicate)  # never rejects a text that has no near duplicate
        agree += added != brute_duplicate
        if added:
            kept.append(grams)
    assert agree >= 0.97 * len(texts)  # LSH may rarely miss a duplicate


def test_parse_polish():
    assert parse_polish('{"query": "Plan  my trip", "changed": true}') == ("Plan my trip", True)
    assert parse_polish("nope") == (None, False)
    assert parse_polish('{"changed": false}') == (None, False)


def test_generation_counts_rejections_dedupes_and_polishes():
    with FakeLLM() as fake:
        first = mentions("The assistant can call these")
        fake.script(Reply("```json\n{oops"),                                            # invalid JSON
                    Reply(pick(["teleport_user", "CancelRegistration"])),            # hallucinated name
                    Reply(pick([])),                                                 # no tool
                    Reply(status=500), Reply(status=500),                            # server down for one attempt
                    when=first)
        with LLMClient(fake.url, "gen", concurrency=1, max_retries=1, backoff=0.0) as client:
            result = generate_queries(_sample_tools(), client, GenerateConfig(n=12, seed=7, batch=4), progress=False)
    report = result.report
    assert report.accepted == 12 and len(result.queries) == 12
    assert report.rejected["invalid_json"] == 1 and report.rejected["unknown_tool"] == 1
    assert report.rejected["wrong_count"] == 1 and report.rejected["llm_error"] == 1
    assert report.attempts == 12 + sum(report.rejected.values())
    ids = {t.id for t in _sample_tools()}
    assert all(q.split == "train" and 2 <= len(q.labels) <= 5 and set(q.labels) <= ids for q in result.queries)
    texts = [q.text for q in result.queries]
    assert all(similarity(a, b) < 0.7 for i, a in enumerate(texts) for b in texts[:i])
    # the heuristic server writes "X, then Y"; polish turns it into "X and Y"
    assert report.polished == 12 and all(", then " in d.draft and ", then " not in d.text for d in result.details)
    # in-context examples: later prompts show earlier accepted queries
    prompts = [r["messages"][1]["content"] for r in fake.requests if "The assistant can call these" in str(r["messages"])]
    assert texts[0] in prompts[-1]


def test_duplicates_are_removed():
    def same(req):  # every generation reply is the same request
        text = str(req["messages"])
        if "<request>" in text:
            return Reply(json.dumps({"query": "Cancel my appointment and check my balance", "changed": False}))
        names = [line.split(":")[0][2:] for line in req["messages"][1]["content"].splitlines() if line.startswith("- ")]
        return Reply(pick(names[:2], "Cancel my appointment and check my balance"))

    with FakeLLM(responder=same) as fake, LLMClient(fake.url, "gen") as client:
        result = generate_queries(_sample_tools(), client, GenerateConfig(n=3, max_attempts=6), progress=False)
    assert result.report.accepted == 1 and result.report.rejected["near_duplicate"] == 5


def test_rerun_is_answered_by_the_cache(tmp_path):
    config = GenerateConfig(n=5, seed=1)
    with FakeLLM() as fake:
        with LLMClient(fake.url, "gen", cache_dir=tmp_path) as client:
            first = generate_queries(_sample_tools(), client, config, progress=False)
        calls = fake.calls
        with LLMClient(fake.url, "gen", cache_dir=tmp_path, concurrency=2) as client:
            second = generate_queries(_sample_tools(), client, config, progress=False)
        assert fake.calls == calls and second.report.llm["cache_hits"] == second.report.llm["calls"]
    assert [(q.text, q.labels) for q in first.queries] == [(q.text, q.labels) for q in second.queries]


def test_config_checks():
    with pytest.raises(ValueError, match="sample_size"):
        GenerateConfig(n=1, sample_size=2, min_tools=2)
    with pytest.raises(ValueError, match="min_tools"):
        GenerateConfig(n=1, min_tools=4, max_tools=3)
    with FakeLLM() as fake, LLMClient(fake.url, "g") as client:
        with pytest.raises(ValueError, match="lower --sample-size"):
            generate_queries(_sample_tools()[:5], client, GenerateConfig(n=1), progress=False)


def _sample_tools():
    from toolscout.ingest import load_tools

    return load_tools(SAMPLE)


def parse(argv):
    parser = argparse.ArgumentParser()
    add_generate_parsers(parser.add_subparsers(dest="command"))
    return parser.parse_args(["generate", *map(str, argv)])


def test_cli_writes_a_benchmark_folder_that_evaluates(tmp_path, capsys):
    out = tmp_path / "gen"
    with FakeLLM() as fake:
        assert cmd_generate(parse([SAMPLE, "--n", "30", "--out", out, "--base-url", fake.url, "--model", "gen",
                                   "--cache-dir", tmp_path / "cache", "--quiet", "--test-fraction", "0.2"])) == 0
    bench = load_benchmark(out)
    assert len(bench.queries) == 30 and len(bench.tools) == 60
    assert {q.split for q in bench.queries} == {"train", "test"}
    report = json.loads((out / "generate_report.json").read_text())
    assert report["accepted"] == 30 and report["config"]["sample_size"] == 10
    drafts = [json.loads(line) for line in (out / "generation.jsonl").read_text().splitlines()]
    assert [d["id"] for d in drafts] == [q.id for q in bench.queries]
    assert "attempts:" in capsys.readouterr().err

    from toolscout.eval import evaluate
    from toolscout.pipeline import ToolScout

    report = evaluate([out], lambda tools: ToolScout.from_tools(tools, retriever="bm25"), progress=False)
    assert report.sets["gen"].n_queries == sum(q.split == "test" for q in bench.queries)
    with pytest.raises(ValueError, match="give a folder"):
        cmd_generate(parse([SAMPLE, "--n", "1", "--out", tmp_path / "x.jsonl", "--model", "m"]))
