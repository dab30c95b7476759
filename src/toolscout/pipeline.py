"""`ToolScout`: the one public facade. A catalog, a first-stage retriever and an optional second-stage
reranker, saved as one directory.

The CLI, the evaluation harness and the servers are thin layers over this class.
"""

from __future__ import annotations

import difflib
import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from . import __version__
from .artifacts import read_config, write_artifact
from .benchmark import read_jsonl
from .errors import ToolScoutError
from .results import Filter, Results
from .rerank.base import Reranker, load_reranker
from .retrievers.base import Retriever, load_retriever, make_retriever
from .tool import Tool, split_identifier

PIPELINE_KIND = "toolscout.pipeline"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Hit:
    """One search result: the tool, its score (higher is better) and its 1-based rank.

    `match` says why the tool is there: "retrieval" (ranked by the retriever), "name" (the query named
    the tool, so it ranks first) or "always" (listed in `always_include`).
    """

    tool: Tool
    score: float
    rank: int
    match: str = "retrieval"

    def to_dict(self) -> dict[str, Any]:
        out = {"rank": self.rank, "id": self.tool.id, "name": self.tool.name,
               "namespace": self.tool.namespace, "score": round(float(self.score), 6),
               "description": self.tool.description}
        if self.tool.method:
            out["method"], out["path"] = self.tool.method, self.tool.path
        if self.match != "retrieval":
            out["match"] = self.match
        return out


