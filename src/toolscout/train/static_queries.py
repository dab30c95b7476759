"""Fit the fast tier's static query table to an encoder (`toolscout.encoders.static`).

    python -m toolscout.train.static_queries --data ../shared/data/{apibank,gorilla_torchhub,...} \
        --out src/toolscout/data/static/toolscout-tools           # scripts/build_fast_queries.sh

The table's rows start as the teacher's vector of each word piece alone ([CLS] piece [SEP]); those
single-piece vectors are poor sums (cosine ~0.26 to the teacher's task vectors), so three things are
learned, by gradient descent on 1 - cosine between the table's sum and the teacher's vector of the same
text (train-split tasks and the catalogs' tool texts; the teacher's vectors are the targets, labels are
not used):

- one linear map shared by every row (it also serves the pieces that no training task contains),
- a residual per word piece seen in training,
- a weight per word piece (how much it counts in a sum).

The final row of piece t is weight_t * (start_t @ map + residual_t), plus one bias row per text. Early
stopping on the cosine over the validation tasks carved from the train splits (`load_training_data`).
Measured choices (2026-11-26, validation cosine after 12 epochs): the map alone 0.815, map + weights
0.844, map + residuals 0.896, all three 0.898; a free table 0.898, but it leaves unseen pieces at their
start vectors. Tool texts beside the tasks: on a training set held out of the fit (its tasks' cosine),
gorilla_torchhub 0.811 -> 0.835, apibank 0.854 -> 0.864, sealtools 0.809 -> 0.806, rotbench 0.838 ->
0.836 (mean 0.828 -> 0.835): new catalogs' words come from tool texts.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ..encoders.onnx_export import PROBE_TEXTS
from ..encoders.torch_utils import st_dimension
from ..tool import TextView, tool_text

logger = logging.getLogger(__name__)

MAX_TOKENS = 256  # the default encoder's truncation: the table reads what the teacher reads
TRUNCATION_SIDE = "right"


def piece_vectors(model, vocab_size: int, cls_id: int, sep_id: int, batch: int = 1024) -> np.ndarray:
    """The teacher's (a SentenceTransformer) unit vector of every word piece alone: [CLS] piece [SEP]."""
    import torch

    out = np.empty((vocab_size, st_dimension(model)), dtype=np.float32)
    device = next(model.parameters()).device
    with torch.inference_mode():
        for start in range(0, vocab_size, batch):
            ids = torch.arange(start, min(vocab_size, start + batch))
            n = len(ids)
            features = {"input_ids": torch.stack([torch.full((n,), cls_id), ids, torch.full((n,), sep_id)], 1).to(device),
                        "attention_mask": torch.ones((n, 3), dtype=torch.long, device=device),
                        "token_type_ids": torch.zeros((n, 3), dtype=torch.long, device=device)}
            vectors = model(features)["sentence_embedding"]
            out[start:start + n] = torch.nn.functional.normalize(vectors, dim=1).cpu().numpy()
    return out


class _TableModel:
    """weight_t * (start_t @ map + residual_t) summed over a text's pieces, plus a bias; see the module doc."""

    def __init__(self, start: np.ndarray):
        import torch

        vocab, dim = start.shape
        self.start = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(start), freeze=True, mode="sum")
        self.map = torch.nn.Parameter(torch.eye(dim))
        self.bias = torch.nn.Parameter(torch.zeros(dim))
        self.residual = torch.nn.EmbeddingBag(vocab, dim, mode="sum", sparse=True)
        self.log_weight = torch.nn.Embedding(vocab, 1, sparse=True)
        torch.nn.init.zeros_(self.residual.weight)
        torch.nn.init.zeros_(self.log_weight.weight)

    def __call__(self, pieces, offsets):
        import torch

        weights = torch.exp(self.log_weight(pieces)[:, 0])
        summed = self.start(pieces, offsets, per_sample_weights=weights) @ self.map
        summed = summed + self.residual(pieces, offsets, per_sample_weights=weights) + self.bias
        return torch.nn.functional.normalize(summed, dim=1)

    def optimizers(self, lr: float):
        import torch

        return [torch.optim.Adam([self.map, self.bias], lr=lr),
                torch.optim.SparseAdam([self.residual.weight, self.log_weight.weight], lr=lr)]

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        import torch

        with torch.no_grad():
            rows = torch.exp(self.log_weight.weight) * (self.start.weight @ self.map + self.residual.weight)
            return rows.numpy().copy(), self.bias.detach().numpy().copy()


