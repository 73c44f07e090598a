"""A small Prometheus text-format writer (no client library needed for a handful of series).

Request latency is kept in-process (per server process, as Prometheus expects: it scrapes each
process); job counts and queue depth are read from SQL at scrape time, so every replica reports
the same truth.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiLatency:
    """A histogram of request durations labelled by method, route template and status code."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (method, route, status) -> (bucket counts, count, sum)
        self._series: dict[tuple[str, str, str], tuple[list[int], int, float]] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, str(status))
        with self._lock:
            buckets, count, total = self._series.get(key, ([0] * len(LATENCY_BUCKETS), 0, 0.0))
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    buckets[i] += 1
            self._series[key] = (buckets, count + 1, total + seconds)

    def render(self) -> list[str]:
        name = "twinkle_api_request_duration_seconds"
        lines = [f"# HELP {name} API request latency.", f"# TYPE {name} histogram"]
        with self._lock:
            items = sorted(self._series.items())
            for (method, route, status), (buckets, count, total) in items:
                labels = {"method": method, "route": route, "status": status}
                for bound, n in zip(LATENCY_BUCKETS, buckets, strict=True):
                    lines.append(f"{name}_bucket{_labels({**labels, 'le': repr(bound)})} {n}")
                lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {count}")
                lines.append(f"{name}_count{_labels(labels)} {count}")
                lines.append(f"{name}_sum{_labels(labels)} {total:.6f}")
        return lines


def gauge(name: str, help_text: str, samples: Iterable[tuple[Mapping[str, str], float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples]
    return lines


def counter(name: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {_number(value)}"]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
