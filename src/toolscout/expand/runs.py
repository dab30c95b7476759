"""What the batch LLM commands, `expand` and `generate`, share while they run: their failed requests by kind
(`ErrorTally`), the rule that stops a run whose server is not answering, and the progress shown from the
first request.

    tally = ErrorTally()
    tally.add(str(exc))                         # a failed request, counted by kind for the report
    rule = BatchFailureRule(client.url)
    reason = rule.check(failures, first=True)   # None, or why the run stops here
    with RunProgress("expanding", "tools", 120, client) as progress:
        progress.advance("expanded")
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, TextIO

from ..llm import ChatResult, LLMClient, LLMConnectionError, LLMError, LLMReplyError, LLMTimeoutError, snippet

_NO_CONTENT = "the reply had no content"


def reply_excerpt(reply: ChatResult, limit: int = 160) -> str:
    """What a report keeps of a reply that was not the JSON asked for: its start, or, for a reply with no
    content at all (a refusal, a reasoning model out of tokens), that it had none and why it ended."""
    if reply.text.strip():
        return snippet(reply.text, limit)
    return f"{_NO_CONTENT}; finish_reason={reply.finish_reason}"


def describe_reply(excerpt: str) -> str:
    """`reply_excerpt`'s text as a failure message quotes it."""
    return excerpt if excerpt.startswith(_NO_CONTENT) else f"one reply began: {excerpt!r}"


def unreachable(exc: LLMError) -> bool:
    """The request never got a reply: nothing listens, or what listens does not answer in time."""
    return isinstance(exc, (LLMConnectionError, LLMTimeoutError))


@dataclass(frozen=True)
class Failure:
    """One failed request of a batch: its message, and whether the server was unreachable."""

    error: str
    unreachable: bool


def cost_line(llm: Mapping[str, Any]) -> str:
    """The run report's line of LLM costs (`LLMStats.to_dict()`): every call made, the failed ones too."""
    return (f"LLM: {llm.get('calls', 0)} calls ({llm.get('errors', 0)} failed), {llm.get('cache_hits', 0)} cache "
            f"hits, {llm.get('http_requests', 0)} HTTP requests ({llm.get('retries', 0)} retries), "
            f"{llm.get('prompt_tokens', 0)} prompt + {llm.get('completion_tokens', 0)} completion tokens")


# what varies between failures of one kind: any word holding a digit (timestamps, ids, token counts); the
# URL and the HTTP status are kept whole (group 1)
_VOLATILE = re.compile(r"(https?://\S+|HTTP \d{3})|[\w.:+-]*\d[\w.:+-]*")


def error_kind(message: str) -> str:
    """The kind of a failed request: its message's first line with the volatile parts blanked, so 20 failures
    whose bodies differ only in a timestamp are one kind."""
    lines = str(message).strip().splitlines()
    return _VOLATILE.sub(lambda m: m.group(1) or "#", snippet(lines[0] if lines else "(no message)"))


class ErrorTally:
    """A run's failed LLM requests by kind (`error_kind`), each with its count and one example message, for
    its report; and the one rule for when they fail the run: more than half of its requests."""

    def __init__(self) -> None:
        self.kinds: Counter = Counter()
        self.examples: dict[str, str] = {}  # kind → the first message of that kind (its first line)

    def add(self, message: str) -> None:
        kind = error_kind(message)
        self.kinds[kind] += 1
        lines = str(message).strip().splitlines()
        self.examples.setdefault(kind, snippet(lines[0] if lines else "(no message)"))

    @property
    def total(self) -> int:
        return sum(self.kinds.values())

    def to_dict(self) -> dict[str, int]:
        """{example message: count}, most common first."""
        return {self.examples[kind]: n for kind, n in self.kinds.most_common()}

    def lines(self, limit: int = 5, report_file: str | None = None) -> list[str]:
        """The most common kinds, one line each, for the console; `report_file`: where the rest are listed."""
        out = [f"  ×{n}  {self.examples[kind]}" for kind, n in self.kinds.most_common(limit)]
        if len(self.kinds) > limit:
            where = f"see {report_file}" if report_file else "--report FILE.json lists them all"
            out.append(f"  ... and {len(self.kinds) - limit} more kinds ({where})")
        return out

    def failed_most(self, requests: int, what: str) -> str | None:
        """The message that fails a run where most of its `requests` failed; None otherwise. The output
        still holds what succeeded, and a rerun retries only the rest (failures are never cached)."""
        if not requests or self.total * 2 <= requests:
            return None
        kind, n = self.kinds.most_common(1)[0]
        return (f"{self.total} of {requests} {what} failed with LLM errors (most often, ×{n}: "
                f"{self.examples[kind]}); the "
                "output holds what succeeded; rerun the same command to retry the rest")


