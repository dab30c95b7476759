"""Per-source limits on tool-use feedback: how fast, and how much in all, one client can teach the index.

Together with the ledger's per-tool cap (`toolscout.feedback`: one source adds at most `per_source_cap`
requests to any one tool) they bound what one client can shift: `rate` events per second on average
(a token bucket holding `burst`), and `volume` requests teaching at once from one source.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..errors import RateLimited, TooLarge
from ..feedback import FeedbackEvent


@dataclass
class FeedbackLimits:
    """`rate` events/s per (tenant, source) on average, bursts up to `burst`; `volume` requests a source
    may have teaching at once. None: no limit of that kind."""

    rate: float | None = 200.0
    burst: float | None = 2000.0
    volume: int | None = 200_000
    _buckets: dict = field(default_factory=dict, repr=False)  # (tenant, source) -> (tokens, time)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def admit(self, tenant: str | None, events: Sequence[FeedbackEvent], taught: Mapping[str, int]) -> None:
        """Raise RateLimited (nothing counted) unless every source of `events` is within its limits."""
        by_source: dict[str, int] = {}
        for event in events:
            by_source[event.source] = by_source.get(event.source, 0) + 1
        for source, n in by_source.items():
            if self.volume is not None and taught.get(source, 0) + n > self.volume:
                raise RateLimited(f"feedback source {source!r} has reached its limit of {self.volume} requests "
                                  "teaching the index; delete its feedback (DELETE /feedback?source=...) or raise "
                                  "the server's --feedback-volume")
        if self.rate is None:
            return
        self._refuse_batches_over_the_burst(by_source)
        with self._lock:
            now = time.monotonic()
            levels = {s: self._level((tenant, s), now) for s in by_source}
            for source, n in by_source.items():
                if levels[source] < n:
                    wait = (n - levels[source]) / self.rate
                    raise RateLimited(f"feedback source {source!r} sends more than {self.rate:g} events/s "
                                      f"(bursts up to {self.burst:g}); retry in {wait:.1f}s", retry_after=wait)
            for source, n in by_source.items():
                self._buckets[(tenant, source)] = (levels[source] - n, now)

    def _refuse_batches_over_the_burst(self, by_source: Mapping[str, int]) -> None:
        """A batch larger than the bucket holds would be refused however long its client waited: say so
        now (413), not 429 with a Retry-After it can never meet."""
        for source, n in by_source.items():
            if self.burst is not None and n > self.burst:
                raise TooLarge(
                    f"a batch of {n} feedback events from source {source!r} is larger than this server's burst of "
                    f"{self.burst:g} events per source (--feedback-burst), so it can never be admitted; send at "
                    f"most {self.burst:g} events per request from one source, or start the server with a larger "
                    "--feedback-burst")

    def _level(self, key: tuple, now: float) -> float:
        burst = self.burst if self.burst is not None else float("inf")
        tokens, then = self._buckets.get(key, (burst, now))
        return min(burst, tokens + (now - then) * self.rate)
