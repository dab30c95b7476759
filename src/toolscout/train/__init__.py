"""Training: labelled queries → model directories that retrievers and rerankers load.

`load_training_data` gathers train splits (with a validation split carved from them), `Trainer` runs
the optimisation with checkpoints, resume and early stopping, and one `fit_*` per method builds a model.
"""

from typing import Any, Mapping

from ..errors import require
from ..registry import lookup
from .data import TrainingData, load_training_data
from .loop import RunSummary, TrainConfig, Trainer, validation_ndcg

# method name -> "module:function"; every fit function takes (data, out, *, model=None, config=None, **options)
TRAINERS: dict[str, str] = {
    "tool2vec": "toolscout.train.tool2vec:fit_tool2vec",
    "mlc": "toolscout.train.mlc:fit_mlc",
    "toolclip": "toolscout.train.toolclip:fit_toolclip",
    "embed": "toolscout.train.embed:fit_embed",
    "cross": "toolscout.train.cross:fit_cross",
    "refiner": "toolscout.train.refiner:fit_refiner",
}


# methods that run no torch: tool2vec averages the vectors of queries (its `finetune=True` runs fit_embed)
TORCH_FREE = frozenset({"tool2vec"})


def trainer_for(method: str):
    """The fit function of `method`; fails, naming the install command, when it needs torch and torch (or
    transformers, sentence-transformers) is not installed."""
    fit = lookup("training method", method, TRAINERS)
    if method not in TORCH_FREE:
        require_trainers(f"toolscout train {method}")
    return fit


def check_options(method: str, fit, options: Mapping[str, Any], flag: str = "-o") -> None:
    """The options (`flag` KEY=VALUE) given to trainer `fit`, checked before training: a key it does not take
    is refused naming it and the ones it does, a value of the wrong type naming the option, the value and
    the type wanted (`retrievers.base.check_types`). A trainer taking **options (toolclip's) checks its own
    the same way."""
    import inspect

    from ..retrievers.base import check_types

    parameters = inspect.signature(fit).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    known = sorted(name for name in list(parameters)[2:] if name not in ("model", "config"))  # after data, out
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{flag} {', '.join(unknown)}: not an option of {method}; its options: "
                         f"{', '.join(known) or 'none'}")
    check_types(method, fit, options, noun="option")


def require_trainers(feature: str) -> None:
    require("torch", "transformers", "sentence_transformers", feature=feature, extra="train")


__all__ = ["TRAINERS", "trainer_for", "check_options", "TrainingData", "load_training_data", "TrainConfig", "Trainer",
           "RunSummary", "validation_ndcg"]
