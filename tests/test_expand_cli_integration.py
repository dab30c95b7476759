"""`toolscout expand | generate` and the view flags of `toolscout eval`, through the real CLI entry point."""

import json
from pathlib import Path

from fakellm import FakeLLM

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
