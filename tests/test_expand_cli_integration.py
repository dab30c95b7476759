"""`toolscout expand | generate` and the view flags of `toolscout eval`, through the real CLI entry point."""

import json
from pathlib import Path

from fakellm import FakeLLM, mentions

from toolscout.cli import main
from toolscout.expand.ablation import compare_views, load_sets
from toolscout.tool import TextView

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"


def test_usage_expansion_then_eval_with_view_flags(tmp_path):
    out = tmp_path / "sample_u3"
    assert main(["expand", str(SAMPLE), "--out", str(out), "--usage", "3"]) == 0
    report = tmp_path / "eval.json"
    assert main(["eval", str(out), "--retriever", "bm25", "--usage", "3", "--profile-fields", "none", "--quiet",
                 "--json", str(report)]) == 0
    via_cli = json.loads(report.read_text())["sets"]["sample_u3"]["ndcg@10"]
    view = TextView(usage=3, profile_fields=())
    via_api = compare_views(load_sets([out]), "bm25", {"u3": view}, progress=False)["u3"]
    assert via_cli == via_api.sets["sample_u3"].metrics["ndcg@10"]


def test_expand_and_generate_commands(tmp_path, capsys):
    with FakeLLM() as fake:
        llm = ["--base-url", fake.url, "--model", "m", "--no-cache", "--quiet"]
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x"), *llm]) == 0
        assert main(["generate", str(tmp_path / "x"), "--n", "5", "--out", str(tmp_path / "g"), *llm]) == 0
        assert main(["generate", str(SAMPLE), "--n", "5", "--out", str(tmp_path / "g.jsonl"), *llm]) == 1
    assert "give a folder" in capsys.readouterr().err
    assert len((tmp_path / "g" / "queries.jsonl").read_text().splitlines()) == 5


def test_an_llm_that_is_not_there_fails_naming_it_and_an_out_of_other_origin_is_never_overwritten(tmp_path, capsys):
    import shutil
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    llm = ["--base-url", url, "--model", "m", "--no-cache", "--quiet", "--max-retries", "0"]
    assert main(["generate", str(SAMPLE), "--n", "3", "--out", str(tmp_path / "g"), *llm]) == 1
    assert f"POST {url}/chat/completions: cannot reach the server" in capsys.readouterr().err
    assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x"), "--limit", "2", *llm]) == 1
    assert "every one of 2 requests to the LLM failed" in capsys.readouterr().err
    labelled = tmp_path / "labelled"  # a benchmark folder with its own hand-labelled queries
    shutil.copytree(SAMPLE, labelled)
    before = {p.name: p.read_bytes() for p in labelled.iterdir()}
    with FakeLLM() as fake:
        working = ["--base-url", fake.url, "--model", "m", "--no-cache", "--quiet"]
        assert main(["expand", str(SAMPLE), "--out", str(labelled), *working]) == 1
        assert main(["generate", str(SAMPLE), "--n", "3", "--out", str(labelled), *working]) == 1
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x"), "--limit", "2", *working]) == 0  # its own: resumed
    assert "holds files `toolscout expand` did not write" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in labelled.iterdir()} == before
    for _ in range(2):  # its own outputs are written again: a file named as the output, a folder it wrote
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "u.jsonl"), "--usage", "2"]) == 0
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "u"), "--usage", "2",
                     "--report", str(tmp_path / "u-report.json")]) == 0


