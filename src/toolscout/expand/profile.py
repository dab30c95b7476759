"""The `tool_profile` an expansion model writes, and the rule checks it must pass before any judge sees it.

A profile (the Tool-REX paper):

    function       required  what the tool does, fewer than 20 words
    tags           required  3–5 distinct lowercase keywords / short phrases
    when_to_use    optional  a realistic situation that calls for the tool
    limitations    optional  restrictions the documentation states
    example_usage  optional  at most 2 {query, api_call} examples

`parse_profile` reads a model's reply (JSON, maybe fenced, maybe wrapped in `{"tool_profile": ...}`),
maps known aliases (`function_description`, `limitation`, ...) to these names and drops optional fields
left empty ("", [], "N/A"). `check_profile` lists every rule the result breaks; an empty list passes.
Nothing is silently repaired that a rule is meant to catch (upper-case tags, too many words).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from ..tool import PROFILE_FIELDS

REQUIRED = ("function", "tags")
OPTIONAL = ("when_to_use", "limitations", "example_usage")
ALIASES = {
    "function_description": "function", "description": "function", "purpose": "function",
    "keywords": "tags", "when": "when_to_use", "use_cases": "when_to_use", "usage_scenarios": "when_to_use",
    "limitation": "limitations", "constraints": "limitations",
    "examples": "example_usage", "example_usages": "example_usage", "example": "example_usage",
}
_EMPTY_WORDS = {"", "n/a", "na", "none", "null", "not applicable", "not specified", "unknown", "-"}


@dataclass(frozen=True)
class ProfileRules:
    """Limits the rule check applies. Word counts split on whitespace."""

    max_function_words: int = 19  # "fewer than 20"
    min_tags: int = 3
    max_tags: int = 5
    max_tag_words: int = 4
    max_when_words: int = 30
    max_limitation_words: int = 50
    max_examples: int = 2
    max_example_chars: int = 400


class ProfileParseError(ValueError):
    """The reply holds no profile object."""


def parse_profile(text: str) -> dict[str, Any]:
    """A model's reply → a profile dict with canonical keys (raises ProfileParseError when unusable)."""
    from ..llm import LLMReplyError, parse_json_reply

    try:
        data = parse_json_reply(text)
    except LLMReplyError as exc:
        raise ProfileParseError(f"invalid JSON ({exc})") from None
    if isinstance(data, Mapping) and isinstance(data.get("tool_profile"), Mapping):
        data = data["tool_profile"]
    elif isinstance(data, Mapping) and "tool_profile" in data:
        raise ProfileParseError(f"not an object ('tool_profile' is a {type(data['tool_profile']).__name__})")
    if not isinstance(data, Mapping):
        raise ProfileParseError(f"not an object (got a JSON {type(data).__name__})")
    return normalise_profile(data)


def normalise_profile(data: Mapping[str, Any]) -> dict[str, Any]:
    """Canonical key names, trimmed strings, list-valued prose fields joined, empty optional fields dropped.

    Keys outside the profile schema are dropped (they never reach a text view)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).strip().lower().replace(" ", "_").replace("-", "_")
        name = ALIASES.get(name, name)
        if name not in PROFILE_FIELDS or name in out:
            continue
        out[name] = _clean(value)
    for key in ("when_to_use", "limitations"):
        value = out.get(key)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[key] = "; ".join(v for v in value if v)
    for key in OPTIONAL:
        if key in out and _is_empty(out[key]):
            del out[key]
    return out


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    return value


def _is_empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip().lower().rstrip(".") in _EMPTY_WORDS
    if isinstance(value, (list, tuple, Mapping)):
        return len(value) == 0
    return False


def _words(text: str) -> int:
    return len(text.split())


def check_profile(profile: Mapping[str, Any], rules: ProfileRules = ProfileRules()) -> list[str]:
    """Every rule `profile` breaks, as `field: problem` messages (empty when it passes)."""
    problems: list[str] = []
    for key in REQUIRED:
        if key not in profile or _is_empty(profile[key]):
            problems.append(f"{key}: missing (required field absent or empty)")
    function = profile.get("function")
    if function is not None and not _is_empty(function):
        if not isinstance(function, str):
            problems.append(f"function: not a string (got {type(function).__name__})")
        elif _words(function) > rules.max_function_words:
            problems.append(f"function: too long ({_words(function)} words, must be fewer than {rules.max_function_words + 1})")
    tags = profile.get("tags")
    if tags is not None and not _is_empty(tags):
        problems.extend(_check_tags(tags, rules))
    for key, limit in (("when_to_use", rules.max_when_words), ("limitations", rules.max_limitation_words)):
        value = profile.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            problems.append(f"{key}: not a string (got {type(value).__name__})")
        elif _words(value) > limit:
            problems.append(f"{key}: too long ({_words(value)} words, at most {limit})")
    if "example_usage" in profile:
        problems.extend(_check_examples(profile["example_usage"], rules))
    return problems


def _check_tags(tags: Any, rules: ProfileRules) -> list[str]:
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        return [f"tags: not a list of strings (got {json.dumps(tags)[:80]})"]
    problems = []
    if not rules.min_tags <= len(tags) <= rules.max_tags:
        problems.append(f"tags: wrong count ({len(tags)} given, need {rules.min_tags}–{rules.max_tags})")
    if any(not t.strip() for t in tags):
        problems.append("tags: empty tag")
    upper = [t for t in tags if t != t.lower()]
    if upper:
        problems.append(f"tags: not lowercase ({upper[:3]})")
    if len({t.strip().lower() for t in tags}) != len(tags):
        problems.append("tags: duplicates")
    long = [t for t in tags if _words(t) > rules.max_tag_words]
    if long:
        problems.append(f"tags: tag too long (over {rules.max_tag_words} words: {long[:2]})")
    return problems


def _check_examples(examples: Any, rules: ProfileRules) -> list[str]:
    if isinstance(examples, (str, Mapping)):
        examples = [examples]
    if not isinstance(examples, list):
        return [f"example_usage: not a list (got {type(examples).__name__})"]
    problems = []
    if len(examples) > rules.max_examples:
        problems.append(f"example_usage: too many ({len(examples)}, at most {rules.max_examples})")
    for i, example in enumerate(examples):
        if isinstance(example, str):
            text = example
        elif isinstance(example, Mapping) and any(isinstance(example.get(k), str) and example.get(k)
                                                  for k in ("query", "api_call")):
            text = " ".join(str(v) for v in example.values())
        else:
            problems.append(f"example_usage: malformed (item {i} needs a 'query' or an 'api_call' string)")
            continue
        if len(text) > rules.max_example_chars:
            problems.append(f"example_usage: too long (item {i}: {len(text)} characters, at most {rules.max_example_chars})")
    return problems


def problem_kind(message: str) -> str:
    """'tags: not lowercase (['Foo'])' → 'tags: not lowercase': the part reports count by."""
    return message.split(" (", 1)[0]
