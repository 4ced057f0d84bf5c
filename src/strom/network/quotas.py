"""Client quotas as Kafka enforces them (seed 002's 限流机制, KIP-13, KIP-124, KIP-219, KIP-612).

Byte-rate quotas (`producer_byte_rate`, `consumer_byte_rate`) and the request-time quota
(`request_percentage`, a share of one event loop) belong to the first entity in Kafka's order
that sets them: user and client id, user and default client, user, default user and client id,
... default client id. Usage is metered per that entity with the defaults filled in, so a
default quota applies to each user (or client) on its own. Rates are measured over
`quota.window.num` windows of `quota.window.size.seconds`; a client over its quota is told
`throttle_time_ms` in the response and its connection is read no further for that long.
Replication and controller traffic is never throttled. `connection_creation_rate` (per IP)
and `max.connection.creation.rate` (broker) bound how fast connections may be opened.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import deque
from collections.abc import Mapping

from strom.config.repository import DEFAULT, sanitize

CLIENT_KEYS = {"producer_byte_rate": int, "consumer_byte_rate": int, "request_percentage": float,
               "controller_mutation_rate": float}
IP_KEYS = {"connection_creation_rate": int}
PRODUCE, FETCH = 0, 1
# Never throttled: the controller's and brokers' own requests, and what a client needs before
# it can be told anything (Kafka's exempt APIs).
EXEMPT_APIS = frozenset({4, 5, 6, 7, 17, 18, 27, 36, 56})


class Rate:
    """Kafka's windowed rate: per-window totals for the last `samples` windows; the elapsed
    time counts at least `samples - 1` whole windows, so a new sensor does not over-report."""

    __slots__ = ("window_s", "samples", "windows")

    def __init__(self, window_s: float, samples: int) -> None:
        self.window_s, self.samples = window_s, samples
        self.windows: deque[list[float]] = deque()  # [window start, total]

    def record(self, value: float, now: float) -> None:
        if not self.windows or now >= self.windows[-1][0] + self.window_s:
            self.windows.append([now, 0.0])
        self.windows[-1][1] += value
        while now - self.windows[0][0] > self.window_s * self.samples:
            self.windows.popleft()

    def measure(self, now: float) -> tuple[float, float]:
        """(rate per second, seconds it is measured over)."""
        elapsed = max(now - self.windows[0][0], self.window_s * (self.samples - 1)) if self.windows else 1.0
        return sum(total for _, total in self.windows) / elapsed, elapsed


def throttle_ms(rate: Rate, limit: float, now: float, max_ms: float) -> int:
    """How long to hold a client back so its rate falls to `limit` (Kafka's formula:
    (observed - quota) / quota * window)."""
    observed, elapsed = rate.measure(now)
    if observed <= limit:
        return 0
    return int(min((observed - limit) / limit * elapsed * 1000, max_ms))


class ClientQuotas:
    def __init__(self, entities: Mapping[str, Mapping[str, str]], window_s: float = 1.0, samples: int = 11) -> None:
        self.entities = entities  # ConfigRepository.clients: /config paths -> configs
        self.window_s, self.samples = window_s, samples
        self.rates: dict[tuple[str, str], Rate] = {}

    def _resolve(self, user: str, client: str, key: str) -> tuple[str, float] | None:
        """(metering entity, limit) of the first entity in Kafka's order that sets `key`."""
        u, c = sanitize(user), sanitize(client)
        candidates = ((f"users/{u}/clients/{c}", None), (f"users/{u}/clients/{DEFAULT}", f"users/{u}/clients/{c}"),
                      (f"users/{u}", None), (f"users/{DEFAULT}/clients/{c}", f"users/{u}/clients/{c}"),
                      (f"users/{DEFAULT}/clients/{DEFAULT}", f"users/{u}/clients/{c}"),
                      (f"users/{DEFAULT}", f"users/{u}"), (f"clients/{c}", None), (f"clients/{DEFAULT}", f"clients/{c}"))
        for path, metered_as in candidates:
            value = self.entities.get(path, {}).get(key)
            if value is not None:
                return metered_as or path, float(value)
        return None

    def record(self, user: str, client: str, key: str, value: float, now: float | None = None) -> int:
        """Add `value` to the entity's usage of `key`; the throttle time it earns (0 if none)."""
        if not self.entities:
            return 0
        found = self._resolve(user, client, key)
        if found is None:
            return 0
        entity, limit = found
        now = time.monotonic() if now is None else now
        rate = self.rates.get((entity, key))
        if rate is None:
            rate = self.rates[(entity, key)] = Rate(self.window_s, self.samples)
        rate.record(value, now)
        return throttle_ms(rate, limit, now, self.window_s * self.samples * 1000)

    def request_throttle_ms(self, user: str, client: str, api_key: int, request_bytes: int,
                            response_bytes: int, local_s: float, follower: bool) -> int:
        """The throttle a request earns: the byte rate of its kind (produce, consumer fetch)
        and the request-time share, whichever holds it back longer."""
        if api_key in EXEMPT_APIS or follower or not self.entities:
            return 0
        throttle = self.record(user, client, "request_percentage", local_s * 100)  # % of one loop-second
        if api_key == PRODUCE:
            throttle = max(throttle, self.record(user, client, "producer_byte_rate", request_bytes))
        elif api_key == FETCH:
            throttle = max(throttle, self.record(user, client, "consumer_byte_rate", response_bytes))
        return throttle


class ConnectionRates:
    """max.connection.creation.rate (all connections) and connection_creation_rate (per IP,
    /config/ips/<ip> or <default>): a connection beyond either is refused."""

    def __init__(self, entities: Mapping[str, Mapping[str, str]], window_s: float = 1.0, samples: int = 11) -> None:
        self.entities = entities
        self.window_s, self.samples = window_s, samples
        self.rates: dict[str, Rate] = {}

    def admit(self, ip: str, broker_limit: float, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        limit = self.entities.get(f"ips/{ip}", {}).get("connection_creation_rate") or \
            self.entities.get(f"ips/{DEFAULT}", {}).get("connection_creation_rate")
        for key, bound, what in (("", broker_limit, "max.connection.creation.rate"),
                                 (ip, float(limit) if limit else math.inf, f"connection_creation_rate of {ip}")):
            if bound == math.inf or bound >= 2**31 - 1:
                continue
            rate = self.rates.get(key)
            if rate is None:
                rate = self.rates[key] = Rate(self.window_s, self.samples)
            observed, _ = rate.measure(now)
            if observed >= bound:
                return f"{what} ({bound:g}/s) reached"
            rate.record(1, now)
        return None


def check_entity(entity: Mapping[str, str | None]) -> str:
    """The /config path of a quota entity ({"user": "alice", "client-id": None} is alice with
    the default client id); ValueError when the combination is not one Kafka allows."""
    kinds = set(entity)
    if kinds == {"ip"}:
        ip = entity["ip"]
        if ip is not None:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"{ip} is not a valid IP address") from None
        return f"ips/{sanitize(ip or DEFAULT)}"
    if not kinds or not kinds <= {"user", "client-id"}:
        raise ValueError(f"Invalid quota entity combination {sorted(kinds)}: user, client-id, both, or ip")
    parts = []
    if "user" in kinds:
        parts.append(f"users/{sanitize(entity['user'] or DEFAULT)}")
    if "client-id" in kinds:
        parts.append(f"clients/{sanitize(entity['client-id'] or DEFAULT)}")
    return "/".join(parts)


def quota_keys(path: str) -> dict[str, type]:
    return IP_KEYS if path.startswith("ips/") else CLIENT_KEYS
