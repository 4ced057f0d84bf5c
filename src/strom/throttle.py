"""A token bucket of bytes, for the transfers Strom throttles by rate: replication of
reassigned replicas (replication.quota) and the copies and reads of tiered storage."""

from __future__ import annotations

import time
from collections.abc import Callable

BURST_S = 1.0  # the bucket holds one second of the rate


class TokenBucket:
    """Refills at `rate()` bytes per second (read each time: rates are dynamic configs); a
    throttled transfer may use what is in it, and goes into debt for what it takes beyond."""

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

    def wait_s(self) -> float:
        """How long until the bucket is out of debt (0: a transfer may go now)."""
        tokens = self.available()
        return 0.0 if tokens > 0 else -tokens / max(self.rate(), 1) + 0.001
