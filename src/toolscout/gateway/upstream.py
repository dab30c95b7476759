"""The contract every upstream honours, whatever it speaks (MCP over stdio or HTTP, an OpenAPI service).

An upstream runs under the gateway's supervision (`run`): it connects, lists its tools and hands them to the
gateway (`Listing`), keeps its listing current, and reconnects with backoff when it fails. `call` forwards
one tool call and returns the upstream's result as MCP's wire form of a tool result (`ToolResult`); when
the upstream cannot be reached it raises `UpstreamUnavailable`, whose message names the upstream and says
why, within the call's timeout. Its `status` is what `/health` shows.

What the protocol carries besides a call's arguments and result passes through too: the agent's side of a
call (`Relay`) takes the upstream's progress notifications and its questions for the user (elicitation);
cancelling the task that awaits `call` cancels the call upstream. An MCP upstream's prompts, resources and
resource templates (`Extras`) are listed with its tools, and `request` forwards the requests that read
them; what changes among them is reported through the `Notice` callback `run` is given.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

from ..errors import ToolScoutError
from ..tool import Tool

STATES = ("starting", "up", "down", "disabled")
# A tools/call result as MCP sends it: {"content": [...], "structuredContent"?, "isError"?, "_meta"?}. The
# gateway passes these dicts through as they came, without building the SDK's models for them.
ToolResult = dict[str, Any]
INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 30.0  # a connection that lasted this long resets the backoff
PAST = "past"  # begins a last error that no longer holds (`UpstreamStatus.change`)


class UpstreamUnavailable(ToolScoutError):
    """A call could not be forwarded: the upstream is down, timed out (`timed_out`), or dropped the
    connection. The message names the upstream and says why."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class ListingNotRecorded(ToolScoutError):
    """The gateway could not record an upstream's listing (its database did not answer, say). The upstream is
    not at fault: a connected one stays connected, its calls go on, and the listing is tried again later."""


class UpstreamRefused(ToolScoutError):
    """The upstream answered a request with a JSON-RPC error (`code`); the message names the upstream."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Listing:
    """One listing of an upstream's tools: the tools read from it, and the ones skipped with the reason."""

    upstream: str
    tools: Sequence[Tool]
    skipped: Sequence[tuple[str, str]] = ()  # (where in the listing, why)


# What the gateway does with a listing (index the tools); awaited before the upstream counts as up. It raises
# ListingNotRecorded when the listing could not be recorded.
ListingSink = Callable[[Listing], Awaitable[None]]
# What an upstream reports besides its tools: (upstream, what, uri) with what "prompts" or "resources" (its
# list changed) or "updated" (the subscribed resource `uri` changed).
Notice = Callable[[str, str, "str | None"], Awaitable[None]]
Progress = Callable[[float, "float | None", "str | None"], Awaitable[None]]


@dataclass(frozen=True)
class Relay:
    """The agent's side of one forwarded request: where the upstream's progress goes (None: the agent asked
    for none), and who answers the upstream's `elicitation/create` (its params; the agent's result) (None:
    the agent's client cannot be asked)."""

    progress: Progress | None = None
    elicit: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None


NO_RELAY = Relay()


@dataclass(frozen=True)
class Extras:
    """An MCP upstream's prompts, resources and resource templates as it last listed them (wire dicts), and
    whether it takes resource subscriptions."""

    prompts: tuple[dict[str, Any], ...] = ()
    resources: tuple[dict[str, Any], ...] = ()
    templates: tuple[dict[str, Any], ...] = ()
    subscribe: bool = False
    completions: bool = False


@dataclass
class UpstreamStatus:
    """What `/health` shows of one upstream."""

    name: str
    kind: str
    target: str
    state: str = "starting"
    tools: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    last_error: str | None = None
    connects: int = 0
    since: float = field(default_factory=time.time)
    restarts_for_hangs: int = 0  # restarts because it stopped answering (missed pings, timed-out calls)

    @property
    def listed(self) -> bool:
        """Whether it has listed its tools since the gateway started (a connection counts once its listing was
        handed to the gateway, and so its definitions compared with those approved)."""
        return self.connects > 0

    def change(self, state: str, error: str | None = None) -> None:
        """Enter `state`; `error`: why. Up again (or its listing recorded again), the last error is marked past."""
        if state != self.state:
            self.state, self.since = state, time.time()
        if error is not None:
            self.last_error = error
        elif state == "up" and self.last_error and not self.last_error.startswith(PAST):
            self.last_error = f"{PAST} (over by {_clock(time.time())}): {self.last_error}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "target": self.target, "state": self.state,
                "tools": self.tools, "skipped": self.skipped[:20], "last_error": self.last_error,
                "connects": self.connects, "since": round(self.since, 3),
                "restarts_for_hangs": self.restarts_for_hangs}


