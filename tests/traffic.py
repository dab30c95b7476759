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

CALENDAR = [f"{verb} {what} {when}" for verb, what, when in itertools.product(
    ["put", "add", "schedule"], ["a meeting with the design team", "my dentist appointment", "a call with the bank"],
    ["on Monday morning", "next Friday at noon", "in my calendar for tomorrow"])]
FILES = [f"{verb} {what}" for verb, what in itertools.product(
    ["open", "read", "show me", "print"], ["the notes file", "the config file on disk", "the todo list file",
                                           "the log file from yesterday"])]
FACTS = [f"{verb} {what}" for verb, what in itertools.product(
    ["remember that", "keep in mind that", "note that", "store the fact that"],
    ["my sister likes tea", "the office moves in spring", "our wifi code changed", "the boss prefers short mails"])]


def mixed(tools: dict[str, str], each: int, source: str | None = None, start: float | None = None) -> list[dict]:
    """`each` events per request family, each family served by the tool `tools` maps it to (at least five
    families: a calibration needs several taught tools before similarity earns anything)."""
    families = {"rain": RAIN, "mail": MAIL, "calendar": CALENDAR, "files": FILES, "facts": FACTS}
    out = []
    for family, tool in tools.items():
        out += events(families[family], tool, each, source, None if start is None else start + len(out))
    return out
