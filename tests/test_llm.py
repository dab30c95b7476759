"""The LLM client against a real HTTP server on loopback (tests/fakellm.py)."""

import json
import math
import threading
import time

import pytest
from fakellm import FakeLLM, Reply, mentions

from toolscout.llm import (
    ChatResult,
    LLMCancelledError,
    LLMClient,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMReplyError,
    LLMSettingError,
    LLMSettings,
    LLMTimeoutError,
    TokenLogprob,
    chat_url,
    choice_probability,
    parse_json_reply,
    parse_retry_after,
)

MSG = [{"role": "user", "content": "say hi to the test"}]


class Waits(list):
    """Records the client's backoff sleeps instead of sleeping."""

    def __call__(self, seconds):
        self.append(round(seconds, 6))


@pytest.fixture
def fake():
    with FakeLLM(responder=lambda req: Reply('{"ok": true}')) as server:
        yield server


def client_for(fake, **kw):
    kw.setdefault("jitter", 0.0)
    kw.setdefault("backoff", 0.01)
    kw.setdefault("timeout", 5.0)
    return LLMClient(fake.url, "small", **kw)


def test_chat_returns_text_usage_and_sends_key_and_model(fake):
    with client_for(fake, api_key="sk-test") as client:
        result = client.chat(MSG, max_tokens=20)
    assert result.text == '{"ok": true}' and result.json() == {"ok": True} and not result.cached
    # the fake counts words: 5 in the prompt, 2 in the reply
    assert (result.prompt_tokens, result.completion_tokens) == (5, 2)
    request = fake.requests[0]
    assert request["model"] == "small" and request["max_tokens"] == 20 and request["temperature"] == 0.0
    assert request["_headers"]["authorization"] == "Bearer sk-test"
    stats = client.stats.to_dict()
    assert (stats["calls"], stats["http_requests"], stats["prompt_tokens"], stats["completion_tokens"]) == (1, 1, 5, 2)


def test_retries_5xx_with_exponential_backoff(fake):
    fake.script(Reply(status=500, content="boom"), Reply(status=502), Reply(status=503))
    waits = Waits()
    with client_for(fake, max_retries=3, sleep=waits) as client:
        result = client.chat(MSG)
    assert result.text == '{"ok": true}'
    assert waits == [0.01, 0.02, 0.04]  # backoff * 2**attempt
    stats = client.stats.to_dict()
    assert stats["http_requests"] == 4 and stats["retries"] == 3 and stats["errors"] == 0


def test_429_honours_retry_after_over_backoff(fake):
    fake.script(Reply(status=429, headers={"Retry-After": "0.25"}), Reply(status=429, headers={"Retry-After": "2"}))
    waits = Waits()
    with client_for(fake, max_retries=2, sleep=waits, max_backoff=1.5) as client:
        client.chat(MSG)
    assert waits == [0.25, 1.5]  # the header's value, capped at max_backoff


def test_a_long_retry_after_is_capped_by_max_backoff_and_said(fake, caplog):
    """Retry-After: 3600 was waited out up to 300 s per attempt, silently; now max_backoff caps it (60 s by
    default, a setting of the config file) and each wait over a second is logged."""
    fake.script(Reply(status=429, headers={"Retry-After": "3600"}), Reply(status=503, headers={"Retry-After": "0.5"}))
    waits = Waits()
    with caplog.at_level("WARNING", logger="toolscout.llm"), \
            LLMSettings(base_url=fake.url, model="m", backoff=0.01).client(sleep=waits) as client:
        assert client.chat(MSG).text == '{"ok": true}'
    assert waits == [60.0, 0.5]
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"LLM: HTTP 429 (Retry-After 3600 s, capped at max_backoff 60 s) from {fake.url}/chat/completions; "
                    "waiting 60 s before attempt 2 of 5"]  # the 0.5 s wait is not worth a line


