"""Synthetic labelled queries from a catalog (ToolBank, the Tool2Vec paper §3).

    result = generate_queries(tools, client, GenerateConfig(n=500))
    result.queries   # Query objects, split "train", labels = the tools the LLM picked
    result.report    # attempts, accepted, rejections by reason, LLM calls and tokens

One attempt: sample T tools (default 10); the LLM picks M ∈ [2, 5] of them that fit one task and writes
the request (shown a few earlier accepted requests as examples); a polish pass rewrites step-by-step or
conditional phrasing. The picked tools are the labels. An attempt is rejected, and counted by reason,
when the reply is not JSON, names a tool that is not in the sample (hallucinated, or from elsewhere in
the catalog), repeats a tool, picks too few or too many, has an empty request, spells out a tool's
identifier, or is a near duplicate of an accepted request.

Attempts run in rounds of `batch` in parallel; within a round results are taken in submission order, so
a run is reproducible from its seed, and a rerun with the same settings is answered by the LLM cache.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..benchmark_sets import Query
from ..llm import UNREADABLE_REPLIES_HINT, LLMClient, LLMError, parse_json_reply
from ..expand.runs import (BatchFailureRule, ErrorTally, Failure, RunProgress, check_models, cost_line,
                           describe_reply, reply_excerpt, unreachable)
from ..tool import Tool
from .dedupe import NearDuplicateIndex
from .prompts import generation_messages, polish_messages, tool_line

REJECT_REASONS = ("invalid_json", "unknown_tool", "not_offered", "duplicate_tool", "wrong_count", "empty_query",
                  "mentions_tool_name", "near_duplicate", "llm_error")
_TOOL_KEYS = ("tools", "functions", "selected_tools", "tool_names", "selected_functions")
_QUERY_KEYS = ("query", "instruction", "request", "user_query", "task")


@dataclass(frozen=True)
class GenerateConfig:
    n: int
    sample_size: int = 10
    min_tools: int = 2
    max_tools: int = 5
    examples: int = 3
    polish: bool = True
    model: str | None = None          # default: the client's model
    polish_model: str | None = None   # default: `model`
    temperature: float = 0.8
    dedupe_threshold: float = 0.7
    max_attempts: int | None = None   # default: 3 n + 10
    batch: int = 16
    seed: int = 0
    test_fraction: float = 0.0
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if not 1 <= self.min_tools <= self.max_tools:
            raise ValueError(f"need 1 <= min_tools <= max_tools, got {self.min_tools} and {self.max_tools}")
        if self.sample_size <= self.min_tools:
            raise ValueError(f"sample_size ({self.sample_size}) must exceed min_tools ({self.min_tools})")
        if not 0 <= self.test_fraction < 1:
            raise ValueError(f"test_fraction must be in [0, 1), got {self.test_fraction}")


@dataclass
class GenerateReport:
    attempts: int = 0
    accepted: int = 0
    rejected: Counter = field(default_factory=Counter)
    polished: int = 0        # accepted requests the polish pass rewrote
    polish_unusable: int = 0  # polish replies that held no request: the unpolished request was kept
    polish_error_kinds: ErrorTally = field(default_factory=ErrorTally)  # polish calls that failed (draft kept)
    labels_per_query: float = 0.0
    invalid_reply: str = ""  # the start of the first reply that was not the JSON asked for
    llm_error_kinds: ErrorTally = field(default_factory=ErrorTally)  # why the llm_error attempts failed
    stopped: str = ""  # why the run stopped before --n queries or --max-attempts (`BatchFailureRule`)
    llm: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"attempts": self.attempts, "accepted": self.accepted,
                "rejected": {r: self.rejected.get(r, 0) for r in REJECT_REASONS},
                "invalid_reply": self.invalid_reply, "llm_error_kinds": self.llm_error_kinds.to_dict(),
                "polished": self.polished, "polish_unusable": self.polish_unusable,
                "polish_errors": self.polish_error_kinds.total,
                "polish_error_kinds": self.polish_error_kinds.to_dict(),
                "labels_per_query": round(self.labels_per_query, 3), "stopped": self.stopped, "llm": self.llm,
                "elapsed_s": self.elapsed_s}

    def nothing_usable(self) -> str | None:
        """Why the run failed, when no attempt gave a query; None when some did. More attempts cannot
        help a server whose replies are never the JSON asked for, so that case says what came back."""
        if self.accepted or not self.attempts:
            return None
        if self.stopped:
            return self.stopped
        unreadable = self.rejected["invalid_json"] + self.rejected["llm_error"]
        if self.rejected["invalid_json"] and unreadable == self.attempts:
            return (f"the server's replies were not the JSON asked for (an object with \"tools\" and \"query\"): "
                    f"none of {self.attempts} attempts gave a query; {describe_reply(self.invalid_reply)}; "
                    f"{UNREADABLE_REPLIES_HINT}")
        rejected = ", ".join(f"{r} {n}" for r, n in self.rejected.most_common())
        return f"none of {self.attempts} attempts gave a usable query (rejected: {rejected})"

    def mostly_failed(self) -> str | None:
        """Why the run failed after writing its output: it stopped early, or most of its attempts were LLM errors."""
        return self.stopped or self.llm_error_kinds.failed_most(self.attempts, "attempts")

    def format(self, report_file: str | None = None) -> str:
        """The console summary; `report_file`: where the report JSON lists every error kind."""
        rejected = ", ".join(f"{r} {n}" for r, n in self.rejected.most_common()) or "none"
        llm = self.llm or {}
        return "\n".join([
            f"attempts: {self.attempts}   accepted: {self.accepted} ({self.labels_per_query:.2f} tools per query)",
            f"rejected: {rejected}",
            *self.llm_error_kinds.lines(report_file=report_file),
            f"polish: {self.polished} rewritten, {self.polish_unusable} unusable polish replies, "
            f"{self.polish_error_kinds.total} polish calls failed (each kept its draft)",
            *self.polish_error_kinds.lines(report_file=report_file),
            cost_line(llm),
            f"time: {self.elapsed_s:.1f}s",
        ])


@dataclass
class GeneratedQuery:
    text: str
    labels: tuple[str, ...]
    draft: str
    names: tuple[str, ...]


@dataclass
class GenerateResult:
    queries: list[Query]
    details: list[GeneratedQuery]
    report: GenerateReport


@dataclass
class _Job:
    sample: list[Tool]
    names: dict[str, str]  # shown name → tool id
    examples: list[dict[str, Any]]


@dataclass
class _Outcome:
    reason: str | None = None            # rejection reason, None when valid
    labels: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    draft: str = ""
    text: str = ""
    polished: bool = False
    polish_unusable: bool = False  # the polish reply held no request
    polish_error: str = ""  # why the polish call failed
    error: str = ""  # why the LLM request failed (reason "llm_error")
    reply: str = ""  # the start of a reply that was not the JSON asked for (reason "invalid_json")
    unreachable: bool = False  # the request failed to connect or timed out

    def failure(self) -> Failure | None:
        """The attempt as the early-stop rule sees it: None when its request was answered."""
        return Failure(self.error, self.unreachable) if self.reason == "llm_error" else None


# ------------------------------------------------------------------------------------------ helpers

def shown_names(sample: Sequence[Tool]) -> dict[str, str]:
    """Name shown to the LLM → tool id: the tool's name, or its id where two sampled names collide."""
    counts = Counter(t.name for t in sample)
    return {(t.name if counts[t.name] == 1 else t.id): t.id for t in sample}


