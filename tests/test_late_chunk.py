"""Late chunking: a request cut from a task is embedded from the task's own token vectors."""

import pickle

import numpy as np
import pytest

from toolscout.encoders.late_chunk import TokenRun
from toolscout.intents import IntentMerge
from toolscout.results import Results
from toolscout.query import Query, as_queries

TASK = "find a flight to Rome, book the cheapest hotel near the station and add both to my calendar"
REQUESTS = ["find a flight to Rome", "book the cheapest hotel near the station", "add both to my calendar"]


def test_a_request_cut_from_a_task_remembers_where():
    task = Query.of(TASK)
    part = task.part("book the cheapest hotel")
    assert part.text == "book the cheapest hotel" and part.within == (TASK, 23, 46)
    assert TASK[23:46] == part.text
    assert part.cache_key != Query.of("book the cheapest hotel").cache_key  # its vector depends on the task too
    assert pickle.loads(pickle.dumps(part)) == part
    assert task.part("a train to Oslo").within is None  # not a stretch of the task: a task of its own
    assert not isinstance(part, str)  # nothing can turn it into text and lose where it was cut


def test_a_query_reads_a_task_once_focus_and_latest_turn():
    long = "please " + "word " * 600 + "x" * 300  # a blob and more than the focus limit
    query = Query.of(long)
    assert query.truncated and len(query.text) <= 2000 and "xxx" not in query.text
    transcript = Query.of("User: book a table\nAI: where?\nUser: in Rome, and the weather there")
    assert transcript.latest_turn == "User: in Rome, and the weather there" and not transcript.truncated
    with pytest.raises(TypeError):
        as_queries("one task")  # a lone string would read as one-character tasks


def test_span_vector_is_the_unit_mean_of_the_tokens_overlapping_the_span():
    tokens = np.array([[9, 9], [1, 0], [0, 1], [3, 4], [9, 9]], dtype=np.float32)
    offsets = [(0, 0), (0, 4), (5, 9), (10, 14), (0, 0)]  # [CLS] w1 w2 w3 [SEP]
    run = TokenRun(np.zeros(2, np.float32), tokens, offsets)
    np.testing.assert_allclose(run.span_vector(0, 9), [2 ** -0.5, 2 ** -0.5], atol=1e-7)  # mean of (1,0),(0,1)
    np.testing.assert_allclose(run.span_vector(12, 14), [0.6, 0.8], atol=1e-7)  # a token partly inside counts
    assert run.span_vector(20, 30) is None  # truncated away: no token


@pytest.fixture(scope="module")
def torch_encoder():
    from toolscout.encoders import Encoder

    return Encoder.load("minilm", backend="torch")


def torch_late_chunk(encoder, task: str, part: str) -> np.ndarray:
    """The oracle: sentence-transformers' own token embeddings of the task, averaged over the part."""
    model = encoder.model
    tokens = model.encode([task], output_value="token_embeddings", convert_to_numpy=False)[0].numpy()
    offsets = model.tokenizer(task, return_offsets_mapping=True)["offset_mapping"]
    start = task.index(part)
    rows = [i for i, (s, e) in enumerate(offsets) if e > s and s < start + len(part) and e > start]
    mean = tokens[rows].mean(axis=0)
    return mean / np.linalg.norm(mean)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_parts_are_pooled_from_the_tasks_tokens_and_the_task_keeps_its_own_vector(backend, torch_encoder):
    from toolscout.encoders import Encoder

    encoder = Encoder.load("minilm", backend=backend)
    parts = [Query.of(TASK).part(r) for r in REQUESTS]
    vectors = encoder.encode_queries([TASK] + parts)
    np.testing.assert_allclose(vectors[0], encoder.encode([TASK])[0], atol=1e-6)
    for part, vector in zip(parts, vectors[1:]):
        np.testing.assert_allclose(vector, torch_late_chunk(torch_encoder, TASK, part.text), atol=2e-4)
        alone = encoder.encode([part.text])[0]
        assert float(vector @ alone) < 0.99  # not the part encoded on its own
    # the same words as a query of their own are encoded alone (the cache keeps the two apart)
    plain = encoder.encode_queries([REQUESTS[0]])[0]
    np.testing.assert_allclose(plain, encoder.encode([REQUESTS[0]])[0], atol=1e-6)
    np.testing.assert_allclose(encoder.encode_queries([parts[0]])[0], vectors[1], atol=1e-6)


def test_intent_merge_hands_the_search_requests_that_know_their_task_unless_told_not_to():
    seen = []

    def search(queries, k):
        seen.append(list(queries))
        return Results.from_lists([["t"]] * len(queries), [[1.0]] * len(queries))

    IntentMerge(merge="max", intent_weight=0.9).search([TASK], 5, search)
    assert [q.text for q in seen[-1][1:]] == REQUESTS
    assert [q.within for q in seen[-1][1:]] == [(TASK, TASK.index(r), TASK.index(r) + len(r)) for r in REQUESTS]
    IntentMerge(merge="max", intent_weight=0.9, late_chunk=False).search([TASK], 5, search)
    assert [q.text for q in seen[-1][1:]] == REQUESTS and all(q.within is None for q in seen[-1])
    # a directory saved before late chunking existed keeps encoding each request alone
    assert IntentMerge.from_dict({"merge": "max", "intent_weight": 0.7}).late_chunk is False
    assert IntentMerge.from_dict(IntentMerge(late_chunk=True).to_dict()).late_chunk is True