def _refusing_url():
    """A port nothing listens on (bound, never listening): every connection is refused at once."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def test_expand_against_a_dead_server_shows_progress_and_stops_after_its_first_batch(tmp_path, capsys):
    sock, url = _refusing_url()
    with sock:
        llm = ["--base-url", url, "--model", "m", "--no-cache", "--max-retries", "0", "--concurrency", "2"]
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x"), *llm]) == 1
    err = capsys.readouterr().err
    # a line from the start (stderr is no terminal here), naming what the run waits on
    assert f"expanding: 0 of 60 tools done; LLM {url}/chat/completions: 0 requests sent" in err
    assert (f"error: stopped early: all 2 requests of the first batch to the LLM at {url}/chat/completions failed "
            f"to connect or timed out; the last: POST {url}/chat/completions: cannot reach the server") in err
    assert "(0 already done, 58 not attempted)" in err  # not 60 tools' worth of failed requests


def test_expand_against_a_server_that_never_answers_stops_after_a_batch(tmp_path, capsys):
    from fakellm import Reply

    with FakeLLM(responder=lambda request: Reply("{}", delay=5.0)) as fake:
        llm = ["--base-url", fake.url, "--model", "m", "--no-cache", "--quiet", "--max-retries", "0",
               "--concurrency", "2", "--timeout", "0.3"]
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x"), *llm]) == 1
        models = [r["model"] for r in fake.requests]
    assert "failed to connect or timed out; the last: POST" in capsys.readouterr().err
    assert len(models) == 2  # the first batch, run alone: not 60 tools' worth, and none left in flight


def test_generate_stops_when_the_server_goes_away_and_keeps_what_it_accepted(tmp_path, capsys):
    from fakellm import Reply, heuristic_reply

    answered = []

    def goes_away_after_two(request):
        answered.append(1)
        return heuristic_reply(request) if len(answered) <= 2 else Reply("{}", delay=5.0)

    with FakeLLM(responder=goes_away_after_two) as fake:
        llm = ["--base-url", fake.url, "--model", "m", "--no-cache", "--quiet", "--no-polish", "--max-retries", "0",
               "--concurrency", "2", "--timeout", "0.3"]
        assert main(["generate", str(SAMPLE), "--n", "4", "--out", str(tmp_path / "g"), *llm]) == 1
        requests = fake.calls
    err = capsys.readouterr().err
    assert "error: stopped early: all 2 requests of a batch to the LLM at" in err
    assert requests == 6  # a first batch of 4 (2 answered), then one of 2: not the 22 attempts --max-attempts allows
    assert len((tmp_path / "g" / "queries.jsonl").read_text().splitlines()) == 2
    assert json.loads((tmp_path / "g" / "generate_report.json").read_text())["stopped"].startswith("stopped early")


def test_replies_that_are_never_the_json_asked_for_fail_quoting_one_and_write_nothing(tmp_path, capsys):
    from fakellm import Reply, heuristic_reply

    def broken(request):  # the right content, cut short: never parseable
        return Reply(heuristic_reply(request).content[:-5] + " oops")

    with FakeLLM(responder=broken) as fake:
        llm = ["--base-url", fake.url, "--model", "m", "--no-cache", "--quiet"]
        assert main(["generate", str(SAMPLE), "--n", "3", "--out", str(tmp_path / "g"), *llm]) == 1
        err = capsys.readouterr().err
        assert "the server's replies were not the JSON asked for" in err and "one reply began: '{" in err
        assert "--max-attempts" not in err  # more attempts cannot help
        assert not (tmp_path / "g" / "queries.jsonl").exists()
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x"), "--limit", "2", *llm]) == 1
        err = capsys.readouterr().err
        assert "none of 2 drafts could be read" in err and "one reply began: '{\"tool_profile\"" in err
        assert not (tmp_path / "x" / "tools.jsonl").exists()


def test_replies_with_no_content_are_unreadable_replies_and_fail_the_run(tmp_path, capsys):
    from fakellm import Reply

    for reply in (Reply(null_content=True, finish_reason="length"), Reply("", finish_reason="content_filter")):
        with FakeLLM(responder=lambda request, reply=reply: reply) as fake:
            llm = ["--base-url", fake.url, "--model", "m", "--no-cache", "--quiet"]
            out = tmp_path / reply.finish_reason
            assert main(["expand", str(SAMPLE), "--out", str(out / "x"), "--limit", "2", *llm]) == 1
            err = capsys.readouterr().err
            # an empty reply the token limit cut off says so (the LLM client's rule); any other is unreadable
            said = ('the reply was cut off at the token limit (finish_reason "length") before its JSON was complete'
                    if reply.finish_reason == "length" else
                    f"none of 2 drafts could be read; the reply had no content; finish_reason={reply.finish_reason}; "
                    "check that --model")
            assert said in err, err
            assert not (out / "x" / "tools.jsonl").exists()
            assert main(["generate", str(SAMPLE), "--n", "2", "--out", str(out / "g"), *llm]) == 1
            err = capsys.readouterr().err
            said = ('cut off at the token limit (finish_reason "length")' if reply.finish_reason == "length" else
                    f"gave a query; the reply had no content; finish_reason={reply.finish_reason}; check")
            assert said in err, err


def test_some_unparseable_replies_are_counted_and_the_run_succeeds(tmp_path, capsys):
    from fakellm import Reply, heuristic_reply, message_text

    seen = []

    def every_other_broken(request):  # generation replies alternate: unparseable, good
        reply = heuristic_reply(request)
        if "The assistant can call these" not in message_text(request):
            return reply
        seen.append(1)
        return Reply("not json at all") if len(seen) % 2 else reply

    with FakeLLM(responder=every_other_broken) as fake:
        llm = ["--base-url", fake.url, "--model", "m", "--no-cache", "--quiet", "--concurrency", "1"]
        assert main(["generate", str(SAMPLE), "--n", "3", "--out", str(tmp_path / "g"), *llm]) == 0
    report = json.loads((tmp_path / "g" / "generate_report.json").read_text())
    assert report["accepted"] == 3 and report["rejected"]["invalid_json"] >= 3
    assert report["invalid_reply"] == "not json at all"


def _failing_first(n, words, status=503, text="model is overloaded"):
    """A fake whose first `n` requests mentioning `words` fail with HTTP `status`; the rest are answered."""
    from fakellm import Reply, mentions

    fake = FakeLLM()
    fake.script(*[Reply(status=status, content=text)] * n, when=mentions(*words))
    return fake


def test_expand_reports_which_llm_errors_and_fails_when_most_drafts_failed(tmp_path, capsys):
    drafts = ("tool_profile", "<document>")  # the expansion requests (judge requests hold <profile> too)
    llm = ["--model", "m", "--no-cache", "--quiet", "--max-retries", "0", "--concurrency", "1", "--limit", "4"]
    with _failing_first(1, drafts) as fake:  # 1 of 4 tools: a partial success
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "few"), "--base-url", fake.url, *llm]) == 0
    err = capsys.readouterr().err
    assert "×1  POST " in err and "HTTP 503: {\"error\": {\"message\": \"model is overloaded\"}}" in err
    kinds = json.loads((tmp_path / "few" / "expand_report.json").read_text())["expand"]["llm_error_kinds"]
    assert list(kinds.values()) == [1] and "HTTP 503" in next(iter(kinds)) and "model is overloaded" in next(iter(kinds))
    with _failing_first(3, drafts, status=500, text="gpu fell over") as fake:  # 3 of 4: most failed
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "most"), "--base-url", fake.url, *llm]) == 1
    err = capsys.readouterr().err
    assert "3 of 4 drafts failed with LLM errors" in err and "gpu fell over" in err
    report = json.loads((tmp_path / "most" / "expand_report.json").read_text())["expand"]  # written all the same
    assert report["expanded"] == 1 and list(report["llm_error_kinds"].values()) == [3]
    assert len((tmp_path / "most" / "tools.jsonl").read_text().splitlines()) == 60


def test_errors_that_differ_only_in_volatile_parts_are_one_kind_and_the_report_named_exists(tmp_path, capsys):
    from fakellm import Reply

    created = iter(range(1732881000, 1732882000))

    def no_choices(request):  # each body unique only in its timestamp and id
        stamp = next(created)
        return Reply(body=json.dumps({"id": f"chatcmpl-{stamp:x}", "created": stamp, "choices": []}))

    report = tmp_path / "run.json"
    with FakeLLM(responder=no_choices) as fake:
        llm = ["--base-url", fake.url, "--model", "m", "--no-cache", "--max-retries", "0", "--quiet", "--limit", "4"]
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x.jsonl"), "--report", str(report), *llm]) == 1
    err = capsys.readouterr().err
    assert f"×4  POST {fake.url}/chat/completions: reply has no choices: {{\"id\": \"chatcmpl-" in err
    assert "more kinds" not in err
    kinds = json.loads(report.read_text())["expand"]["llm_error_kinds"]  # written although the run failed
    assert list(kinds.values()) == [4] and '"created": 173288100' in next(iter(kinds))  # one of them, as an example
    assert not (tmp_path / "x.jsonl").exists()


def test_more_error_kinds_than_shown_point_to_a_report_that_exists(tmp_path, capsys):
    from fakellm import Reply

    drafts = ("tool_profile", "<document>")
    fake = FakeLLM()
    fake.script(*[Reply(status=500, content=f"shard {name} is down") for name in "abcdef"], when=mentions(*drafts))
    llm = ["--model", "m", "--no-cache", "--quiet", "--max-retries", "0", "--concurrency", "1", "--limit", "8",
           "--no-judge"]
    with fake:
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x"), "--base-url", fake.url, *llm]) == 1
    err = capsys.readouterr().err
    assert "6 of 8 drafts failed" in err
    assert f"... and 1 more kinds (see {tmp_path / 'x' / 'expand_report.json'})" in err
    kinds = json.loads((tmp_path / "x" / "expand_report.json").read_text())["expand"]["llm_error_kinds"]
    assert len(kinds) == 6


def test_generate_reports_which_llm_errors_and_fails_when_most_attempts_failed(tmp_path, capsys):
    picks = ("The assistant can call these",)
    llm = ["--model", "m", "--no-cache", "--quiet", "--max-retries", "0", "--no-polish", "--n", "4"]
    with _failing_first(1, picks) as fake:
        assert main(["generate", str(SAMPLE), "--out", str(tmp_path / "few"), "--base-url", fake.url, *llm]) == 0
    err = capsys.readouterr().err
    assert "×1  POST " in err and "model is overloaded" in err
    report = json.loads((tmp_path / "few" / "generate_report.json").read_text())
    assert list(report["llm_error_kinds"].values()) == [1] and "HTTP 503" in next(iter(report["llm_error_kinds"]))
    from fakellm import Reply, heuristic_reply

    answered = []

    def fails_after_three(request):  # the first batch of 4 gets 3 answers; every later request fails
        answered.append(1)
        return heuristic_reply(request) if 1 < len(answered) <= 4 else Reply(status=500, content="gpu fell over")

    with FakeLLM(responder=fails_after_three) as fake:
        assert main(["generate", str(SAMPLE), "--out", str(tmp_path / "most"), "--base-url", fake.url, *llm,
                     "--concurrency", "1", "--max-attempts", "10"]) == 1
    assert "7 of 10 attempts failed with LLM errors (most often, ×7: POST" in capsys.readouterr().err
    assert len((tmp_path / "most" / "queries.jsonl").read_text().splitlines()) == 3  # written all the same


def test_generate_names_failed_polish_calls_as_failures_and_counts_every_call(tmp_path, capsys):
    from fakellm import Reply

    fake = FakeLLM()
    fake.script(*[Reply(status=500, content="polisher crashed")] * 2, when=mentions("<request>"))
    llm = ["--model", "m", "--no-cache", "--quiet", "--max-retries", "0", "--concurrency", "1", "--n", "4"]
    with fake:
        assert main(["generate", str(SAMPLE), "--out", str(tmp_path / "g"), "--base-url", fake.url, *llm]) == 0
        requests = fake.calls
    err = capsys.readouterr().err
    assert "0 unusable polish replies, 2 polish calls failed (each kept its draft)" in err
    body = '{"error": {"message": "polisher crashed"'
    assert f"  ×2  POST {fake.url}/chat/completions → HTTP 500: {body}" in err
    assert f"LLM: {requests} calls (2 failed), 0 cache hits, {requests} HTTP requests (0 retries)" in err
    report = json.loads((tmp_path / "g" / "generate_report.json").read_text())
    assert (report["polish_unusable"], report["polish_errors"], report["llm"]["calls"]) == (0, 2, requests)


def test_every_model_a_run_may_use_is_checked_before_its_first_request(tmp_path, capsys):
    from fakellm import Reply, model_is

    base = ["--model", "m", "--no-cache", "--quiet", "--max-retries", "0"]
    for command, flag in ((["expand", "--limit", "2"], "--strong-model"), (["expand", "--limit", "2"], "--judge-model"),
                          (["generate", "--n", "2"], "--polish-model")):
        fake = FakeLLM()
        fake.script(Reply(status=404, content="model 'nope' does not exist"), when=model_is("nope"))
        with fake:
            out = tmp_path / flag.strip("-")
            assert main([command[0], str(SAMPLE), "--out", str(out), *command[1:], "--base-url", fake.url, *base,
                         flag, "nope"]) == 1
            models = [r["model"] for r in fake.requests]
        err = capsys.readouterr().err
        assert f"error: {flag} nope: the model could not be used: POST {fake.url}/chat/completions → HTTP 404" in err
        assert models == ["nope", "m"]  # asked first; then the working model, to tell whose failure it is
        assert not out.exists()
    # no model answers usably: the check passes (it was answered), the run's first batch fails as itself
    with FakeLLM(responder=lambda request: Reply(body='{"choices": []}')) as fake:
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x"), "--base-url", fake.url, *base,
                     "--strong-model", "big"]) == 1
    err = capsys.readouterr().err
    assert f"the last: POST {fake.url}/chat/completions: reply has no choices" in err
    assert "could not be used" not in err


def test_the_model_check_sends_the_runs_own_parameters_so_a_reasoning_model_passes_it(tmp_path, capsys):
    # OpenAI's reasoning models reject max_tokens; the run sends it only when --max-tokens is given, and so
    # does the check: it must not fail a run that would work. Any reply passes it, an empty one too.
    base = ["--base-url", "", "--model", "m", "--no-cache", "--quiet", "--max-retries", "0", "--limit", "2",
            "--strong-model", "o3-mini"]
    with FakeLLM(reject_max_tokens=True) as fake:
        base[1] = fake.url
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x"), *base]) == 0
        checked = [r for r in fake.requests if r["model"] == "o3-mini"]
    assert len(checked) == 1 and "max_tokens" not in checked[0]
    with FakeLLM() as fake:
        base[1] = fake.url
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "y"), *base, "--max-tokens", "700"]) == 0
        checked = [r for r in fake.requests if r["model"] == "o3-mini"]
    assert [r.get("max_tokens") for r in checked] == [700]  # the run's own limit, not a 1-token probe
    capsys.readouterr()


def test_llm_settings_are_checked_before_anything_is_printed_or_sent(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TS_TEST_UNSET_KEY", raising=False)
    with FakeLLM() as fake:
        config = tmp_path / "llm.yaml"
        config.write_text(f'base_url: {fake.url}\nmodel: m\ntimeout: "abc"\n')
        base = ["expand", str(SAMPLE), "--out", str(tmp_path / "x"), "--no-cache", "--quiet", "--limit", "1"]
        cases = [(["--llm-config", str(config)], f"{config}: timeout: must be a number of seconds above 0, got 'abc'"),
                 (["--base-url", fake.url, "--model", "m", "--timeout", "-5"], "--timeout: must be a number"),
                 (["--base-url", fake.url, "--model", "m", "--api-key-env", "TS_TEST_UNSET_KEY"],
                  "--api-key-env TS_TEST_UNSET_KEY: the environment variable TS_TEST_UNSET_KEY is not set"),
                 (["--model", "m"], "no LLM base URL given: --base-url, or base_url in an --llm-config file")]
        for flags, message in cases:
            assert main([*base, *flags]) == 1
            err = capsys.readouterr().err
            assert f"toolscout expand: error: {message}" in err and "expanding with" not in err
        assert fake.calls == 0
