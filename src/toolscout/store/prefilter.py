"""Exact top-k over a large float32 matrix from an int8 copy a quarter of its size.

Scoring queries against a big catalog reads every stored vector once per matrix product, so it is bound
by memory bandwidth, not arithmetic (43k x 384 float32 = 66 MB). An int8 copy of the rows is a quarter
of that, and onnxruntime (which every install has: it runs the encoder) multiplies it by int8 queries
with its integer kernel (`data/kernels/matmul_integer.onnx`, one MatMulInteger node; written by
`scripts/make_matmul_integer.py`), so no torch is needed. Its scores are approximate,
but each has a hard error bound, so they select a small candidate set per query that is guaranteed to
contain the exact top-k; the candidates are then rescored in float32. The result is the exact search's
result, not an approximation.

The bound. A row r is stored as s_r * r8 (r8 = round(r / s_r), s_r = max |r_i| / 127) with rounding
error e_r = r - s_r * r8, and a query q likewise as s_q * q8 with error e_q. The approximate score
s_r * s_q * (r8 . q8) is exact integer arithmetic, and differs from r . q by
    |s_r r8 . e_q + e_r . s_q q8 + e_r . e_q| <= (|r| + |e_r|) |e_q| + |e_r| (|q| + |e_q|) + |e_r| |e_q|
(Cauchy-Schwarz), where every norm is computed from the actual vectors (|e_r| once per row when the copy is
built, |e_q| per query), plus a margin for float32 rounding. Taking the largest |r| and |e_r| of the
catalog gives one bound, delta, per query. Let t be the k-th largest approximate score: k rows score at
least t - delta, so every row of the exact top-k scores at least t - delta and has an approximate score
of at least t - 2 delta. Every such row is kept; the others cannot be in the top-k.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

logger = logging.getLogger(__name__)
KERNEL = Path(__file__).resolve().parent.parent / "data" / "kernels" / "matmul_integer.onnx"

LEVELS = 127  # symmetric int8
# Queries get fewer levels: on x86 CPUs with AVX2 but no VNNI, onnxruntime's uint8 x int8 kernel adds each
# pair of products in saturating int16 (VPMADDUBSW), and 2 x 255 x 63 < 32767 keeps every sum exact there.
# The coarser query only widens its error bound, so a few more candidates are rescored.
QUERY_LEVELS = 63
ROUNDING_MARGIN = 1e-4  # x |r| |q|: float32 rounding of a 384..4096-term dot product stays far below this
BOUND_SAFETY = 1.0  # the measured error must stay within this times the bound when the copy is checked


CHUNK = 4096  # rows worked on in float64 at once: a whole large catalog in float64 would double a server's peak


class Quantised(NamedTuple):
    """Float rows as int8 codes with one scale per row, and what the error bound reads of each row."""

    codes: np.ndarray  # int8
    scales: np.ndarray
    errors: np.ndarray  # the norm of each row's rounding error
    norms: np.ndarray  # each row's own norm


def quantise_rows(rows: np.ndarray, levels: int = LEVELS) -> Quantised:
    """`rows` rounded to int8 within +-`levels` (a chunk at a time in float64)."""
    rows = np.asarray(rows)
    codes = np.empty(rows.shape, dtype=np.int8)
    scales, errors, norms = np.empty(len(rows)), np.empty(len(rows)), np.empty(len(rows))
    for start in range(0, len(rows), CHUNK):
        part, at = rows[start:start + CHUNK].astype(np.float64), slice(start, start + CHUNK)
        peak = np.abs(part).max(axis=1) if part.shape[1] else np.zeros(len(part))
        scales[at] = np.where(peak > 0, peak / levels, 1.0)
        rounded = np.clip(np.rint(part / scales[at, None]), -levels, levels)
        errors[at] = np.linalg.norm(part - rounded * scales[at, None], axis=1)
        norms[at] = np.linalg.norm(part, axis=1)
        codes[at] = rounded
    return Quantised(codes, scales, errors, norms)


def exact_scores(queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """queries . rows in float64, (queries, rows), a chunk of rows at a time."""
    queries = queries.astype(np.float64)
    return np.concatenate([queries @ rows[start:start + CHUNK].T.astype(np.float64)
                           for start in range(0, len(rows), CHUNK)] or [np.zeros((len(queries), 0))], axis=1)


class IntegerProduct:
    """Integer dot products of int8 rows and queries within +-QUERY_LEVELS, exact on every CPU, through
    onnxruntime's MatMulInteger. Its fast kernel takes uint8 on the left, so the rows are kept offset by
    128 (`stored`), and (r + 128) . q - 128 sum(q) = r . q in int32 (4096 x 255 x 63 fits)."""

    def __init__(self):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # searches run side by side, one per core
        self.session = ort.InferenceSession(str(KERNEL), options, providers=["CPUExecutionProvider"])

    @staticmethod
    def stored(codes: np.ndarray) -> np.ndarray:
        """int8 codes as the product keeps them: offset by 128, as uint8 (flipping the sign bit does it)."""
        return np.ascontiguousarray(codes, dtype=np.int8).view(np.uint8) ^ np.uint8(0x80)

    def __call__(self, stored: np.ndarray, queries: np.ndarray) -> np.ndarray:
        """(queries, rows) int32 products of int8 `queries` with the rows held as `stored`."""
        offset = self.session.run(None, {"rows": stored, "queries": np.ascontiguousarray(queries.T)})[0]
        scores = np.ascontiguousarray(offset.T)  # each query's scores in one run of memory: read per query next
        scores -= 128 * queries.sum(axis=1, dtype=np.int32)[:, None]
        return scores


@functools.cache
def integer_product() -> IntegerProduct | None:
    """The one product every prefilter shares (sessions take concurrent runs); None when onnxruntime
    cannot run the kernel here (the stores then scan in float32)."""
    try:
        return IntegerProduct()
    except Exception as exc:  # noqa: BLE001  (an import error, or onnxruntime refusing the graph)
        logger.info("int8 prefilter unavailable: %s", exc)
        return None


class Int8Prefilter:
    """An int8 copy of a store's matrix that narrows each query's exact search to a few rows.

    It follows writes row by row (`set_rows`, `append`, `keep`): a write to a 20k-row store re-quantises
    the written rows only (rebuilding the copy took ~140 ms a write: under a writer at 4 writes/s, most
    of a two-core server's time). The bound reads the largest row norm and rounding error, kept per row."""

    def __init__(self, product: IntegerProduct, rows: Quantised):
        self.product = product
        self._set(product.stored(rows.codes), rows.scales.astype(np.float32), rows.norms, rows.errors)

    def _set(self, stored: np.ndarray, scales: np.ndarray, norms: np.ndarray, errors: np.ndarray) -> None:
        self.stored = np.ascontiguousarray(stored)  # the int8 codes as the product keeps them
        self.scales, self.norms, self.errors = scales, norms, errors
        self.max_norm = float(norms.max()) if len(norms) else 0.0
        self.max_error = float(errors.max()) if len(errors) else 0.0

    @classmethod
    def build(cls, matrix: np.ndarray) -> "Int8Prefilter | None":
        """The prefilter for `matrix`, or None when the integer product cannot run here, the matrix is not
        finite, or the bound fails its check on stored rows."""
        product = integer_product()
        if product is None or not len(matrix) or not np.isfinite(matrix).all():
            return None
        prefilter = cls(product, quantise_rows(matrix))
        probes = np.vstack([matrix[: min(4, len(matrix))], matrix.mean(axis=0, keepdims=True)])
        # the products searches use: one query alone and a batch
        checks = [(prefilter.bounds(probes[:1]), probes[:1]), (prefilter.bounds(probes), probes)]
        for (approx, delta), batch in checks:
            error = np.abs(approx - exact_scores(batch, matrix)).max(axis=1)
            if np.any(error > BOUND_SAFETY * delta):
                logger.warning("int8 prefilter disabled: measured error %.3g exceeds its bound", float(error.max()))
                return None
        return prefilter

    # following the store's writes (each False: a row is not finite, so the store must drop the copy)
    def set_rows(self, rows: Sequence[int], vectors: np.ndarray) -> bool:
        if not np.isfinite(vectors).all():
            return False
        new = quantise_rows(vectors)
        self.stored[rows], self.scales[rows] = self.product.stored(new.codes), new.scales
        self.errors[rows], self.norms[rows] = new.errors, new.norms
        self.max_norm, self.max_error = float(self.norms.max()), float(self.errors.max())
        return True

    def append(self, vectors: np.ndarray) -> bool:
        if not np.isfinite(vectors).all():
            return False
        new = quantise_rows(vectors)
        self._set(np.concatenate([self.stored, self.product.stored(new.codes)]),
                  np.concatenate([self.scales, new.scales.astype(np.float32)]),
                  np.concatenate([self.norms, new.norms]), np.concatenate([self.errors, new.errors]))
        return True

    def keep(self, rows: np.ndarray) -> bool:
        """Keep only `rows` (indices or a mask, as the store keeps its matrix's)."""
        self._set(self.stored[rows], self.scales[rows], self.norms[rows], self.errors[rows])
        return len(self.norms) > 0

    def bounds(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(approximate scores of every row for each query, (queries, rows); each query's error bound)."""
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        codes, scales, errors, q_norms = quantise_rows(queries, QUERY_LEVELS)
        approx = self.product(self.stored, codes) * self.scales[None, :]
        approx *= scales.astype(np.float32)[:, None]
        n, e = self.max_norm, self.max_error
        delta = (n + e) * errors + e * (q_norms + errors) + e * errors + ROUNDING_MARGIN * n * q_norms
        return approx, delta

    def candidates(self, approx: np.ndarray, delta: float, k: int, mask: np.ndarray | None) -> np.ndarray:
        """Rows (ascending) guaranteed to include the exact top-k of one query among `mask`'s rows, from
        that query's approximate scores and bound (`bounds`)."""
        if mask is not None:
            approx = np.where(mask, approx, -np.inf)
        n = len(approx)
        if k >= n:
            rows = np.arange(n)
        else:
            kth = np.partition(approx, n - k)[n - k]
            # fewer than k allowed rows: every allowed row is a candidate
            rows = np.arange(n) if not np.isfinite(kth) else np.flatnonzero(approx >= kth - 2.0 * delta)
        if mask is not None:
            rows = rows[mask[rows]]
        return rows