def _parameter_names(tool: Tool) -> list[str]:
    props = (tool.parameters or {}).get("properties") if isinstance(tool.parameters, Mapping) else None
    return [str(k) for k in props] if isinstance(props, Mapping) else []


def _first(data: Mapping[str, Any], keys: Sequence[str]) -> Any:
    return next((data[k] for k in keys if k in data), None)


def check_pick(reply_text: str, names: Mapping[str, str], catalog_names: set[str], low: int,
               high: int) -> tuple[str | None, tuple[str, ...], tuple[str, ...], str]:
    """Validate a generation reply → (rejection reason or None, labels, picked names, query text)."""
    try:
        data = parse_json_reply(reply_text)
    except LLMError:
        return "invalid_json", (), (), ""
    if not isinstance(data, Mapping):
        return "invalid_json", (), (), ""
    picked, query = _first(data, _TOOL_KEYS), _first(data, _QUERY_KEYS)
    if not isinstance(picked, list) or not all(isinstance(p, str) for p in picked):
        return "invalid_json", (), (), ""
    if not isinstance(query, str) or not query.strip():
        return "empty_query", (), tuple(picked), ""
    lookup = {k.lower(): v for k, v in names.items()}
    lookup.update({v.lower(): v for v in names.values()})
    labels = []
    for name in picked:
        key = name.strip().strip("`").lower()
        if key not in lookup:
            return ("not_offered" if key in catalog_names else "unknown_tool"), (), tuple(picked), query
        labels.append(lookup[key])
    if len(set(labels)) != len(labels):
        return "duplicate_tool", (), tuple(picked), query
    if not low <= len(labels) <= high:
        return "wrong_count", (), tuple(picked), query
    query = " ".join(query.split())
    for name in names:
        if re.search(r"[_.]|[a-z][A-Z]", name) and name.lower() in query.lower():
            return "mentions_tool_name", tuple(labels), tuple(picked), query
    return None, tuple(labels), tuple(picked), query


