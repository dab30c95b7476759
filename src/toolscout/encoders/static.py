"""The fast tier's query encoder: a static table of word-piece vectors distilled from an encoder.

A task's vector is the sum of its word pieces' rows (plus one bias row), L2-normalised: no network runs,
so a task costs a small fraction of an encoder pass (docs/serving.md). Tools are still embedded by
the encoder the table was distilled from (its teacher), and feedback is still learned with it, so the
table answers in the teacher's vector space: an index built with the default pipeline serves fast
queries as it is, nothing re-embedded, and can go back to the teacher's queries at any time.

The table is fitted so that its sum reproduces the teacher's embedding of real tasks (`toolscout.train.
static_queries`; `scripts/build_fast_queries.sh`). It loses some quality (docs/serving.md: dev-set figures
next to the default's), so it is opt-in: `toolscout serve --fast-queries`, `ToolScout.load(dir,
fast_queries=True)` or `scout.use_fast_queries()`.

A table ships as package data (`toolscout/data/static/TEACHER/`):

    manifest.json   teacher name and the SHA-256 of its weights file, the teacher's encoding, the word-piece
                    truncation, recipe, data and validation figures (the tokenizer is the teacher's own)
    table.npz       codes (vocabulary x dim, int8), one scale per row, the bias row (float32)
    reference.npz   probe texts and their vectors by the fitting run's table, as shipped (the load check)
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from ..conversation import emphasise_latest_turn
from ..errors import FastQueriesUnavailable
from ..query import Query, as_queries
from .shipped import tokenizer_file, weights_sha256
from .query_cache import QueryCache

STATIC_DIR = Path(__file__).resolve().parents[1] / "data" / "static"
MANIFEST = "manifest.json"
TABLE = "table.npz"
REFERENCE = "reference.npz"


class StaticTableError(FastQueriesUnavailable):
    """A static query table cannot serve this encoder (none ships for it, or it was fitted to other weights)."""


class StaticTable:
    """Word-piece rows and a bias row; `encode` sums a text's rows. `tokenizer` is the teacher's (a
    `tokenizers.Tokenizer`), `max_tokens` its truncation."""

    def __init__(self, rows: np.ndarray, bias: np.ndarray, tokenizer, max_tokens: int, truncation_side: str = "right"):
        self.rows = np.ascontiguousarray(rows, dtype=np.float32)
        self.bias = np.asarray(bias, dtype=np.float32)
        if self.rows.shape[1] != len(self.bias) or tokenizer.get_vocab_size() != len(self.rows):
            raise StaticTableError(f"a static table of {self.rows.shape} with a {len(self.bias)}-wide bias does not "
                                   f"fit a tokenizer of {tokenizer.get_vocab_size()} word pieces")
        self.tokenizer = piece_tokenizer(tokenizer, max_tokens, truncation_side)
        self.dim = len(self.bias)

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return word_pieces(self.tokenizer, texts)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, ids in enumerate(self.token_ids(texts)):
            vector = self.rows[ids].sum(axis=0) + self.bias if ids else self.bias.copy()
            out[i] = vector / max(float(np.linalg.norm(vector)), 1e-12)
        return out


def piece_tokenizer(tokenizer, max_tokens: int, truncation_side: str = "right"):
    """`tokenizer` set up as a table reads texts, in fitting and in serving alike: no padding, at most
    `max_tokens` word pieces."""
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens, direction=truncation_side)
    return tokenizer


def word_pieces(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Each text's word pieces, without the special tokens (the bias row stands for them)."""
    return [e.ids for e in tokenizer.encode_batch([str(t) for t in texts], add_special_tokens=False)]


