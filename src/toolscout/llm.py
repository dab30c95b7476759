"""One client for every LLM feature: the OpenAI chat-completions protocol, to a URL the user gives.

    client = LLMClient("http://localhost:8000/v1", model="qwen3-32b", api_key=key, cache_dir="~/.cache/x")
    reply = client.chat([{"role": "user", "content": "..."}], json_mode=True)
    data = reply.json()                       # the reply parsed as JSON (LLMReplyError if it is not)
    client.stats.to_dict()                    # calls, HTTP requests, retries, cache hits, tokens

Works with OpenAI, vLLM, Ollama, llama.cpp server, LiteLLM and anything else that speaks
`POST {base_url}/chat/completions`.

- Timeouts and retries: connection errors, timeouts, 429 and 5xx are retried with exponential backoff;
  a `Retry-After` header (seconds or an HTTP date) is honoured up to `max_backoff`, and a wait over a second
  is logged. Other 4xx fail at once. A call may carry a deadline that bounds it, waits included, and a
  cancel event: once set, the call makes no further attempt and cuts its wait short (LLMCancelledError).
- Concurrency: `map(fn, items)` runs `fn` over a thread pool; a semaphore bounds the requests in
  flight to `concurrency` however many threads call `chat`.
- JSON mode: `json_mode=True` sends `response_format={"type": "json_object"}`; a server that rejects
  the field (HTTP 400/422) is asked again without it, and the client stops sending it to that model.
- Log-probabilities: `logprobs=True, top_logprobs=N` → `ChatResult.logprobs`, one entry per token.
- Cache: with `cache_dir`, each successful reply is stored under a hash of (model, messages,
  parameters), one JSON file per reply, written atomically; a rerun answers from disk with no HTTP call.
- Errors: `LLMError` subclasses whose message names the URL, the HTTP status and the start of the body.
- Settings: `check_setting` holds what each setting must be; `LLMSettings.from_sources` (config file, then
  flags) and `LLMClient` apply it, so a bad value is reported once, naming the flag or the file and key.

The client reads no environment variables; the CLI passes the key in.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import random
import re
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from .errors import MissingDependency, ToolScoutError

_log = logging.getLogger(__name__)

Message = Mapping[str, Any]
T = TypeVar("T")
R = TypeVar("R")

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 520, 522, 524, 529})
CACHE_FORMAT = 1
_SNIPPET = 300


# ------------------------------------------------------------------------------------------ errors

class LLMError(ToolScoutError):
    """An LLM request failed; the message says where and why."""


class LLMHTTPError(LLMError):
    """The server answered with an HTTP error status."""

    def __init__(self, url: str, status: int, body: str, attempts: int = 1, hint: str = ""):
        self.url, self.status, self.body, self.attempts = url, status, body, attempts
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        message = f"POST {url} → HTTP {status}{tries}: {snippet(body) or '(empty body)'}"
        super().__init__(message + (f" ({hint})" if hint else ""))


class LLMTimeoutError(LLMError):
    """No complete reply within the timeout, on every attempt."""


class LLMNotSentError(LLMTimeoutError):
    """The call's deadline passed before a request went out (every slot busy, or no time left for the next
    attempt): it says nothing about the endpoint, only that the caller ran out of time."""


class LLMConnectionError(LLMError):
    """The server could not be reached."""


class LLMCancelledError(LLMError):
    """The caller's cancel event was set: the call stopped before its next attempt (or was never sent)."""


class LLMSettingError(LLMError, ValueError):
    """An LLM setting is missing or has a value it cannot have; the message names the flag or the file and key."""


class LLMReplyError(LLMError):
    """The server answered 200 but the reply is unusable (no choices, or not the JSON that was asked for)."""


def snippet(text: str, limit: int = _SNIPPET) -> str:
    """The start of `text` on one line, for an error message."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


DEFAULT_KEY_ENV = "TOOLSCOUT_LLM_API_KEY"  # where every LLM feature reads its key unless told another variable


@dataclass(frozen=True)
class SettingHints:
    """How the user of the failing command sets what an error's hint names: the CLI's flags by default; the
    LLM reranker, which has no flags at search time, names its config keys."""

    key: str = f"--api-key-env names the environment variable that holds it; default {DEFAULT_KEY_ENV}"
    timeout: str = "--timeout"
    base_url: str = "--base-url"
    max_tokens: str = "--max-tokens"
    deadline: str = "the caller's deadline"


def _status_hint(status: int, sent_key: bool, hints: SettingHints) -> str:
    if status == 401 and not sent_key:
        return f"the request carried no API key ({hints.key})"
    return {
        400: "the server rejected the request; check the model name and parameters",
        401: f"check the API key ({hints.key})",
        403: "the API key may not have access to this model",
        404: "check the base URL (usually ends in /v1) and the model name",
        413: "the prompt is too long for this server",
        422: "the server rejected the request parameters",
    }.get(status, "")


# ------------------------------------------------------------------------------------------ results

@dataclass(frozen=True)
class TokenLogprob:
    """One generated token, its log-probability and the most likely alternatives at that position."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ChatResult:
    text: str
    model: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    cached: bool = False

    def json(self) -> Any:
        """The reply parsed as JSON (code fences and text around one object are tolerated)."""
        return parse_json_reply(self.text)


