"""MLC's torch module: a sentence-transformers encoder plus a linear head over its unit embedding.

Imports torch at the top: only `fit_mlc` imports this module, so `import toolscout` stays free of torch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..encoders import st_dimension


class MLCNetwork(torch.nn.Module):
    """Sentence-transformers encoder + linear head over the unit sentence embedding.

    The head parameters hold weight / `head_scale` (`toolscout.train.mlc`'s module doc, on `head_lr`)."""

    def __init__(self, st_model, n_tools: int, head_scale: float):
        super().__init__()
        self.encoder = st_model
        dim = st_dimension(st_model)
        self.head_scale = float(head_scale)
        self.head_weight = torch.nn.Parameter(torch.zeros(n_tools, dim))
        self.head_bias = torch.nn.Parameter(torch.zeros(n_tools))

    @property
    def device(self):
        return self.head_weight.device

    def embed(self, texts: Sequence[str]):
        prepare = getattr(self.encoder, "preprocess", None) or self.encoder.tokenize  # ST >= 6 / older
        features = prepare(list(texts))
        features = {key: value.to(self.device) if torch.is_tensor(value) else value
                    for key, value in features.items()}
        return F.normalize(self.encoder(features)["sentence_embedding"], p=2.0, dim=-1)

    def head(self, embeddings):
        return embeddings @ (self.head_scale * self.head_weight).T + self.head_scale * self.head_bias

    def forward(self, texts: Sequence[str]):
        return self.head(self.embed(texts))

    def set_head(self, weight: np.ndarray, bias: np.ndarray) -> None:
        with torch.no_grad():
            self.head_weight.copy_(torch.as_tensor(weight, dtype=torch.float32) / self.head_scale)
            self.head_bias.copy_(torch.as_tensor(bias, dtype=torch.float32) / self.head_scale)

    def head_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            weight = (self.head_scale * self.head_weight).detach().cpu().numpy().astype(np.float32)
            bias = (self.head_scale * self.head_bias).detach().cpu().numpy().astype(np.float32)
        return weight, bias

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Unit embeddings, no gradients, eval mode (dropout off)."""
        was_training = self.training
        self.eval()
        out = []
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                out.append(self.embed(texts[start:start + batch_size]).cpu().numpy())
        self.train(was_training)
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, self.head_weight.shape[1]), np.float32)
