"""Choosing which expansion fields go into the text retrievers index (`TextView`).

    --profile-fields function,tags        only these profile fields (in this order)
    --profile-fields default              function, tags, when_to_use, limitations (the Tool-REX choice)
    --profile-fields all                  every field, example_usage included
    --profile-fields none                 the original document only
    --usage N                             append up to N known requests per tool (usage expansion)

`ablation_views("add-one")` / `ablation_views("one-out")` give the views of the paper's field ablation
(the Tool-REX paper §2.4): Add-One starts from the original document and adds one field; One-Out starts from the
full expansion and removes one.
"""

from __future__ import annotations

from typing import Any

from ..tool import DEFAULT_PROFILE_FIELDS, PROFILE_FIELDS, TextView

FIELD_ALIASES = {"function_description": "function", "limitation": "limitations", "examples": "example_usage",
                 "when": "when_to_use"}
PRESETS = {"default": DEFAULT_PROFILE_FIELDS, "all": PROFILE_FIELDS, "none": ()}
PROTOCOLS = ("add-one", "one-out")


def parse_profile_fields(text: str) -> tuple[str, ...]:
    """'function,tags' → ('function', 'tags'); presets default / all / none; unknown names fail."""
    text = (text or "").strip()
    if text.lower() in PRESETS:
        return tuple(PRESETS[text.lower()])
    fields: list[str] = []
    for part in text.split(","):
        name = part.strip().lower().replace("-", "_")
        if not name:
            continue
        name = FIELD_ALIASES.get(name, name)
        if name not in PROFILE_FIELDS:
            raise ValueError(f"unknown profile field {part.strip()!r}; known: {', '.join(PROFILE_FIELDS)} "
                             f"(or a preset: {', '.join(PRESETS)})")
        if name not in fields:
            fields.append(name)
    return tuple(fields)


def make_view(profile_fields: tuple[str, ...] | None = None, usage: int | None = None,
              base: TextView | None = None) -> TextView:
    """`base` (default TextView()) with the given profile fields and usage count replaced."""
    data: dict[str, Any] = (base or TextView()).to_dict()
    if profile_fields is not None:
        data["profile_fields"] = tuple(profile_fields)
    if usage is not None:
        if usage < 0:
            raise ValueError(f"usage must be 0 or more, got {usage}")
        data["usage"] = int(usage)
    return TextView.from_dict(data)


def ablation_views(protocol: str, fields: tuple[str, ...] = PROFILE_FIELDS) -> dict[str, TextView]:
    """Named views for one ablation protocol over `fields` (the baseline first)."""
    if protocol == "add-one":
        views = {"original": make_view(())}
        views.update({f"+{f}": make_view((f,)) for f in fields})
    elif protocol == "one-out":
        views = {"full": make_view(tuple(fields))}
        views.update({f"-{f}": make_view(tuple(x for x in fields if x != f)) for f in fields})
    else:
        raise ValueError(f"unknown ablation protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    return views
