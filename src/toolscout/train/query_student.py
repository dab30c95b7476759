"""Distil a query student: a copy of an encoder with fewer transformer layers, trained to give the
teacher's vectors for tasks, so that searches encode tasks faster while tools keep the teacher's vectors.

    python -m toolscout.train.query_student --data ../shared/data/{apibank,gorilla_torchhub,...} \
        --out runs/query-student                                   # scripts/build_query_student.sh

The student starts as the teacher with only `layers` kept (the last layer matters most: keeping 0, 2, 4, 5
of six gives a cosine of 0.86 to the teacher before any training, 0, 2, 5 gives 0.60). It is trained in
phases, each a fresh AdamW run over every training text (the train-split tasks and the catalogs' tool
texts; the teacher's float32 vectors are the targets, labels are not used):

- loss 1 - cosine to the teacher's vector, plus `kl` times the KL divergence between the teacher's and
  the student's softmax (temperature 0.05) over the text's 32 nearest tools by the teacher: the ranking
  a search reads, not only the vector;
- length-bucketed batches of 64, 5% warm-up then linear decay, gradient norm clipped at 1;
- the best state on the validation tasks carved from the train splits is kept: by mean cosine to the
  teacher in a phase without the ranking loss, by top-10 agreement with the teacher's ranking of the
  tools in one with it.

The word embeddings are put back to the teacher's at the end: the student's own moved them little and
shipping them would double the package (measured: test macro nDCG@10 59.76 with them, 59.86 without).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..tool import TextView, tool_text

logger = logging.getLogger(__name__)

LAYERS = (0, 2, 4, 5)
WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"
CANDIDATES = 32  # the teacher's nearest tools whose ranking the student learns


@dataclass(frozen=True)
class Phase:
    epochs: float
    lr: float
    kl: float = 0.0  # weight of the ranking loss
    tau: float = 0.05


RECIPE = (Phase(1, 1e-4), Phase(1, 5e-5), Phase(1, 5e-5, kl=1.0))  # docs/serving.md: how it was chosen
BATCH = 64


@dataclass
class Texts:
    """Training texts and validation tasks with the teacher's vectors of each, and the tools whose
    ranking the ranking loss compares."""
    train: list[str]
    targets: np.ndarray
    validation: list[str]
    validation_targets: np.ndarray
    tools: np.ndarray

    def candidates(self, vectors: np.ndarray) -> np.ndarray:
        """Rows of `tools` nearest to each of `vectors` (the teacher's top `CANDIDATES`, unordered)."""
        k = min(CANDIDATES, len(self.tools) - 1)
        out = np.empty((len(vectors), k), dtype=np.int64)
        for start in range(0, len(vectors), 2048):
            scores = vectors[start:start + 2048] @ self.tools.T
            out[start:start + 2048] = np.argpartition(-scores, k, axis=1)[:, :k]
        return out


def student_of(teacher, layers: Sequence[int]):
    """A copy of the SentenceTransformer `teacher` keeping only `layers` of its transformer (in order)."""
    import torch

    student = copy.deepcopy(teacher)
    bert = student[0].auto_model
    if max(layers) >= len(bert.encoder.layer) or min(layers) < 0 or len(set(layers)) != len(layers):
        raise ValueError(f"layers {list(layers)}: the teacher has layers 0..{len(bert.encoder.layer) - 1}, each kept once")
    bert.encoder.layer = torch.nn.ModuleList([bert.encoder.layer[i] for i in layers])
    bert.config.num_hidden_layers = len(layers)
    return student


def _embed(bert, tokenizer, texts: Sequence[str], max_length: int):
    """Mean-pooled unit vectors (the teacher's pooling) of `texts` by the transformer `bert`."""
    import torch

    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    hidden = bert(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def _agreement(bert, tokenizer, texts: Texts, max_length: int) -> tuple[float, float]:
    """(mean cosine to the teacher, mean top-10 overlap with the teacher's ranking of the tools) over the
    validation tasks."""
    import torch

    bert.eval()
    with torch.inference_mode():
        vectors = np.concatenate([_embed(bert, tokenizer, texts.validation[i:i + 128], max_length).numpy()
                                  for i in range(0, len(texts.validation), 128)])
    bert.train()
    cosine = float((vectors * texts.validation_targets).sum(1).mean())
    ours = np.argsort(-(vectors @ texts.tools.T), axis=1)[:, :10]
    theirs = np.argsort(-(texts.validation_targets @ texts.tools.T), axis=1)[:, :10]
    overlap = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ours, theirs)]))
    return cosine, overlap


