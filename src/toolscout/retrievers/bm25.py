"""BM25 over each tool's text view (bm25s's Lucene scores, from an index that takes writes one tool at a time:
`bm25_index.py`). Identifiers in names are split into words first."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..artifacts import read_json, write_json
from ..conversation import without_speaker_labels
from ..errors import MissingDependency
from ..feedback import Usage
from ..query import Query, as_queries
from ..results import Filter, Results, top_k_rows
from ..rows import RowTable
from ..tool import TextView, Tool, tool_text
from .base import Accepts, write_retriever_config
from .bm25_index import InvertedIndex

_TOKEN = re.compile(r"(?u)\b\w\w+\b")
USAGE_FILE = "usage.json"
USAGE_WEIGHT = 0.25  # chosen on validation, partial feedback included (docs/learning.md)
USAGE_EVIDENCE = 4.0  # requests at which a tool's usage field counts half (docs/learning.md, "Crowding out")


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
            try:
                from bm25s.stopwords import STOPWORDS_EN
            except ImportError:
                raise MissingDependency("bm25s", "BM25's English stopword list") from None
            if stopwords != "en":
                raise ValueError(f"unsupported stopword list {stopwords!r}; use 'en' or None")
            self._stop = frozenset(STOPWORDS_EN)

    def __call__(self, text: str) -> list[str]:
        return self.stems(self.words(text))

    def words(self, text: str) -> list[str]:
        """The text's words as BM25 reads them, before stemming: lowercase, 2+ characters, no stopwords."""
        return [w for w in _TOKEN.findall(text.lower()) if w not in self._stop]

    def stems(self, words: list[str]) -> list[str]:
        """The terms BM25 indexes for `words` (one per word, in order)."""
        return self._stem(words) if self._stem else words


