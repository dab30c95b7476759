"""Document expansion (Tool-REX): expand → rule checks → judge → regenerate failures with a stronger model.

    result = expand_tools(tools, client, ExpandConfig(model="qwen3-32b", strong_model="gpt-4o"),
                          journal="out/expand-journal.jsonl")
    result.tools      # the same tools, each with `profile` set where expansion succeeded
    result.report     # counts, LLM calls, tokens, cache hits

Per tool: the expansion model writes a profile from the tool's document alone; `check_profile` applies
the rules; the judge model says whether the profile is faithful to the document. A draft that fails
either is written again by `strong_model` (told why the first was rejected) and checked the same way.
A tool whose profile still fails, or whose LLM calls fail, keeps its original document: nothing is lost.

Resuming: every finished tool is appended to the journal (one JSON line, flushed and fsynced) under a
key hashed from its document and the prompt version. A later run with the same journal skips tools
already expanded with no LLM call, and retries the ones that failed (their replies, if the LLM answered,
come from the client's cache at no cost).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..llm import UNREADABLE_REPLIES_HINT, LLMClient, LLMError, parse_json_reply
from ..tool import Tool, content_hash
from .profile import ProfileParseError, ProfileRules, check_profile, parse_profile, problem_kind
from .prompts import PROMPT_VERSION, expansion_messages, judge_messages
from .runs import (BatchFailureRule, ErrorTally, Failure, RunProgress, check_models, cost_line, describe_reply,
                   reply_excerpt, unreachable)

DONE = ("expanded", "regenerated")
_DOC_SKIP_KEYS = {"profile", "tool_profile", "usage", "raw"}


@dataclass(frozen=True)
class ExpandConfig:
    """Models and limits of one expansion run. `judge_model` defaults to `model`; without
    `strong_model` a failed draft is not regenerated (the tool keeps its document)."""

    model: str
    strong_model: str | None = None
    judge_model: str | None = None
    judge: bool = True
    rules: ProfileRules = ProfileRules()
    temperature: float = 0.0
    max_tokens: int | None = None
    max_document_chars: int = 6000


@dataclass(frozen=True)
class Verdict:
    faithful: bool | None  # None: the judge's reply could not be read
    reason: str = ""


@dataclass
class Draft:
    """One attempt by one model: the profile it wrote (if readable) and what was wrong with it."""

    model: str
    profile: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    verdict: Verdict | None = None
    error: str | None = None
    reply: str = ""  # the start of a reply that held no profile object (not the JSON asked for)
    unreachable: bool = False  # `error` is a connection failure or a timeout: the server did not answer

    @property
    def ok(self) -> bool:
        return self.profile is not None and not self.problems and self.error is None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "problems": self.problems}
        if self.verdict is not None:
            out["verdict"] = {"faithful": self.verdict.faithful, "reason": self.verdict.reason}
        if self.error:
            out["error"] = self.error
        if self.reply:
            out["reply"] = self.reply
        return out


@dataclass
class ToolOutcome:
    tool_id: str
    key: str
    status: str  # expanded | regenerated | failed
    profile: dict[str, Any] | None
    drafts: list[Draft]

    def failure(self) -> Failure | None:
        """The tool's requests as the early-stop rule sees them: None when one of them was answered."""
        if not self.drafts or not all(d.error and d.profile is None for d in self.drafts):
            return None  # (a judge's failure follows an answered draft)
        return Failure(self.drafts[-1].error or "", all(d.unreachable for d in self.drafts))

    def to_record(self) -> dict[str, Any]:
        return {"key": self.key, "tool_id": self.tool_id, "status": self.status, "profile": self.profile,
                "drafts": [d.to_dict() for d in self.drafts], "prompt_version": PROMPT_VERSION,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


# ------------------------------------------------------------------------------------------ document

def tool_document(tool: Tool, max_chars: int = 6000) -> str:
    """The tool's documentation as the expansion model sees it: its source object when that is plain
    JSON (without earlier profiles or usage), else the normalised fields; truncated to `max_chars`."""
    doc: dict[str, Any] | None = None
    if isinstance(tool.raw, Mapping):
        candidate = {k: v for k, v in tool.raw.items() if k not in _DOC_SKIP_KEYS}
        try:
            json.dumps(candidate)
            doc = candidate
        except (TypeError, ValueError):
            doc = None
    if doc is None or not doc:
        doc = {"name": tool.name, "description": tool.description, "parameters": tool.parameters,
               "returns": tool.returns, "method": tool.method, "path": tool.path, "category": tool.category,
               "tags": list(tool.tags), "examples": list(tool.examples), "limitations": tool.limitations}
        doc = {k: v for k, v in doc.items() if v not in (None, "", [], {})}
    elif "name" not in doc:
        doc = {"name": tool.name, **doc}
    text = json.dumps(doc, ensure_ascii=False, default=str)
    if len(text) > max_chars:
        text = text[: max_chars - 16] + " ...(truncated)"
    return text


def expansion_key(document: str) -> str:
    """Journal key of a tool: its document and the prompt wording, hashed."""
    return content_hash(f"{PROMPT_VERSION}\x00{document}")


# ------------------------------------------------------------------------------------------ one tool

def parse_verdict(text: str) -> Verdict:
    """The judge's reply → Verdict. JSON `{"faithful": bool|"yes"|"no", "reason": ...}`, or a bare
    yes/no/true/false/pass/fail word."""
    try:
        data = parse_json_reply(text)
    except LLMError:
        data = None
    if isinstance(data, Mapping):
        reason = str(data.get("reason") or data.get("explanation") or "")
        for key in ("faithful", "consistent", "verdict", "answer", "pass"):
            if key in data:
                return Verdict(_truth(data[key]), reason)
        return Verdict(None, reason or f"no 'faithful' key in {text[:80]!r}")
    first = text.strip().split(maxsplit=1)
    return Verdict(_truth(first[0]) if first else None, first[1] if len(first) > 1 else "")


def _truth(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    word = str(value).strip().strip(".,!\"'").lower()
    if word in ("yes", "true", "pass", "faithful", "consistent"):
        return True
    if word in ("no", "false", "fail", "unfaithful", "inconsistent"):
        return False
    return None


def write_draft(client: LLMClient, document: str, config: ExpandConfig, model: str,
                rejected_because: Sequence[str] = (), cancel: threading.Event | None = None) -> Draft:
    """One model writes a profile; rule checks, then the judge. `cancel`: set when the run stops early."""
    draft = Draft(model)
    try:
        reply = client.chat(expansion_messages(document, rejected_because), model=model, json_mode=True,
                            temperature=config.temperature, max_tokens=config.max_tokens, cancel=cancel)
    except LLMError as exc:
        draft.error, draft.unreachable = str(exc), unreachable(exc)
        return draft
    try:
        draft.profile = parse_profile(reply.text)
    except ProfileParseError as exc:
        draft.problems.append(f"json: {exc}")
        draft.reply = reply_excerpt(reply)
        return draft
    draft.problems = check_profile(draft.profile, config.rules)
    if draft.problems or not config.judge:
        return draft
    try:
        answer = client.chat(judge_messages(document, draft.profile), model=config.judge_model or config.model,
                             json_mode=True, temperature=0.0, max_tokens=config.max_tokens, cancel=cancel)
    except LLMError as exc:
        draft.error, draft.unreachable = f"judge: {exc}", unreachable(exc)
        return draft
    draft.verdict = parse_verdict(answer.text)
    if draft.verdict.faithful is None:
        draft.problems.append(f"judge: unreadable verdict ({answer.text[:120]!r})")
    elif not draft.verdict.faithful:
        draft.problems.append(f"judge: unfaithful ({draft.verdict.reason or 'no reason given'})")
    return draft


def expand_tool(tool: Tool, client: LLMClient, config: ExpandConfig,
                cancel: threading.Event | None = None) -> ToolOutcome:
    """One tool's drafts (see the module's doc); `cancel`: set when the run stops early, ending its calls."""
    document = tool_document(tool, config.max_document_chars)
    key = expansion_key(document)
    first = write_draft(client, document, config, config.model, cancel=cancel)
    drafts = [first]
    if first.ok:
        return ToolOutcome(tool.id, key, "expanded", first.profile, drafts)
    if config.strong_model and not first.unreachable:  # the same server: it would not answer either
        # the strong model is told what was wrong with the draft (not about failed HTTP calls)
        second = write_draft(client, document, config, config.strong_model, rejected_because=first.problems,
                             cancel=cancel)
        drafts.append(second)
        if second.ok:
            return ToolOutcome(tool.id, key, "regenerated", second.profile, drafts)
    return ToolOutcome(tool.id, key, "failed", None, drafts)


# ------------------------------------------------------------------------------------------ journal

class Journal:
    """Append-only JSON lines, one per finished tool; a torn last line (a crash mid-write) is ignored."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def load(self) -> dict[str, dict[str, Any]]:
        records: dict[str, dict[str, Any]] = {}
        if not self.path.exists():
            return records
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and isinstance(record.get("key"), str):
                    records[record["key"]] = record  # the latest record of a key wins
        return records

    def append(self, record: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as fh:
            # a torn last line (no newline) must not swallow this record: end it first
            fh.seek(0, os.SEEK_END)
            torn = False
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                torn = fh.read(1) != b"\n"
            line = json.dumps(record, ensure_ascii=False) + "\n"
            fh.write((b"\n" if torn else b"") + line.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())


# ------------------------------------------------------------------------------------------ many tools

@dataclass
class ExpandReport:
    """What a run did. Counts are for this run; `resumed` tools were done by an earlier one."""

    tools: int = 0
    resumed: int = 0
    expanded: int = 0
    regenerated: int = 0
    regeneration_attempts: int = 0  # drafts the strong model wrote (regenerated of them passed)
    failed: int = 0
    not_attempted: int = 0
    rule_failures: int = 0
    judged_unfaithful: int = 0
    judge_unreadable: int = 0
    drafts: int = 0  # drafts this run asked for (llm_errors of them failed)
    unreadable_replies: int = 0  # drafts whose reply held no profile object
    invalid_reply: str = ""  # the start of the first such reply (`reply_excerpt`)
    last_llm_error: str = ""
    llm_error_kinds: ErrorTally = field(default_factory=ErrorTally)
    stopped: str = ""  # why the run stopped before its last tool (`BatchFailureRule`)
    problems: Counter = field(default_factory=Counter)
    llm: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def count(self, outcome: ToolOutcome) -> None:
        setattr(self, outcome.status, getattr(self, outcome.status) + 1)
        self.regeneration_attempts += len(outcome.drafts) - 1  # every draft after the first is the strong model's
        for draft in outcome.drafts:
            self.drafts += 1
            if draft.error:
                self.last_llm_error = draft.error
                self.llm_error_kinds.add(draft.error)
            if draft.reply:
                self.unreadable_replies += 1
                self.invalid_reply = self.invalid_reply or draft.reply
            if draft.verdict is not None and draft.verdict.faithful is False:
                self.judged_unfaithful += 1
            if draft.verdict is not None and draft.verdict.faithful is None:
                self.judge_unreadable += 1
            rule_problems = [p for p in draft.problems if not p.startswith("judge:")]
            if rule_problems:
                self.rule_failures += 1
            self.problems.update(problem_kind(p) for p in rule_problems)

    @property
    def llm_errors(self) -> int:
        return self.llm_error_kinds.total

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in ("tools", "resumed", "expanded", "regenerated",
                                              "regeneration_attempts", "failed",
                                              "not_attempted", "rule_failures", "judged_unfaithful",
                                              "judge_unreadable", "llm_errors", "unreadable_replies",
                                              "invalid_reply", "stopped", "elapsed_s")}
        data["llm_error_kinds"] = self.llm_error_kinds.to_dict()
        data["problems"] = dict(self.problems.most_common())
        data["llm"] = self.llm
        return data

    def nothing_usable(self) -> str | None:
        """Why the run failed, when nothing usable came back from the LLM; None otherwise.

        Every draft of this run an LLM error: the LLM is not there (or not an LLM). Every draft an error
        or a reply that is not the JSON asked for, and no tool has a profile, from this run or an earlier
        one: the server does not do what is asked. (A run that resumes finished tools is not failed for
        one tool's bad reply: its output still holds the others.)"""
        if not self.drafts:
            return None
        if self.stopped and not self.expanded + self.regenerated:
            return self.stopped
        if self.llm_errors == self.drafts:
            return f"every one of {self.drafts} requests to the LLM failed; the last: {self.last_llm_error}"
        done = self.expanded + self.regenerated + self.resumed
        if not done and self.unreadable_replies and self.llm_errors + self.unreadable_replies == self.drafts:
            return (f"the server's replies were not the JSON asked for (a tool_profile object): none of "
                    f"{self.drafts} drafts could be read; {describe_reply(self.invalid_reply)}; "
                    f"{UNREADABLE_REPLIES_HINT}")
        return None

    def mostly_failed(self) -> str | None:
        """Why the run failed after writing its output: it stopped early, or most of its drafts were LLM errors."""
        return self.stopped or self.llm_error_kinds.failed_most(self.drafts, "drafts")

    def _regenerations(self) -> str:
        """'2 of 3 tried': a bare 0 would read as 'never tried' when the strong model's drafts failed too."""
        if not self.regeneration_attempts:
            return f"{self.regenerated} (none tried)"
        return f"{self.regenerated} of {self.regeneration_attempts} tried"

    def format(self, report_file: str | None = None) -> str:
        """The console summary; `report_file`: where the report JSON lists every error kind."""
        llm = self.llm or {}
        lines = [
            f"tools: {self.tools} ({self.resumed} already done, {self.not_attempted} not attempted)",
            f"expanded: {self.expanded}   regenerated by the strong model: {self._regenerations()}   "
            f"failed (kept original document): {self.failed}",
            f"drafts breaking rules: {self.rule_failures}   judged unfaithful: {self.judged_unfaithful}   "
            f"unreadable verdicts: {self.judge_unreadable}   LLM errors: {self.llm_errors}",
            *self.llm_error_kinds.lines(report_file=report_file),
            cost_line(llm),
        ]
        for model, counts in (llm.get("by_model") or {}).items():
            lines.append(f"  {model}: {counts['calls']} calls, {counts['cache_hits']} cached, "
                         f"{counts['prompt_tokens']} + {counts['completion_tokens']} tokens")
        if self.problems:
            lines.append("rule problems: " + ", ".join(f"{k} ×{n}" for k, n in self.problems.most_common(8)))
        lines.append(f"time: {self.elapsed_s:.1f}s")
        return "\n".join(lines)


@dataclass
class ExpandResult:
    tools: list[Tool]
    report: ExpandReport
    outcomes: dict[str, dict[str, Any]]  # tool id → journal record (this run's and resumed ones)


def expand_tools(tools: Sequence[Tool], client: LLMClient, config: ExpandConfig, *,
                 journal: str | os.PathLike | None = None, progress: bool = True, limit: int | None = None,
                 on_outcome: Callable[[ToolOutcome], None] | None = None) -> ExpandResult:
    """Expand every tool (up to `limit` new ones this run); return the tools with profiles merged.

    Tools are processed `client.concurrency` at a time. Ctrl-C stops the run; what finished is in the
    journal, so the next run with the same journal picks up where this one stopped.
    """
    start = time.perf_counter()
    store = Journal(journal) if journal is not None else None
    previous = store.load() if store is not None else {}
    keys = {t.id: expansion_key(tool_document(t, config.max_document_chars)) for t in tools}
    report = ExpandReport(tools=len(tools))
    records: dict[str, dict[str, Any]] = {}
    todo = []
    for tool in tools:
        record = previous.get(keys[tool.id])
        if record is not None and record.get("status") in DONE and isinstance(record.get("profile"), Mapping):
            records[tool.id] = record
            report.resumed += 1
        else:
            todo.append(tool)
    if limit is not None and len(todo) > limit:
        report.not_attempted = len(todo) - limit
        todo = todo[:limit]

    with RunProgress("expanding", "tools", len(todo), client, enabled=progress) as shown:
        if todo:
            check_models(client, config.model, {"--strong-model": config.strong_model,
                                                "--judge-model": config.judge_model if config.judge else None},
                         max_tokens=config.max_tokens)
        _run(todo, client, config, store, records, report, shown, on_outcome)

    merged = [merge_profile(t, records.get(t.id)) for t in tools]
    report.llm = client.stats.to_dict()
    report.elapsed_s = round(time.perf_counter() - start, 2)
    return ExpandResult(merged, report, records)


def _run(todo: Sequence[Tool], client: LLMClient, config: ExpandConfig, store: Journal | None,
         records: dict[str, dict[str, Any]], report: ExpandReport, shown: RunProgress,
         on_outcome: Callable[[ToolOutcome], None] | None) -> None:
    """Expand `todo`, `client.concurrency` at a time, journalling each finished tool; stop early by the
    batch rule (the tools not reached count as not attempted). The first batch runs alone: a server that is
    not there is found out with no other request in flight. After a later batch, the tools still in flight
    are cancelled on the way out: they make no further attempt, so their threads do not hold the exit for
    their retries."""
    cancel = threading.Event()
    try:
        _run_batches(todo, client, config, store, records, report, shown, on_outcome, cancel)
    finally:
        cancel.set()


def _run_batches(todo: Sequence[Tool], client: LLMClient, config: ExpandConfig, store: Journal | None,
                 records: dict[str, dict[str, Any]], report: ExpandReport, shown: RunProgress,
                 on_outcome: Callable[[ToolOutcome], None] | None, cancel: threading.Event) -> None:
    rule, size = BatchFailureRule(client.url), client.concurrency
    finished = 0
    for first, part in ((True, todo[:size]), (False, todo[size:])):
        batch: list[Failure | None] = []
        # closed on the way out: the tools not started are cancelled
        with closing(client.map(lambda t: expand_tool(t, client, config, cancel), part)) as results:
            for _index, outcome in results:
                if isinstance(outcome, BaseException):
                    raise outcome
                _keep(outcome, store, records, report, shown, on_outcome)
                finished += 1
                batch.append(outcome.failure())
                if len(batch) == size and finished < len(todo):
                    report.stopped = rule.check(batch, first=first) or ""
                    batch, first = [], False
                    if report.stopped:
                        report.not_attempted += len(todo) - finished
                        return


def _keep(outcome: ToolOutcome, store: Journal | None, records: dict[str, dict[str, Any]], report: ExpandReport,
          shown: RunProgress, on_outcome: Callable[[ToolOutcome], None] | None) -> None:
    """A finished tool: journalled (flushed), recorded, counted, shown."""
    record = outcome.to_record()
    if store is not None:
        store.append(record)
    records[outcome.tool_id] = record
    report.count(outcome)
    if on_outcome is not None:
        on_outcome(outcome)
    shown.advance(outcome.status)


def merge_profile(tool: Tool, record: Mapping[str, Any] | None) -> Tool:
    """The tool with its new profile; unchanged when expansion failed (its document stays as it was)."""
    if record is None or record.get("status") not in DONE or not isinstance(record.get("profile"), Mapping):
        return tool
    return tool.with_changes(profile=dict(record["profile"]))