def parse_json_reply(text: str) -> Any:
    """Parse a model's reply as JSON: plain, inside a ``` fence, or the outermost {...} in the text."""
    stripped = re.sub(r"^\s*<think>.*?</think>", "", text, flags=re.DOTALL).strip()  # reasoning models
    fence = re.match(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", stripped, re.DOTALL)
    if fence:
        stripped = fence.group(1).strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError as exc:
        first, last = stripped.find("{"), stripped.rfind("}")
        if 0 <= first < last:
            try:
                return json.loads(stripped[first: last + 1])
            except json.JSONDecodeError:
                pass
        raise LLMReplyError(f"reply is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
                            f"{snippet(text, 200)!r}") from None


def parse_logprobs(choice: Mapping[str, Any]) -> tuple[TokenLogprob, ...] | None:
    """`choices[i].logprobs` in the chat shape (`content: [{token, logprob, top_logprobs}]`) or the legacy
    completions shape (`tokens`, `token_logprobs`, `top_logprobs: [{token: logprob}]`)."""
    data = choice.get("logprobs")
    if not isinstance(data, Mapping):
        return None
    content = data.get("content")
    if isinstance(content, list):
        out = []
        for item in content:
            top = tuple((str(t.get("token", "")), float(t.get("logprob", float("-inf"))))
                        for t in item.get("top_logprobs") or ())
            out.append(TokenLogprob(str(item.get("token", "")), float(item.get("logprob", float("-inf"))), top))
        return tuple(out)
    tokens, values = data.get("tokens"), data.get("token_logprobs")
    if isinstance(tokens, list) and isinstance(values, list):
        tops = data.get("top_logprobs") or [None] * len(tokens)
        return tuple(
            TokenLogprob(str(tok), float(lp if lp is not None else float("-inf")),
                         tuple((str(k), float(v)) for k, v in (top or {}).items()))
            for tok, lp, top in zip(tokens, values, tops))
    return None


# the share of the first token's probability that "true" and "false" must hold together for P(true) to be
# read from them: below it the model's answer was something else ("maybe", a code fence, "<think>")
MIN_CHOICE_MASS = 0.5


def choice_masses(result: ChatResult, yes: str = "true", no: str = "false") -> tuple[float, float] | None:
    """(m_yes, m_no): the first token's probability spent on each word, summed over the distinct alternatives
    that spell it (case-insensitively, without surrounding spaces: "true", "True" and " true" are one answer).
    None when the reply carries no log-probabilities."""
    import math

    if not result.logprobs:
        return None
    first = result.logprobs[0]
    alternatives = {first.token: first.logprob}  # the generated token's own value first, as servers report it
    for token, logprob in first.top:
        alternatives.setdefault(token, logprob)
    mass = {yes.lower(): 0.0, no.lower(): 0.0}
    for token, logprob in alternatives.items():
        word = token.strip().lower()
        if word in mass:
            mass[word] += math.exp(logprob)
    return mass[yes.lower()], mass[no.lower()]


def choice_probability(result: ChatResult, yes: str = "true", no: str = "false") -> float | None:
    """P(yes) from the first token's alternatives: m_yes / (m_yes + m_no), the masses of `choice_masses`.

    None when the reply carries no log-probabilities, or when the two words together hold less than
    MIN_CHOICE_MASS of the first token's probability: a 5 % "true" beside a "maybe" is no judgement.
    """
    masses = choice_masses(result, yes, no)
    if masses is None or sum(masses) < MIN_CHOICE_MASS:
        return None
    return masses[0] / sum(masses)


# ------------------------------------------------------------------------------------------ stats

_COUNTERS = ("calls", "http_requests", "retries", "cache_hits", "errors", "json_mode_fallbacks",
             "prompt_tokens", "completion_tokens")


class LLMStats:
    """Thread-safe counts for a cost report, in total and per model.

    `calls`: chat() calls, failed ones too (`errors` of them failed); `http_requests`: requests sent (retries
    included); `cache_hits`: calls answered from the cache; tokens are those the server reported in `usage`
    (cache hits cost none).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_model: dict[str, dict[str, int]] = {}

    def add(self, model: str, **counts: int) -> None:
        with self._lock:
            row = self._by_model.setdefault(model, dict.fromkeys(_COUNTERS, 0))
            for key, value in counts.items():
                row[key] += value

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            by_model = {m: dict(c) for m, c in self._by_model.items()}
        total = {key: sum(c[key] for c in by_model.values()) for key in _COUNTERS}
        return {**total, "by_model": by_model}

    def summary(self) -> str:
        d = self.to_dict()
        return (f"{d['calls']} LLM calls ({d['cache_hits']} from cache, {d['http_requests']} HTTP requests, "
                f"{d['retries']} retries, {d['errors']} failed), {d['prompt_tokens']} prompt + "
                f"{d['completion_tokens']} completion tokens")


# what to check when a server's replies are never the JSON a pipeline asked for (`expand`, `generate`)
UNREADABLE_REPLIES_HINT = ("check that --model names a chat model that follows instructions, and that --max-tokens "
                           "does not cut replies short")


# ------------------------------------------------------------------------------------------ cache

class ResponseCache:
    """One JSON file per reply under `folder/ab/abcdef....json`, written beside then renamed."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder).expanduser()
        self.folder.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(model: str, messages: Sequence[Message], params: Mapping[str, Any]) -> str:
        blob = json.dumps({"format": CACHE_FORMAT, "model": model, "messages": list(messages), "params": dict(params)},
                          sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        path = self._path(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return None  # missing, or damaged by something else: a miss, rewritten on the next success
        return data.get("response") if isinstance(data, dict) else None

    def put(self, key: str, request: Mapping[str, Any], response: Mapping[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"request": request, "response": response}, fh, ensure_ascii=False)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


# ------------------------------------------------------------------------------------------ client

# what each setting must be: checked wherever settings come in (a config file, a flag, the constructor)
_OPTIONAL = frozenset({"strong_model", "judge_model", "api_key", "api_key_env", "cache_dir", "temperature"})
_TEXT = frozenset({"base_url", "model", "strong_model", "judge_model", "api_key", "api_key_env", "cache_dir"})
_NUMBERS = {  # name: (whole numbers only, lowest value, whether the lowest is allowed, what it is)
    "timeout": (False, 0, False, "a number of seconds above 0"),
    "backoff": (False, 0, True, "a number of seconds, 0 or more"),
    "max_backoff": (False, 0, True, "a number of seconds, 0 or more"),
    "temperature": (False, 0, True, "a number, 0 or more"),
    "max_retries": (True, 0, True, "a whole number, 0 or more"),
    "concurrency": (True, 1, True, "a whole number, 1 or more"),
}
JSON_MODES = ("auto", "always", "never")


def check_setting(name: str, value: Any, where: str) -> Any:
    """`value` as setting `name` needs it (numbers from numeric text too), or LLMSettingError naming
    `where` (a flag such as `--timeout`, or `llm.yaml: timeout`)."""
    if value is None and name in _OPTIONAL:
        return None
    if name in _NUMBERS:
        return _check_number(value, where, *_NUMBERS[name])
    if name == "json_mode" and value not in JSON_MODES:
        raise LLMSettingError(f"{where}: must be one of {', '.join(JSON_MODES)}, got {value!r}")
    if name == "extra" and not isinstance(value, Mapping):
        raise LLMSettingError(f"{where}: must be a mapping of extra request fields, got {value!r}")
    if name in _TEXT and not isinstance(value, str):
        raise LLMSettingError(f"{where}: must be text, got {value!r}")
    if name == "base_url" and value:
        try:
            chat_url(value)
        except LLMError as exc:
            raise LLMSettingError(f"{where}: {exc}") from None
    return value


def _check_number(value: Any, where: str, whole: bool, lowest: float, inclusive: bool, what: str) -> float | int:
    try:
        if isinstance(value, bool) or (whole and isinstance(value, float) and not value.is_integer()):
            raise ValueError
        number = int(value) if whole else float(value)
    except (TypeError, ValueError):
        raise LLMSettingError(f"{where}: must be {what}, got {value!r}") from None
    if number != number or number < lowest or (number == lowest and not inclusive):  # NaN, or too low
        raise LLMSettingError(f"{where}: must be {what}, got {value!r}")
    return number


@dataclass
class LLMSettings:
    """Everything needed to build a client, e.g. from a config file (`LLMSettings.from_file`).

    `model` is the working model; `strong_model` and `judge_model` are optional second names that
    pipelines use for regeneration and judging (document expansion). The key is not read from the
    environment here: the CLI resolves `api_key_env` once and fills `api_key`.
    """

    base_url: str = ""
    model: str = ""
    api_key: str | None = None
    api_key_env: str | None = None
    strong_model: str | None = None
    judge_model: str | None = None
    timeout: float = 60.0
    max_retries: int = 4
    backoff: float = 1.0
    max_backoff: float = 60.0
    concurrency: int = 4
    cache_dir: str | None = None
    json_mode: str = "auto"
    temperature: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "LLMSettings":
        """A JSON or YAML mapping with any of the field names; unknown keys are an error."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise LLMError(f"{path}: LLM config file not found") from None
        try:
            if path.suffix.lower() == ".json":
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text)
        except Exception as exc:  # JSON or YAML syntax
            raise LLMError(f"{path}: cannot parse the LLM config: {exc}") from None
        if not isinstance(data, Mapping):
            raise LLMError(f"{path}: the LLM config must be a mapping of settings, got {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise LLMError(f"{path}: unknown LLM setting(s) {unknown}; known: {sorted(known)}")
        return cls(**{key: check_setting(key, value, f"{path}: {key}") for key, value in data.items()})

    @classmethod
    def from_sources(cls, config_file: str | os.PathLike | None,
                     flags: Mapping[str, tuple[str, Any]]) -> "LLMSettings":
        """The config file's settings (if any), then flags over them: `{setting: (flag, value or None)}`.
        Every value is checked once, here, and an error names its flag, or its key and the file; the base
        URL and the model must be given by one or the other."""
        settings = cls.from_file(config_file) if config_file else cls()
        for name, (flag, value) in flags.items():
            if value is not None:
                setattr(settings, name, check_setting(name, value, flag))
        settings.require_connection(config_file)
        return settings

    def require_connection(self, config_file: str | os.PathLike | None = None) -> None:
        """The base URL and the model are set (before anything is printed or sent)."""
        where = f"in {config_file}" if config_file else "in an --llm-config file"
        if not self.base_url:
            raise LLMSettingError(f"no LLM base URL given: --base-url, or base_url {where}")
        if not self.model:
            raise LLMSettingError(f"no LLM model given: --model, or model {where}")

    def fill_api_key(self, environ: Mapping[str, str], *, key: str | None, key_env_flag: str | None,
                     default_env: str, config_file: str | os.PathLike | None = None) -> None:
        """The API key: `key` (a flag), else the environment variable `key_env_flag` names (or this
        settings' `api_key_env`, or `default_env`), else a key the config file holds. A variable named on
        purpose that is not set is an error: the requests would go out with no key."""
        name = key_env_flag or self.api_key_env or default_env
        if key:
            self.api_key = key
        elif environ.get(name):
            self.api_key = environ[name]
        elif not self.api_key and (key_env_flag or self.api_key_env):
            where = f"--api-key-env {name}" if key_env_flag else f"{config_file or 'the LLM settings'}: api_key_env"
            raise LLMSettingError(f"{where}: the environment variable {name} is not set; set it to the API key, "
                                  "or name no variable for a server that needs no key")

    def client(self, **overrides: Any) -> "LLMClient":
        self.require_connection()
        options = dict(timeout=self.timeout, max_retries=self.max_retries, backoff=self.backoff,
                       max_backoff=self.max_backoff, concurrency=self.concurrency, cache_dir=self.cache_dir,
                       json_mode=self.json_mode, extra_body=self.extra)
        options.update(overrides)
        return LLMClient(self.base_url, self.model, self.api_key, **options)


class LLMClient:
    """An OpenAI-compatible chat-completions client with retries, a bounded pool, JSON mode and a cache.

    `model`: the default model name (each call may name another). `timeout`: seconds per request.
    `max_retries`: extra attempts after the first for retryable failures. Backoff before retry n
    (0-based) is `backoff * 2**n` seconds (capped at `max_backoff`, ± `jitter` share), or the
    server's `Retry-After` when it sends one (capped at `max_backoff` too: no wait is longer). A wait over a
    second is logged (logger "toolscout.llm", level WARNING) with its reason. `json_mode`: "auto"
    (ask, fall back if rejected), "always" (never fall back), "never". `sleep` is injectable for tests.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, timeout: float = 60.0,
                 max_retries: int = 4, backoff: float = 1.0, max_backoff: float = 60.0, jitter: float = 0.1,
                 concurrency: int = 4, cache_dir: str | os.PathLike | None = None,
                 json_mode: str = "auto", extra_body: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None, sleep: Callable[[float], None] = time.sleep,
                 seed: int | None = None, hints: SettingHints = SettingHints()):
        try:
            import httpx
        except ImportError:
            raise MissingDependency("httpx", "LLM features", extra="llm") from None
        checked = {name: check_setting(name, value, name) for name, value in (
            ("timeout", timeout), ("max_retries", max_retries), ("backoff", backoff), ("max_backoff", max_backoff),
            ("concurrency", concurrency), ("json_mode", json_mode))}
        self.url = chat_url(base_url)
        self.model = model
        self.timeout = float(checked["timeout"])
        self.max_retries = int(checked["max_retries"])
        self.backoff, self.max_backoff, self.jitter = checked["backoff"], checked["max_backoff"], float(jitter)
        self.concurrency = int(checked["concurrency"])
        self.json_mode = json_mode
        self.extra_body = dict(extra_body or {})
        self.hints = hints
        self.cache = ResponseCache(cache_dir) if cache_dir else None
        self.stats = LLMStats()
        self._sleep = sleep
        self._random = random.Random(seed)
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._no_json_mode: set[str] = set()  # models whose server rejected response_format
        self._state_lock = threading.Lock()
        request_headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key:
            request_headers["Authorization"] = f"Bearer {api_key}"
        self._sends_key = bool(api_key)
        # plain-http URLs (local servers) use no TLS, so skip loading CA certificates (~0.5 s per client)
        tls = {} if self.url.startswith("https://") else {"verify": False}
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout), headers=request_headers,
                                  limits=httpx.Limits(max_connections=self.concurrency + 2), **tls)
        self._httpx = httpx

    # lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "LLMClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # one call ----------------------------------------------------------------------------
    def chat(self, messages: Sequence[Message], *, model: str | None = None, temperature: float | None = 0.0,
             max_tokens: int | None = None, json_mode: bool = False, logprobs: bool = False,
             top_logprobs: int | None = None, stop: Sequence[str] | None = None, seed: int | None = None,
             use_cache: bool = True, deadline: float | None = None, cancel: threading.Event | None = None,
             **extra: Any) -> ChatResult:
        """Send one chat request (or answer it from the cache) and return the first choice. `deadline`: a
        `time.monotonic()` instant the call must end by, retries and waits included (LLMTimeoutError after).
        `cancel`: an event the caller sets to stop the call (a run that stopped early): no attempt starts
        after it is set and a wait ends at once (LLMCancelledError); an attempt in flight runs to its reply
        or its timeout."""
        model = model or self.model
        messages = [dict(m) for m in messages]
        params = self._params(temperature, max_tokens, logprobs, top_logprobs, stop, seed, extra)
        logical = {**params, "json_mode": bool(json_mode)}  # the cache key: what was asked, not how it was sent
        key = ResponseCache.key(model, messages, logical) if self.cache is not None else None
        if key is not None and use_cache:  # use_cache=False asks the server again and refreshes the entry
            hit = self._from_cache(key, model, json_mode, max_tokens)
            if hit is not None:
                return hit
        body = {"model": model, "messages": messages, **params}
        self._check_cancel(cancel, model, 0)
        want_json = json_mode and self.json_mode != "never"
        if not self._acquire_slot(deadline):
            self.stats.add(model, errors=1)  # never sent: an error, not a call made
            raise LLMNotSentError(f"POST {self.url}: not sent, all {self.concurrency} request slots stayed busy "
                                  f"until the deadline (model {model!r})")
        try:
            # counts its own failures as errors
            data = self._post_with_json_mode(body, model, want_json, deadline, cancel)
        except LLMError:
            self.stats.add(model, calls=1)  # a failed call is a call too
            raise
        finally:
            self._slots.release()
        try:
            result = _result(data, model, self.url, cached=False)
        except LLMReplyError:
            self.stats.add(model, calls=1, errors=1)
            raise
        self.stats.add(model, calls=1, prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens)
        self._complete(result, model, json_mode, max_tokens)  # a cut-off reply is not cached: a rerun asks again
        if key is not None:
            self.cache.put(key, {"model": model, "messages": messages, "params": logical}, _cacheable(data))
        return result

    def cached_reply(self, messages: Sequence[Message], *, model: str | None = None,
                     temperature: float | None = 0.0, max_tokens: int | None = None, json_mode: bool = False,
                     logprobs: bool = False, top_logprobs: int | None = None, stop: Sequence[str] | None = None,
                     seed: int | None = None, **extra: Any) -> ChatResult | None:
        """What `chat` with the same arguments would answer from the cache, without asking the server; None
        when the cache holds no reply for it (or there is no cache)."""
        if self.cache is None:
            return None
        model = model or self.model
        params = self._params(temperature, max_tokens, logprobs, top_logprobs, stop, seed, extra)
        key = ResponseCache.key(model, [dict(m) for m in messages], {**params, "json_mode": bool(json_mode)})
        return self._from_cache(key, model, json_mode, max_tokens)

    def _params(self, temperature: float | None, max_tokens: int | None, logprobs: bool, top_logprobs: int | None,
                stop: Sequence[str] | None, seed: int | None, extra: Mapping[str, Any]) -> dict[str, Any]:
        """The request's parameters besides the model and the messages (also the cache key's)."""
        params: dict[str, Any] = {**self.extra_body, **extra}
        for key, value in (("temperature", temperature), ("max_tokens", max_tokens), ("stop", list(stop or ()) or None),
                           ("seed", seed)):
            if value is not None:
                params[key] = value
        if logprobs:
            params["logprobs"] = True
            if top_logprobs:
                params["top_logprobs"] = int(top_logprobs)
        return params

    def _from_cache(self, key: str, model: str, json_mode: bool, max_tokens: int | None) -> ChatResult | None:
        hit = self.cache.get(key)
        if hit is None:
            return None
        self.stats.add(model, calls=1, cache_hits=1)
        return self._complete(_result(hit, model, self.url, cached=True), model, json_mode, max_tokens)

    def _acquire_slot(self, deadline: float | None) -> bool:
        """A request slot: waited for as long as it takes without a deadline (a BoundedSemaphore's timeout=-1
        would not wait at all), else until the deadline; False when it passed first."""
        if deadline is None:
            return self._slots.acquire()
        return self._slots.acquire(timeout=max(0.0, deadline - time.monotonic()))

    def _complete(self, result: ChatResult, model: str, json_mode: bool, max_tokens: int | None) -> ChatResult:
        """`result`, unless it was asked for JSON and the token limit cut it off before the JSON was whole:
        then LLMReplyError saying so and which setting raises the limit (more attempts would not help)."""
        if not json_mode or result.finish_reason != "length":
            return result
        try:
            parse_json_reply(result.text)
        except LLMReplyError:
            self.stats.add(model, errors=1)
            now = f" (now {max_tokens})" if max_tokens else ""
            raise LLMReplyError(
                f"POST {self.url}: the reply was cut off at the token limit (finish_reason \"length\") before its "
                f"JSON was complete; raise {self.hints.max_tokens}{now} or the server's limit; it began: "
                f"{snippet(result.text, 120)!r}") from None
        return result

    def _post_with_json_mode(self, body: dict, model: str, want_json: bool, deadline: float | None,
                             cancel: threading.Event | None) -> dict:
        with self._state_lock:
            use_json = want_json and model not in self._no_json_mode
        if not use_json:
            return self._post(body, model, deadline, cancel)
        try:
            return self._post({**body, "response_format": {"type": "json_object"}}, model, deadline, cancel)
        except LLMHTTPError as exc:
            if exc.status not in (400, 415, 422):
                raise
            if self.json_mode == "always":
                if not _about_json_mode(exc.body):
                    raise  # another fault (a prompt over the context length): its own hint
                raise LLMHTTPError(exc.url, exc.status, exc.body, exc.attempts,
                                   "the request asked for JSON mode (response_format), as --json-mode always does; "
                                   "if the server has none, --json-mode auto asks again without it") from None
            # asked again without response_format: the server rejected it
            data = self._post(body, model, deadline, cancel)
            with self._state_lock:
                self._no_json_mode.add(model)
            self.stats.add(model, json_mode_fallbacks=1)
            return data

    def _post(self, body: dict, model: str, deadline: float | None = None,
              cancel: threading.Event | None = None) -> dict:
        """POST with retries; `deadline` (a `time.monotonic()` instant) bounds the whole call, waits included;
        `cancel`, once set, ends it before its next attempt."""
        httpx = self._httpx
        attempts = self.max_retries + 1

        def pause(seconds: float, attempt: int, why: str) -> bool:
            return self._pause(seconds, deadline, attempt, why, cancel)

        for attempt in range(attempts):
            last = attempt == attempts - 1
            if attempt:
                self._check_cancel(cancel, model, attempt)
            timeout = self._request_timeout(deadline, model)
            self.stats.add(model, http_requests=1, retries=1 if attempt else 0)
            try:
                response = self._http.post(self.url, json=body, timeout=timeout)
            except httpx.TimeoutException:
                if last or not pause(self._backoff(attempt), attempt, "no reply in time"):
                    self.stats.add(model, errors=1)
                    advice = (f"the call's deadline cut it short ({self.hints.deadline})" if timeout < self.timeout
                              else f"raise the timeout ({self.hints.timeout}) or check the server")
                    raise LLMTimeoutError(f"POST {self.url}: no reply within {timeout:.3g} s on {attempt + 1} attempt(s) "
                                          f"(model {model!r}){_cut_short(last)}; {advice}") from None
                continue
            except httpx.TransportError as exc:
                if last or not pause(self._backoff(attempt), attempt, f"cannot connect: {exc}"):
                    self.stats.add(model, errors=1)
                    raise LLMConnectionError(
                        f"POST {self.url}: cannot reach the server on {attempt + 1} attempt(s){_cut_short(last)}: "
                        f"{exc}; check {self.hints.base_url} and that the server is running") from None
                continue
            if 200 <= response.status_code < 300:  # a 201 or 204 is an answer too, judged by its body
                return self._reply_body(response, model)
            status = response.status_code
            hint = _status_hint(status, self._sends_key, self.hints)
            if status in RETRY_STATUSES and not last:
                wait_s, why = self._retry_wait(response, attempt)
                if pause(wait_s, attempt, f"HTTP {status}{why}"):
                    continue
                hint = f"stopped: waiting {wait_s:g} s{why} would pass the deadline" + (f"; {hint}" if hint else "")
            self.stats.add(model, errors=1)
            raise LLMHTTPError(self.url, status, response.text, attempt + 1, hint)
        raise AssertionError("unreachable")  # pragma: no cover

    def _reply_body(self, response: Any, model: str) -> dict:
        try:
            text = response.content.decode("utf-8")  # JSON on the wire is UTF-8 (RFC 8259)
        except UnicodeDecodeError as exc:
            self.stats.add(model, errors=1)
            raise LLMReplyError(f"POST {self.url} → HTTP 200 but the body is not UTF-8 text (byte "
                                f"0x{exc.object[exc.start]:02x} at offset {exc.start} is invalid): "
                                f"{snippet(response.content.decode('utf-8', 'replace'))}") from None
        try:
            data = json.loads(text)
        except ValueError:
            self.stats.add(model, errors=1)
            raise LLMReplyError(f"POST {self.url} → HTTP 200 but the body is not JSON: "
                                f"{snippet(response.text)}") from None
        if not isinstance(data, dict):
            self.stats.add(model, errors=1)
            raise LLMReplyError(f"POST {self.url} → HTTP 200 but the body is not a JSON object: "
                                f"{snippet(response.text)}")
        return data

    def _request_timeout(self, deadline: float | None, model: str) -> float:
        """Seconds one attempt may take: the timeout, or less when the deadline is nearer."""
        if deadline is None:
            return self.timeout
        left = deadline - time.monotonic()
        if left <= 0:
            self.stats.add(model, errors=1)
            raise LLMNotSentError(f"POST {self.url}: not sent, the deadline had passed (model {model!r})")
        return min(self.timeout, left)

    def _pause(self, seconds: float, deadline: float | None, attempt: int, why: str,
               cancel: threading.Event | None = None) -> bool:
        """Wait `seconds` before retry `attempt + 1`; False (and no wait) when that would pass the deadline.
        A wait over a second is said, so that a run waiting on a rate limit does not look hung. A `cancel`
        set during the wait ends it (the next attempt then raises LLMCancelledError)."""
        if deadline is not None and time.monotonic() + seconds >= deadline:
            return False
        if seconds > 1.0:
            _log.warning("LLM: %s from %s; waiting %.0f s before attempt %d of %d", why, self.url, seconds,
                         attempt + 2, self.max_retries + 1)
        if cancel is None:
            self._sleep(seconds)
        else:
            cancel.wait(seconds)
        return True

    def _check_cancel(self, cancel: threading.Event | None, model: str, attempts: int) -> None:
        """LLMCancelledError when the caller's `cancel` is set (`attempts`: how many were made before)."""
        if cancel is None or not cancel.is_set():
            return
        self.stats.add(model, errors=1)
        done = f"stopped after {attempts} attempt(s)" if attempts else "not sent"
        raise LLMCancelledError(f"POST {self.url}: {done}: the caller cancelled the call (model {model!r})")

    def _backoff(self, attempt: int) -> float:
        wait_s = min(self.max_backoff, self.backoff * (2 ** attempt))
        if self.jitter:
            wait_s *= 1 + self.jitter * (2 * self._random.random() - 1)
        return max(0.0, wait_s)

    def _retry_wait(self, response: Any, attempt: int) -> tuple[float, str]:
        """Seconds to wait before retrying an HTTP error, and what they come from: the server's Retry-After
        (capped at max_backoff, like every wait), else the backoff."""
        after = parse_retry_after(response.headers.get("retry-after"))
        if after is None:
            return self._backoff(attempt), ""
        if after > self.max_backoff:
            return self.max_backoff, f" (Retry-After {after:g} s, capped at max_backoff {self.max_backoff:g} s)"
        return after, f" (Retry-After {after:g} s)"

    # many calls --------------------------------------------------------------------------
    def map(self, fn: Callable[[T], R], items: Iterable[T],
            workers: int | None = None) -> Iterator[tuple[int, R | BaseException]]:
        """Run `fn(item)` on a thread pool; yield `(index, result or exception)` as each one finishes.

        At most `workers` (default: `concurrency`) items are in flight, so a long input is consumed
        lazily. Closing the generator early (or Ctrl-C) cancels what has not started.
        """
        workers = workers or self.concurrency
        yield from run_parallel(fn, items, workers)


def run_parallel(fn: Callable[[T], R], items: Iterable[T],
                 workers: int) -> Iterator[tuple[int, R | BaseException]]:
    """`LLMClient.map` without a client: bounded thread-pool map, results in completion order."""
    source = iter(enumerate(items))
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="toolscout-llm")
    pending: dict[Future, int] = {}
    try:
        for index, item in source:
            pending[pool.submit(fn, item)] = index
            if len(pending) >= workers:
                break
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                index = pending.pop(future)
                exc = future.exception()
                yield index, (exc if exc is not None else future.result())
                nxt = next(source, None)
                if nxt is not None:
                    pending[pool.submit(fn, nxt[1])] = nxt[0]
    except BaseException:  # Ctrl-C, or the caller stopped early: do not wait for requests in flight
        for future in pending:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