class ReadWriteLock:
    """Many readers at once, or one writer. A waiting writer holds back new readers, so a stream of
    searches cannot starve an update. Not reentrant: a thread must not take it twice."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class ToolScout:
    """Search a tool catalog with a task in plain language.

        scout = ToolScout.from_tools(tools, retriever="dense")
        hits = scout.search("book a flight to Paris", k=5)

    With a `reranker` (see `toolscout.rerank`), the retriever's top `reranker.depth` candidates (or k,
    when larger) go to the reranker, whose order and scores are the answer; it never adds or drops a tool.

    Writes (`add`, `remove`) and reads may come from different threads: searches run concurrently
    under a shared lock, a write takes it exclusively, and each search sees the catalog either before
    or after a write, never half of one.
    """

    def __init__(self, retriever: Retriever, tools: Sequence[Tool] = (), *, indexed: bool = False,
                 reranker: Reranker | None = None):
        self.retriever = retriever
        self.reranker = reranker
        self._tools: dict[str, Tool] = {}
        self._lock = ReadWriteLock()
        if tools:
            self._tools = _catalog(tools)
            if not indexed:
                self.retriever.index(list(self._tools.values()))
        self._names = NameIndex(self._tools.values())
        self.saved_config: dict[str, Any] = {}  # config.json of the directory this was loaded from

    # construction ------------------------------------------------------------------------
    @classmethod
    def from_tools(cls, tools: Iterable[Tool], retriever: str = "dense", *, reranker: Reranker | str | Path | None = None,
                   **options: Any) -> "ToolScout":
        """Index `tools` with the retriever registered as `retriever` (options go to its constructor).
        `reranker`: a Reranker, or the path of a trained reranker / saved reranker folder."""
        if isinstance(reranker, (str, Path)):
            reranker = load_reranker(reranker)
        return cls(make_retriever(retriever, **options), list(tools), reranker=reranker)

    @classmethod
    def load(cls, path: str | Path) -> "ToolScout":
        folder, config = read_config(path, kind=PIPELINE_KIND, max_format=FORMAT_VERSION)
        tools = [Tool.from_dict(row) for _n, row in read_jsonl(folder / "tools.jsonl")]
        retriever = load_retriever(folder / "retriever")
        reranker = load_reranker(folder / "reranker") if (folder / "reranker").exists() else None
        scout = cls(retriever, tools, indexed=True, reranker=reranker)
        if len(retriever) != len(tools):  # a hand-edited or mismatched directory
            raise ToolScoutError(f"{path}: retriever holds {len(retriever)} tools but tools.jsonl has {len(tools)}")
        scout.saved_config = config
        return scout

    def save(self, path: str | Path, *, extra_config: dict[str, Any] | None = None) -> None:
        """Write the pipeline atomically: a crash mid-save leaves the previous save loadable.
        Searches go on while it writes; writes wait until it is done. `extra_config` adds keys to
        config.json (the server records its journal position there); `load` keeps them in `saved_config`."""
        with self._lock.read():
            config = {**(extra_config or {}),
                      "kind": PIPELINE_KIND, "format_version": FORMAT_VERSION, "toolscout": __version__,
                      "retriever": self.retriever.name, "tools": len(self._tools),
                      "reranker": self.reranker.name if self.reranker is not None else None,
                      "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            with write_artifact(path, config) as folder:
                with open(folder / "tools.jsonl", "w", encoding="utf-8") as fh:
                    for tool in self._tools.values():
                        fh.write(json.dumps(_tool_row(tool), ensure_ascii=False) + "\n")
                self.retriever.save(folder / "retriever")
                if self.reranker is not None:
                    self.reranker.save(folder / "reranker")

    # catalog -----------------------------------------------------------------------------
    @property
    def tools(self) -> list[Tool]:
        with self._lock.read():
            return list(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, tool_id: str) -> bool:
        return tool_id in self._tools

    def get(self, tool_id: str) -> Tool:
        try:
            return self._tools[tool_id]
        except KeyError:
            raise KeyError(f"no tool with id {tool_id!r} in this catalog") from None

    def add(self, tools: Iterable[Tool]) -> None:
        """Insert new tools or replace tools with the same id; only changed tools are re-encoded."""
        batch = _catalog(tools)
        with self._lock.write():
            self.retriever.add(list(batch.values()))
            for tool in batch.values():
                old = self._tools.get(tool.id)
                if old is not None:
                    self._names.remove(old)
                self._names.add(tool)
            self._tools.update(batch)

    def remove(self, ids: Iterable[str]) -> None:
        ids = list(dict.fromkeys(ids))
        with self._lock.write():
            unknown = [i for i in ids if i not in self._tools]
            if unknown:
                raise KeyError(f"cannot remove unknown tool id(s) {unknown[:5]}")
            self.retriever.remove(ids)
            for tool_id in ids:
                self._names.remove(self._tools.pop(tool_id))

    # search ------------------------------------------------------------------------------
    def retrieve(self, queries: Sequence[str], k: int = 10, filter: Filter | None = None) -> Results:
        """Raw batched results (ids and scores), as the evaluation harness wants them."""
        if isinstance(queries, str):
            raise TypeError("retrieve takes a list of queries")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        with self._lock.read():
            return self._ranked(list(queries), k, filter)

    def _ranked(self, queries: list[str], k: int, filter: Filter | None) -> Results:
        """First stage, then the reranker over its top `depth` (caller holds the read lock)."""
        if self.reranker is None:
            return self.retriever.search(queries, k, filter)
        candidates = self.retriever.search(queries, max(k, self.reranker.depth), filter)
        return self.reranker.rerank(queries, candidates, self._tools, self.retriever).top(k)

    def search(self, query: str | Sequence[str], k: int = 5, *, namespaces: Iterable[str] | None = None,
               filter: Filter | None = None, min_score: float | None = None,
               always_include: Iterable[str] = (), match_names: bool = True) -> list[Hit] | list[list[Hit]]:
        """The k best tools for `query`, best first; a list of queries gives one list per query.

        `namespaces` restricts results to tools in those namespaces (and so does `filter`; both apply).
        `min_score` is the abstention threshold: when the best retrieved tool scores below it, no
        retrieved tool is returned (a task no tool fits gets an empty list, not k weak matches).
        `match_names`: a query that is a tool's name, exactly or nearly (`get_weather`, `getWeather`,
        `weather.get_weather`, one typo), ranks that tool first, whatever the threshold (`match="name"`).
        `always_include`: tool ids returned after the ranked ones, not counted in k (`match="always"`);
        filters still apply to them. Unknown ids there are ignored.
        """
        single = isinstance(query, str)
        queries = [query] if single else list(query)
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise ValueError("each query must be a non-empty string")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if namespaces is not None:
            extra = Filter.make(namespaces=namespaces)
            filter = extra if filter is None else Filter(extra.namespaces if filter.namespaces is None
                                                         else extra.namespaces & filter.namespaces,
                                                         filter.ids, filter.exclude_ids)
        always = list(dict.fromkeys(always_include))
        with self._lock.read():
            results = self._ranked(queries, k, filter)
            hits = [self._hits(q, ids, scores, k, filter, min_score, always, match_names)
                    for q, (ids, scores) in zip(queries, results)]
        return hits[0] if single else hits

    def _hits(self, query: str, ids, scores, k: int, filter: Filter | None, min_score: float | None,
              always: list[str], match_names: bool) -> list[Hit]:
        """Hits for one query from its retrieved (ids, scores): name matches, threshold, always_include."""
        retrieved = {tid: float(s) for tid, s in zip(ids, scores)}
        named = [tid for tid in (self._names.lookup(query) if match_names else [])
                 if filter is None or filter.allows(tid, self._tools[tid].namespace)]
        out = [(tid, retrieved.get(tid, self._score_of(query, tid)), "name") for tid in named[:k]]
        abstain = min_score is not None and (not len(scores) or float(scores[0]) < min_score)
        if not abstain:
            taken = set(named)
            out += [(tid, s, "retrieval") for tid, s in retrieved.items() if tid not in taken][: k - len(out)]
        taken = {tid for tid, _s, _m in out}
        for tid in always:
            tool = self._tools.get(tid)
            if tool is None or tid in taken or (filter is not None and not filter.allows(tid, tool.namespace)):
                continue
            out.append((tid, retrieved.get(tid, self._score_of(query, tid)), "always"))
            taken.add(tid)
        return [Hit(self._tools[tid], s, rank, match) for rank, (tid, s, match) in enumerate(out, 1)]

    def _score_of(self, query: str, tool_id: str) -> float:
        """The retriever's score of one tool for `query` (0.0 if it does not match at all)."""
        res = self.retriever.search([query], 1, Filter.make(ids=[tool_id]))
        return float(res.scores[0][0]) if len(res.scores[0]) else 0.0


