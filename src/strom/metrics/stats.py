"""What the broker counts for its metrics, recorded on the hot path.

Recording is plain arithmetic on the event loop (counters in dicts, histograms as bucket
lists): no locks, no metric objects per record. What is state already (partitions, ISRs,
logs, groups, connections) is not recorded at all: endpoint.py reads it when
Prometheus scrapes.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections import Counter, defaultdict
from contextvars import ContextVar

from strom.protocol.messages import REQUESTS

# Seconds; Kafka's request-time histograms span sub-millisecond to the 30 s request timeout.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_IDLE_SAMPLE_S = 1.0


class Histogram:
    """Observations in fixed buckets; observed on the loop only, so no lock."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(BUCKETS, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, int]]:
        cumulative, out = 0, []
        for bound, count in zip((*map(str, BUCKETS), "+Inf"), self.counts, strict=True):
            cumulative += count
            out.append((bound, cumulative))
        return out


# --- per request --------------------------------------------------------------------------

class RequestTimer:
    """One request's moments (monotonic seconds) and what it spent waiting on others
    (Kafka's remote time: the purgatories, fsyncs)."""

    __slots__ = ("received", "started", "handled", "sending", "remote", "throttle")

    def __init__(self, received: float, started: float) -> None:
        self.received = received  # its last byte arrived
        self.started = started  # its handler was called
        self.handled = self.sending = started  # its response was ready / handed to the socket
        self.remote = 0.0
        self.throttle = 0.0  # what a quota held the client back by

CURRENT_REQUEST: ContextVar[RequestTimer | None] = ContextVar("strom_current_request", default=None)


class remote_wait:
    """`with remote_wait(): await ...` counts the wait as the current request's remote time."""

    __slots__ = ("_timer", "_start")

    def __enter__(self) -> None:
        self._timer = CURRENT_REQUEST.get()
        self._start = time.monotonic()

    def __exit__(self, *_: object) -> None:
        if self._timer is not None:
            self._timer.remote += time.monotonic() - self._start


# Kafka's RequestMetrics times (TotalTimeMs, RequestQueueTimeMs, ...), in this order.
PHASES = (
    ("strom_request_time_seconds", "Time from a request's last byte arriving to its response sent"),
    ("strom_request_queue_time_seconds",
     "Time from a request's turn on its connection (its last byte, or the previous answer) to its handler"),
    ("strom_request_local_time_seconds", "Time the broker worked on a request itself"),
    ("strom_request_remote_time_seconds",
     "Time a request waited for others: followers (acks=all), new data (fetch long polls), fsyncs"),
    ("strom_request_throttle_time_seconds",
     "Time a quota held the client back after the response (its connection read no further)"),
    ("strom_response_queue_time_seconds",
     "Time from a response being ready to its first byte handed to the socket (encoding included)"),
    ("strom_response_send_time_seconds", "Time handing a response to the socket, file regions included"),
)


class _ApiStats:
    __slots__ = ("versions", "phases")

    def __init__(self) -> None:
        self.versions: Counter[int] = Counter()
        self.phases = [Histogram() for _ in PHASES]


class RequestMetrics:
    """Kafka's RequestMetrics: count and time breakdown per API."""

    def __init__(self) -> None:
        self.apis: dict[int, _ApiStats] = {}

    def record(self, api_key: int, version: int, t: RequestTimer, done: float) -> None:
        stats = self.apis.get(api_key)
        if stats is None:
            stats = self.apis[api_key] = _ApiStats()
        stats.versions[version] += 1
        total, queue, local, remote, throttle, response_queue, send = stats.phases
        total.observe(done - t.received)
        queue.observe(t.started - t.received)
        local.observe(local_time(t))
        remote.observe(t.remote)
        throttle.observe(t.throttle)
        response_queue.observe(t.sending - t.handled)
        send.observe(done - t.sending)


def local_time(t: RequestTimer) -> float:
    return max(0.0, t.handled - t.started - t.remote)


def api_name(api_key: int) -> str:
    """Kafka's name for an API, as its request metrics label them ("Produce", "Fetch")."""
    cls = REQUESTS.get(api_key)
    return cls.name.removesuffix("Request") if cls is not None else str(api_key)


# --- per topic ----------------------------------------------------------------------------

# BrokerTopicMetrics, in this order in each topic's list of counters.
TOPIC_COUNTERS = (
    ("bytes_in", "Bytes of record batches clients produced"),
    ("messages_in", "Records clients produced"),
    ("bytes_out", "Bytes of record batches sent to consumers"),
    ("bytes_rejected", "Bytes of produced record sets the broker refused"),
    ("produce_requests", "Partition appends clients asked for"),
    ("fetch_requests", "Partition reads consumers asked for"),
    ("failed_produce_requests", "Partition appends refused or failed"),
    ("failed_fetch_requests", "Partition reads that failed"),
)
(BYTES_IN, MESSAGES_IN, BYTES_OUT, BYTES_REJECTED, PRODUCE_REQUESTS, FETCH_REQUESTS, FAILED_PRODUCE_REQUESTS,
 FAILED_FETCH_REQUESTS) = range(len(TOPIC_COUNTERS))


class BrokerTopicStats:
    """Kafka's BrokerTopicStats: counters per topic (the all-topics totals are their sums),
    plus replication traffic, which has no topic label (ReplicationBytesIn/OutPerSec)."""

    def __init__(self) -> None:
        self.topics: defaultdict[str, list[int]] = defaultdict(lambda: [0] * len(TOPIC_COUNTERS))
        self.deleted_topics = [0] * len(TOPIC_COUNTERS)  # so the totals never go down
        self.replication_bytes_in = 0
        self.replication_bytes_out = 0

    def remove_topic(self, topic: str) -> None:
        counts = self.topics.pop(topic, None)
        if counts is not None:
            self.deleted_topics = [a + b for a, b in zip(self.deleted_topics, counts, strict=True)]

    def total(self, index: int) -> int:
        return self.deleted_topics[index] + sum(c[index] for c in self.topics.values())

# --- the event loop ----------------------------------------------------------------------

class LoopIdleSampler:
    """Kafka's NetworkProcessorAvgIdlePercent for an event loop: the share of wall-clock time
    the loop's thread did not spend on the CPU, sampled once a second."""

    def __init__(self) -> None:
        self.idle_ratio = 1.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-idle-sampler")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        wall, cpu = time.monotonic(), time.thread_time()
        while True:
            await asyncio.sleep(_IDLE_SAMPLE_S)
            now_wall, now_cpu = time.monotonic(), time.thread_time()
            if now_wall > wall:
                self.idle_ratio = min(1.0, max(0.0, 1.0 - (now_cpu - cpu) / (now_wall - wall)))
            wall, cpu = now_wall, now_cpu
