"""ToolRefiner's torch module. Imports torch at the top: `build_refiner_net` imports this module only when
a refiner is built, so `import toolscout` stays free of torch."""

from __future__ import annotations

import torch
from torch import nn


def standardise(scores, mask):
    """Per-query z-scores of the first stage's scores over the real (unmasked) candidates: the refiner
    sees how far ahead each candidate is, not the first stage's own scale (cosine, BM25, RRF...)."""
    weights = mask.to(scores.dtype)
    count = weights.sum(dim=1, keepdim=True).clamp(min=1.0)
    mean = (scores * weights).sum(dim=1, keepdim=True) / count
    var = (((scores - mean) * weights) ** 2).sum(dim=1, keepdim=True) / count
    return torch.where(mask.bool(), (scores - mean) / (var.sqrt() + 1e-6), torch.zeros_like(scores))


class RefinerNet(nn.Module):
    """The torch module (see `toolscout.rerank.refiner`): `transformer` is a BERT-style HF model (word,
    position and type embeddings), `vector_dim` the candidates' vector size, `query_cap` the query's
    token limit (candidate positions start there)."""

    def __init__(self, transformer, vector_dim: int, query_cap: int):
        super().__init__()
        self.transformer = transformer
        hidden = transformer.config.hidden_size
        self.project = nn.Linear(vector_dim, hidden)
        self.score_embedding = nn.Parameter(torch.zeros(hidden))  # how the first-stage z-score enters
        self.head = nn.Linear(hidden, 1)
        # Start as the first stage: logit = prior_weight · z + bias, the head's part zero. Training then
        # learns corrections, so a short run cannot rank worse than the candidates arrived.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.prior_weight = nn.Parameter(torch.tensor(2.0))
        self.prior_bias = nn.Parameter(torch.tensor(-2.0))
        self.query_cap = query_cap
        limit = transformer.config.max_position_embeddings
        self.max_candidates = limit - query_cap

    def forward(self, input_ids, attention_mask, vectors, candidate_mask, scores=None):
        """input_ids/attention_mask: [B, L] (L <= query_cap); vectors [B, N, D]; candidate_mask [B, N];
        scores [B, N]: the first stage's scores (None: no prior). Returns logits [B, N]."""
        batch, length = input_ids.shape
        n = vectors.shape[1]
        if n > self.max_candidates:
            raise ValueError(f"ToolRefiner takes at most {self.max_candidates} candidates, got {n}")
        z = (standardise(scores, candidate_mask) if scores is not None
             else torch.zeros(vectors.shape[:2], dtype=vectors.dtype, device=vectors.device))
        words = self.transformer.embeddings.word_embeddings(input_ids)
        tools = self.project(vectors) + z.unsqueeze(-1) * self.score_embedding
        embeds = torch.cat([words, tools], dim=1)
        mask = torch.cat([attention_mask, candidate_mask.to(attention_mask.dtype)], dim=1)
        device = input_ids.device
        positions = torch.cat([torch.arange(length, device=device),
                               self.query_cap + torch.arange(n, device=device)]).expand(batch, -1)
        types = torch.cat([torch.zeros(length, dtype=torch.long, device=device),
                           torch.ones(n, dtype=torch.long, device=device)]).expand(batch, -1)
        states = self.transformer(inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                                  token_type_ids=types).last_hidden_state
        return self.head(states[:, length:, :]).squeeze(-1) + self.prior_weight * z + self.prior_bias