class UsageField:
    """The words of the requests that taught each tool (`toolscout.feedback`), searched as a second field
    of the tool's document with BM25 (k1, b; lengths against the mean length of the taught tools' fields).

    Its idf counts requests, not tools: a word is informative if few requests use it. Requests share
    words that tool descriptions lack ("can you find me"); counted over tools, such a word is rare while
    few tools are taught, so those few tools matched almost any task and pulled ahead of untaught ones
    (validation: docs/learning.md). Kept per (tool, source), so a source can be taken back exactly;
    updated per tool, so one event costs the words of one tool's requests.

    A tool's field counts in proportion to the evidence behind it: a tool taught by n requests scores
    n / (n + `evidence`) of its field's BM25. One request says little about which tasks a tool serves,
    and at full weight the words it shares with other tasks ("calculate the ...") pulled a tool taught once
    ahead of untaught tools for every such task (docs/learning.md, "Crowding out")."""

    def __init__(self, k1: float, b: float, evidence: float = USAGE_EVIDENCE):
        if evidence < 0:
            raise ValueError(f"usage evidence must be >= 0, got {evidence}")
        self.k1, self.b, self.evidence = k1, b, float(evidence)
        self.requests: dict[str, dict[str, list[list[str]]]] = {}  # tool -> source -> token lists
        self.postings: dict[str, dict[str, int]] = {}  # term -> tool -> term frequency
        self.terms: dict[str, set[str]] = {}  # tool -> the terms it is indexed under
        self.lengths: dict[str, int] = {}  # tool -> words in its field
        self.taught: dict[str, int] = {}  # tool -> requests in its field
        self.total_length = 0  # sum of `lengths`, kept as they change: a search reads the mean in O(1)
        self.request_df: Counter[str] = Counter()  # term -> taught requests that contain it
        self.request_count = 0
        # each term's (rows, scores), built when a search first needs it and dropped by any change of
        # this field or of the rows (`rows_changed`): a search then costs a few vector additions
        self._term_scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.lengths)

    def add(self, tool_id: str, source: str, tokens: list[str]) -> None:
        self.add_many([(tool_id, source, tokens)])

    def add_many(self, taught: Sequence[tuple[str, str, list[str]]]) -> None:
        """(tool, source, request tokens) in arrival order; each taught tool is re-indexed once."""
        touched = []
        for tool_id, source, tokens in taught:
            if not tokens:  # a request of stopwords only teaches this field nothing
                continue
            self.requests.setdefault(tool_id, {}).setdefault(source, []).append(tokens)
            self._count([tokens], +1)
            touched.append(tool_id)
        for tool_id in dict.fromkeys(touched):
            self._reindex(tool_id)

    def forget(self, tool_id: str, source: str) -> None:
        removed = self.requests.get(tool_id, {}).pop(source, None)
        if removed is not None:
            self._count(removed, -1)
            self._reindex(tool_id)

    def drop(self, tool_id: str) -> None:
        for removed in self.requests.pop(tool_id, {}).values():
            self._count(removed, -1)
        self._reindex(tool_id)

    def _count(self, requests: list[list[str]], sign: int) -> None:
        """Count `requests` in (+1) or out (-1) of the request frequencies the idf reads."""
        self.request_count += sign * len(requests)
        for tokens in requests:
            for term in set(tokens):
                self.request_df[term] += sign
                if not self.request_df[term]:
                    del self.request_df[term]

    def _reindex(self, tool_id: str) -> None:
        self._term_scores.clear()  # a change moves the request count and mean length: every term's idf
        for term in self.terms.pop(tool_id, ()):
            tools = self.postings[term]
            tools.pop(tool_id, None)
            if not tools:
                del self.postings[term]
        self.total_length -= self.lengths.pop(tool_id, 0)
        self.taught.pop(tool_id, None)
        words = Counter(w for source in sorted(self.requests.get(tool_id, {}))
                        for tokens in self.requests[tool_id][source] for w in tokens)
        if not words:
            self.requests.pop(tool_id, None)
            return
        self.taught[tool_id] = sum(len(requests) for requests in self.requests[tool_id].values())
        for term, tf in words.items():
            self.postings.setdefault(term, {})[tool_id] = tf
        self.terms[tool_id] = set(words)
        self.lengths[tool_id] = sum(words.values())
        self.total_length += self.lengths[tool_id]

    def rows_changed(self) -> None:
        """The retriever's rows were rebuilt or moved up (tools removed): cached rows are stale."""
        self._term_scores.clear()

    def scores(self, tokens: list[str], rows: RowTable) -> np.ndarray:
        """This field's BM25 score of every row for the query words `tokens`."""
        out = np.zeros(len(rows), dtype=np.float32)
        for term in tokens:
            found = self._term_scores.get(term)
            if found is None:
                found = self._term_scores[term] = self._score_term(term, rows)
            out[found[0]] += found[1]
        return out

    def _score_term(self, term: str, rows: RowTable) -> tuple[np.ndarray, np.ndarray]:
        """(rows, float64 scores) of the taught tools whose field holds `term` (empty when none does)."""
        tools = [(rows.row_of[t], tf, self.lengths[t], self.taught[t]) for t, tf in self.postings.get(term, {}).items()
                 if t in rows.row_of]
        if not tools:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        where, tf, length, taught = (np.asarray(column) for column in zip(*tools))
        df, n, avgdl = self.request_df[term], self.request_count, self.total_length / len(self.lengths)
        idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
        norm = tf + self.k1 * (1 - self.b + self.b * length / avgdl)
        evidence = taught / (taught + self.evidence)
        return where.astype(np.int64), evidence * idf * tf * (self.k1 + 1) / norm

    def to_dict(self) -> dict:
        return self.requests

    @classmethod
    def from_dict(cls, data: dict, k1: float, b: float, evidence: float = USAGE_EVIDENCE) -> "UsageField":
        field = cls(k1, b, evidence)
        for tool_id, sources in data.items():
            field.requests[tool_id] = {s: [list(t) for t in tokens if t] for s, tokens in sources.items()}
            for requests in field.requests[tool_id].values():
                field._count(requests, +1)
            field._reindex(tool_id)
        return field