def check_models(client: LLMClient, working: str, models: Mapping[str, str | None], *,
                 max_tokens: int | None = None) -> None:
    """Ask each model the run may use besides the `working` one (`{flag: model}`) one tiny question before
    the run, so that a misspelt --strong-model fails now, naming its flag, rather than mid-run when a draft
    first needs it (or never, when none does). The working model's check is the run's first batch
    (`BatchFailureRule`, `nothing_usable`). A failure the working model shares (a server that does not
    answer, or rejects the request) fails the run as itself, blaming no flag.

    The question carries the run's own `max_tokens` (none unless the run sends one: OpenAI's reasoning models
    reject the parameter), and any reply passes, an empty or unreadable one too: the check asks whether the
    model is there and takes the run's requests, not what it answers."""
    asked = {working}
    for flag, model in models.items():
        if not model or model in asked:
            continue
        asked.add(model)
        try:
            _ask(client, model, max_tokens)
        except LLMError as exc:
            if unreachable(exc):
                raise  # the server, not the model
            _ask(client, working, max_tokens)  # raises, as itself, when the server fails the working model too
            raise LLMError(f"{flag} {model}: the model could not be used: {exc}") from None


def _ask(client: LLMClient, model: str, max_tokens: int | None) -> None:
    try:
        client.chat([{"role": "user", "content": "Reply with the word OK."}], model=model, max_tokens=max_tokens)
    except LLMReplyError:
        pass  # answered: what it said is the run's business


class BatchFailureRule:
    """When a run stops early, rather than spend minutes on retries that cannot succeed: after a batch (the
    requests in flight together) every request of which failed to connect or timed out. The first batch: the
    server is not there; a later one: it went away. (HTTP errors are the report's business:
    `ErrorTally.failed_most`; `generate` also stops when its whole first batch failed, whatever the error.)"""

    def __init__(self, url: str):
        self.url = url

    def check(self, failures: Sequence[Failure | None], *, first: bool) -> str | None:
        """Why the run stops after this batch (`None` in `failures`: a request that was answered), or None."""
        if not failures or not all(f is not None and f.unreachable for f in failures):
            return None
        what = "the first batch" if first else "a batch"
        return (f"stopped early: all {len(failures)} requests of {what} to the LLM at {self.url} failed to "
                f"connect or timed out; the last: {failures[-1].error}")


class RunProgress:
    """Progress of a batch LLM run from its first request: a bar on a terminal, else a line every `every`
    seconds (a log file, CI). Both show the client's counts (requests sent, retries, failures) and the URL,
    so a run waiting on a dead or slow server says what it waits on."""

    def __init__(self, verb: str, unit: str, total: int, client: LLMClient, *, enabled: bool = True,
                 every: float = 10.0, stream: TextIO | None = None):
        self.verb, self.unit, self.total, self.client = verb, unit, total, client
        self.enabled, self.every = enabled and total > 0, every
        self.stream = stream if stream is not None else sys.stderr
        self.counts: Counter = Counter()
        self.done = 0
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._bar: Any = None

    def llm_status(self, url: bool = True) -> str:
        stats = self.client.stats.to_dict()
        return (f"LLM{' ' + self.client.url if url else ''}: {stats['http_requests']} requests sent, "
                f"{stats['retries']} retries, {stats['errors']} failed")

    def line(self) -> str:
        statuses = "".join(f", {k} {v}" for k, v in sorted(self.counts.items()))
        return (f"{self.verb}: {self.done} of {self.total} {self.unit} done{statuses}; {self.llm_status()}; "
                f"{time.monotonic() - self._start:.0f}s")

    def __enter__(self) -> "RunProgress":
        if not self.enabled:
            return self
        if getattr(self.stream, "isatty", lambda: False)():
            self._bar = self._rich_bar()
        else:
            self._print()
            threading.Thread(target=self._heartbeat, daemon=True, name="toolscout-progress").start()
        return self

    def advance(self, status: str | None = None) -> None:
        with self._lock:
            self.done += 1
            if status:
                self.counts[status] += 1
        if self._bar is not None:
            bar, task = self._bar
            bar.update(task, advance=1, status=" ".join(f"{k} {v}" for k, v in sorted(self.counts.items())))

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._bar is not None:
            self._bar[0].__exit__(*exc)

    def _print(self) -> None:
        with self._lock:
            text = self.line()
        print(text, file=self.stream, flush=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.every):
            self._print()

    def _rich_bar(self) -> tuple[Any, Any]:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        def status() -> str:  # the URL is in the line above the bar
            return self.llm_status(url=False)

        class LLMColumn(TextColumn):  # read at each refresh: retries show while nothing finishes
            def render(self, task: Any) -> Any:
                from rich.text import Text

                return Text(status(), style="dim")

        bar = Progress(TextColumn(self.verb), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("{task.fields[status]}"), LLMColumn(""), transient=True,
                       console=Console(file=self.stream))
        bar.__enter__()
        return bar, bar.add_task(self.verb, total=self.total, status="")
