"""Request counters and latency histograms, rendered in the Prometheus text format (version 0.0.4)."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any, Mapping

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """Thread-safe: request handlers in the thread pool and the event loop both record here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self._buckets: dict[tuple[str, str], list[int]] = {}
        self._sums: dict[tuple[str, str], float] = defaultdict(float)
        self.events: dict[str, int] = defaultdict(int)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route)
        with self._lock:
            self.requests[(method, route, status)] += 1
            counts = self._buckets.get(key)
            if counts is None:
                counts = self._buckets[key] = [0] * (len(BUCKETS) + 1)
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    counts[i] += 1
                    break
            else:
                counts[-1] += 1
            self._sums[key] += seconds

    def count(self, event: str, n: int = 1) -> None:
        with self._lock:
            self.events[event] += n

    def render(self, gauges: Mapping[str, Any] = (), learning: Mapping[str, Any] | None = None) -> str:
        with self._lock:
            requests = dict(self.requests)
            buckets = {k: list(v) for k, v in self._buckets.items()}
            sums = dict(self._sums)
            events = dict(self.events)
        lines = ["# HELP toolscout_http_requests_total HTTP requests by method, route template and status.",
                 "# TYPE toolscout_http_requests_total counter"]
        for (method, route, status), n in sorted(requests.items()):
            lines.append(f'toolscout_http_requests_total{{method="{method}",route="{_label(route)}",'
                         f'status="{status}"}} {n}')
        lines += ["# HELP toolscout_http_request_duration_seconds Time to answer an HTTP request.",
                  "# TYPE toolscout_http_request_duration_seconds histogram"]
        for (method, route), counts in sorted(buckets.items()):
            labels = f'method="{method}",route="{_label(route)}"'
            cumulative = 0
            for bound, n in zip(BUCKETS, counts):
                cumulative += n
                lines.append(f'toolscout_http_request_duration_seconds_bucket{{{labels},le="{bound}"}} {cumulative}')
            cumulative += counts[-1]
            lines.append(f'toolscout_http_request_duration_seconds_bucket{{{labels},le="+Inf"}} {cumulative}')
            lines.append(f"toolscout_http_request_duration_seconds_sum{{{labels}}} {sums[(method, route)]:.6f}")
            lines.append(f"toolscout_http_request_duration_seconds_count{{{labels}}} {cumulative}")
        lines += ["# HELP toolscout_search_events_total Search outcomes: queries, abstained, name_match.",
                  "# TYPE toolscout_search_events_total counter"]
        for event, n in sorted(events.items()):
            lines.append(f'toolscout_search_events_total{{event="{_label(event)}"}} {n}')
        for name, value in gauges.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            lines += [f"# TYPE toolscout_{name} gauge", f"toolscout_{name} {value}"]
        return "\n".join(lines + _learning_lines(learning)) + "\n"


def _learning_lines(report: Mapping[str, Any] | None) -> list[str]:
    """The deployment's measurement of its learning (`toolscout.learning`), per namespace."""
    if not report:
        return []
    lines = ["# HELP toolscout_learning_requests Distinct requests feedback taught.",
             "# TYPE toolscout_learning_requests gauge", f"toolscout_learning_requests {report['requests']}",
             "# HELP toolscout_learning_weight Learning's weight per namespace (set by hand, or automatic).",
             "# TYPE toolscout_learning_weight gauge"]
    # how the weight came is a gauge of its own: as a label it would start a new series whenever an operator
    # sets a weight or makes it automatic again
    hands = ["# HELP toolscout_learning_weight_set_by_hand 1 where an operator set the namespace's learning "
             "weight, 0 where it is automatic.", "# TYPE toolscout_learning_weight_set_by_hand gauge"]
    for ns, weight in sorted(report["weights"].items()):
        lines.append(f'toolscout_learning_weight{{namespace="{_label(ns)}"}} {weight["weight"]}')
        hands.append(f'toolscout_learning_weight_set_by_hand{{namespace="{_label(ns)}"}} {int(weight["how"] == "set")}')
    lines += hands
    lines += ["# HELP toolscout_learning_mrr Mean reciprocal rank of used tools before learning from them, by "
              "ranking (served, untaught, learned at full weight) and window: first_seen (requests not scored for "
              "the tool before: what learning does to new tasks, what the automatic weight reads), repeats (ranked "
              "first by their earlier copy), new_tools (tools no earlier batch taught), all, recent (the last 1,000).",
              "# TYPE toolscout_learning_mrr gauge"]
    for ns, figures in sorted(report["measured"]["namespaces"].items()):
        for window in ("first_seen", "repeats", "new_tools", "all", "recent"):
            for ranking in ("served", "untaught", "learned"):
                lines.append(f'toolscout_learning_mrr{{namespace="{_label(ns)}",window="{window}",ranking="{ranking}"}} '
                             f'{figures[window][ranking]["mrr"]}')
    lines += ["# HELP toolscout_learning_events (event, tool) pairs scored before they were learned, per namespace "
              "(an event counts once per tool it names).", "# TYPE toolscout_learning_events gauge"]
    for ns, figures in sorted(report["measured"]["namespaces"].items()):
        lines.append(f'toolscout_learning_events{{namespace="{_label(ns)}"}} {figures["all"]["events"]}')
    lines += ["# HELP toolscout_learning_first_seen_events (event, tool) pairs whose request was not scored for the "
              "tool before, per namespace (the rest are repeats).", "# TYPE toolscout_learning_first_seen_events gauge"]
    for ns, figures in sorted(report["measured"]["namespaces"].items()):
        first = figures["first_seen"]["events"]
        lines.append(f'toolscout_learning_first_seen_events{{namespace="{_label(ns)}"}} {first}')
    return lines