def test_a_wait_past_the_deadline_ends_the_call_at_once(fake):
    fake.script(Reply(status=429, headers={"Retry-After": "20"}, content="slow down"))
    waits = Waits()
    with client_for(fake, max_retries=4, sleep=waits, max_backoff=60.0) as client:
        start = time.monotonic()
        with pytest.raises(LLMHTTPError, match=r"HTTP 429: .*slow down.*waiting 20 s \(Retry-After 20 s\) would pass "
                                               r"the deadline"):
            client.chat(MSG, deadline=time.monotonic() + 2.0)
    assert waits == [] and time.monotonic() - start < 1.0 and fake.calls == 1


def test_retry_after_really_waits():
    with FakeLLM(responder=lambda req: Reply("fine")) as fake:
        fake.script(Reply(status=429, headers={"Retry-After": "0.2"}))
        start = time.perf_counter()
        with LLMClient(fake.url, "m", backoff=0.0, jitter=0.0) as client:
            assert client.chat(MSG).text == "fine"
        assert time.perf_counter() - start >= 0.2


def test_parse_retry_after_seconds_and_http_date():
    assert parse_retry_after("3") == 3.0 and parse_retry_after("0.5") == 0.5 and parse_retry_after(None) is None
    future = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 27 <= parse_retry_after(future) <= 30
    assert parse_retry_after("soon") is None


def test_gives_up_with_url_status_and_body(fake):
    fake.script(*[Reply(status=503, content="model is overloaded, try later")] * 3)
    with client_for(fake, max_retries=2, sleep=Waits()) as client:
        with pytest.raises(LLMHTTPError) as info:
            client.chat(MSG)
    message = str(info.value)
    assert fake.url + "/chat/completions" in message and "HTTP 503" in message
    assert "model is overloaded" in message and "after 3 attempts" in message
    assert info.value.status == 503 and client.stats.to_dict()["errors"] == 1


def test_failed_calls_are_counted_as_calls_and_errors(fake):
    fake.script(Reply(status=500, content="boom"), Reply(body='{"choices": []}'))
    with client_for(fake, max_retries=0, sleep=Waits()) as client:
        for _ in range(2):
            with pytest.raises(LLMError):
                client.chat(MSG)
        client.chat(MSG)
    stats = client.stats.to_dict()
    assert (stats["calls"], stats["errors"], stats["http_requests"]) == (3, 2, 3)


