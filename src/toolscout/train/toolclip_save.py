"""Writing a ToolCLIP model directory (the format `toolscout.retrievers.toolclip_model.load_model` reads),
and a parameter count for reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..artifacts import write_artifact, write_json
from ..encoders.torch_utils import state_digest
from ..models import model_base
from ..retrievers.toolclip_model import ARCHITECTURE_VERSION, WEIGHTS_FILE, Featurizer


def weights_digest(state: Mapping[str, Any]) -> str:
    """The digest a model directory records (and an index built on it checks) of its weights."""
    return state_digest(state)[:24]


def save_model(out: str | Path, model, featurizer: Featurizer, summary: Mapping[str, Any] | None = None,
               training: Mapping[str, Any] | None = None) -> str:
    """Write a toolclip model directory atomically; returns the weights digest stored in its config."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    digest = weights_digest(state)
    config = model_base("toolclip", architecture=model.config.to_dict(), architecture_version=ARCHITECTURE_VERSION,
                        weights=WEIGHTS_FILE, weights_sha=digest, dim=model.dim,
                        parameters=sum(p.numel() for p in model.parameters()),
                        training=dict(training or {}), summary=dict(summary or {}))
    with write_artifact(out, config) as folder:
        save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        model.task_transformer.config.to_json_file(str(folder / "transformer_config.json"))
        featurizer.tokenizer.save_pretrained(str(folder / "tokenizer"))
        if summary:
            write_json(folder / "summary.json", dict(summary))
    return digest


def describe(model) -> dict[str, Any]:
    """Parameter counts per part (for reports and the shared-towers check)."""
    def count(module):
        return sum(p.numel() for p in module.parameters())

    heads = sum(p.numel() for n, p in model.named_parameters() if "transformer" not in n)
    return {"total": count(model), "heads": heads, "shared_towers": model.config.shared_towers,
            "config": json.loads(json.dumps(model.config.to_dict()))}
