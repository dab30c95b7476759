"""An inverted index that scores BM25 at query time, so documents can be added and removed one at a time.

bm25s precomputes every (document, term) score, which depends on the catalog's size, document
frequencies and mean length: one added tool changes them all, and the whole matrix is rebuilt (about a
second at 20k tools, under the write lock, while searches wait). Here the postings keep raw term
frequencies; a term's scores are computed (vectorised over its postings) when a query first needs them
and kept until the next write. A write costs the words of the documents written. The postings of a term
as arrays (reading a dict of thousands of entries is the slow part) outlive writes that do not touch the
term: under a writer at 4 writes/s, rebuilding them after every write took 7% of a 2-core server's time.

The scores are bm25s's "lucene" scores to the bit: the same idf (float32), the same term-frequency
component (float64), each (document, term) score rounded to float32 and summed in query-token order, as
bm25s's `get_scores` does; an empty document counts as one word long (bm25s indexes a placeholder).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Mapping, Sequence

import numpy as np


class InvertedIndex:
    """BM25 (Lucene variant) over documents identified by their row; rows shift down when rows before them
    are removed, as `RowTable.remove_rows` does."""

    def __init__(self, k1: float, b: float):
        self.k1, self.b = k1, b
        self._postings: dict[str, dict[int, int]] = {}  # term -> slot -> term frequency
        self._slot_terms: list[tuple[str, ...]] = []  # slot -> its distinct terms (() once removed)
        self._lengths: list[int] = []  # slot -> document length
        self._slot_of_row: list[int] = []
        self._total_length = 0
        # built on use, dropped by every write (a write changes the catalog's size and mean length, so
        # every score): each term's (rows, scores) and the slots' length normalisers
        self._term_scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._norms: np.ndarray | None = None
        # each term's postings as (slots, term frequencies) arrays: dropped only by a write to that term;
        # at most every posting once (12 bytes each: 5 MB for the load test's 20,000 tools)
        self._term_postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    @classmethod
    def build(cls, documents: Sequence[Sequence[str]], k1: float, b: float) -> "InvertedIndex":
        index = cls(k1, b)
        for tokens in documents:
            index.append(tokens)
        return index

    def __len__(self) -> int:
        return len(self._slot_of_row)

    def __contains__(self, term: str) -> bool:
        return term in self._postings

    def append(self, tokens: Sequence[str]) -> None:
        """A new document at the next row."""
        self._slot_of_row.append(self._new_slot(tokens))
        self._changed()

    def replace(self, row: int, tokens: Sequence[str]) -> None:
        """The document at `row` becomes `tokens`."""
        self._drop_slot(self._slot_of_row[row])
        self._slot_of_row[row] = self._new_slot(tokens)
        self._changed()
        self._compact_if_sparse()

    def remove_rows(self, keep: np.ndarray) -> None:
        """Drop the rows whose `keep` entry is False; the others close up in order."""
        for row in np.flatnonzero(~keep):
            self._drop_slot(self._slot_of_row[row])
        self._slot_of_row = [slot for slot, k in zip(self._slot_of_row, keep) if k]
        self._changed()
        self._compact_if_sparse()

    def scores(self, tokens: Sequence[str]) -> np.ndarray:
        """The BM25 score of every row for the query words `tokens` (repeats count again)."""
        out = np.zeros(len(self._slot_of_row), dtype=np.float32)
        for term in tokens:
            found = self._scores_of(term)
            if found is not None:
                rows, scores = found
                out[rows] += scores
        return out

    def weighted_scores(self, weights: Mapping[str, float]) -> np.ndarray:
        """The BM25 score of every row for query words of given weights: each word's term score times its
        weight (`scores` is the case where every occurrence weighs 1)."""
        out = np.zeros(len(self._slot_of_row), dtype=np.float32)
        for term, weight in weights.items():
            found = self._scores_of(term)
            if found is not None:
                rows, scores = found
                out[rows] += np.float32(weight) * scores
        return out

    def _scores_of(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows, float32 scores) of the documents holding `term`, computed once per catalog state."""
        found = self._term_scores.get(term)
        if found is None:
            arrays = self._postings_arrays(term)
            if arrays is None:
                return None
            slots, tfs = arrays
            n = len(self._slot_of_row)
            idf = np.float32(math.log(1 + (n - len(slots) + 0.5) / (len(slots) + 0.5)))
            rows, norms = self._rows_and_norms()
            found = (rows[slots], (idf * (tfs / (norms[slots] + tfs))).astype(np.float32))
            self._term_scores[term] = found
        return found

    # internals ------------------------------------------------------------------------------
    def _postings_arrays(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(slots, float32 term frequencies) of the documents holding `term`, in the postings' order."""
        found = self._term_postings.get(term)
        if found is None:
            postings = self._postings.get(term)
            if postings is None:
                return None
            found = (np.fromiter(postings.keys(), dtype=np.int64, count=len(postings)),
                     np.fromiter(postings.values(), dtype=np.float32, count=len(postings)))
            self._term_postings[term] = found
        return found

    def _new_slot(self, tokens: Sequence[str]) -> int:
        slot = len(self._lengths)
        counts = Counter(tokens)
        for term, tf in counts.items():
            self._postings.setdefault(term, {})[slot] = tf
            self._term_postings.pop(term, None)
        self._slot_terms.append(tuple(counts))
        length = len(tokens) or 1  # bm25s gives an empty document one placeholder word
        self._lengths.append(length)
        self._total_length += length
        return slot

    def _drop_slot(self, slot: int) -> None:
        for term in self._slot_terms[slot]:
            postings = self._postings[term]
            del postings[slot]
            self._term_postings.pop(term, None)
            if not postings:
                del self._postings[term]
        self._slot_terms[slot] = ()
        self._total_length -= self._lengths[slot]

    def _compact_if_sparse(self) -> None:
        """Slots of removed documents are not reused; once they outnumber the live ones (plus some slack),
        renumber the live ones 0, 1, ... in row order (amortised: at most one pass per that many writes)."""
        if len(self._lengths) <= 2 * len(self._slot_of_row) + 1024:
            return
        new_of_old = {old: new for new, old in enumerate(self._slot_of_row)}
        self._postings = {term: {new_of_old[s]: tf for s, tf in postings.items()}
                          for term, postings in self._postings.items()}
        self._slot_terms = [self._slot_terms[old] for old in self._slot_of_row]
        self._lengths = [self._lengths[old] for old in self._slot_of_row]
        self._slot_of_row = list(range(len(self._slot_of_row)))
        self._term_postings.clear()  # every slot was renumbered
        self._changed()

    def _changed(self) -> None:
        self._term_scores.clear()
        self._row_of_slot = self._norms = None

    def _rows_and_norms(self) -> tuple[np.ndarray, np.ndarray]:
        """Each slot's row (-1: removed) and k1 * (1 - b + b * length / mean length), as bm25s computes it."""
        if self._row_of_slot is None:
            rows = np.full(len(self._lengths), -1, dtype=np.int64)
            rows[np.asarray(self._slot_of_row, dtype=np.int64)] = np.arange(len(self._slot_of_row))
            self._row_of_slot = rows
        if self._norms is None:
            avgdl = self._total_length / max(1, len(self._slot_of_row))
            self._norms = self.k1 * ((1 - self.b) + self.b * np.asarray(self._lengths, dtype=np.int64) / avgdl)
        return self._row_of_slot, self._norms
