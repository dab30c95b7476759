"""Training losses (torch). Scores are cosine similarities; `tau` is the softmax temperature."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def info_nce(query: torch.Tensor, tools: torch.Tensor, positives: torch.Tensor, tau: float = 0.07,
             multi_positive: bool = True) -> torch.Tensor:
    """In-batch InfoNCE.

    query: (B, d) unit vectors; tools: (T, d) unit vectors (each query's positives and any negatives);
    positives: (B, T) bool, True where tool t is a gold tool of query b.
    Multi-positive form: −log(Σ_pos exp(s/τ) / Σ_all exp(s/τ)), i.e. all gold tools share the mass.
    Single-positive form: the standard cross-entropy with the first positive of each row as the target;
    other positives of that row are masked out so they are not pushed away as negatives.
    """
    logits = query @ tools.T / tau
    if multi_positive:
        log_all = torch.logsumexp(logits, dim=1)
        log_pos = torch.logsumexp(logits.masked_fill(~positives, float("-inf")), dim=1)
        return (log_all - log_pos).mean()
    target = positives.float().argmax(dim=1)
    other_positives = positives.clone()
    other_positives[torch.arange(len(target)), target] = False
    return F.cross_entropy(logits.masked_fill(other_positives, float("-inf")), target)


def hard_negative_loss(query: torch.Tensor, tools: torch.Tensor, positives: torch.Tensor, top_k: int = 7,
                       tau: float = 0.07) -> torch.Tensor:
    """Contrast each query's positives against only its `top_k` highest-scoring negatives.

    Same multi-positive softmax as `info_nce`, restricted to the positives plus the hardest negatives,
    so the gradient concentrates on near misses.
    """
    logits = query @ tools.T / tau
    neg_logits = logits.masked_fill(positives, float("-inf"))
    k = min(top_k, tools.shape[0])
    hardest = neg_logits.topk(k, dim=1).values  # (B, k); -inf where fewer negatives exist
    pos = logits.masked_fill(~positives, float("-inf"))
    log_pos = torch.logsumexp(pos, dim=1)
    log_all = torch.logsumexp(torch.cat([pos, hardest], dim=1), dim=1)
    return (log_all - log_pos).mean()


def multilabel_bce(logits: torch.Tensor, targets: torch.Tensor, pos_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Binary cross-entropy over tool logits (B, n_tools) against 0/1 targets."""
    return F.binary_cross_entropy_with_logits(logits, targets.float(), pos_weight=pos_weight)
