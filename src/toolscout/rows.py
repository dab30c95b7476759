"""A row table: tool ids in row order, with namespaces, for vectorised filtering."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .results import Filter


class RowTable:
    """Keeps `ids[row]`, `namespaces[row]` and the reverse map `row_of[id]` in step."""

    def __init__(self, ids: Sequence[str] = (), namespaces: Sequence[str | None] = ()):
        self.ids: list[str] = list(ids)
        self.namespaces: list[str] = [ns or "" for ns in namespaces] or [""] * len(self.ids)
        if len(self.namespaces) != len(self.ids):
            raise ValueError("RowTable: one namespace per id")
        self.row_of: dict[str, int] = {tid: i for i, tid in enumerate(self.ids)}
        if len(self.row_of) != len(self.ids):
            raise ValueError("RowTable: duplicate ids")
        self._ns_array: np.ndarray | None = None
        self._id_array: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, tool_id: str) -> bool:
        return tool_id in self.row_of

    def append(self, tool_id: str, namespace: str | None) -> int:
        row = len(self.ids)
        self.ids.append(tool_id)
        self.namespaces.append(namespace or "")
        self.row_of[tool_id] = row
        self._invalidate()
        return row

    def set_namespace(self, row: int, namespace: str | None) -> None:
        self.namespaces[row] = namespace or ""
        self._invalidate()

    def remove_rows(self, rows: Iterable[int]) -> np.ndarray:
        """Drop `rows`; return a boolean keep-mask over the old rows (to compact parallel arrays)."""
        keep = np.ones(len(self.ids), dtype=bool)
        rows = list(rows)
        keep[rows] = False
        if not rows:
            return keep
        # only the rows after the first removed one move: a write that removes a recently added tool
        # (near the end) costs O(1), not a rebuild of a 20k-entry map (~15 ms) under the write lock
        first = min(rows)
        for row in set(rows):
            del self.row_of[self.ids[row]]
        self.ids[first:] = [tid for tid, k in zip(self.ids[first:], keep[first:]) if k]
        self.namespaces[first:] = [ns for ns, k in zip(self.namespaces[first:], keep[first:]) if k]
        for row in range(first, len(self.ids)):
            self.row_of[self.ids[row]] = row
        self._invalidate()
        return keep

    def _invalidate(self) -> None:
        self._ns_array = None
        self._id_array = None

    @property
    def id_array(self) -> np.ndarray:
        if self._id_array is None:
            self._id_array = np.asarray(self.ids, dtype=object)
        return self._id_array

    def mask(self, flt: Filter | None) -> np.ndarray | None:
        """Boolean mask of rows `flt` allows, or None when it allows every row."""
        if flt is None:
            return None
        mask = np.ones(len(self.ids), dtype=bool)
        if flt.namespaces is not None:
            if self._ns_array is None:
                self._ns_array = np.asarray(self.namespaces, dtype=object)
            mask &= np.isin(self._ns_array, list(flt.namespaces))
        if flt.ids is not None:
            allowed = np.zeros(len(self.ids), dtype=bool)
            allowed[[self.row_of[t] for t in flt.ids if t in self.row_of]] = True
            mask &= allowed
        if flt.exclude_ids:
            mask[[self.row_of[t] for t in flt.exclude_ids if t in self.row_of]] = False
        return mask
