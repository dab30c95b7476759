"""BM25 over each tool's text view (bm25s's Lucene scores, from an index that takes writes one tool at a time:
`bm25_index.py`). Identifiers in names are split into words first."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from ..artifacts import read_json, read_json_lines
from ..conversation import turn_weights
from ..errors import InvalidRequest, MissingDependency
from ..query import Query, as_queries
from ..results import Filter, Results, top_k_rows
from ..rows import RowTable
from ..tool import TextView, Tool, tool_text
from .base import Accepts, Retriever, parts, write_retriever_config
from .bm25_index import InvertedIndex

_TOKEN = re.compile(r"(?u)\b\w\w+\b")
_SNAKE = re.compile(r"\b[^\W_]+(?:_+[^\W_]+)+\b")


def task_text(text: str) -> str:
    """A task as BM25 reads it: each snake_case identifier kept and followed by its words. The text view
    splits tool names and parameters ("send_email" meets the tool `send_email`, indexed as "send email"),
    while descriptions keep the identifiers they mention whole ("replaces the legacy flush_redis command").
    camelCase stays whole: in tasks it is mostly a brand ("iPhone", "eBay"), not an identifier."""
    return _SNAKE.sub(lambda found: f"{found.group(0)} {found.group(0).replace('_', ' ')}", text)


@functools.lru_cache(maxsize=1)
def english_stopwords() -> frozenset[str]:
    """bm25s's English stopword list, read from its `stopwords.py` without importing the bm25s package: its
    `__init__` imports numba and scipy (over a second and some 100 MB in every server and gateway, for a tuple
    of words; toolscout scores with its own index, `bm25_index.py`)."""
    spec = importlib.util.find_spec("bm25s")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency("bm25s", "BM25's English stopword list")
    path = Path(next(iter(spec.submodule_search_locations))) / "stopwords.py"
    source = importlib.util.spec_from_file_location("toolscout_bm25s_stopwords", path)
    module = importlib.util.module_from_spec(source)
    source.loader.exec_module(module)
    return frozenset(module.STOPWORDS_EN)


class Tokenizer:
    """bm25s's default scheme (lowercase, words of 2+ characters, English stopwords), plus an optional
    Snowball stemmer. Identifiers were already split into words by the text view."""

    def __init__(self, stemmer: str | None = "english", stopwords: str | None = "en"):
        self.stemmer_name = stemmer
        self.stopwords_name = stopwords
        self._stem = None
        if stemmer:
            try:
                import Stemmer
            except ImportError:
                raise MissingDependency("PyStemmer", "BM25 stemming") from None
            self._stem = Stemmer.Stemmer(stemmer).stemWords
        self._stop: frozenset[str] = frozenset()
        if stopwords:
            if stopwords != "en":
                raise ValueError(f"unsupported stopword list {stopwords!r}; use 'en' or None")
            self._stop = english_stopwords()

    def __call__(self, text: str) -> list[str]:
        return self.stems(self.words(text))

    def words(self, text: str) -> list[str]:
        """The text's words as BM25 reads them, before stemming: lowercase, 2+ characters, no stopwords."""
        return [w for w in _TOKEN.findall(text.lower()) if w not in self._stop]

    def stems(self, words: list[str]) -> list[str]:
        """The terms BM25 indexes for `words` (one per word, in order)."""
        return self._stem(words) if self._stem else words