def _bag(pieces: Sequence[Sequence[int]]):
    import torch

    flat = torch.tensor([p for ids in pieces for p in ids], dtype=torch.long)
    offsets = torch.tensor(np.cumsum([0] + [len(ids) for ids in pieces[:-1]]), dtype=torch.long)
    return flat, offsets


def _mean_cosine(model: _TableModel, pieces, targets) -> float:
    import torch

    with torch.no_grad():
        return float((model(*_bag(pieces)) * targets).sum(1).mean())


def fit_rows(start: np.ndarray, train: list[list[int]], train_targets: np.ndarray, validation: list[list[int]],
             validation_targets: np.ndarray, *, epochs: int = 12, patience: int = 2, lr: float = 1e-3,
             batch_size: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """(rows, bias, validation cosine per epoch, epoch 0 first) of the best epoch on validation."""
    import torch

    torch.manual_seed(seed)
    model = _TableModel(start)
    optimizers = model.optimizers(lr)
    targets, held_out = torch.from_numpy(train_targets), torch.from_numpy(validation_targets)
    history = [_mean_cosine(model, validation, held_out)]
    best = (history[0], *model.rows())
    for epoch in range(1, epochs + 1):
        order = np.random.RandomState(seed + epoch).permutation(len(train))
        for at in range(0, len(order), batch_size):
            batch = order[at:at + batch_size]
            loss = (1 - (model(*_bag([train[i] for i in batch])) * targets[batch]).sum(1)).mean()
            for opt in optimizers:
                opt.zero_grad()
            loss.backward()
            for opt in optimizers:
                opt.step()
        history.append(_mean_cosine(model, validation, held_out))
        logger.info("static table: epoch %d, validation cosine %.4f", epoch, history[-1])
        if history[-1] > best[0]:
            best = (history[-1], *model.rows())
        elif epoch - int(np.argmax(history)) >= patience:
            break
    return best[1], best[2], history


def build(sets: Sequence[str | Path], out: Path, teacher_name: str | None = None, **options) -> dict:
    """Fit the table for `teacher_name` (default: the default encoder) on the train splits of `sets` and
    write it to `out` (`encoders.static.write_table`)."""
    from ..encoders import Encoder
    from ..encoders.static import encoder_tokenizer, piece_tokenizer, teacher_digest, word_pieces, write_table
    from . import load_training_data

    started = time.time()
    data = load_training_data(sets)
    teacher = Encoder.load(teacher_name)  # targets: the encoding that serves queries (int8 where approved)
    tokenizer = piece_tokenizer(encoder_tokenizer(teacher), MAX_TOKENS, TRUNCATION_SIDE)

    def pieces(texts):
        return word_pieces(tokenizer, texts)

    train = list(dict.fromkeys([q.text for q in data.train] + [tool_text(t, TextView()) for t in data.tools.values()]))
    validation = list(dict.fromkeys(q.text for q in data.validation))
    start = piece_vectors(Encoder.load(teacher.name, backend="torch").model, tokenizer.get_vocab_size(),
                          tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]"))
    rows, bias, history = fit_rows(start, pieces(train), teacher.encode(train), pieces(validation),
                                   teacher.encode(validation), **options)
    info = {"teacher": teacher.name, "teacher_digest": teacher_digest(teacher), "teacher_encoding": teacher.backend_in_use,
            "max_tokens": MAX_TOKENS, "truncation_side": TRUNCATION_SIDE, "vocabulary": len(rows), "dim": len(bias),
            "data": {"sets": data.sets, "train_texts": len(train), "of_which_tool_texts": len(data.tools),
                     "validation_tasks": len(validation)},
            "recipe": {"epochs_max": options.get("epochs", 12), "lr": options.get("lr", 1e-3), "seed": options.get("seed", 0),
                       "loss": "1 - cosine to the teacher's vector", "rows": "weight * (start @ map + residual)"},
            "validation_cosine": [round(c, 4) for c in history], "best_validation_cosine": round(max(history), 4),
            "rebuild": "bash scripts/build_fast_queries.sh", "fit_seconds": round(time.time() - started, 1)}
    return write_table(Path(out), rows, bias, info, PROBE_TEXTS, tokenizer)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolscout.train.static_queries", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="benchmark folders whose train splits are fitted on")
    parser.add_argument("--out", required=True, help="the table folder to write")
    parser.add_argument("--teacher", default=None, help="encoder to distil (default: toolscout's default encoder)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    info = build(args.data, Path(args.out), args.teacher, epochs=args.epochs, seed=args.seed)
    print(f"static table for {info['teacher']}: best validation cosine {info['best_validation_cosine']} "
          f"({info['data']['train_texts']} train texts, {info['fit_seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
