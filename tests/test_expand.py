"""Document expansion: rule checks, judge, strong-model regeneration, resume, usage expansion, views, CLI."""

import argparse
import json
from pathlib import Path

import pytest
from fakellm import FakeLLM, Reply, all_of, mentions, model_is

from toolscout.benchmark_sets import Query, load_benchmark
from toolscout.cli.expand import add_parsers as add_expand_parsers
from toolscout.cli.expand import cmd_expand, journal_path
from toolscout.cli.options import view_from_args
from toolscout.expand import (
    ExpandConfig,
    ProfileRules,
    check_profile,
    expand_tools,
    expand_usage,
    parse_profile,
    tool_document,
)
from toolscout.expand.pipeline import Journal, expand_tool, parse_verdict
from toolscout.expand.profile import ProfileParseError, problem_kind
from toolscout.expand.usage import UsageReport
from toolscout.expand.views import ablation_views, parse_profile_fields
from toolscout.llm import LLMClient
from toolscout.tool import TextView, Tool, tool_text

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"
GOOD = {"function": "Get the weather forecast for a city", "tags": ["weather", "forecast", "city"]}


# ------------------------------------------------------------------------------------------ rules

@pytest.mark.parametrize("profile, expected", [
    ({"tags": ["a", "b", "c"]}, ["function: missing"]),
    ({"function": "x"}, ["tags: missing"]),
    ({**GOOD, "function": " ".join(["word"] * 20)}, ["function: too long"]),
    ({**GOOD, "tags": ["weather", "forecast"]}, ["tags: wrong count"]),
    ({**GOOD, "tags": ["a", "b", "c", "d", "e", "f"]}, ["tags: wrong count"]),
    ({**GOOD, "tags": ["Weather", "forecast", "city"]}, ["tags: not lowercase"]),
    ({**GOOD, "tags": ["weather", "weather", "city"]}, ["tags: duplicates"]),
    ({**GOOD, "tags": "weather, forecast"}, ["tags: not a list of strings"]),
    ({**GOOD, "tags": ["weather", "forecast", "one two three four five"]}, ["tags: tag too long"]),
    ({**GOOD, "when_to_use": " ".join(["w"] * 31)}, ["when_to_use: too long"]),
    ({**GOOD, "limitations": {"max": 3}}, ["limitations: not a string"]),
    ({**GOOD, "example_usage": [{"query": "a"}, {"query": "b"}, {"query": "c"}]}, ["example_usage: too many"]),
    ({**GOOD, "example_usage": [{"note": "x"}]}, ["example_usage: malformed"]),
])
def test_rule_checks_catch_each_violation(profile, expected):
    assert [problem_kind(p) for p in check_profile(profile)] == expected


def test_a_good_profile_passes_and_limits_are_configurable():
    full = {**GOOD, "when_to_use": "Planning a trip", "limitations": "Cities only",
            "example_usage": [{"query": "rain in Oslo?", "api_call": "get_forecast(city='Oslo')"}]}
    assert check_profile(full) == []
    assert check_profile({**GOOD, "function": "one two three four five"}, ProfileRules(max_function_words=4))


def test_parse_profile_reads_wrappers_aliases_and_drops_empty_optionals():
    text = ('```json\n{"tool_profile": {"function_description": "Look up  stock prices", "tags": ["stocks"], '
            '"limitation": "US markets only", "when_to_use": "N/A", "example_usage": [], "vendor": "x"}}\n```')
    assert parse_profile(text) == {"function": "Look up stock prices", "tags": ["stocks"],
                                   "limitations": "US markets only"}
    assert parse_profile('{"function": "f", "tags": ["a"]}') == {"function": "f", "tags": ["a"]}
    with pytest.raises(ProfileParseError, match="invalid JSON"):
        parse_profile("Sure, here is the profile: function = weather")
    with pytest.raises(ProfileParseError, match="not an object"):
        parse_profile('["function"]')


def test_parse_verdict_forms():
    assert parse_verdict('{"faithful": false, "reason": "invents a rate limit"}').faithful is False
    assert parse_verdict('{"faithful": "yes"}').faithful is True
    assert parse_verdict("true").faithful is True
    assert parse_verdict("No. The tags mention finance.").faithful is False
    assert parse_verdict("I am not sure").faithful is None