class StaticQueryEncoder:
    """A dense retriever's query encoder (`DenseRetriever.query_encoder`): tasks through `table`, which
    was distilled from `teacher` (the `Encoder` that made the tool vectors and keeps learning from
    feedback). A chat transcript weighs in its latest user turn, as the teacher's queries do."""

    def __init__(self, teacher, table: StaticTable):
        if teacher.dim != table.dim:
            raise StaticTableError(f"the static table gives {table.dim}-dimensional vectors, {teacher.name!r} {teacher.dim}")
        self.teacher = teacher
        self.table = table
        self.dim = table.dim
        self.query_cache = QueryCache()

    def encode_queries(self, queries: Sequence[Query | str]) -> np.ndarray:
        queries = as_queries(queries)
        if len(queries) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        weight = self.teacher.latest_turn_weight
        return self.query_cache.vectors(queries, ("static", weight), lambda missing: emphasise_latest_turn(
            self.table.encode([q.context for q in missing]), [q.latest_turn for q in missing], self.table.encode, weight))


# ------------------------------------------------------------------------------------------ loading

_loaded: dict[Path, StaticTable] = {}
_load_lock = threading.Lock()


def static_queries_for(encoder) -> StaticQueryEncoder:
    """`encoder` with its tasks encoded by the static table distilled from it. Raises StaticTableError
    when no shipped table was fitted to exactly these weights."""
    folder = STATIC_DIR / Path(str(encoder.name)).name
    if not (folder / MANIFEST).is_file():
        shipped = sorted(p.parent.name for p in STATIC_DIR.glob(f"*/{MANIFEST}"))
        raise StaticTableError(f"fast queries need a static table distilled from the index's encoder {encoder.name!r}; "
                               f"toolscout ships one for: {', '.join(shipped) or 'none'}")
    info = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    found = teacher_digest(encoder)
    if found != info["teacher_digest"]:
        raise StaticTableError(f"the static table in {folder} was distilled from other weights of {info['teacher']!r} "
                               f"(digest {info['teacher_digest'][:12]}, this encoder's {found[:12]}); rebuild it with "
                               "scripts/build_fast_queries.sh")
    with _load_lock:
        if folder not in _loaded:
            _loaded[folder] = load_table(folder, encoder_tokenizer(encoder), info)
    return StaticQueryEncoder(encoder, _loaded[folder])


def load_table(folder: Path, tokenizer, info: dict) -> StaticTable:
    with np.load(folder / TABLE) as data:
        rows = data["codes"].astype(np.float32) * data["scales"][:, None]
        bias = data["bias"]
    return StaticTable(rows, bias, tokenizer, int(info["max_tokens"]), info.get("truncation_side", "right"))


def teacher_digest(encoder) -> str:
    """SHA-256 of the teacher's weights file (what the table was fitted to; for a packaged model run from
    its shipped ONNX export, what the export recorded of the weights it was made from)."""
    digest = weights_sha256(encoder.path)
    if digest is None:
        missing = Path(str(encoder.path)) / "model.safetensors"
        raise StaticTableError(f"fast queries need the encoder's weights on disk; {missing} does not exist")
    return digest


def encoder_tokenizer(encoder):
    from tokenizers import Tokenizer

    path = tokenizer_file(encoder.path)
    if path is None:
        missing = Path(str(encoder.path)) / "tokenizer.json"
        raise StaticTableError(f"fast queries need the encoder's fast tokenizer; {missing} does not exist")
    return Tokenizer.from_file(str(path))


def write_table(out: Path, rows: np.ndarray, bias: np.ndarray, info: dict, probes: Sequence[str], tokenizer) -> dict:
    """Write a table folder: rows rounded to int8 with one scale per row, the manifest, and the reference
    vectors of `probes` by the table exactly as written."""
    from ..store.prefilter import quantise_rows  # the int8 scheme the vector store's prefilter uses

    out.mkdir(parents=True, exist_ok=True)
    quantised = quantise_rows(rows)
    np.savez_compressed(out / TABLE, codes=quantised.codes, scales=quantised.scales.astype(np.float32),
                        bias=np.asarray(bias, dtype=np.float32))
    (out / MANIFEST).write_text(json.dumps(info, indent=2, default=str) + "\n", encoding="utf-8")
    table = load_table(out, tokenizer, info)
    np.savez(out / REFERENCE, texts=np.asarray(list(probes), dtype=str), vectors=table.encode(list(probes)))
    return info
