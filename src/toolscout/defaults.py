"""What toolscout does when the user does not say: the one place each default is decided.

Kept free of heavy imports, so the command line can show these defaults in `--help` at no cost.
"""

import os

# The first stage `ToolScout.from_tools`, `toolscout index`, `eval`, `demo` and `serve` build when no retriever
# is named: BM25 fused with the tool-tuned dense encoder, the best configuration on tools no model was
# trained on (chosen on validation carved from the train splits: docs/default-model.md).
DEFAULT_RETRIEVER = "hybrid"

# How a hybrid fuses its components when not told: each list's scores divided by its best one, then a
# weighted sum, with these weights by component name (others: 1). Chosen leaving one training set out at a
# time (benchmarks/leave_one_out.py: train the encoder on the other five, rank the held-out set's
# train-split queries): macro nDCG@10 over the six 64.32 (min-max, 1 : 1.5) -> 64.83, and the best fusion
# for the untrained and half-tuned encoders as well (docs/default-model.md). fusion="score" (min-max) and
# "rrf" (reciprocal rank) stay one option away.
HYBRID_FUSION = "max"
HYBRID_WEIGHTS = {"bm25": 1.0, "dense": 3.0}

# How `ToolScout.from_tools` splits and merges tasks that hold several requests (`IntentMerge` settings;
# None: it does not). Decided on validation queries carved from the train splits with the default encoder
# and fusion above (benchmarks/intents.py --split validation, docs/default-model.md): "max" with each
# request's own list weighted 0.9 lifted mean Completeness@10 59.4 -> 64.5 over toollens, sealtools,
# rotbench, metatool and gorilla_torchhub while the single-tool sets kept their figures (metatool -0.06
# nDCG@10, torchhub 0); weight 1 cost torchhub 0.6. Requests are pooled from their task's forward pass
# (late chunking, `encoders.late_chunk`): the same quality as encoding each alone, one pass per task.
DEFAULT_INTENTS: dict | None = {"merge": "max", "intent_weight": 0.9, "late_chunk": True}

# The encoder dense retrievers use when no model is named (a name `toolscout.encoders.resolve_model`
# knows: a model that ships with toolscout, "minilm" for the untrained all-MiniLM-L6-v2, a path...).
# toolscout-tools is all-MiniLM-L6-v2 with its transformer layers tuned on the dev sets' train splits
# (src/toolscout/data/models/toolscout-tools; rebuilt by scripts/build_default_model.sh).
DEFAULT_ENCODER = "toolscout-tools"


def usable_cores() -> int:
    """The cores toolscout sizes its threads by when not told: those this process may run on (a container's or
    `taskset`'s CPU set), not every core of the machine, which would put several threads on each allowed one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on macOS and Windows: every core is allowed
        return os.cpu_count() or 1
