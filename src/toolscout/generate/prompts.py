"""Prompts for synthetic query generation (ToolBank-style): pick tools that belong together, then polish."""

from __future__ import annotations

import json
from typing import Mapping, Sequence

GENERATE_SYSTEM = (
    "You invent realistic requests that people send to an AI assistant able to call software tools. "
    "You reply with a single JSON object and no other text."
)

GENERATE_TEMPLATE = """The assistant can call these {count} tools:

{tool_list}

Choose {low} to {high} of these tools that one person would plausibly need together for a single task, ideally because the result of one feeds another, and write the request that person would send. Pick the combination that makes most sense rather than a number of tools.

The request must:
- need every tool you chose and none of the others;
- sound like a real person: one or two sentences with concrete details (names, dates, places, amounts);
- not name the tools, not number steps, and not read like "first do this, then do that";
- differ in subject and wording from the examples below.

{examples_block}Reply as {{"tools": ["name", ...], "query": "the request"}}, with each name spelled exactly as in the list above."""

EXAMPLES_HEADER = "Examples of earlier requests (their tools may not be in today's list):\n"

STARTER_EXAMPLE = {"tools": ["find_restaurants", "book_table"],
                   "query": "Get me a table for four somewhere with good vegan food near Union Square this Friday at 7."}

POLISH_SYSTEM = (
    "You edit requests that people send to an AI assistant so that they read like something a person would "
    "actually write. You reply with a single JSON object and no other text."
)

POLISH_TEMPLATE = """Here is a request for an assistant:

<request>
{query}
</request>

If it reads like a list of steps ("do X, then Y, and finally Z"), like a conditional instruction ("if ..., then ..."), or names software functions, rewrite it as one fluent, direct request. Keep every goal, constraint and concrete detail (names, numbers, dates) so that it needs exactly the same work, and add nothing new. If it already reads naturally, return it unchanged.

Reply as {{"query": "the final request", "changed": true or false}}."""


def tool_line(name: str, description: str, parameters: Sequence[str], max_chars: int = 300) -> str:
    text = " ".join(description.split())
    if len(text) > max_chars:
        text = text[: max_chars - 3] + "..."
    line = f"- {name}: {text or '(no description)'}"
    if parameters:
        line += f" [parameters: {', '.join(parameters[:12])}]"
    return line


def generation_messages(lines: Sequence[str], low: int, high: int,
                        examples: Sequence[Mapping[str, object]]) -> list[dict[str, str]]:
    shown = list(examples) or [STARTER_EXAMPLE]
    examples_block = EXAMPLES_HEADER + "\n".join(json.dumps(e, ensure_ascii=False) for e in shown) + "\n\n"
    user = GENERATE_TEMPLATE.format(count=len(lines), tool_list="\n".join(lines), low=low, high=high,
                                    examples_block=examples_block)
    return [{"role": "system", "content": GENERATE_SYSTEM}, {"role": "user", "content": user}]


def polish_messages(query: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": POLISH_SYSTEM},
            {"role": "user", "content": POLISH_TEMPLATE.format(query=query)}]
