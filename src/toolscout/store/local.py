"""In-process vector stores: exact search in numpy (the default) and approximate search with FAISS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from ..artifacts import DamagedFile, load_array, read_json
from ..errors import InvalidRequest, MissingDependency, UnknownName
from ..results import Filter, Results, top_k_rows
from ..rows import RowTable
from .base import VectorStore, checked_vectors
from .prefilter import Int8Prefilter


class NumpyStore:
    """Exact inner-product search over a dense float32 matrix. Fast enough for ~100k tools on a CPU.

    Large stores answer queries through an int8 prefilter (`store.prefilter`): a quarter of the memory
    read per query, same exact top-k, at the price of a quarter-size copy of the matrix.
    """

    kind = "numpy"
    PREFILTER_MIN_ROWS = 16384  # smaller matrices scan in float32 in ~1.5 ms or less
    PREFILTER_MAX_QUERIES = 64  # a server's batch: one int8 product for all; bigger ones are not searches

    def __init__(self, dim: int):
        self.dim = int(dim)
        self.rows = RowTable()
        self.matrix = np.zeros((0, self.dim), dtype=np.float32)
        self._prefilter: Int8Prefilter | None = None
        self._prefilter_checked = False  # built (or found unusable) for the current matrix

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def ids(self) -> list[str]:
        return self.rows.ids

    def upsert(self, ids: Sequence[str], vectors: np.ndarray, namespaces: Sequence[str | None] | None = None) -> None:
        vectors = checked_vectors(ids, vectors, self.dim, "upsert")
        namespaces = list(namespaces) if namespaces is not None else [None] * len(ids)
        new_rows, replaced, replaced_rows = [], [], []
        for i, (tid, ns) in enumerate(zip(ids, namespaces)):
            row = self.rows.row_of.get(tid)
            if row is None:
                new_rows.append(i)
                self.rows.append(tid, ns)
            else:
                self.matrix[row] = vectors[i]
                self.rows.set_namespace(row, ns)
                replaced.append(i)
                replaced_rows.append(row)
        if replaced:
            self._follow(lambda p: p.set_rows(replaced_rows, vectors[replaced]))
        if new_rows:
            self.matrix = np.concatenate([self.matrix, vectors[new_rows]], axis=0)
            self._follow(lambda p: p.append(vectors[new_rows]))

    def update_vectors(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        vectors = checked_vectors(ids, vectors, self.dim, "update_vectors")
        rows = [self.rows.row_of[t] for t in ids]  # KeyError before anything changes
        if rows:
            self.matrix[rows] = vectors
            self._follow(lambda p: p.set_rows(rows, vectors))

    def delete(self, ids: Sequence[str]) -> None:
        rows = [self.rows.row_of[t] for t in ids if t in self.rows.row_of]
        if rows:
            keep = self.rows.remove_rows(rows)
            self.matrix = self.matrix[keep]
            self._follow(lambda p: p.keep(keep))

    def get(self, ids: Sequence[str]) -> np.ndarray:
        return self.matrix[[self.rows.row_of[t] for t in ids]]

    def _follow(self, change) -> None:
        """Apply a write to the int8 copy, row by row; when there is none, or the change cannot follow
        (rows that are not finite), the copy is rebuilt (or found unusable) on next use."""
        if self._prefilter is None or not change(self._prefilter):
            self._matrix_changed()

    def _matrix_changed(self) -> None:
        self._prefilter, self._prefilter_checked = None, False

    def prefilter(self) -> Int8Prefilter | None:
        """The int8 prefilter when this store is large enough to gain from it (built on first use)."""
        if len(self.rows) < self.PREFILTER_MIN_ROWS:
            return None
        if not self._prefilter_checked:
            self._prefilter, self._prefilter_checked = Int8Prefilter.build(self.matrix), True
        return self._prefilter

    def search(self, vectors: np.ndarray, k: int, filter: Filter | None = None) -> Results:
        vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
        if len(self.rows) == 0:
            return Results.empty(len(vectors))
        if len(vectors) <= self.PREFILTER_MAX_QUERIES and (prefilter := self.prefilter()) is not None:
            return self._search_prefiltered(prefilter, vectors, k, self.rows.mask(filter))
        if len(vectors) <= 32:  # the same dot products (bitwise); OpenBLAS runs this orientation 1.5-3.4x
            # faster for a few queries (a server's batch of 2-32), the other one faster for many
            scores = np.ascontiguousarray((self.matrix @ vectors.T).T)
        else:
            scores = vectors @ self.matrix.T
        mask = self.rows.mask(filter)
        if mask is not None:
            scores[:, ~mask] = -np.inf
        top = top_k_rows(scores, k)
        id_array = self.rows.id_array
        out_ids, out_scores = [], []
        for q in range(len(vectors)):
            rows = top[q]
            s = scores[q, rows]
            if mask is not None:
                rows, s = rows[np.isfinite(s)], s[np.isfinite(s)]
            out_ids.append(id_array[rows])
            out_scores.append(s.astype(np.float32))
        return Results(tuple(out_ids), tuple(out_scores))

    def _search_prefiltered(self, prefilter: Int8Prefilter, vectors: np.ndarray, k: int,
                            mask: np.ndarray | None) -> Results:
        id_array = self.rows.id_array
        out_ids, out_scores = [], []
        approx, delta = prefilter.bounds(vectors)
        for vector, approx_row, bound in zip(vectors, approx, delta):
            rows = prefilter.candidates(approx_row, bound, k, mask)
            scores = self.matrix[rows] @ vector  # exact float32 scores of the candidates
            top = top_k_rows(scores[None, :], k)[0]  # candidates ascend by row: same tie order as a full scan
            out_ids.append(id_array[rows[top]])
            out_scores.append(scores[top].astype(np.float32))
        return Results(tuple(out_ids), tuple(out_scores))

    # persistence ---------------------------------------------------------------------------
    def save(self, folder: Path) -> dict:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "vectors.npy", self.matrix)
        (folder / "ids.json").write_text(json.dumps({"ids": self.rows.ids, "namespaces": self.rows.namespaces}))
        return {"store": self.kind, "dim": self.dim}

    @classmethod
    def load(cls, folder: Path, config: dict) -> "NumpyStore":
        store = cls(config["dim"])
        meta = read_json(folder / "ids.json")
        store.rows = RowTable(meta["ids"], meta["namespaces"])
        store.matrix = load_array(folder / "vectors.npy")
        if store.matrix.shape != (len(store.rows), store.dim):
            raise DamagedFile(f"{folder / 'vectors.npy'}: has shape {store.matrix.shape}, expected "
                              f"({len(store.rows)}, {store.dim}) (ids.json lists {len(store.rows)} tools)")
        return store


class FaissStore(NumpyStore):
    """Approximate search with a FAISS index built from a factory string (default `HNSW32`).

    The numpy matrix stays the source of truth (so updates and exact fallbacks are cheap); the FAISS
    index is rebuilt lazily after deletes or updates, and added to incrementally on inserts. Searches
    whose filter allows only a small share of the catalog run exactly on that share, where graph
    search would lose recall.

    efSearch 256 by default: on the 43k-tool scale benchmark, recall@10 against exact search (tools
    with identical vectors counted as equal) was 0.975 at 128, 0.992 at 256 and 0.997 at 512, for a
    search of 0.45, 0.75 and 1.3 ms p50; the query encoding (~7 ms) dominates either way.
    """

    kind = "faiss"
    EXACT_FILTER_SHARE = 0.2

    def __init__(self, dim: int, factory: str = "HNSW32", ef_search: int = 256, ef_construction: int = 80):
        super().__init__(dim)
        try:
            import faiss  # noqa: F401
        except ImportError:
            raise MissingDependency("faiss-cpu", "the FAISS store", extra="faiss") from None
        self.factory = factory
        self.ef_search = ef_search
        self.ef_construction = ef_construction
        self._index = None  # covers rows [0, _indexed) of self.matrix
        self._indexed = 0
        self._new_index()  # a factory string FAISS cannot read is refused now, not at the first search

    def _new_index(self):
        import faiss

        try:
            index = faiss.index_factory(self.dim, self.factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as exc:  # FAISS's message ends a C++ trace; its last line says what is wrong
            said = str(exc).strip().rsplit(": ", 1)[-1] or type(exc).__name__
            raise InvalidRequest(f"store faiss:{self.factory}: FAISS cannot make that index ({said})") from None
        hnsw = getattr(index, "hnsw", None)
        if hnsw is not None:
            hnsw.efConstruction = self.ef_construction
            hnsw.efSearch = self.ef_search
        return index

    def upsert(self, ids, vectors, namespaces=None) -> None:
        replaced = any(t in self.rows.row_of for t in ids)
        super().upsert(ids, vectors, namespaces)
        if replaced:
            self._index = None  # an existing row's vector changed: graph must be rebuilt

    def update_vectors(self, ids, vectors) -> None:
        super().update_vectors(ids, vectors)
        if len(ids):
            self._index = None  # existing rows' vectors changed: the graph must be rebuilt

    def delete(self, ids) -> None:
        before = len(self.rows)
        super().delete(ids)
        if len(self.rows) != before:
            self._index = None

    def _ensure_index(self):
        if self._index is None:
            self._index = self._new_index()
            self._indexed = 0
        if self._indexed < len(self.matrix):
            part = self.matrix[self._indexed:]
            if not self._index.is_trained:
                self._index.train(self.matrix)
            self._index.add(part)
            self._indexed = len(self.matrix)
        return self._index

    def build(self) -> None:
        """Build the index now (otherwise it is built on the first search)."""
        self._ensure_index()

    def search(self, vectors, k, filter=None) -> Results:
        import faiss

        vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
        if len(self.rows) == 0:
            return Results.empty(len(vectors))
        mask = self.rows.mask(filter)
        if mask is not None and mask.sum() <= self.EXACT_FILTER_SHARE * len(mask):
            return self._exact_subset(vectors, k, mask)
        index = self._ensure_index()
        params = None
        if mask is not None:
            selector = faiss.IDSelectorBitmap(np.packbits(mask, bitorder="little"))
            params = faiss.SearchParametersHNSW(sel=selector, efSearch=max(self.ef_search, k)) \
                if hasattr(index, "hnsw") else faiss.SearchParameters(sel=selector)
        elif hasattr(index, "hnsw") and k > self.ef_search:
            params = faiss.SearchParametersHNSW(efSearch=k)
        scores, rows = index.search(vectors, min(k, len(self.rows)), params=params)
        id_array = self.rows.id_array
        out_ids, out_scores = [], []
        for q in range(len(vectors)):
            valid = rows[q] >= 0
            out_ids.append(id_array[rows[q][valid]])
            out_scores.append(scores[q][valid].astype(np.float32))
        return Results(tuple(out_ids), tuple(out_scores))

    def _exact_subset(self, vectors, k, mask) -> Results:
        allowed = np.flatnonzero(mask)
        scores = vectors @ self.matrix[allowed].T
        top = top_k_rows(scores, k)
        id_array = self.rows.id_array
        return Results(
            tuple(id_array[allowed[top[q]]] for q in range(len(vectors))),
            tuple(scores[q, top[q]].astype(np.float32) for q in range(len(vectors))),
        )

    def save(self, folder: Path) -> dict:
        import faiss

        config = super().save(folder)
        faiss.write_index(self._ensure_index(), str(folder / "faiss.index"))
        config.update(store=self.kind, factory=self.factory, ef_search=self.ef_search,
                      ef_construction=self.ef_construction)
        return config

    @classmethod
    def load(cls, folder: Path, config: dict) -> "FaissStore":
        import faiss

        base = NumpyStore.load(folder, config)
        store = cls(config["dim"], config.get("factory", "HNSW32"), config.get("ef_search", 128),
                    config.get("ef_construction", 80))
        store.rows, store.matrix = base.rows, base.matrix
        index_file = folder / "faiss.index"
        if index_file.exists():
            store._index = faiss.read_index(str(index_file))
            store._indexed = store._index.ntotal
            hnsw = getattr(store._index, "hnsw", None)
            if hnsw is not None:
                hnsw.efSearch = store.ef_search
            if store._indexed != len(store.matrix):
                store._index = None  # stale: rebuild on first search
        return store


STORES = {"numpy": NumpyStore, "faiss": FaissStore}


def make_store(kind: str, dim: int, **options) -> VectorStore:
    """`kind` is 'numpy', 'faiss' or 'faiss:FACTORY' (e.g. 'faiss:HNSW32', 'faiss:IVF1024,Flat'), or a
    PostgreSQL DSN `postgresql://...` for the shared pgvector store (store/pgvector.py): a new index for
    its tenant, which its first write replaces atomically (store/pg_catalog.py `NewPgIndex`)."""
    if kind.startswith(("postgresql://", "postgres://")):
        from .pg_catalog import NewPgIndex

        return NewPgIndex.from_spec(kind, dim, **options)
    name, _, factory = kind.partition(":")
    if name not in STORES:  # a mistyped DSN (`postgress://u:pw@h/db`) lands here: named without its password
        from .pgvector import redact

        raise UnknownName("store", redact(kind), list(STORES))
    if name == "faiss" and factory:
        options["factory"] = factory
    return STORES[name](dim, **options)


def load_store(folder: Path, config: dict) -> VectorStore:
    name = config.get("store", "numpy")
    if name == "pgvector":  # rows live in PostgreSQL; the config holds the DSN (no password)
        from .pgvector import PgVectorStore

        return PgVectorStore.load(folder, config)
    if name not in STORES:
        raise UnknownName("store", name, list(STORES))
    return STORES[name].load(folder, config)