class NameIndex:
    """Finds the tools a short query names: exactly (after normalising case, `_`, `-`, `.`, camelCase and
    spaces) a tool's name, title, id or `namespace.name`; or nearly its name or title (a typo or two:
    similarity >= `NEAR` between the squashed forms, candidates found through character trigrams)."""

    NEAR = 0.88
    MAX_WORDS = 6

    def __init__(self, tools: Iterable[Tool] = ()):
        self._exact: dict[str, dict[str, None]] = {}  # squashed key -> ids
        self._near: dict[str, dict[str, None]] = {}  # squashed name/title -> ids
        self._grams: dict[str, set[str]] = {}  # trigram -> squashed names/titles
        for tool in tools:
            self.add(tool)

    @staticmethod
    def squash(text: str) -> str:
        return "".join(split_identifier(text).lower().split())

    @staticmethod
    def _keys(tool: Tool) -> tuple[set[str], set[str]]:
        near = {NameIndex.squash(k) for k in (tool.name, tool.title) if k} - {""}
        exact = near | ({NameIndex.squash(k) for k in (tool.id, tool.qualified_name)} - {""})
        return exact, near

    @staticmethod
    def _trigrams(key: str) -> set[str]:
        padded = f"^{key}$"
        return {padded[i:i + 3] for i in range(len(padded) - 2)}

    def add(self, tool: Tool) -> None:
        exact, near = self._keys(tool)
        for key in exact:
            self._exact.setdefault(key, {})[tool.id] = None
        for key in near:
            self._near.setdefault(key, {})[tool.id] = None
            for gram in self._trigrams(key):
                self._grams.setdefault(gram, set()).add(key)

    def remove(self, tool: Tool) -> None:
        exact, near = self._keys(tool)
        for key in exact:
            _discard(self._exact, key, tool.id)
        for key in near:
            if _discard(self._near, key, tool.id):
                for gram in self._trigrams(key):
                    keys = self._grams.get(gram)
                    if keys is not None:
                        keys.discard(key)
                        if not keys:
                            del self._grams[gram]

    def lookup(self, query: str) -> list[str]:
        """Ids of the tools `query` names (best match first), or [] when it names none."""
        if len(query) > 200 or len(query.split()) > self.MAX_WORDS:  # a sentence, not a name: skip the work
            return []
        words = split_identifier(query).split()
        if not words or len(words) > self.MAX_WORDS:
            return []
        key = "".join(words).lower()
        if key in self._exact:
            return list(self._exact[key])
        if len(key) < 5:
            return []
        grams = self._trigrams(key)
        counts: dict[str, int] = {}
        for gram in grams:
            for candidate in self._grams.get(gram, ()):
                counts[candidate] = counts.get(candidate, 0) + 1
        best, best_ratio = [], self.NEAR
        for candidate, shared in counts.items():
            if shared * 2 < len(grams):
                continue
            ratio = difflib.SequenceMatcher(None, key, candidate).ratio()
            if ratio > best_ratio + 1e-9:
                best, best_ratio = [candidate], ratio
            elif abs(ratio - best_ratio) <= 1e-9:
                best.append(candidate)
        return list(dict.fromkeys(tid for candidate in sorted(best) for tid in self._near[candidate]))


def _discard(index: dict[str, dict[str, None]], key: str, tool_id: str) -> bool:
    """Remove `tool_id` under `key`; True when the key is left with no ids (and was dropped)."""
    ids = index.get(key)
    if ids is None:
        return False
    ids.pop(tool_id, None)
    if ids:
        return False
    del index[key]
    return True


def _catalog(tools: Iterable[Tool]) -> dict[str, Tool]:
    out: dict[str, Tool] = {}
    for tool in tools:
        if not isinstance(tool, Tool):
            raise TypeError(f"expected Tool objects, got {type(tool).__name__}; use toolscout.load_tools to parse catalogs")
        if tool.id in out:
            raise ValueError(f"duplicate tool id {tool.id!r} in one batch")
        out[tool.id] = tool
    return out


def _tool_row(tool: Tool) -> dict[str, Any]:
    row = tool.to_dict()
    if "raw" in row:  # keep the original object when it is plain JSON (a Python callable is not)
        try:
            json.dumps(row["raw"])
        except (TypeError, ValueError):
            row["raw"] = repr(row["raw"])
    return row
