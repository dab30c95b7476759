"""Document expansion: LLM-written tool profiles (the Tool-REX paper) and usage expansion (no LLM).

    from toolscout.expand import ExpandConfig, expand_tools, expand_usage
    result = expand_tools(tools, client, ExpandConfig(model="small", strong_model="large"), journal="j.jsonl")
    tools = expand_usage(result.tools, train_queries, max_per_tool=5)

Which profile fields reach the retrievers is a `TextView` choice (`views.py`); the field ablation of the
paper runs with `python -m toolscout.expand.ablation`.
"""

from .catalog import Catalog, read_catalog, write_catalog
from .pipeline import ExpandConfig, ExpandReport, ExpandResult, expand_tool, expand_tools, tool_document
from .profile import ProfileRules, check_profile, parse_profile
from .usage import UsageReport, expand_usage
from .views import ablation_views, make_view, parse_profile_fields

__all__ = [
    "ExpandConfig", "ExpandReport", "ExpandResult", "expand_tool", "expand_tools", "tool_document",
    "ProfileRules", "check_profile", "parse_profile", "expand_usage", "UsageReport",
    "ablation_views", "make_view", "parse_profile_fields", "Catalog", "read_catalog", "write_catalog",
]
