"""Prompts for document expansion: writing a tool profile, and judging one against the documentation.

Changing a prompt changes `PROMPT_VERSION`, which is part of every tool's expansion key: a resumed run
then redoes the tools instead of keeping profiles written under the old wording.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

PROMPT_VERSION = "expand-v1"

EXPAND_SYSTEM = (
    "You describe software tools (API endpoints, functions, commands) so that a search engine can match "
    "user requests to them. Every statement you make must be backed by the documentation you are given. "
    "You reply with a single JSON object and no other text."
)

EXPAND_TEMPLATE = """Below is the documentation of one tool. Write a profile of it as JSON:

{{"tool_profile": {{
  "function": "...",
  "tags": ["...", "..."],
  "when_to_use": "...",
  "limitations": "...",
  "example_usage": [{{"query": "...", "api_call": "..."}}]
}}}}

Keys:
- function (always): the job the tool does, in plain words, fewer than 20 words.
- tags (always): 3 to 5 different lowercase keywords or short phrases: the subject area, the main action, and words a user might type instead.
- when_to_use (only if the documentation supports it): one realistic situation in which someone needs this tool, at most 30 words.
- limitations (only if the documentation states any): required formats, value ranges, quotas, regions, preconditions.
- example_usage (only if it can be built from the documented parameters; at most 2): a request a user might make and the matching call.

Leave an optional key out entirely when the documentation gives too little to support it. Do not add features, parameters, outputs or limits that the documentation does not mention, and do not drift to another subject area.{feedback}

Documentation:
<document>
{document}
</document>"""

FEEDBACK_TEMPLATE = """

An earlier profile of this tool was rejected for these reasons:
{reasons}
Write a new profile that fixes them."""

JUDGE_SYSTEM = (
    "You check generated tool profiles against the tool's documentation. You are strict about facts and "
    "lenient about wording. You reply with a single JSON object and no other text."
)

JUDGE_TEMPLATE = """Is the profile below faithful to the documentation? A profile is faithful when every claim in it (its function, tags, usage situation, limitations and examples) is stated in or directly follows from the documentation, and nothing in it contradicts the documentation. Paraphrase and summary are fine; invented features, parameters, limits or subject areas are not.

Documentation:
<document>
{document}
</document>

Profile:
<profile>
{profile}
</profile>

Reply as {{"faithful": true or false, "reason": "one short sentence"}}."""


def expansion_messages(document: str, rejected_because: Sequence[str] = ()) -> list[dict[str, str]]:
    feedback = ""
    if rejected_because:
        feedback = FEEDBACK_TEMPLATE.format(reasons="\n".join(f"- {r}" for r in rejected_because))
    return [{"role": "system", "content": EXPAND_SYSTEM},
            {"role": "user", "content": EXPAND_TEMPLATE.format(document=document, feedback=feedback)}]


def judge_messages(document: str, profile: Mapping[str, Any]) -> list[dict[str, str]]:
    shown = json.dumps(dict(profile), ensure_ascii=False, indent=2)
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": JUDGE_TEMPLATE.format(document=document, profile=shown)}]
