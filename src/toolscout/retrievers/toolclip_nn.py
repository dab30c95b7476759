"""ToolCLIP's torch modules (see `toolclip_model` for the architecture and why it starts as it does).

This module imports torch at the top: only `toolclip_model` imports it, when a ToolCLIP model is built or
loaded, so `import toolscout` stays free of torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from .toolclip_model import Packed, ToolCLIPConfig, ToolTensors


class HeadLinear(nn.Module):
    """y = (mult·W) x + mult·b, stored divided by `mult` (`toolclip_model`'s doc, on head_lr_mult);
    the identity at init when square."""

    def __init__(self, n_in: int, n_out: int, mult: float):
        super().__init__()
        self.mult = float(mult)
        if n_in == n_out:
            weight = torch.eye(n_in)
        else:
            weight = torch.empty(n_out, n_in)
            nn.init.orthogonal_(weight)
        self.weight = nn.Parameter(weight / self.mult)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return F.linear(x, self.weight * self.mult, self.bias * self.mult)


class AttentionPool(nn.Module):
    """Attention(Q, H, H) with a learned query Q (one per head); zero at init, i.e. mean pooling."""

    def __init__(self, hidden: int, heads: int, mult: float):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"pool_heads={heads} must divide the hidden size {hidden}")
        self.heads, self.mult = heads, float(mult)
        self.query = nn.Parameter(torch.zeros(heads, hidden // heads))

    def forward(self, states, mask):
        """states (N, L, h), mask (N, L) bool → (N, h); rows with no valid position give zeros."""
        n, length, hidden = states.shape
        split = states.view(n, length, self.heads, hidden // self.heads)
        logits = torch.einsum("nlhd,hd->nlh", split, self.query * self.mult) / math.sqrt(hidden // self.heads)
        valid = mask.unsqueeze(-1)
        logits = logits.masked_fill(~valid, torch.finfo(logits.dtype).min)
        weights = torch.softmax(logits, dim=1) * valid
        weights = weights / weights.sum(dim=1, keepdim=True).clamp_min(1e-12)
        return torch.einsum("nlh,nlhd->nhd", weights, split).reshape(n, hidden)


class Gates(nn.Module):
    """Per-component gates g_c = σ(W_c h_c + b_c), one value per dimension."""

    def __init__(self, hidden: int, bias: Sequence[float], mult: float):
        super().__init__()
        self.mult = float(mult)
        self.weight = nn.Parameter(torch.zeros(len(bias), hidden, hidden))
        self.bias = nn.Parameter(torch.tensor(list(bias), dtype=torch.float32)[:, None].repeat(1, hidden)
                                 / self.mult)

    def forward(self, components):
        """components (T, C, h) → gates (T, C, h) in (0, 1)."""
        pre = torch.einsum("tch,cgh->tcg", components, self.weight * self.mult) + self.bias * self.mult
        return torch.sigmoid(pre)


def freeze_lower_layers(transformer, trainable: int) -> None:
    """Only the top `trainable` layers learn; embeddings and lower layers are frozen."""
    layers = getattr(getattr(transformer, "encoder", None), "layer", None) or getattr(transformer, "layers", None)
    if layers is None:
        raise ValueError(f"train_layers: cannot find the layers of a {type(transformer).__name__}; "
                         "leave train_layers unset to train all of it")
    if not 0 <= trainable <= len(layers):
        raise ValueError(f"train_layers={trainable}: the transformer has {len(layers)} layers")
    for p in transformer.parameters():
        p.requires_grad_(False)
    for layer in list(layers)[len(layers) - trainable:]:
        for p in layer.parameters():
            p.requires_grad_(True)


def mean_pool(states, mask):
    weights = mask.unsqueeze(-1).to(states.dtype)
    return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1e-9)


class ToolCLIPModel(nn.Module):
    """Both towers and their heads (see `toolclip_model`'s module doc); `shared_towers` uses one
    transformer and one projection for tasks and tools."""

    def __init__(self, config: ToolCLIPConfig, task_transformer, tool_transformer=None):
        super().__init__()
        self.config = config
        hidden = int(task_transformer.config.hidden_size)
        self.hidden = hidden
        self.dim = int(config.dim or hidden)
        mult = config.head_lr_mult
        self.task_transformer = task_transformer
        if not config.shared_towers:
            if tool_transformer is None:
                raise ValueError("separate towers need a tool transformer")
            self.tool_transformer = tool_transformer
        self.intent_pool = AttentionPool(hidden, config.pool_heads, mult)
        self.param_pool = AttentionPool(hidden, config.pool_heads, mult)
        self.gates = Gates(hidden, config.gate_bias, mult)
        self.task_projection = HeadLinear(hidden, self.dim, mult)
        if not config.shared_towers:
            self.tool_projection = HeadLinear(hidden, self.dim, mult)
        if config.learn_tau:  # CLIP-style: learn log(1/τ), starting at the configured τ
            self.log_inv_tau = nn.Parameter(torch.tensor(math.log(1.0 / config.tau)))
        if config.train_layers is not None:
            for transformer in {id(t): t for t in (self.task_transformer, self.tool_tower)}.values():
                freeze_lower_layers(transformer, config.train_layers)

    # towers -----------------------------------------------------------------------
    @property
    def tool_tower(self):
        return self.task_transformer if self.config.shared_towers else self.tool_transformer

    @property
    def tool_head(self):
        return self.task_projection if self.config.shared_towers else self.tool_projection

    def tau(self):
        """The softmax temperature: fixed, or learned and kept in [0.01, 1]."""
        if not self.config.learn_tau:
            return self.config.tau
        return 1.0 / self.log_inv_tau.exp().clamp(1.0, 100.0)

    def encode_tasks(self, tokens: Mapping[str, Any]):
        states = self.task_transformer(**tokens).last_hidden_state
        pooled = self.intent_pool(states, tokens["attention_mask"].bool())
        return F.normalize(self.task_projection(pooled), dim=-1)

    def _embed(self, packed: "Packed | None"):
        """Mean-pooled tool-tower vectors of packed texts, in the texts' original order."""
        if packed is None:
            return None
        pooled = [mean_pool(self.tool_tower(**tokens).last_hidden_state, tokens["attention_mask"].bool())
                  for tokens in packed.chunks]
        return torch.cat(pooled)[packed.inverse]

    def tool_components(self, batch: "ToolTensors"):
        """(components (T, 3, h), present (T, 3) bool): name, description, parameters, each L2-normalised."""
        n = batch.n_tools
        name = self._embed(batch.names)
        desc = name.new_zeros(n, self.hidden)
        if batch.descriptions is not None:
            desc = desc.index_copy(0, batch.description_rows, self._embed(batch.descriptions))
        params = name.new_zeros(n, self.hidden)
        has_params = batch.param_index.ge(0).any(dim=1)
        if batch.params is not None:
            if self.training and not self.config.param_grad:
                with torch.no_grad():
                    unique = self._embed(batch.params)  # (U, h): each distinct parameter text once
            else:
                unique = self._embed(batch.params)
            index = batch.param_index.clamp_min(0)
            per_tool = unique[index]  # (T, P, h)
            params = self.param_pool(per_tool, batch.param_index.ge(0))
        present = torch.stack([torch.ones_like(has_params), batch.has_description, has_params], dim=1)
        components = F.normalize(torch.stack([name, desc, params], dim=1), dim=-1)
        return components, present

    def encode_tools(self, batch: "ToolTensors", return_gates: bool = False):
        components, present = self.tool_components(batch)
        gates = self.gates(components)
        fused = (gates * components * present.unsqueeze(-1).to(components.dtype)).sum(dim=1)
        out = F.normalize(self.tool_head(fused), dim=-1)
        return (out, gates, present) if return_gates else out
