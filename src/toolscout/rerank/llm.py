"""The LLM reranker: an OpenAI-compatible chat model judges each (query, candidate tool) pair.

This is the LLM variant of Tool-Rank (the Tool-REX paper): for every first-stage candidate the model is asked
whether the tool's document meets the user's task and must answer with one word, `true` or `false`.
The score is not the word but the model's confidence in it,

    P(true) = m_true / (m_true + m_false),   m_word = sum of exp(logprob) over the first token's
                                             alternatives that spell the word ("true", "True", " true")

from the log-probabilities of the first generated token (`max_tokens=1`, `temperature=0`,
`logprobs=True`). A graded score is what makes this a *ranker*: a bare yes/no would leave most
candidates tied. Endpoints that return no log-probabilities still work: the answer text is read as
1.0 / 0.0 (one warning per reranker says so) and ties keep the first stage's order; so is an answer whose
two words hold less than MIN_CHOICE_MASS of the first token's probability (its own count and warning).

    reranker = LLMReranker(LLMSettings(base_url="http://localhost:8000/v1", model="qwen3-32b",
                                       cache_dir="~/.cache/toolscout-llm"))
    results = reranker.rerank(queries, candidates, tools)
    reranker.stats.to_dict()        # pairs, asked, logprob_scored, text_fallbacks, errors, cached, ...

Batching: all pairs of all queries go through the client's bounded thread pool at once; a pair that
occurs twice in one call (same query text, same tool text) is asked once; the client's response cache
(`cache_dir`) answers repeated pairs across runs without an HTTP request.

Errors (timeout, HTTP error, unreachable server, unusable reply) are per pair. `on_error="fallback"`
(default) keeps the first stage's list (order and scores, `rerank.base`) for every query that lost a pair —
a half-judged list would mix LLM scores with missing ones — and warns once per call
(`errors.DegradedResults`); `on_error="raise"` raises the `LLMError`, its message naming the query index
and the tool id. A search never waits for the LLM longer than `deadline` seconds (per query of the call,
retries included): pairs not judged by then have failed. An endpoint that failed to connect or to answer in
time, in a call where it answered no pair, is not asked for `endpoint_pause` seconds (`EndpointBreaker`): the
searches meanwhile fall back at once, except for pairs the cache answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..artifacts import read_config
from ..errors import DegradedResults
from ..llm import (
    DEFAULT_KEY_ENV,
    ChatResult,
    LLMClient,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMNotSentError,
    LLMReplyError,
    LLMSettingError,
    LLMSettings,
    LLMTimeoutError,
    SettingHints,
    MIN_CHOICE_MASS,
    choice_probability,
    public_reason,
    snippet,
)
from ..results import Degraded, Results
from ..tool import TextView, Tool, tool_text
from .base import (
    DEFAULT_DEPTH,
    FORMAT_VERSION,
    RERANKER_KIND,
    check_candidates,
    checked_settings,
    judged_or_kept,
    write_reranker_config,
)

ON_ERROR = ("fallback", "raise")
DEFAULT_DEADLINE = 5.0  # seconds a rerank call may spend per query: a search waits no longer for the LLM
DEFAULT_ENDPOINT_PAUSE = 30.0  # seconds an endpoint that failed to connect or answer in time is not asked

SYSTEM_PROMPT = ("You decide whether a software tool can carry out a user's task. You are shown the task "
                 "and the tool's documentation. Answer with exactly one word: true if the tool meets the "
                 "task, false if it does not. Write nothing else.")
USER_TEMPLATE = ("Task:\n{query}\n\nTool documentation:\n{document}\n\n"
                 "Does this tool meet the task? Answer true or false.")

_TRUE_WORDS = frozenset({"true", "yes"})
_FALSE_WORDS = frozenset({"false", "no"})


@dataclass
class LLMRerankStats:
    """Counts over the reranker's life (all calls).

    `pairs`: (query, candidate) pairs reranked; `asked`: distinct pairs put to the client (duplicates
    within a call are asked once), each ending as exactly one of `logprob_scored`, `text_fallbacks` (scored
    0/1 from the answer text: no log-probabilities), `low_mass` (scored 0/1 from the answer text: true and
    false held less than MIN_CHOICE_MASS of the first token's probability) or `errors`; `cached`: asked
    pairs the client answered from its cache; `failed_queries`: queries that kept their first-stage order
    because a pair failed.
    """

    calls: int = 0
    queries: int = 0
    pairs: int = 0
    asked: int = 0
    logprob_scored: int = 0
    text_fallbacks: int = 0
    low_mass: int = 0
    errors: int = 0
    cached: int = 0
    failed_queries: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def answer_score(text: str) -> float | None:
    """1.0 for true/yes, 0.0 for false/no (case, spaces and punctuation ignored), None otherwise."""
    word = re.sub(r"[\W_]+", "", text or "").lower()
    if word in _TRUE_WORDS:
        return 1.0
    if word in _FALSE_WORDS:
        return 0.0
    return None


def settings_from_client(client: LLMClient) -> LLMSettings:
    """Settings that rebuild `client` (without its key, which the client does not expose)."""
    return LLMSettings(base_url=client.url, model=client.model, timeout=client.timeout,
                       max_retries=client.max_retries, backoff=client.backoff, max_backoff=client.max_backoff,
                       concurrency=client.concurrency,
                       cache_dir=str(client.cache.folder) if client.cache is not None else None,
                       json_mode=client.json_mode, extra=dict(client.extra_body))


def api_key_from_env(settings: LLMSettings, config_file: str | os.PathLike | None = None, *, strict: bool = True,
                     environ: Mapping[str, str] | None = None, key: str | None = None,
                     default_env: str | None = DEFAULT_KEY_ENV) -> LLMSettings:
    """Fill `settings.api_key` as `expand` and `generate` do (`LLMSettings.fill_api_key`): `key` (given on
    purpose: it beats the environment), else the variable `api_key_env` names, else `default_env` (None: no
    other variable is read), else a key the config file holds. A variable named on purpose that is not set is
    an error when `strict` (reading a config file), else a warning (loading an index: its searches still
    answer, from the first stage)."""
    try:
        settings.fill_api_key(os.environ if environ is None else environ, key=key, key_env_flag=None,
                              default_env=default_env or "", config_file=config_file)
    except LLMSettingError as exc:
        if strict:
            raise
        warnings.warn(f"LLM reranker: {exc}; sending no API key", stacklevel=3)
    return settings


def reranker_hints(settings: LLMSettings) -> SettingHints:
    """What the reranker's error hints name: its settings, which live in the llm: config when indexing and in
    the index's reranker/config.json after (search and serve have no LLM flags)."""
    where = "the llm: config (saved in the index's reranker/config.json)"
    if settings.api_key_env:
        key = f"the LLM reranker reads the environment variable {settings.api_key_env}, named by api_key_env in {where}"
    else:
        key = (f"the LLM reranker reads the environment variable {DEFAULT_KEY_ENV} when indexing, or the one "
               f"api_key_env in {where} names; an index whose config names none sends no key")
    return SettingHints(key=key, timeout=f"timeout in {where}", base_url=f"base_url in {where}",
                        deadline="the reranker's deadline setting, e.g. --rerank-option deadline=10 when indexing")


class EndpointPaused(LLMConnectionError):
    """A pair not asked because the endpoint is paused (`EndpointBreaker`): no new failure of the endpoint."""


def _endpoint_failure(error: BaseException) -> bool:
    """Whether an error says the endpoint is unreachable or too slow: a request sent that could not connect
    or got no reply in time. Not a request left unsent for want of time (the caller's deadline or busy slots
    say nothing of the endpoint), nor a pair skipped during a pause."""
    return (isinstance(error, (LLMConnectionError, LLMTimeoutError))
            and not isinstance(error, (LLMNotSentError, EndpointPaused)))


class EndpointBreaker:
    """Remembers an endpoint that just failed to connect or to answer in time, so that the searches of the
    next `pause` seconds fall back at once instead of each paying the timeouts. The first search after the
    pause asks it again; an answer from it clears the failure, another failure starts a new pause. It is told
    once per rerank call (`record_call`): a call in which any pair got an answer never starts a pause."""

    def __init__(self, pause: float = DEFAULT_ENDPOINT_PAUSE, clock=time.monotonic):
        self.pause, self._clock = float(pause), clock
        self._lock = threading.Lock()
        self._failed_at: float | None = None
        self._reason = ""

    def skip_reason(self) -> str | None:
        """Why the endpoint is not to be asked now; None when it is."""
        with self._lock:
            ago = None if self._failed_at is None else self._clock() - self._failed_at
            if ago is None or ago >= self.pause:
                return None
            return (f"not asked: it failed {ago:.1f} s ago ({self._reason}), so it is skipped for "
                    f"{self.pause:g} s (endpoint_pause)")

    def record_call(self, answered: bool, errors: Sequence[BaseException]) -> None:
        """What one rerank call saw: whether the endpoint answered any of its requests, and its errors. An
        answer clears a failure; with none, a request that could not connect or got no reply starts a pause."""
        with self._lock:
            if answered:
                self._failed_at = None
                return
            failure = next((e for e in errors if _endpoint_failure(e)), None)
            if failure is not None:
                self._failed_at, self._reason = self._clock(), snippet(str(failure), 160)


def _endpoint_answered(outcome: Any) -> bool:
    """Whether a pair's outcome came from the endpoint itself: a fresh reply, usable or not, or an HTTP answer
    (an error status or an unusable body: it is reachable and answering)."""
    if isinstance(outcome, ChatResult):
        return not outcome.cached
    return isinstance(outcome, (LLMHTTPError, LLMReplyError))


@dataclass
class _Pairs:
    """The distinct (query text, tool document) prompts of a rerank call: `prompts` maps each to its index,
    `first_asker[i]` is the first (query index, tool id) that asks prompt i, and `slots[q][j]` is the
    prompt of query q's j-th candidate."""

    prompts: dict[tuple[str, str], int] = field(default_factory=dict)
    first_asker: list[tuple[int, str]] = field(default_factory=list)
    slots: list[list[int]] = field(default_factory=list)


def _judged(candidates: Results, slots: list[list[int]], scores: list[float | None],
            failures: Mapping[int, LLMError]) -> tuple[list[np.ndarray | None], int]:
    """Each query's LLM scores, None for a query that lost a pair, and how many did. Such a query keeps
    the first stage's list (`rerank.base`): a half-judged list would mix LLM scores with missing ones."""
    judged: list[np.ndarray | None] = []
    for q in range(len(candidates)):
        failed = any(s in failures for s in slots[q])
        judged.append(None if failed else np.asarray([scores[s] for s in slots[q]], dtype=np.float32))
    return judged, sum(j is None for j in judged)


def _kept_because(candidates: Results, slots: list[list[int]],
                  failures: Mapping[int, LLMError]) -> list[Degraded | None]:
    """Per query that lost a pair, its first failure (the tool named): what its answer says of the fallback."""
    firsts = [next((j for j, s in enumerate(slots[q]) if s in failures), None) for q in range(len(candidates))]
    return [None if j is None else Degraded("LLM reranker", public_reason(failures[slots[q][j]]),
                                            f"{failures[slots[q][j]]} (tool {candidates.ids[q][j]!r})")
            for q, j in enumerate(firsts)]


class LLMReranker:
    """Reorders candidates by an LLM's P(true) that the tool meets the task (see the module docstring).

    `settings` builds the client (or pass a ready `client`; both: the client is used, the settings
    are what `save` writes). `depth`: first-stage candidates wanted per query. `view`: which parts
    of a tool make its document, cut to `max_doc_chars`. `on_error`: "fallback" or "raise".
    `top_logprobs`: alternatives asked for at the answer token (both words must be among them).
    `deadline`: seconds a rerank call may spend per query (a search: its whole wait for the LLM, retries
    included); pairs not judged by then have failed, and their queries keep the first stage's list.
    `endpoint_pause`: seconds an endpoint that failed to connect or answer in time is not asked (`EndpointBreaker`).
    """

    name = "llm"
    # constructor arguments, then single LLM settings (model=..., cache_dir=...) that override the saved ones
    settings = ("depth", "view", "max_doc_chars", "on_error", "top_logprobs", "deadline", "endpoint_pause", "client",
                "settings", *LLMSettings.__dataclass_fields__)

    def __init__(self, settings: LLMSettings | None = None, *, client: LLMClient | None = None,
                 depth: int = DEFAULT_DEPTH, view: TextView | None = None, max_doc_chars: int = 1500,
                 on_error: str = "fallback", top_logprobs: int = 5, deadline: float = DEFAULT_DEADLINE,
                 endpoint_pause: float = DEFAULT_ENDPOINT_PAUSE):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if int(depth) < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        if int(max_doc_chars) < 1:
            raise ValueError(f"max_doc_chars must be at least 1, got {max_doc_chars}")
        if not 0 <= int(top_logprobs) <= 20:  # the OpenAI API accepts 0..20
            raise ValueError(f"top_logprobs must be between 0 and 20, got {top_logprobs}")
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not deadline > 0:
            raise ValueError(f"deadline must be a number of seconds above 0, got {deadline!r}")
        if isinstance(endpoint_pause, bool) or not isinstance(endpoint_pause, (int, float)) or not endpoint_pause >= 0:
            raise ValueError(f"endpoint_pause must be a number of seconds, 0 or more, got {endpoint_pause!r}")
        if settings is None and client is None:
            raise ValueError("LLMReranker needs LLM settings (base_url, model) or a client")
        self._owns_client = client is None
        self.client = client if client is not None else settings.client(hints=reranker_hints(settings))
        self.settings = settings if settings is not None else settings_from_client(client)
        self.depth = int(depth)
        self.view = view or TextView()
        self.max_doc_chars = int(max_doc_chars)
        self.on_error = on_error
        self.top_logprobs = int(top_logprobs)
        self.deadline = float(deadline)
        self.breaker = EndpointBreaker(float(endpoint_pause))
        self.stats = LLMRerankStats()
        self._warned_text_scores: set[str] = set()  # the reasons already warned of (`_warn_text_scores`)
        self._key_not_saved: str | None = None  # said when saved: a key from a config file that searches lack

    # lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> "LLMReranker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # prompting ---------------------------------------------------------------------------
    def document(self, tool: Tool) -> str:
        return tool_text(tool, self.view)[: self.max_doc_chars]

    @staticmethod
    def messages(query: str, document: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": USER_TEMPLATE.format(query=query.strip(), document=document)}]

    def _ask(self, pair: tuple[str, str], deadline: float) -> ChatResult:
        query, document = pair
        hit = self.client.cached_reply(self.messages(query, document), **self._answer_params())
        if hit is not None and self._usable(hit):  # a cached pair needs no endpoint, paused or not
            return hit
        skipped = self.breaker.skip_reason()
        if skipped is not None:
            raise EndpointPaused(f"{self.client.url}: {skipped}")
        # the cache was just read: a reply it holds that is no judgement ("maybe", "") is asked again, not kept
        return self._request(query, document, deadline, use_cache=False)

    def _usable(self, result: ChatResult) -> bool:
        try:
            self.score_reply(result)
        except LLMReplyError:
            return False
        return True

    def _answer_params(self) -> dict[str, Any]:
        # One token is all the answer needs; its log-probabilities carry the score.
        return dict(temperature=0.0, max_tokens=1, logprobs=True, top_logprobs=self.top_logprobs or None)

    def _request(self, query: str, document: str, deadline: float, use_cache: bool = True) -> ChatResult:
        return self.client.chat(self.messages(query, document), deadline=deadline, use_cache=use_cache,
                                **self._answer_params())

    def endpoint_problem(self) -> str | None:
        """Why the endpoint cannot be used, from one tiny request shaped as a search's (the same parameters,
        within `deadline`, never from the cache); None when it answered, whatever it said. `index` warns with
        it, so that an index is not written for an endpoint its searches cannot reach without a word."""
        try:
            self._request("check", "a tool", time.monotonic() + self.deadline, use_cache=False)
        except LLMReplyError:
            return None  # it answered; what it says is each search's business
        except LLMError as exc:
            return str(exc)
        return None

    def score_reply(self, result: ChatResult) -> tuple[float, str]:
        """(score, where it came from: "logprobs", "text" when the reply has no log-probabilities, "low_mass"
        when true and false hold less than MIN_CHOICE_MASS of them). Raises LLMReplyError when the answer is
        neither true nor false."""
        p = choice_probability(result, "true", "false")
        if p is not None:
            return p, "logprobs"
        p = answer_score(result.text)
        if p is None:
            raise LLMReplyError(f"the model answered {result.text[:80]!r}, expected true or false")
        return p, "low_mass" if result.logprobs else "text"  # logprobs there: true and false held too little

    # reranking ---------------------------------------------------------------------------
    def rerank(self, queries: Sequence[str], candidates: Results, tools: Mapping[str, Tool],
               first_stage: Any = None) -> Results:
        check_candidates(queries, candidates)
        pairs = self._distinct_pairs(queries, candidates, tools)
        self.stats.calls += 1
        self.stats.queries += len(queries)
        self.stats.pairs += sum(len(r) for r in pairs.slots)
        self.stats.asked += len(pairs.prompts)
        # a batch of N queries (a batch search, `eval`) has N deadlines in all: each query's pairs wait in turn
        scores, failures, sources = self._judge(pairs, time.monotonic() + self.deadline * max(1, len(queries)))
        self._warn_text_scores(sources, len(pairs.prompts))
        judged, failed_queries = _judged(candidates, pairs.slots, scores, failures)
        if failures:
            self.stats.failed_queries += failed_queries
            q, tool_id = pairs.first_asker[min(failures)]
            reason = f"{failures[min(failures)]} (tool {tool_id!r})"
            warnings.warn(DegradedResults(
                f"LLM reranker: {len(failures)} of {len(pairs.prompts)} pairs failed, so {failed_queries} of "
                f"{len(queries)} queries keep their first-stage order; first error (query {q}, tool "
                f"{tool_id!r}): {failures[min(failures)]}",
                stage="LLM reranker", queries=failed_queries, fallback="they kept the first stage's order",
                reason=reason), stacklevel=2)
        return judged_or_kept(candidates, judged, _kept_because(candidates, pairs.slots, failures))

    def _warn_text_scores(self, sources: Mapping[str, int], asked: int) -> None:
        """Once per reranker and reason: scores read 0/1 from the answer text, not from log-probabilities."""
        endpoint = f"the endpoint {self.client.url} (model {self.client.model!r})"
        outcome = "so those scores are 0/1 from the answer text and ties keep the first-stage order"
        if sources.get("text") and "text" not in self._warned_text_scores:
            self._warned_text_scores.add("text")
            warnings.warn(f"LLM reranker: {endpoint} gives no log-probabilities ({sources['text']} of {asked} "
                          f"pairs), {outcome}", stacklevel=3)
        if sources.get("low_mass") and "low_mass" not in self._warned_text_scores:
            self._warned_text_scores.add("low_mass")
            warnings.warn(f"LLM reranker: {endpoint} gives log-probabilities, but in {sources['low_mass']} of "
                          f"{asked} pairs true and false together hold less than {MIN_CHOICE_MASS:.0%} of the first "
                          f"token's probability (its likeliest tokens are other words), {outcome}", stacklevel=3)

    def _distinct_pairs(self, queries: Sequence[str], candidates: Results, tools: Mapping[str, Tool]) -> "_Pairs":
        """Every (query, candidate) pair, mapped to a distinct prompt: equal pairs are asked once."""
        docs: dict[str, str] = {}
        pairs = _Pairs()
        for q, (ids, _scores) in enumerate(candidates):
            row = []
            for tool_id in ids:
                tool_id = str(tool_id)
                if tool_id not in docs:
                    if tool_id not in tools:
                        raise KeyError(f"candidate {tool_id!r} of query {q} is not in the tools given to the reranker")
                    docs[tool_id] = self.document(tools[tool_id])
                key = (str(queries[q]), docs[tool_id])
                if key not in pairs.prompts:
                    pairs.prompts[key] = len(pairs.prompts)
                    pairs.first_asker.append((q, tool_id))
                row.append(pairs.prompts[key])
            pairs.slots.append(row)
        return pairs

    def _judge(self, pairs: "_Pairs", deadline: float
               ) -> tuple[list[float | None], dict[int, LLMError], dict[str, int]]:
        """Ask the model about every distinct pair: (score per pair, None where it failed; the failures;
        how many scores came from each source `score_reply` names)."""
        scores: list[float | None] = [None] * len(pairs.prompts)
        failures: dict[int, LLMError] = {}
        sources = dict.fromkeys(("logprobs", "text", "low_mass"), 0)
        answered = False  # whether the endpoint itself answered any pair (a reply read from the cache is no sign)
        # Results are scored here, on the caller's thread, so the counters need no lock.
        outcomes = self.client.map(functools.partial(self._ask, deadline=deadline), list(pairs.prompts))
        with contextlib.closing(outcomes), self._tell_breaker(lambda: answered, failures):
            for index, outcome in outcomes:
                answered = answered or _endpoint_answered(outcome)
                if isinstance(outcome, ChatResult):
                    self.stats.cached += outcome.cached
                    try:
                        score, source = self.score_reply(outcome)
                    except LLMReplyError as exc:
                        outcome = exc
                    else:
                        scores[index] = score
                        sources[source] += 1
                        self.stats.logprob_scored += source == "logprobs"
                        self.stats.text_fallbacks += source == "text"
                        self.stats.low_mass += source == "low_mass"
                        continue
                if not isinstance(outcome, LLMError):
                    raise outcome  # a bug, not a server problem: never hidden behind the fallback
                self.stats.errors += 1
                if self.on_error == "raise":
                    q, tool_id = pairs.first_asker[index]
                    # Same exception type and attributes (e.g. an HTTP status), with the pair named.
                    outcome.args = (f"LLM reranker: query {q}, tool {tool_id!r}: {outcome}",)
                    failures[index] = outcome
                    raise outcome
                failures[index] = outcome
        return scores, failures, sources

    @contextlib.contextmanager
    def _tell_breaker(self, answered, failures: Mapping[int, LLMError]):
        """Tells the breaker what the rerank call saw once it ends (raising early too): `answered()` says
        whether the endpoint answered any pair."""
        try:
            yield
        finally:
            self.breaker.record_call(answered(), list(failures.values()))

    # saving ------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        settings = dataclasses.asdict(self.settings)
        settings.pop("api_key", None)  # never on disk: `api_key_env` names where to find it
        return {"settings": settings, "depth": self.depth, "max_doc_chars": self.max_doc_chars,
                "on_error": self.on_error, "top_logprobs": self.top_logprobs, "deadline": self.deadline,
                "endpoint_pause": self.breaker.pause, "view": self.view.to_dict()}

    def save(self, folder: Path) -> None:
        if self._key_not_saved:
            warnings.warn(self._key_not_saved, stacklevel=2)
        elif self.settings.api_key and not self.settings.api_key_env:
            warnings.warn("LLM reranker: its API key is not saved (keys never are) and its settings name no "
                          "api_key_env, so the saved reranker sends no key: name the variable that holds it with "
                          "api_key_env", stacklevel=2)
        write_reranker_config(Path(folder), self.name, **self.config())

    @classmethod
    def load(cls, folder: str | Path, **options: Any) -> "LLMReranker":
        """Rebuild a saved reranker. `options` override saved values: the constructor's arguments
        (depth=..., on_error=..., client=..., settings=...) or single LLM settings (model=..., cache_dir=...)."""
        _folder, config = read_config(folder, kind=RERANKER_KIND, max_format=FORMAT_VERSION)
        fields = set(LLMSettings.__dataclass_fields__)
        if "settings" in options:
            settings = options.pop("settings")
        else:
            saved = {k: v for k, v in (config.get("settings") or {}).items() if k in fields}
            saved.update({k: options.pop(k) for k in list(options) if k in fields})
            settings = LLMSettings(**saved)
            # a key given here beats the environment; else only the variable the index names is read, so that a
            # default key for another service never goes to the base_url an index names
            api_key_from_env(settings, Path(_folder) / "config.json", strict=False, key=settings.api_key,
                             default_env=None)
        saved_args = ("depth", "max_doc_chars", "on_error", "top_logprobs", "deadline", "endpoint_pause")
        args: dict[str, Any] = {key: config[key] for key in saved_args if key in config}
        args["view"] = TextView.from_dict(config.get("view"))
        args.update(options)
        if isinstance(args.get("view"), Mapping):
            args["view"] = TextView.from_dict(args["view"])
        return cls(settings, **args)

    @classmethod
    def from_settings_file(cls, path: str | os.PathLike, **options: Any) -> "LLMReranker":
        """A reranker from an LLM config file (JSON/YAML with base_url, model, api_key_env, ...)."""
        options = dict(checked_settings(cls, options, path))
        fields = set(LLMSettings.__dataclass_fields__)
        overrides = {key: options.pop(key) for key in list(options) if key in fields}
        written = LLMSettings.from_file(path)
        settings = dataclasses.replace(written, **overrides)
        variable = settings.api_key_env or DEFAULT_KEY_ENV
        api_key_from_env(settings, path, key=overrides.get("api_key"))
        if settings.api_key and not settings.api_key_env:
            settings.api_key_env = variable  # saved: the index's searches read this variable, and no other
        reranker = cls(settings, **options)
        if settings.api_key and settings.api_key != os.environ.get(variable):
            given = "--rerank-option api_key" if overrides.get("api_key") else "api_key"
            reranker._key_not_saved = (
                f"{path}: {given} is not saved with the index (keys never are), so its searches send the key in the "
                f"environment variable {variable}: set it where they run, or name another with api_key_env")
        return reranker


__all__ = ["LLMReranker", "LLMRerankStats", "EndpointBreaker", "EndpointPaused", "answer_score", "SYSTEM_PROMPT",
           "USER_TEMPLATE", "DEFAULT_DEADLINE", "DEFAULT_ENDPOINT_PAUSE"]