def parse_polish(reply_text: str) -> tuple[str | None, bool]:
    """Polish reply → (request text or None if unusable, whether the model says it changed it)."""
    try:
        data = parse_json_reply(reply_text)
    except LLMError:
        return None, False
    if not isinstance(data, Mapping):
        return None, False
    query = _first(data, _QUERY_KEYS + ("refined_instruction", "refined_query", "rewritten"))
    if not isinstance(query, str) or not query.strip():
        return None, False
    return " ".join(query.split()), bool(data.get("changed", False))


def _split_of(query_id: str, seed: int, test_fraction: float) -> str:
    if test_fraction <= 0:
        return "train"
    digest = hashlib.sha256(f"{seed}\x00{query_id}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < test_fraction else "train"


# ------------------------------------------------------------------------------------------ the run

class _Generator:
    def __init__(self, tools: Sequence[Tool], client: LLMClient, config: GenerateConfig):
        if len(tools) < config.sample_size:
            raise ValueError(f"the catalog has {len(tools)} tools; sampling {config.sample_size} per attempt needs "
                             f"at least that many (lower --sample-size)")
        self.tools, self.client, self.config = list(tools), client, config
        self.catalog_names = {t.name.lower() for t in tools} | {t.id.lower() for t in tools}
        self.model = config.model or client.model
        self.polish_model = config.polish_model or self.model

    def job(self, rng: random.Random, accepted: Sequence[GeneratedQuery]) -> _Job:
        sample = rng.sample(self.tools, self.config.sample_size)
        shown = rng.sample(list(accepted), min(self.config.examples, len(accepted))) if self.config.examples else []
        return _Job(sample, shown_names(sample), [{"tools": list(g.names), "query": g.text} for g in shown])

    def run(self, job: _Job) -> _Outcome:
        by_id = {t.id: t for t in job.sample}
        lines = [tool_line(name, by_id[tid].description, _parameter_names(by_id[tid])) for name, tid in job.names.items()]
        try:
            reply = self.client.chat(generation_messages(lines, self.config.min_tools, self.config.max_tools,
                                                         job.examples),
                                     model=self.model, json_mode=True, temperature=self.config.temperature,
                                     max_tokens=self.config.max_tokens)
        except LLMError as exc:
            return _Outcome("llm_error", error=str(exc), unreachable=unreachable(exc))
        reason, labels, names, text = check_pick(reply.text, job.names, self.catalog_names,
                                                 self.config.min_tools, self.config.max_tools)
        outcome = _Outcome(reason, labels, names, text, text)
        if reason == "invalid_json":
            outcome.reply = reply_excerpt(reply)
        if reason is None and self.config.polish:
            try:
                answer = self.client.chat(polish_messages(text), model=self.polish_model, json_mode=True,
                                          temperature=0.0, max_tokens=self.config.max_tokens)
            except LLMError as exc:
                outcome.polish_error = str(exc)
                return outcome
            polished, _changed = parse_polish(answer.text)
            if polished is None:
                outcome.polish_unusable = True
            else:
                outcome.polished = polished != text
                outcome.text = polished
        return outcome


def _run_batch(gen: _Generator, jobs: list[_Job]) -> list[_Outcome]:
    """One round of attempts in parallel; the outcomes in submission order."""
    outcomes: list[_Outcome | None] = [None] * len(jobs)
    for index, outcome in gen.client.map(gen.run, jobs):
        if isinstance(outcome, BaseException):
            raise outcome
        outcomes[index] = outcome
    return [o for o in outcomes if o is not None]


def generate_queries(tools: Sequence[Tool], client: LLMClient, config: GenerateConfig, *,
                     progress: bool = True) -> GenerateResult:
    start = time.perf_counter()
    gen = _Generator(tools, client, config)
    rng = random.Random(config.seed)
    dedupe = NearDuplicateIndex(config.dedupe_threshold)
    max_attempts = config.max_attempts if config.max_attempts is not None else 3 * config.n + 10
    report = GenerateReport()
    accepted: list[GeneratedQuery] = []
    rule = BatchFailureRule(client.url)
    with RunProgress("generating", "queries", config.n, client, enabled=progress) as shown:
        check_models(client, gen.model, {"--polish-model": gen.polish_model if config.polish else None},
                     max_tokens=config.max_tokens)
        while len(accepted) < config.n and report.attempts < max_attempts:
            size = min(config.batch, config.n - len(accepted), max_attempts - report.attempts)
            outcomes = _run_batch(gen, [gen.job(rng, accepted) for _ in range(size)])
            stop = rule.check([o.failure() for o in outcomes], first=report.attempts == 0)
            if report.attempts == 0 and all(o.reason == "llm_error" for o in outcomes):
                # the whole first batch failed: the LLM is not there (or not an LLM); nothing to write
                raise LLMError(stop or f"all {size} requests of the first batch to the LLM failed; the last: "
                                       f"{outcomes[-1].error}")
            for outcome in outcomes:  # submission order: reproducible
                report.attempts += 1
                if outcome.reason is None and not dedupe.add(outcome.text):
                    outcome.reason = "near_duplicate"
                if outcome.reason is not None:
                    report.rejected[outcome.reason] += 1
                    report.invalid_reply = report.invalid_reply or outcome.reply
                    if outcome.error:
                        report.llm_error_kinds.add(outcome.error)
                    continue
                accepted.append(GeneratedQuery(outcome.text, outcome.labels, outcome.draft, outcome.names))
                report.polished += outcome.polished
                report.polish_unusable += outcome.polish_unusable
                if outcome.polish_error:
                    report.polish_error_kinds.add(outcome.polish_error)
                shown.advance()
            if stop:
                report.stopped = stop  # what was accepted is kept: the command writes it, then fails
                break
    queries = []
    for i, g in enumerate(accepted, 1):
        qid = f"gen-{i:06d}"
        queries.append(Query(qid, g.text, g.labels, _split_of(qid, config.seed, config.test_fraction)))
    report.accepted = len(accepted)
    report.labels_per_query = sum(len(g.labels) for g in accepted) / len(accepted) if accepted else 0.0
    report.llm = client.stats.to_dict()
    report.elapsed_s = round(time.perf_counter() - start, 2)
    return GenerateResult(queries, accepted, report)