class BM25Retriever:
    """Lexical first stage.

    `add`/`remove` update the inverted index by the written tools' words only (`InvertedIndex`); the
    scores are those a fresh bm25s index of the same documents gives with its default variant, Lucene's.
    """

    name = "bm25"
    accepts = Accepts(view=True)

    def __init__(self, view: TextView | None = None, k1: float = 1.5, b: float = 0.75,
                 stemmer: str | None = "english", stopwords: str | None = "en"):
        if not 0 <= k1 < math.inf or not 0 <= b <= 1:  # a NaN fails both
            raise InvalidRequest(f"the bm25 retriever: k1 is a number of 0 or more and b one from 0 to 1, got k1={k1!r}, "
                                 f"b={b!r}")
        self.view = view or TextView()
        self.params = {"k1": k1, "b": b}
        self.tokenizer = Tokenizer(stemmer, stopwords)
        self.rows = RowTable()
        self.tokens: list[list[str]] = []
        self._index = InvertedIndex(k1, b)

    def __len__(self) -> int:
        return len(self.rows)

    def index(self, tools: Sequence[Tool]) -> None:
        self.rows = RowTable([t.id for t in tools], [t.namespace for t in tools])
        self.tokens = [self.tokenizer(tool_text(t, self.view)) for t in tools]
        self._rebuild()

    def add(self, tools: Sequence[Tool]) -> None:
        for tool in tools:
            tokens = self.tokenizer(tool_text(tool, self.view))
            row = self.rows.row_of.get(tool.id)
            if row is None:
                self.rows.append(tool.id, tool.namespace)
                self.tokens.append(tokens)
                self._index.append(tokens)
            else:
                self.rows.set_namespace(row, tool.namespace)
                self.tokens[row] = tokens
                self._index.replace(row, tokens)

    def remove(self, ids: Sequence[str]) -> None:
        rows = [self.rows.row_of[t] for t in ids if t in self.rows.row_of]
        if rows:
            keep = self.rows.remove_rows(rows)
            self.tokens = [tok for tok, k in zip(self.tokens, keep) if k]
            self._index.remove_rows(keep)

    def _rebuild(self) -> None:
        self._index = InvertedIndex.build(self.tokens, self.params["k1"], self.params["b"])

    def scores(self, query: Query | str) -> np.ndarray:
        """BM25 score of every row for one query: each query word adds its term score. A chat transcript's
        words count by the turn they are in (`conversation.turn_weights`: twice in the latest turn, less
        the further back), so earlier turns about something else do not outvote the latest request."""
        query = query if isinstance(query, Query) else Query.of(query)
        if query.latest_turn is None:
            return self._index.scores(self.tokenizer(task_text(query.text)))
        weights: dict[str, float] = {}
        for piece, weight in turn_weights(query.text):
            for word in self.tokenizer(task_text(piece)):
                weights[word] = weights.get(word, 0.0) + weight
        return self._index.weighted_scores(weights)

    def search(self, queries: Sequence[Query | str], k: int = 10, filter: Filter | None = None) -> Results:
        queries = as_queries(queries)
        if not len(self.rows):
            return Results.empty(len(queries))
        mask = self.rows.mask(filter)
        ids, scores = [], []
        for query in queries:
            s = self.scores(query)
            if mask is not None:
                s = np.where(mask, s, 0.0)
            matched = np.flatnonzero(s > 0)  # a tool sharing no term with the query is not a match
            top = matched[top_k_rows(s[matched][None, :], k)[0]]  # ascending rows: ties keep catalog order
            ids.append(self.rows.id_array[top])
            scores.append(s[top])
        return Results(tuple(ids), tuple(scores))

    # persistence ---------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        write_retriever_config(folder, self.name, **self.settings())
        with open(folder / "tokens.jsonl", "w", encoding="utf-8") as fh:
            for tid, ns, tok in zip(self.rows.ids, self.rows.namespaces, self.tokens):
                fh.write(json.dumps({"id": tid, "namespace": ns, "tokens": tok}) + "\n")

    def settings(self) -> dict:
        """What `save` records besides the tokens: the text view, k1 and b, the stemmer and stopwords."""
        return {"view": self.view.to_dict(), "params": dict(self.params), "stemmer": self.tokenizer.stemmer_name,
                "stopwords": self.tokenizer.stopwords_name}

    @classmethod
    def from_settings(cls, settings: dict) -> "BM25Retriever":
        """An empty retriever of these `settings` (what `settings()` gave). Older configs also name the
        "method", and the usage field learning from use once had (now its own channel,
        `toolscout.learning`): both are ignored."""
        return cls(TextView.from_dict(settings.get("view")), stemmer=settings.get("stemmer"),
                   stopwords=settings.get("stopwords"), k1=settings["params"]["k1"], b=settings["params"]["b"])

    @classmethod
    def load(cls, folder: Path) -> "BM25Retriever":
        retriever = cls.from_settings(read_json(folder / "config.json"))
        rows = read_json_lines(folder / "tokens.jsonl")
        retriever.rows = RowTable([r["id"] for r in rows], [r["namespace"] for r in rows])
        retriever.tokens = [r["tokens"] for r in rows]
        retriever._rebuild()
        return retriever


def lexical_reading(retriever: Retriever) -> tuple[TextView, Tokenizer]:
    """How a first stage reads a tool's words, for telling a caller which of a task's words its tools hold
    (`explain`): its BM25 part's view and tokenizer (the words it searched); without one, the view of its
    first part that takes one (`Accepts.view`; ToolCLIP's towers read their own fields) and BM25's defaults."""
    readers = [part for part in parts(retriever) if part.accepts.view]
    for part in readers:
        if isinstance(part, BM25Retriever):
            return part.view, part.tokenizer
    return (readers[0].view if readers else TextView()), Tokenizer()
