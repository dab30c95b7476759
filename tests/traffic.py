"""Feedback traffic for tests of learning from use: many differently worded requests for one need, as agents
send them, so that an index has enough evidence to learn from (one or two events teach nothing by design)."""

import itertools

RAIN = [f"{ask} {gear} {when}" for ask, gear, when in itertools.product(
    ["do I need", "should I take", "will I need", "is it wise to bring", "must I pack"],
    ["an umbrella", "my umbrella", "a raincoat", "rain gear"], ["today", "tomorrow", "this evening", "for the walk"])]
MAIL = [f"{verb} {what} {why}" for verb, what, why in itertools.product(
    ["send", "write", "draft and send"], ["an email to my boss", "a note to the team", "a message to the landlord"],
    ["about the report", "with the agenda", "about the rent", "saying I am late"])]
RAIN_TASK = "will I need a raincoat on Sunday"  # like the RAIN requests, and none of them


def events(requests: list[str], tool: str, n: int, source: str | None = None, start: float | None = None) -> list[dict]:
    """`n` feedback events: each of the first `n` requests served by `tool`."""
    out = []
    for i, request in enumerate(requests[:n]):
        event = {"query": request, "tool_ids": [tool]}
        if source is not None:
            event["source"] = source
        if start is not None:
            event["time"] = start + i
        out.append(event)
    return out
