"""toolscout: pick the right tools for an LLM agent out of thousands.

    from toolscout import ToolScout, load_tools
    scout = ToolScout.from_tools(load_tools("tools.json"))
    for hit in scout.search("book a flight to Paris", k=5):
        print(hit.tool.name, hit.score)
"""

from .tool import TextView, Tool
from .version import __version__

__all__ = ["Tool", "TextView", "ToolScout", "Hit", "Filter", "IntentMerge", "load_tools", "evaluate", "__version__"]


def __getattr__(name):  # heavy parts load on first use, so `import toolscout` stays fast
    if name == "ToolScout":
        from .pipeline import ToolScout

        return ToolScout
    if name == "Hit":
        from .hits import Hit

        return Hit
    if name == "Filter":  # what `search(filter=...)` takes
        from .results import Filter

        return Filter
    if name == "IntentMerge":  # what `from_tools(intents=...)` takes
        from .intents import IntentMerge

        return IntentMerge
    if name == "load_tools":
        from .ingest import load_tools

        return load_tools
    if name == "evaluate":
        from .eval import evaluate

        return evaluate
    raise AttributeError(f"module 'toolscout' has no attribute {name!r}")


def __dir__():  # the lazily loaded names too, for tab completion and help(toolscout)
    return sorted(set(globals()) | set(__all__))