def cut_off(text):
    """A 200 reply the token limit cut off (finish_reason "length")."""
    return Reply(body=json.dumps({"id": "x", "model": "m", "choices": [
        {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": text}}]}))


def test_a_json_reply_cut_off_at_the_token_limit_says_so_and_names_the_setting(fake, tmp_path):
    fake.script(cut_off('{"tool_profile": {"function": "Gets the wea'), cut_off('{"a": 1} and then some more wor'))
    with client_for(fake, cache_dir=tmp_path / "cache") as client:
        said = (r'cut off at the token limit \(finish_reason "length"\) before its JSON was complete; raise '
                r"--max-tokens \(now 12\) or the server's limit; it began: '\{\"tool_profile\"")
        with pytest.raises(LLMReplyError, match=said) as info:
            client.chat(MSG, json_mode=True, max_tokens=12)
        assert fake.url in str(info.value) and client.stats.to_dict()["errors"] == 1
        # the same call again reaches the server (the cut-off reply was not cached); whole JSON is still usable
        assert client.chat(MSG, json_mode=True, max_tokens=12).json() == {"a": 1} and fake.calls == 2


def test_a_body_that_is_not_utf8_is_named_so_not_as_not_json(fake):
    body = '{"choices": [{"message": {"content": "caf'.encode() + b"\xe9" + '"}}]}'.encode()
    fake.script(Reply(body=body))
    with client_for(fake) as client, pytest.raises(LLMReplyError) as info:
        client.chat(MSG)
    message = str(info.value)
    assert "HTTP 200 but the body is not UTF-8 text (byte 0xe9 at offset 41 is invalid)" in message
    assert "not JSON" not in message and '"content": "caf\ufffd' in message


def test_client_errors_are_not_retried_and_say_what_to_check(fake):
    fake.script(Reply(status=401, content="invalid api key"))
    with client_for(fake, max_retries=4, sleep=Waits()) as client:
        with pytest.raises(LLMHTTPError) as info:
            client.chat(MSG)
    assert fake.calls == 1 and "HTTP 401" in str(info.value) and "API key" in str(info.value)


def test_timeout_then_success_and_timeout_every_time(fake):
    fake.script(Reply("late", delay=0.6))
    with client_for(fake, timeout=0.2, max_retries=1, sleep=Waits()) as client:
        assert client.chat(MSG).text == '{"ok": true}'
        assert client.stats.to_dict()["retries"] == 1
        fake.script(Reply("late", delay=0.6), Reply("late", delay=0.6))
        with pytest.raises(LLMTimeoutError) as info:
            client.chat([{"role": "user", "content": "another"}])
    assert "0.2 s" in str(info.value) and fake.url in str(info.value) and "--timeout" in str(info.value)


def test_connection_refused_names_the_url():
    with FakeLLM() as fake:
        url = fake.url
    with LLMClient(url, "m", max_retries=1, backoff=0.0, jitter=0.0) as client:
        with pytest.raises(LLMConnectionError) as info:
            client.chat(MSG)
    assert url in str(info.value) and "--base-url" in str(info.value)


def test_cache_answers_reruns_with_zero_http_calls(fake, tmp_path):
    with client_for(fake, cache_dir=tmp_path / "cache") as client:
        first = client.chat(MSG, json_mode=True)
        second = client.chat(MSG, json_mode=True)
    assert fake.calls == 1 and not first.cached and second.cached and second.text == first.text
    assert second.prompt_tokens == 0  # a cache hit costs nothing
    with client_for(fake, cache_dir=tmp_path / "cache") as rerun:  # a new process, same folder
        assert rerun.chat(MSG, json_mode=True).cached
        assert fake.calls == 1
        rerun.chat(MSG, json_mode=True, temperature=0.7)  # other parameters: another entry
        rerun.chat(MSG, json_mode=False)
        assert fake.calls == 3
        assert rerun.stats.to_dict()["cache_hits"] == 1
    files = list((tmp_path / "cache").rglob("*"))
    assert not [f for f in files if ".tmp" in f.name]
    assert len([f for f in files if f.suffix == ".json"]) == 3


def test_damaged_cache_file_is_a_miss(fake, tmp_path):
    with client_for(fake, cache_dir=tmp_path) as client:
        client.chat(MSG)
        entry = next(tmp_path.rglob("*.json"))
        entry.write_text("{ torn")
        assert not client.chat(MSG).cached and fake.calls == 2
        assert client.chat(MSG).cached and fake.calls == 2


def test_json_mode_falls_back_when_server_rejects_response_format(tmp_path):
    with FakeLLM(responder=lambda req: Reply('{"a": 1}'), reject_json_mode=True) as fake:
        with LLMClient(fake.url, "m", backoff=0.0) as client:
            assert client.chat(MSG, json_mode=True).json() == {"a": 1}
            assert "response_format" in fake.requests[0] and "response_format" not in fake.requests[1]
            client.chat([{"role": "user", "content": "second"}], json_mode=True)
            assert fake.calls == 3 and "response_format" not in fake.requests[2]  # remembered
            assert client.stats.to_dict()["json_mode_fallbacks"] == 1
        with LLMClient(fake.url, "m", json_mode="always") as strict:
            with pytest.raises(LLMHTTPError, match="response_format is not supported") as info:
                strict.chat(MSG, json_mode=True)
    assert info.value.status == 400 and "check the model name" not in str(info.value)
    assert str(info.value).endswith("(the request asked for JSON mode (response_format), as --json-mode always does; "
                                    "if the server has none, --json-mode auto asks again without it)")


def test_json_mode_always_names_itself_only_when_the_server_rejected_json_mode(fake):
    too_long = json.dumps({"error": {"message": "This model's maximum context length is 8192 tokens. However, your "
                                                "messages resulted in 9000 tokens.", "code": "context_length_exceeded"}})
    fake.script(Reply(status=400, body=too_long))
    with LLMClient(fake.url, "m", json_mode="always") as strict:
        with pytest.raises(LLMHTTPError, match="maximum context length") as info:
            strict.chat(MSG, json_mode=True)
    assert "--json-mode" not in str(info.value) and "response_format" not in str(info.value)
    assert str(info.value).endswith("(the server rejected the request; check the model name and parameters)")
    fake.script(Reply(status=422, body='{"detail": [{"loc": ["body", "response_format"], "msg": "extra fields not '
                                       'permitted"}]}'))
    with LLMClient(fake.url, "m", json_mode="always") as strict:
        with pytest.raises(LLMHTTPError, match="as --json-mode always does"):
            strict.chat(MSG, json_mode=True)


def test_a_cancelled_call_makes_no_further_attempt_and_cuts_its_wait_short():
    cancel = threading.Event()

    def busy_then_cancelled(request):  # the caller stops its run while this request is being answered
        cancel.set()
        return Reply(status=503, headers={"Retry-After": "30"})

    with FakeLLM(responder=busy_then_cancelled) as fake:
        with LLMClient(fake.url, "m", max_retries=4, max_backoff=60.0) as client:
            started = time.monotonic()
            with pytest.raises(LLMCancelledError, match="stopped after 1 attempt\\(s\\): the caller cancelled"):
                client.chat(MSG, cancel=cancel)
            assert time.monotonic() - started < 5 and fake.calls == 1  # not a 30 s wait, nor 4 retries
            with pytest.raises(LLMCancelledError, match="not sent"):
                client.chat(MSG, cancel=cancel)
            assert fake.calls == 1


def test_json_mode_sent_when_supported(fake):
    with client_for(fake) as client:
        client.chat(MSG, json_mode=True)
        client.chat(MSG)
    assert fake.requests[0]["response_format"] == {"type": "json_object"}
    assert "response_format" not in fake.requests[1]


def test_logprobs_are_requested_and_parsed(fake):
    fake.script(Reply("true", logprobs=[{"token": "true", "logprob": -0.2, "bytes": None,
                                         "top_logprobs": [{"token": "true", "logprob": -0.2},
                                                          {"token": " False", "logprob": -1.9}]}]))
    with client_for(fake) as client:
        result = client.chat(MSG, logprobs=True, top_logprobs=2, max_tokens=1)
        assert fake.requests[0]["logprobs"] is True and fake.requests[0]["top_logprobs"] == 2
        assert result.logprobs == (TokenLogprob("true", -0.2, (("true", -0.2), (" False", -1.9))),)
        # P(true) = e^-0.2 / (e^-0.2 + e^-1.9) = 1 / (1 + e^-1.7)
        assert choice_probability(result) == pytest.approx(1 / (1 + math.exp(-1.7)))
        generic = client.chat([{"role": "user", "content": "more"}], logprobs=True, top_logprobs=3)
    assert [t.token for t in generic.logprobs] == ['{"ok":', " ", "true}"]
    assert len(generic.logprobs[0].top) == 3 and generic.logprobs[0].top[1] == ("<alt1>", -4.0)


def test_choice_probability_edge_cases():
    assert choice_probability(ChatResult("x", "m")) is None
    only_yes = ChatResult("true", "m", logprobs=(TokenLogprob("true", -0.1, (("maybe", -2.0),)),))
    assert choice_probability(only_yes) == 1.0


def first_token(token, p, *alternatives):
    """A one-token reply whose first token `token` has probability p, with (token, probability) alternatives."""
    top = ((token, math.log(p)),) + tuple((t, math.log(q)) for t, q in alternatives)
    return ChatResult(token, "m", logprobs=(TokenLogprob(token, math.log(p), top),))


def test_choice_probability_needs_the_two_words_to_hold_real_mass():
    # the model answered "maybe" (90 %); "true" is an alternative at 5 %, "false" is not listed: no judgement
    assert choice_probability(first_token("maybe", 0.90, ("true", 0.05), ("I", 0.02))) is None
    # a code fence with "true" at 0.03 %
    assert choice_probability(first_token("```", 0.9997, ("true", 0.0003))) is None
    # "maybe" 30 %, "true" 29 %, "false" 28 %: the words hold 57 %, so P(true) = 0.29 / 0.57
    assert choice_probability(first_token("maybe", 0.30, ("true", 0.29), ("false", 0.28))) == \
        pytest.approx(0.29 / 0.57)
    # every spelling of a word counts: "true" 80 % + " True" 10 % against "false" 5 % → 0.90 / 0.95
    assert choice_probability(first_token("true", 0.80, (" True", 0.10), ("false", 0.05))) == \
        pytest.approx(0.90 / 0.95)
    # no spelling alone holds half, together they do: true 0.30 + 0.25 + 0.20 = 0.75, false 0.10 + 0.10 = 0.20,
    # so P(true) = 0.75 / 0.95 = 0.78947 (the likeliest spelling alone, 0.30 + 0.10 = 0.40, was under 50 %)
    spread = first_token("true", 0.30, ("True", 0.25), (" true", 0.20), ("false", 0.10), ("False", 0.10))
    assert choice_probability(spread) == pytest.approx(0.789474, abs=1e-6)
    # a certain "false", "true" beyond the listed alternatives
    assert choice_probability(first_token("false", 0.99, ("no", 0.005))) == 0.0


def test_parse_json_reply_tolerates_fences_thinking_and_prose():
    assert parse_json_reply('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json_reply('<think>maybe {x}</think>\n{"a": 2}') == {"a": 2}
    assert parse_json_reply('Sure! Here it is: {"a": 3} Hope it helps.') == {"a": 3}
    with pytest.raises(LLMReplyError, match="not valid JSON"):
        parse_json_reply("no json here")


def test_map_bounds_requests_in_flight():
    state = {"now": 0, "peak": 0}
    lock = threading.Lock()

    def slow(req):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return Reply(json.dumps({"echo": req["messages"][0]["content"]}))

    with FakeLLM(responder=slow) as fake, LLMClient(fake.url, "m", concurrency=3) as client:
        items = [f"q{i}" for i in range(9)]
        results = dict(client.map(lambda text: client.chat([{"role": "user", "content": text}]).json(), items))
    assert [results[i]["echo"] for i in range(9)] == items
    assert 2 <= state["peak"] <= 3


def test_map_returns_exceptions_per_item(fake):
    fake.script(Reply(status=400, content="bad"), when=mentions("poison"))
    with client_for(fake) as client:
        out = dict(client.map(lambda t: client.chat([{"role": "user", "content": t}]).text, ["ok", "poison"]))
    assert out[0] == '{"ok": true}' and isinstance(out[1], LLMHTTPError)


def test_settings_from_yaml_file_and_errors(tmp_path, fake):
    config = tmp_path / "llm.yaml"
    config.write_text(f"base_url: {fake.url}\nmodel: small\nstrong_model: big\nconcurrency: 2\n")
    settings = LLMSettings.from_file(config)
    assert (settings.model, settings.strong_model, settings.concurrency) == ("small", "big", 2)
    with settings.client() as client:
        assert client.chat(MSG).text == '{"ok": true}'
    (tmp_path / "bad.yaml").write_text("base_url: x\nmodle: typo\n")
    with pytest.raises(Exception, match="unknown LLM setting.*modle"):
        LLMSettings.from_file(tmp_path / "bad.yaml")


@pytest.mark.parametrize("line, message", [
    ('timeout: "abc"', "timeout: must be a number of seconds above 0, got 'abc'"),
    ("timeout: 0", "timeout: must be a number of seconds above 0, got 0"),
    ("concurrency: 2.5", "concurrency: must be a whole number, 1 or more, got 2.5"),
    ("max_retries: -1", "max_retries: must be a whole number, 0 or more, got -1"),
    ("json_mode: sometimes", "json_mode: must be one of auto, always, never, got 'sometimes'"),
    ("base_url: localhost:8000", "base_url: LLM base URL must start with http:// or https://"),
    ("model: [a, b]", "model: must be text, got ['a', 'b']"),
])
def test_a_bad_value_in_the_config_file_names_the_file_and_the_key(tmp_path, line, message):
    config = tmp_path / "llm.yaml"
    config.write_text(f"base_url: http://127.0.0.1:1/v1\nmodel: m\n{line}\n")
    with pytest.raises(LLMSettingError) as info:
        LLMSettings.from_file(config)
    assert str(info.value).startswith(f"{config}: {message}")


def test_flags_over_the_file_are_checked_naming_the_flag_and_numeric_text_is_read(tmp_path):
    config = tmp_path / "llm.yaml"
    config.write_text('base_url: http://127.0.0.1:1/v1\ntimeout: "30"\n')
    settings = LLMSettings.from_sources(config, {"model": ("--model", "m"), "concurrency": ("--concurrency", None)})
    assert (settings.timeout, settings.model, settings.concurrency) == (30.0, "m", 4)
    with pytest.raises(LLMSettingError, match=r"^--timeout: must be a number of seconds above 0, got -5.0$"):
        LLMSettings.from_sources(config, {"model": ("--model", "m"), "timeout": ("--timeout", -5.0)})
    with pytest.raises(LLMSettingError, match=f"no LLM model given: --model, or model in {config}"):
        LLMSettings.from_sources(config, {})


def test_a_key_variable_named_on_purpose_must_be_set_and_a_401_without_key_says_none_was_sent(fake, tmp_path):
    settings = LLMSettings(base_url=fake.url, model="m")
    with pytest.raises(LLMSettingError, match="^--api-key-env MY_KEY: the environment variable MY_KEY is not set"):
        settings.fill_api_key({}, key=None, key_env_flag="MY_KEY", default_env="DEFAULT_KEY")
    from_file = LLMSettings(base_url=fake.url, model="m", api_key_env="MY_KEY")
    with pytest.raises(LLMSettingError, match=f"^{tmp_path}: api_key_env: the environment variable MY_KEY"):
        from_file.fill_api_key({}, key=None, key_env_flag=None, default_env="DEFAULT_KEY", config_file=tmp_path)
    from_file.fill_api_key({"MY_KEY": "sk-1"}, key=None, key_env_flag=None, default_env="DEFAULT_KEY")
    assert from_file.api_key == "sk-1"
    settings.fill_api_key({}, key=None, key_env_flag=None, default_env="DEFAULT_KEY")  # the default unset: no key
    assert settings.api_key is None
    fake.script(Reply(status=401, content="invalid api key"))
    with settings.client(sleep=Waits()) as client, pytest.raises(LLMHTTPError, match="carried no API key"):
        client.chat(MSG)
    assert "authorization" not in fake.requests[-1]["_headers"]


def test_client_arguments_are_checked_by_the_same_rules(fake):
    with pytest.raises(LLMSettingError, match="^timeout: must be a number of seconds above 0, got -5"):
        LLMClient(fake.url, "m", timeout=-5)
    with pytest.raises(ValueError, match="^json_mode: must be one of auto, always, never"):
        LLMClient(fake.url, "m", json_mode="yes")


def test_chat_url():
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_url("https://x/v1/chat/completions") == "https://x/v1/chat/completions"
    with pytest.raises(Exception, match="http://"):
        chat_url("localhost:8000")


def test_without_a_deadline_a_call_waits_for_a_busy_slot():
    # one slot, three callers, each answer slow: the later callers wait for the slot instead of failing
    with FakeLLM(responder=lambda req: Reply("ok", delay=0.15)) as fake, \
            LLMClient(fake.url, "m", concurrency=1, max_retries=0) as client:
        outcomes = []

        def call(i):
            try:
                outcomes.append(client.chat([{"role": "user", "content": f"hi {i}"}]).text)
            except LLMError as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert outcomes == ["ok", "ok", "ok"] and len(fake.requests) == 3
