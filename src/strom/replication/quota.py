"""Replication throttles (Kafka's ReplicationQuotaManager, for reassignments).

A leader stops sending throttled replicas' data while its budget of
`leader.replication.throttled.rate` is spent, and a follower asks for no more than its
budget of `follower.replication.throttled.rate` allows. Only replicas named
in the topic's `*.replication.throttled.replicas` count, so client traffic is never throttled.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BURST_S = 1.0  # the bucket holds one second of the rate


class ReplicationQuota:
    """A token bucket of bytes: it refills at the configured rate (read each time, as it is
    a dynamic config) and a throttled transfer may use what is in it."""

    def __init__(self, rate: Callable[[], int]) -> None:
        self.rate = rate
        self.tokens: float | None = None
        self.last = time.monotonic()

    def available(self) -> float:
        now, rate = time.monotonic(), self.rate()
        capacity = rate * BURST_S
        self.tokens = capacity if self.tokens is None else min(capacity, self.tokens + (now - self.last) * rate)
        self.last = now
        return self.tokens

    def exceeded(self) -> bool:
        return self.available() <= 0

    def record(self, size: int) -> None:
        if size:
            self.tokens = self.available() - size