class Upstream(Protocol):
    name: str
    timeout: float  # seconds one call may take
    forward_headers: tuple[str, ...]  # the agent's request headers this upstream's calls may carry
    status: UpstreamStatus

    extras: Extras  # its prompts and resources (none for an OpenAPI service)

    async def run(self, sink: ListingSink, notice: Notice | None = None) -> None:
        """Connect, list, keep the listing current and reconnect with backoff, until cancelled."""
        ...

    async def call(self, tool: Tool, arguments: Mapping[str, Any], headers: Mapping[str, str],
                   relay: Relay = NO_RELAY) -> ToolResult:
        """Forward one call of `tool` (one of this upstream's) and return its result; raise
        `UpstreamUnavailable` when the upstream cannot answer within `timeout`."""
        ...

    async def request(self, method: str, params: Mapping[str, Any], relay: Relay = NO_RELAY) -> dict[str, Any]:
        """Forward one MCP request (prompts/get, resources/read, ...) and return its result; raise
        `UpstreamUnavailable` as `call` does, and `UpstreamRefused` when the upstream answered with an error."""
        ...

    async def wait_up(self, within: float) -> bool:
        """Wait (up to `within` seconds) while the upstream is starting; whether it is up."""
        ...

    async def relist(self) -> None:
        """List the tools again now (and hand them to the sink); a no-op while disconnected."""
        ...


class Backoff:
    """Seconds to wait before the next reconnection: doubling from `INITIAL_BACKOFF_S` to `MAX_BACKOFF_S`,
    back to the start once a connection has lasted `STABLE_AFTER_S`."""

    def __init__(self) -> None:
        self.delay = INITIAL_BACKOFF_S

    def next(self, connected_for: float) -> float:
        if connected_for >= STABLE_AFTER_S:
            self.delay = INITIAL_BACKOFF_S
        delay, self.delay = self.delay, min(self.delay * 2, MAX_BACKOFF_S)
        return delay


def next_attempt(delay: float) -> str:
    """When a failed upstream is tried again, in clock times (not "in 0.5 s": the reason is read, in errors and
    /health, long after it was written)."""
    now = time.time()
    return f"as of {_clock(now)}; next attempt at {_clock(now + delay)}"


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(when))


def timed_out(section: str, name: str, what: str, timeout: float, told: str = "") -> UpstreamUnavailable:
    """A request of upstream `name` (an entry of the config's `section`) got no answer within its `timeout`:
    the error says the request may have run, and which setting allows more time."""
    return UpstreamUnavailable(f"upstream {name!r} did not answer {what} within its timeout of {timeout:g} s "
                               f"({told}it may have run in part); a call that needs longer needs a higher "
                               f"`timeout` in {section}.{name} of the gateway's config", timed_out=True)


def sent_and_lost(name: str, what: str, why: str, then: str = "") -> UpstreamUnavailable:
    """Upstream `name` failed (`why`) after `what` was sent: the error says it may have run, so the agent
    calls again only if that is safe (a payment must not be made twice). `then`: what the gateway does now."""
    return UpstreamUnavailable(f"upstream {name!r} failed during {what}: {why.rstrip('.')}{then}. It was sent "
                               "and may have run: call it again only if running it twice is safe")


def error_result(message: str) -> ToolResult:
    """A tool result that reports `message` as an error (what the agent sees of a failed call)."""
    return {"content": [{"type": "text", "text": message}], "isError": True}


def text_result(payload: Any) -> ToolResult:
    """A tool result carrying `payload` as structured content and as its JSON text."""
    return {"content": [{"type": "text", "text": json.dumps(payload)}], "structuredContent": payload}