def _batches(lengths: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch of batches of similar lengths (less padding): shuffle, sort within groups of 50 batches."""
    order, out = rng.permutation(len(lengths)), []
    for start in range(0, len(order), BATCH * 50):
        group = order[start:start + BATCH * 50]
        group = group[np.argsort(lengths[group], kind="stable")]
        out += [group[i:i + BATCH] for i in range(0, len(group), BATCH)]
    rng.shuffle(out)
    return out


def run_phase(bert, tokenizer, texts: Texts, phase: Phase, max_length: int, seed: int = 0,
              eval_every: int = 200) -> list[dict]:
    """Train `bert` in place for one phase; it ends holding the phase's best validation state."""
    import torch

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    candidates = torch.from_numpy(texts.candidates(texts.targets)) if phase.kl else None
    tools, targets = torch.from_numpy(texts.tools), torch.from_numpy(texts.targets)
    lengths = np.array([len(t) for t in texts.train])
    total = max(1, int(len(texts.train) // BATCH * phase.epochs))
    optimiser = torch.optim.AdamW(bert.parameters(), lr=phase.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min(1.0, s / (0.05 * total + 1)) * max(0.0, 1 - s / total))
    pick = 1 if phase.kl else 0  # what "best" means: top-10 agreement with the ranking loss, else cosine
    history, best, step, started = [], (-1.0, None), 0, time.time()
    while step < total:
        for rows in _batches(lengths, rng):
            if step >= total:
                break
            vectors = _embed(bert, tokenizer, [texts.train[i] for i in rows], max_length)
            index = torch.from_numpy(rows)
            loss = 1 - (vectors * targets[index]).sum(-1).mean()
            if phase.kl:
                near = tools[candidates[index]]  # (batch, CANDIDATES, dim)
                theirs = torch.einsum("bd,bkd->bk", targets[index], near) / phase.tau
                ours = torch.einsum("bd,bkd->bk", vectors, near) / phase.tau
                loss = loss + phase.kl * torch.nn.functional.kl_div(
                    torch.log_softmax(ours, -1), torch.log_softmax(theirs, -1), log_target=True, reduction="batchmean")
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(bert.parameters(), 1.0)
            optimiser.step()
            schedule.step()
            step += 1
            if step % eval_every == 0 or step == total:
                cosine, overlap = _agreement(bert, tokenizer, texts, max_length)
                history.append({"step": step, "loss": round(loss.item(), 4), "cosine": round(cosine, 4),
                                "top10": round(overlap, 4), "seconds": round(time.time() - started)})
                logger.info("step %d/%d loss %.4f validation cosine %.4f top-10 agreement %.4f (%.0f s)",
                            step, total, loss.item(), cosine, overlap, time.time() - started)
                if (cosine, overlap)[pick] > best[0]:
                    best = ((cosine, overlap)[pick], copy.deepcopy(bert.state_dict()))
    bert.load_state_dict(best[1])
    return history


def training_texts(sets: Sequence[str | Path], teacher) -> Texts:
    """The train-split tasks and tool texts of `sets`, the validation tasks carved from the train splits,
    and the teacher's (an Encoder) vectors of all of them."""
    from . import load_training_data

    data = load_training_data(sets)
    tasks = list(dict.fromkeys(q.text for q in data.train))
    tools = list(dict.fromkeys(tool_text(t, TextView()) for t in data.tools.values()))
    validation = list(dict.fromkeys(q.text for q in data.validation))
    logger.info("teacher vectors of %d tasks, %d tool texts and %d validation tasks",
                len(tasks), len(tools), len(validation))
    tool_vectors = teacher.encode(tools, show_progress=True)
    return Texts(tasks + tools, np.concatenate([teacher.encode(tasks, show_progress=True), tool_vectors]),
                 validation, teacher.encode(validation), tool_vectors)


def build(sets: Sequence[str | Path], out: Path, teacher_name: str | None = None, layers: Sequence[int] = LAYERS,
          recipe: Sequence[Phase] = RECIPE, seed: int = 0) -> dict:
    """Distil the student of `teacher_name` (default: the default encoder) on `sets` and save it to `out`
    as a sentence-transformers folder; returns what was done (for the packaged manifest)."""
    import torch

    from ..encoders import Encoder

    started = time.time()
    teacher = Encoder.load(teacher_name, backend="torch")  # float32 targets, not the int8 approximation
    texts = training_texts(sets, teacher)
    student = student_of(teacher.model, layers)
    bert, tokenizer, max_length = student[0].auto_model, student.tokenizer, student.max_seq_length
    bert.train()
    history = [{"phase": i, **vars(phase), "history": run_phase(bert, tokenizer, texts, phase, max_length, seed)}
               for i, phase in enumerate(recipe)]
    with torch.no_grad():  # the teacher's word embeddings: see the module doc
        bert.embeddings.word_embeddings.weight.copy_(teacher.model[0].auto_model.embeddings.word_embeddings.weight)
    bert.eval()
    cosine, overlap = _agreement(bert, tokenizer, texts, max_length)
    student.save(str(out))
    return {"teacher": teacher.name, "layers": list(layers), "recipe": history, "seed": seed,
            "data": {"sets": [Path(s).name for s in sets], "train_texts": len(texts.train),
                     "validation_tasks": len(texts.validation)},
            "validation": {"cosine": round(cosine, 4), "top10_agreement": round(overlap, 4)},
            "train_seconds": round(time.time() - started)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolscout.train.query_student", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="benchmark folders whose train splits are used")
    parser.add_argument("--out", required=True, help="folder to save the student in (sentence-transformers)")
    parser.add_argument("--teacher", default=None, help="encoder to distil (default: toolscout's default encoder)")
    parser.add_argument("--layers", default=",".join(map(str, LAYERS)), help="teacher layers kept, e.g. 0,2,4,5")
    parser.add_argument("--epochs-scale", type=float, default=1.0, help="multiply every phase's epochs (e.g. 0.05 for a quick trial run)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    recipe = [Phase(p.epochs * args.epochs_scale, p.lr, p.kl, p.tau) for p in RECIPE]
    info = build(args.data, Path(args.out), args.teacher, [int(x) for x in args.layers.split(",")], recipe, args.seed)
    (Path(args.out) / "toolscout-student.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"query student of {info['teacher']} ({len(info['layers'])} layers): validation cosine "
          f"{info['validation']['cosine']}, top-10 agreement {info['validation']['top10_agreement']} "
          f"({info['train_seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