def test_tool_document_uses_the_source_object_without_old_profiles():
    tool = Tool("t", "get_x", "Gets x.", raw={"description": "Gets x.", "profile": {"function": "old"}, "usage": ["u"]})
    assert json.loads(tool_document(tool)) == {"name": "get_x", "description": "Gets x."}
    plain = Tool("p", "send_mail", "Send mail.", parameters={"type": "object", "properties": {"to": {"type": "string"}}})
    assert json.loads(tool_document(plain))["parameters"]["properties"] == {"to": {"type": "string"}}
    assert tool_document(Tool("l", "long", "x" * 9000), max_chars=500).endswith("...(truncated)")


# ------------------------------------------------------------------------------------------ pipeline

TOOLS = [
    Tool("weather", "get_forecast", "Get the weather forecast for a city for the next days."),
    Tool("stocks", "get_quote", "Latest share price of a company by its ticker symbol."),
    Tool("mail", "send_email", "Send an email message to one or more recipients."),
    Tool("files", "read_file", "Read the contents of a text file from disk."),
]


def profile_reply(function, tags):
    return Reply(json.dumps({"tool_profile": {"function": function, "tags": tags}}))


def doc_of(name):
    """A predicate for the expansion request of tool `name` (not its judge request)."""
    return all_of(mentions(f'"name": "{name}"', "tool_profile"), lambda req: "<profile>" not in str(req["messages"]))


def judge_of(name):
    return mentions(f'"name": "{name}"', "<profile>")


def test_judge_unfaithful_regenerated_by_strong_model_and_failures_keep_their_document(tmp_path):
    with FakeLLM() as fake:
        # weather: the judge rejects the small model's profile; the strong model's profile passes
        fake.script(Reply('{"faithful": false, "reason": "mentions air quality, which the doc does not"}'),
                    when=all_of(judge_of("get_forecast"), lambda r: "air quality" in str(r["messages"])))
        fake.script(profile_reply("Forecast and air quality", ["weather", "air", "city"]),
                    when=all_of(doc_of("get_forecast"), model_is("small")))
        # stocks: invalid JSON from the small model, good profile from the strong one
        fake.script(Reply("The tool gets quotes."), when=all_of(doc_of("get_quote"), model_is("small")))
        # mail: both models break rules (upper-case tags, then too few) → failed, original kept
        fake.script(profile_reply("Send email", ["Email", "Send", "Mail"]), when=all_of(doc_of("send_email"), model_is("small")))
        fake.script(profile_reply("Send email", ["email"]), when=all_of(doc_of("send_email"), model_is("big")))
        with LLMClient(fake.url, "small", backoff=0.0, concurrency=2) as client:
            result = expand_tools(TOOLS, client, ExpandConfig(model="small", strong_model="big"),
                                  journal=tmp_path / "j.jsonl", progress=False)
        requests = list(fake.requests)
    by_id = {t.id: t for t in result.tools}
    statuses = {tid: r["status"] for tid, r in result.outcomes.items()}
    assert statuses == {"weather": "regenerated", "stocks": "regenerated", "mail": "failed", "files": "expanded"}
    assert by_id["weather"].profile["function"] != "Forecast and air quality"  # the strong model's version
    assert by_id["mail"].profile is None and by_id["mail"].description == TOOLS[2].description
    report = result.report
    assert (report.expanded, report.regenerated, report.failed) == (1, 2, 1)
    assert report.judged_unfaithful == 1 and report.rule_failures == 3  # stocks JSON, mail twice
    assert report.problems == {"json: invalid JSON": 1, "tags: not lowercase": 1, "tags: wrong count": 1}
    # the strong model was told why the first draft was rejected
    strong_weather = next(r for r in requests if r["model"] == "big" and doc_of("get_forecast")(r))
    assert "mentions air quality" in strong_weather["messages"][1]["content"]
    # the judge saw the document and the profile; it ran once per rule-passing draft
    assert sum(1 for r in requests if "<profile>" in str(r["messages"])) == 4
    assert requests[0]["messages"][0]["content"] == "Reply with the word OK." and requests[0]["model"] == "big"
    assert report.llm["calls"] == len(requests) == 12  # "big" checked before the run, then 11 calls


def test_llm_failure_keeps_the_original_document(tmp_path):
    with FakeLLM() as fake:
        fake.script(*[Reply(status=500, content="gpu fell over")] * 2, when=doc_of("read_file"))
        with LLMClient(fake.url, "small", max_retries=1, backoff=0.0) as client:
            result = expand_tools(TOOLS, client, ExpandConfig(model="small"), progress=False)
    files = next(t for t in result.tools if t.id == "files")
    assert files.profile is None and result.outcomes["files"]["status"] == "failed"
    assert "HTTP 500" in result.outcomes["files"]["drafts"][0]["error"]
    assert result.report.llm_errors == 1 and result.report.expanded == 3


