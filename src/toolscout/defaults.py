"""What toolscout does when the user does not say: the one place each default is decided.

Kept free of heavy imports, so the command line can show these defaults in `--help` at no cost.
"""

# The first stage `ToolScout.from_tools`, `toolscout index`, `eval` and `demo` build when no retriever is named.
DEFAULT_RETRIEVER = "dense"

# How `ToolScout.from_tools` splits and merges tasks that hold several requests (`IntentMerge` settings;
# None: it does not). Decided on validation queries carved from the train splits (see `toolscout.intents`).
DEFAULT_INTENTS: dict | None = None

# The encoder dense retrievers use when no model is named (a name `toolscout.encoders.resolve_model`
# knows: a model that ships with toolscout, "minilm" for the untrained all-MiniLM-L6-v2, a path...).
DEFAULT_ENCODER = "minilm"
