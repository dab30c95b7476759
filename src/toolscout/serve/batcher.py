"""Coalesces concurrent single-query searches into batches (one encoder call, one matrix product)."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any


class SearchBatcher:
    """Answers single-query searches in batches: a worker takes every request queued so far, groups
    them by their options (k, filter, threshold, ...) and answers each group with one batched search:
    one encoder call (the ONNX encoder splits a batch of mixed lengths into runs where padding costs
    least), one matrix product. There is no waiting window: at low load a batch is one request (no
    added latency); under load, requests that arrive while a batch is computed form the next one.
    Two workers by default. One worker makes bigger batches (on 2 busy cores with 8 clients: mean batch
    4.0 against 2.2, and 6% less CPU per request), but it leaves cores idle while it runs the
    single-threaded parts of a batch (the matrix product, building hits): on 2 idle cores with 8 clients
    and 20k tools it served 99.9 req/s with the server at 1.59 cores, and two workers served 110.8 req/s
    at 1.90 cores (`benchmarks/loadtest.py --batch-workers 1|2`). A failing batch is retried
    query by query, so one bad request cannot fail the others."""

    def __init__(self, search_many: Any, workers: int = 2, max_batch: int = 32):
        self._search_many = search_many
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.batches = 0
        self.queries = 0
        self._threads = [threading.Thread(target=self._work, name=f"toolscout-search-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit_future(self, options: tuple, query: str) -> Future:
        """A Future of the query's hits. Cancelling it before a worker takes it drops the query."""
        future: Future = Future()
        self._queue.put((options, query, future))
        return future

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=30)

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            items = [first]
            while len(items) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:  # closing: finish this batch, then stop
                    self._queue.put(None)
                    break
                items.append(item)
            groups: dict[tuple, list] = {}
            for options, query, future in items:
                if future.set_running_or_notify_cancel():  # False: cancelled (its client went away)
                    groups.setdefault(options, []).append((query, future))
            for options, group in groups.items():
                self._answer(options, group)

    def _answer(self, options: tuple, group: list) -> None:
        self.batches += 1
        self.queries += len(group)
        try:
            results = self._search_many(options, [query for query, _future in group])
        except Exception as exc:
            if len(group) == 1:
                group[0][1].set_exception(exc)
            else:
                for item in group:
                    self._answer(options, [item])
            return
        for (_query, future), hits in zip(group, results):
            future.set_result(hits)