# what an error body says when the server rejected JSON mode itself: the field's name, or the feature's
_JSON_MODE_WORDS = re.compile(r"response_format|json[ _-]?(mode|object|schema)|structured output", re.IGNORECASE)


def _about_json_mode(body: str) -> bool:
    """Whether an HTTP error's body is about the request's `response_format` (JSON mode), not another fault."""
    return bool(_JSON_MODE_WORDS.search(body or ""))


def _cut_short(last: bool) -> str:
    """What an error adds when the call's deadline, not its retries, ended it."""
    return "" if last else ", stopped there: a retry would pass the deadline"


def chat_url(base_url: str) -> str:
    """`http://host/v1` → `http://host/v1/chat/completions` (a full endpoint URL is kept as is)."""
    url = (base_url or "").strip().rstrip("/")
    if not re.match(r"^https?://", url):
        raise LLMError(f"LLM base URL must start with http:// or https://, got {base_url!r} "
                       "(e.g. http://localhost:8000/v1 or https://api.openai.com/v1)")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a `Retry-After` header: a number of seconds or an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _cacheable(data: Mapping[str, Any]) -> dict:
    """The parts of a reply worth keeping: choices, usage, model."""
    return {key: data[key] for key in ("id", "model", "choices", "usage") if key in data}


def _result(data: Mapping[str, Any], model: str, url: str, cached: bool) -> ChatResult:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise LLMReplyError(f"POST {url}: reply has no choices: {snippet(json.dumps(data, default=str))}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice.get("message"), Mapping) else {}
    text = message.get("content")
    if text is None:
        text = choice.get("text", "")  # completions-style servers
    usage = data.get("usage") if isinstance(data.get("usage"), Mapping) else {}
    return ChatResult(
        text=str(text or ""), model=str(data.get("model") or model), finish_reason=choice.get("finish_reason"),
        prompt_tokens=0 if cached else int(usage.get("prompt_tokens") or 0),
        completion_tokens=0 if cached else int(usage.get("completion_tokens") or 0),
        logprobs=parse_logprobs(choice), cached=cached)


def public_reason(error: BaseException) -> str:
    """Why a stage failed, in words any search caller may read: the kind of failure, nothing of the
    endpoint's URL, its reply or the server's settings (those stay in `Degraded.detail` and the log)."""
    if isinstance(error, LLMTimeoutError):
        return "the LLM did not answer in time"
    if isinstance(error, LLMConnectionError):
        return "the LLM endpoint could not be reached"
    if isinstance(error, LLMHTTPError):
        return f"the LLM answered HTTP {error.status}"
    if isinstance(error, LLMReplyError):
        return "the LLM's replies could not be read"
    return "the stage failed (the server's log says why)"
