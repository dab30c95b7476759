"""Late chunking: a request cut from a task is embedded from the task's own token vectors."""

import pickle

import numpy as np
import pytest

from toolscout.encoders.late_chunk import TokenRun
from toolscout.intents import IntentMerge
from toolscout.results import Results
from toolscout.task_part import TaskPart

TASK = "find a flight to Rome, book the cheapest hotel near the station and add both to my calendar"
REQUESTS = ["find a flight to Rome", "book the cheapest hotel near the station", "add both to my calendar"]


def test_a_task_part_is_its_text_and_remembers_where_it_was_cut():
    part = TaskPart.find(TASK, "book the cheapest hotel")
    assert part == "book the cheapest hotel" and isinstance(part, str)
    assert (part.task, part.start, part.end) == (TASK, 23, 46)
    assert TASK[part.start:part.end] == part
    assert part.cache_key != "book the cheapest hotel"  # its vector depends on the task too
    again = pickle.loads(pickle.dumps(part))
    assert isinstance(again, TaskPart) and (again.task, again.start, again.end) == (TASK, 23, 46)
    assert type(TaskPart.find(TASK, "a train to Oslo")) is str  # not a stretch of the task: plain text
    with pytest.raises(ValueError):
        TaskPart(TASK, 5, 5)


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
    parts = [TaskPart.find(TASK, r) for r in REQUESTS]
    vectors = encoder.encode_queries([TASK] + parts)
    np.testing.assert_allclose(vectors[0], encoder.encode([TASK])[0], atol=1e-6)
    for part, vector in zip(parts, vectors[1:]):
        np.testing.assert_allclose(vector, torch_late_chunk(torch_encoder, TASK, part), atol=2e-4)
        alone = encoder.encode([str(part)])[0]
        assert float(vector @ alone) < 0.99  # not the part encoded on its own
    # the same words as a query of their own are encoded alone (the cache keeps the two apart)
    plain = encoder.encode_queries([REQUESTS[0]])[0]
    np.testing.assert_allclose(plain, encoder.encode([REQUESTS[0]])[0], atol=1e-6)
    np.testing.assert_allclose(encoder.encode_queries([parts[0]])[0], vectors[1], atol=1e-6)


def test_intent_merge_hands_the_search_task_parts_unless_told_not_to():
    seen = []

    def search(queries, k):
        seen.append(list(queries))
        return Results.from_lists([["t"]] * len(queries), [[1.0]] * len(queries))

    IntentMerge(merge="max", intent_weight=0.9).search([TASK], 5, search)
    assert seen[-1][1:] == REQUESTS and all(isinstance(q, TaskPart) for q in seen[-1][1:])
    IntentMerge(merge="max", intent_weight=0.9, late_chunk=False).search([TASK], 5, search)
    assert seen[-1][1:] == REQUESTS and not any(isinstance(q, TaskPart) for q in seen[-1])
    # a directory saved before late chunking existed keeps encoding each request alone
    assert IntentMerge.from_dict({"merge": "max", "intent_weight": 0.7}).late_chunk is False
    assert IntentMerge.from_dict(IntentMerge(late_chunk=True).to_dict()).late_chunk is True
