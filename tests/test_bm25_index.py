"""The writable BM25 index against bm25s itself: after any sequence of adds, replacements and removals,
every row's score equals, to the bit, that of a fresh bm25s index over the documents as they now stand."""

import random

import bm25s
import numpy as np
import pytest

from toolscout.retrievers.bm25_index import InvertedIndex

WORDS = [f"w{i}" for i in range(40)]


def bm25s_scores(documents, query, k1=1.5, b=0.75):
    model = bm25s.BM25(k1=k1, b=b, method="lucene")
    model.index([d or ["\x00"] for d in documents], show_progress=False)  # as BM25Retriever indexed them
    tokens = [t for t in query if t in model.vocab_dict]
    return model.get_scores(tokens) if tokens else np.zeros(len(documents), dtype=np.float32)


def random_document(rng):
    return [rng.choice(WORDS[: rng.randint(3, 40)]) for _ in range(rng.randint(0, 12))]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_equal_a_fresh_bm25s_index_after_every_write(seed):
    rng = random.Random(seed)
    documents = [random_document(rng) for _ in range(30)]
    index = InvertedIndex.build(documents, 1.5, 0.75)
    queries = [[rng.choice(WORDS) for _ in range(rng.randint(1, 6))] for _ in range(8)] + [["w1", "w1", "w2"]]
    for step in range(60):
        action = rng.random()
        if action < 0.4 or len(documents) < 3:
            documents.append(random_document(rng))
            index.append(documents[-1])
        elif action < 0.7:
            row = rng.randrange(len(documents))
            documents[row] = random_document(rng)
            index.replace(row, documents[row])
        else:
            keep = np.array([rng.random() > 0.2 for _ in documents])
            documents = [d for d, k in zip(documents, keep) if k]
            index.remove_rows(keep)
        for query in queries:
            got = index.scores(query)
            assert got.dtype == np.float32 and got.tobytes() == bm25s_scores(documents, query).tobytes(), step


def test_slots_of_removed_documents_are_reclaimed_without_changing_scores():
    documents = [["alpha", "beta"], ["beta", "gamma", "gamma"], []]
    index = InvertedIndex.build(documents, 1.2, 0.5)
    for i in range(3000):  # add and remove a document, as a writer does, far past the compaction point
        index.append(["delta", f"x{i}"])
        index.remove_rows(np.array([True, True, True, False]))
    assert len(index._lengths) < 2100  # compacted: not one slot per write
    assert index.scores(["gamma", "beta"]).tobytes() == bm25s_scores(documents, ["gamma", "beta"], 1.2, 0.5).tobytes()
    assert "delta" not in index and "x2999" not in index


def test_term_arrays_kept_across_writes_follow_renumbered_slots():
    # the postings of a term, as arrays, outlive writes to other terms; compaction renumbers every slot,
    # so arrays read before it must not be used after it
    documents = [["alpha", "beta"], ["beta", "gamma", "gamma"], []]
    index = InvertedIndex.build(documents, 1.2, 0.5)
    documents[0] = ["beta", "epsilon"]
    index.replace(0, documents[0])  # a new slot (3) for row 0
    query = ["beta", "epsilon", "gamma"]
    assert index.scores(query).tobytes() == bm25s_scores(documents, query, 1.2, 0.5).tobytes()
    for i in range(1100):  # past the compaction point: row 0's slot 3 becomes slot 0
        index.append([f"x{i}"])
        index.remove_rows(np.array([True, True, True, False]))
    assert len(index._lengths) < 1100
    assert index.scores(query).tobytes() == bm25s_scores(documents, query, 1.2, 0.5).tobytes()