class BM25Retriever:
    """Lexical first stage.

    `add`/`remove` update the inverted index by the written tools' words only (`InvertedIndex`); the
    scores are those a fresh bm25s index of the same documents gives with its default variant, Lucene's.
    """

    name = "bm25"
    accepts = Accepts(view=True)

    def __init__(self, view: TextView | None = None, k1: float = 1.5, b: float = 0.75,
                 stemmer: str | None = "english", stopwords: str | None = "en",
                 usage_weight: float = USAGE_WEIGHT, usage_evidence: float = USAGE_EVIDENCE):
        self.view = view or TextView()
        self.params = {"k1": k1, "b": b}
        self.tokenizer = Tokenizer(stemmer, stopwords)
        self.rows = RowTable()
        self.tokens: list[list[str]] = []
        self.usage = UsageField(k1, b, usage_evidence)
        self.usage_weight = float(usage_weight)
        self._index = InvertedIndex(k1, b)

    def __len__(self) -> int:
        return len(self.rows)

    def index(self, tools: Sequence[Tool]) -> None:
        self.rows = RowTable([t.id for t in tools], [t.namespace for t in tools])
        self.tokens = [self.tokenizer(tool_text(t, self.view)) for t in tools]
        self._rebuild()
        self.usage.rows_changed()

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
        self.usage.rows_changed()
        for tool_id in ids:
            self.usage.drop(tool_id)  # a deleted tool's feedback goes with it

    def prepare_learning(self, usages: Sequence[Usage]) -> dict[Usage, list[str]]:
        """Each request's terms, tokenised once however many tools it taught."""
        terms = {q: self.tokenizer(without_speaker_labels(q)) for q in dict.fromkeys(u.query for u in usages)}
        return {u: terms[u.query] for u in usages}

    def learn(self, added: Sequence[Usage] = (), forgotten: Sequence[tuple[str, str]] = (),
              prepared: Mapping[Usage, list[str]] | None = None) -> None:
        """The words of requests that used a tool join its usage field; `forgotten` (tool, source) pairs
        leave it. Nothing else is re-indexed."""
        prepared = {**self.prepare_learning([u for u in added if u not in (prepared or {})]), **(prepared or {})}
        self.usage.add_many([(u.tool_id, u.source, prepared[u]) for u in added if u.tool_id in self.rows.row_of])
        for tool_id, source in forgotten:
            self.usage.forget(tool_id, source)

    def _rebuild(self) -> None:
        self._index = InvertedIndex.build(self.tokens, self.params["k1"], self.params["b"])

    def scores(self, query: Query | str) -> np.ndarray:
        """BM25 score of every row for one query. A chat transcript scores as the transcript plus its
        latest user turn (`toolscout.conversation`), as dense retrieval embeds it: each query token adds
        its term score, so the latest turn's words count twice (its speaker labels do not)."""
        query = query if isinstance(query, Query) else Query.of(query)
        tail = query.latest_turn
        text = query.text if tail is None else f"{query.text}\n{without_speaker_labels(tail)}"
        words = self.tokenizer(text)
        scores = self._index.scores(words)
        if len(self.usage):  # what tools learned from use, as a second field (toolscout.feedback)
            scores = scores + self.usage_weight * self.usage.scores(words, self.rows)
        return scores

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
        write_retriever_config(folder, self.name, view=self.view.to_dict(), params=self.params,
                               stemmer=self.tokenizer.stemmer_name, stopwords=self.tokenizer.stopwords_name,
                               usage_weight=self.usage_weight, usage_evidence=self.usage.evidence)
        with open(folder / "tokens.jsonl", "w", encoding="utf-8") as fh:
            for tid, ns, tok in zip(self.rows.ids, self.rows.namespaces, self.tokens):
                fh.write(json.dumps({"id": tid, "namespace": ns, "tokens": tok}) + "\n")
        if len(self.usage):
            write_json(folder / USAGE_FILE, self.usage.to_dict())

    @classmethod
    def load(cls, folder: Path) -> "BM25Retriever":
        config = read_json(folder / "config.json")
        retriever = cls(TextView.from_dict(config.get("view")), stemmer=config.get("stemmer"),
                        stopwords=config.get("stopwords"), usage_weight=config.get("usage_weight", USAGE_WEIGHT),
                        usage_evidence=config.get("usage_evidence", USAGE_EVIDENCE),
                        k1=config["params"]["k1"], b=config["params"]["b"])  # older configs also name the "method"
        rows = [json.loads(line) for line in (folder / "tokens.jsonl").read_text(encoding="utf-8").splitlines() if line]
        retriever.rows = RowTable([r["id"] for r in rows], [r["namespace"] for r in rows])
        retriever.tokens = [r["tokens"] for r in rows]
        retriever._rebuild()
        if (folder / USAGE_FILE).exists():
            params = config["params"]
            retriever.usage = UsageField.from_dict(read_json(folder / USAGE_FILE), params["k1"], params["b"],
                                                   retriever.usage.evidence)
        return retriever