def test_a_server_that_does_not_answer_is_not_asked_again_by_the_strong_model():
    import socket

    with socket.socket() as sock:  # bound, never listening: connections refused
        sock.bind(("127.0.0.1", 0))
        with LLMClient(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", "small", max_retries=0) as client:
            outcome = expand_tool(TOOLS[0], client, ExpandConfig(model="small", strong_model="big"))
    assert outcome.status == "failed" and [d.model for d in outcome.drafts] == ["small"]
    assert "cannot reach the server" in outcome.drafts[0].error


def test_requests_in_flight_when_a_later_batch_stops_the_run_end_with_it_not_after_their_retries():
    # the server answers the first batch, then hangs: the stop comes when a batch has timed out on every
    # attempt; the request started meanwhile must not go on retrying (its thread would hold the exit)
    import threading
    import time

    answered = []

    def hangs_after_two(request):
        answered.append(1)
        return Reply(json.dumps({"tool_profile": GOOD})) if len(answered) <= 2 else Reply("{}", delay=10.0)

    def llm_threads():
        return [t for t in threading.enumerate() if t.name.startswith("toolscout-llm")]

    tools = [*TOOLS, *(Tool(f"t{i}", f"tool_{i}", f"Does thing {i}.") for i in range(2))]
    with FakeLLM(responder=hangs_after_two) as fake:
        with LLMClient(fake.url, "small", timeout=0.2, max_retries=4, backoff=0.0, concurrency=2) as client:
            report = expand_tools(tools, client, ExpandConfig(model="small", judge=False), progress=False).report
            stopped_at = time.monotonic()
            for thread in llm_threads():
                thread.join(timeout=5)
            assert time.monotonic() - stopped_at < 0.6  # one attempt's timeout at most; not 5 × 0.2 s more
    assert report.stopped.startswith("stopped early") and (report.expanded, report.not_attempted) == (2, 2)


def test_resume_skips_done_tools_with_zero_calls(tmp_path):
    journal = tmp_path / "journal.jsonl"
    config = ExpandConfig(model="small")
    with FakeLLM() as fake, LLMClient(fake.url, "small") as client:  # no cache: only the journal saves work
        partial = expand_tools(TOOLS, client, config, journal=journal, progress=False, limit=2)
        assert partial.report.not_attempted == 2 and fake.calls == 4  # 2 tools × (expand + judge)
        with open(journal, "a") as fh:
            fh.write('{"key": "torn line from a cra')  # a crash mid-write
        finished = expand_tools(TOOLS, client, config, journal=journal, progress=False)
        assert finished.report.resumed == 2 and finished.report.expanded == 2 and fake.calls == 8
        again = expand_tools(TOOLS, client, config, journal=journal, progress=False)
        assert again.report.resumed == 4 and fake.calls == 8  # nothing left to do: no call
    assert [t.profile for t in again.tools] == [t.profile for t in finished.tools]
    assert all(t.profile for t in again.tools)
    # a changed document is a new key: that tool alone is expanded again
    changed = [TOOLS[0].with_changes(description="Get the weather forecast for a city, hourly."), *TOOLS[1:]]
    with FakeLLM() as fake, LLMClient(fake.url, "small") as client:
        result = expand_tools(changed, client, config, journal=journal, progress=False)
        assert result.report.resumed == 3 and fake.calls == 2
    assert len(Journal(journal).load()) == 5


def test_no_judge_and_no_strong_model():
    with FakeLLM() as fake:
        fake.script(profile_reply("Reads files", ["File"]), when=doc_of("read_file"))
        with LLMClient(fake.url, "small") as client:
            result = expand_tools(TOOLS, client, ExpandConfig(model="small", judge=False), progress=False)
        assert fake.calls == 4  # expansion only, no judge, no regeneration
    assert result.report.failed == 1 and result.report.expanded == 3


def test_report_says_how_many_regenerations_were_tried_not_only_how_many_passed():
    with FakeLLM() as fake:  # mail: the small and the strong model both break the rules
        fake.script(profile_reply("Send email", ["Email", "Send", "Mail"]), when=all_of(doc_of("send_email"), model_is("small")))
        fake.script(profile_reply("Send email", ["email"]), when=all_of(doc_of("send_email"), model_is("big")))
        with LLMClient(fake.url, "small") as client:
            report = expand_tools(TOOLS, client, ExpandConfig(model="small", strong_model="big"), progress=False).report
    assert (report.regenerated, report.regeneration_attempts, report.failed) == (0, 1, 1)
    assert "regenerated by the strong model: 0 of 1 tried" in report.format()
    assert report.to_dict()["regeneration_attempts"] == 1
    assert "regenerated by the strong model: 0 (none tried)" in type(report)().format()


# ------------------------------------------------------------------------------------------ views

def test_profile_fields_flag_and_ablation_views():
    assert parse_profile_fields("function, Tags,limitation") == ("function", "tags", "limitations")
    assert parse_profile_fields("none") == () and "example_usage" not in parse_profile_fields("default")
    assert len(parse_profile_fields("all")) == 5
    with pytest.raises(ValueError, match="unknown profile field 'colour'"):
        parse_profile_fields("function,colour")
    add_one = ablation_views("add-one")
    assert list(add_one) == ["original", "+function", "+tags", "+when_to_use", "+limitations", "+example_usage"]
    assert add_one["original"].profile_fields == () and add_one["+tags"].profile_fields == ("tags",)
    one_out = ablation_views("one-out")
    assert one_out["full"].profile_fields == ("function", "tags", "when_to_use", "limitations", "example_usage")
    assert one_out["-example_usage"].profile_fields == ("function", "tags", "when_to_use", "limitations")
    assert view_from_args(argparse.Namespace(profile_fields=None, usage=None)) is None
    view = view_from_args(argparse.Namespace(profile_fields="function,tags", usage=3))
    assert view == TextView(profile_fields=("function", "tags"), usage=3)


def test_views_choose_profile_fields_and_leave_out_example_usage_by_default():
    tool = Tool("w", "get_forecast", "Forecast.", profile={"function": "Predicts weather", "tags": ["rain", "sun", "wind"],
                                                            "example_usage": [{"query": "EXAMPLEQ"}]})
    assert "Predicts weather" in tool_text(tool) and "EXAMPLEQ" not in tool_text(tool)
    assert tool_text(tool, TextView(profile_fields=("tags",))) == "get forecast\nForecast.\nTags: rain, sun, wind"


# ------------------------------------------------------------------------------------------ usage

def test_expand_usage_uses_only_train_queries_most_specific_first():
    queries = [
        Query("1", "check the weather and email it to Bob", ("weather", "mail"), "train"),
        Query("2", "Will it rain in Oslo?", ("weather",), "train"),
        Query("3", "will it rain in oslo", ("weather",), "train"),  # same words as 2
        Query("4", "forecast for Paris", ("weather",), "test"),
        Query("5", "tomorrow's weather in Rome", ("weather",), "validation"),
        Query("6", "ghost", ("nope",), "train"),
    ]
    report = UsageReport()
    out = expand_usage(TOOLS, queries, max_per_tool=5, report=report)
    weather, stocks, mail = out[0], out[1], out[2]
    assert weather.usage == ("Will it rain in Oslo?", "check the weather and email it to Bob")
    assert mail.usage == ("check the weather and email it to Bob",) and stocks.usage == ()
    assert stocks is TOOLS[1]
    assert report.to_dict() == {"tools_with_usage": 2, "queries_used": 3, "train_queries": 4,
                                "ignored_queries": 2, "unknown_labels": 1}
    assert expand_usage(TOOLS, queries, max_per_tool=1)[0].usage == ("Will it rain in Oslo?",)
    text = tool_text(weather, TextView(usage=1))
    assert text.endswith("Example requests: Will it rain in Oslo?") and "Paris" not in text


# ------------------------------------------------------------------------------------------ CLI

def parse(argv):
    parser = argparse.ArgumentParser()
    add_expand_parsers(parser.add_subparsers(dest="command"))
    return parser.parse_args(["expand", *map(str, argv)])


def test_cli_expands_a_benchmark_folder_resumably_and_eval_reads_it(tmp_path, capsys):
    out = tmp_path / "expanded"
    with FakeLLM() as fake:
        argv = [SAMPLE, "--out", out, "--base-url", fake.url, "--model", "small", "--strong-model", "big",
                "--cache-dir", tmp_path / "cache", "--quiet", "--concurrency", "4"]
        assert cmd_expand(parse([*argv, "--limit", "10"])) == 0
        first_calls = fake.calls
        assert first_calls == 21  # 10 tools × (draft + judge), and "big" checked once before the run
        assert cmd_expand(parse(argv)) == 0  # resumes: 50 tools left
        assert fake.calls == first_calls + 100
        assert cmd_expand(parse([*argv, "--fresh"])) == 0  # everything again, all from the cache
        assert fake.calls == first_calls + 100
    err = capsys.readouterr().err
    assert "121 cache hits" in err
    bench = load_benchmark(out)
    original = load_benchmark(SAMPLE)
    assert len(bench.tools) == 60 and all(t.profile and t.profile["function"] for t in bench.tools)
    assert [q.id for q in bench.queries] == [q.id for q in original.queries]
    assert [t.description for t in bench.tools] == [t.description for t in original.tools]
    row = json.loads((out / "tools.jsonl").read_text().splitlines()[0])
    assert row["doc"] == json.loads((SAMPLE / "tools.jsonl").read_text().splitlines()[0])["doc"]
    report = json.loads((out / "expand_report.json").read_text())
    assert report["expand"]["expanded"] == 60 and report["expand"]["llm"]["cache_hits"] == 121
    assert report["expand"]["llm"]["http_requests"] == 0  # the --fresh rerun cost nothing
    assert (out / "expand-journal.jsonl").exists() and journal_path(out) == out / "expand-journal.jsonl"



def test_cli_usage_expansion_without_llm_and_to_a_jsonl_file(tmp_path, capsys):
    out = tmp_path / "usage"
    assert cmd_expand(parse([SAMPLE, "--out", out, "--usage", "2"])) == 0
    rows = [json.loads(line) for line in (out / "tools.jsonl").read_text().splitlines()]
    train = {q.text for q in load_benchmark(SAMPLE).split("train")}
    test = {q.text for q in load_benchmark(SAMPLE).split("test")} - train
    used = [u for r in rows for u in r.get("usage", [])]
    assert used and set(used) <= train and not set(used) & test
    assert max(len(r.get("usage", [])) for r in rows) == 2
    assert (out / "queries.jsonl").read_bytes() == (SAMPLE / "queries.jsonl").read_bytes()
    single = tmp_path / "tools2.jsonl"
    assert cmd_expand(parse([SAMPLE / "tools.jsonl", "--out", single, "--usage", "1"])) == 0
    assert single.exists() and not (tmp_path / "queries.jsonl").exists()
    with pytest.raises(ValueError, match="nothing to do"):
        cmd_expand(parse([SAMPLE, "--out", out]))
    openapi = SAMPLE.parent / "petstore_openapi.yaml"
    with pytest.raises(ValueError, match="no train-split queries"):
        cmd_expand(parse([openapi, "--out", tmp_path / "p", "--usage", "3"]))


def test_cli_expands_an_openapi_catalog_into_benchmark_rows(tmp_path):
    out = tmp_path / "pets.jsonl"
    with FakeLLM() as fake:
        assert cmd_expand(parse([SAMPLE.parent / "petstore_openapi.yaml", "--out", out, "--base-url", fake.url,
                                 "--model", "m", "--no-cache", "--quiet", "--no-judge"])) == 0
    assert (tmp_path / "pets.journal.jsonl").exists()
    from toolscout.ingest import load_tools

    tools = load_tools(out)
    assert len(tools) == 19 and all(t.profile for t in tools)
    assert any(t.name == "deletePet" for t in tools)


def test_ablation_runner_compares_views(tmp_path, capsys):
    from toolscout.expand.ablation import main

    out = tmp_path / "expanded"
    with FakeLLM() as fake:
        cmd_expand(parse([SAMPLE, "--out", out, "--base-url", fake.url, "--model", "m", "--no-cache", "--quiet"]))
    assert main([str(out), "--protocol", "add-one", "--quiet", "--json", str(tmp_path / "a.json")]) == 0
    table = capsys.readouterr().out
    assert "+when_to_use" in table and "Δ mean" in table
    data = json.loads((tmp_path / "a.json").read_text())["bm25"]
    assert data["original"]["view"]["profile_fields"] == []
    assert set(data) == {"original", "+function", "+tags", "+when_to_use", "+limitations", "+example_usage"}


def test_error_kinds_leave_out_volatile_parts_but_keep_the_status_and_one_example():
    from toolscout.expand.runs import ErrorTally

    tally = ErrorTally()
    url = "http://127.0.0.1:18970/v1/chat/completions"
    for stamp in (1732881000, 1732881007):
        tally.add(f'POST {url}: reply has no choices: {{"id": "req-{stamp}", "created": {stamp}}}')
    tally.add(f"POST {url} → HTTP 500: busy")
    tally.add(f"POST {url} → HTTP 503: busy\nsecond line")
    first = f'POST {url}: reply has no choices: {{"id": "req-1732881000", "created": 1732881000}}'
    assert tally.to_dict() == {first: 2, f"POST {url} → HTTP 500: busy": 1, f"POST {url} → HTTP 503: busy": 1}
