"""The torch module an ONNX export traces: token ids -> transformer -> pooling -> L2 normalise.

Imports torch at the top: `export_onnx` imports this module only when it exports, so importing the
encoders stays free of torch."""

from __future__ import annotations

import torch


class EmbeddingGraph(torch.nn.Module):
    """`transformer`'s hidden states pooled by each of `modes` (concatenated), then L2-normalised; the
    forward takes the tokenizer's tensors named `input_names`, in that order, and returns the pooled
    vectors and the token vectors (the hidden states, for late chunking: `encoders.late_chunk`)."""

    def __init__(self, transformer, input_names: list[str], modes: list[str]):
        super().__init__()
        self.transformer = transformer
        self.input_names = list(input_names)
        self.modes = list(modes)

    def forward(self, *tensors):
        features = dict(zip(self.input_names, tensors))
        mask = features["attention_mask"]
        hidden = self.transformer(**features).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = []
        for mode in self.modes:
            if mode == "cls":
                first = mask.to(torch.int32).argmax(dim=1)  # first real token (left padding too)
                index = first.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
                pooled.append(torch.gather(hidden, 1, index).squeeze(1))
            elif mode == "max":
                pooled.append(hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values)
            else:
                count = torch.clamp(weights.sum(dim=1), min=1e-9)
                total = (hidden * weights).sum(dim=1)
                pooled.append(total / (count if mode == "mean" else torch.sqrt(count)))
        vector = torch.cat(pooled, dim=-1) if len(pooled) > 1 else pooled[0]
        return torch.nn.functional.normalize(vector, p=2.0, dim=1), hidden
