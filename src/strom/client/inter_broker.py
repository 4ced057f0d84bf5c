"""Requests from this broker to other brokers. BrokerConnections (transaction markers,
transaction checks): one connection per broker, one request at a time on it, reopened after a
failure. ConnectionPool (the share Persister): a few connections per broker."""

from __future__ import annotations

import asyncio
from typing import Any

from strom.client import AsyncConnection


class BrokerConnections:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.conns: dict[int, AsyncConnection] = {}
        self.locks: dict[int, asyncio.Lock] = {}

    async def call(self, broker_id: int, api_key: int, version: int, fields: dict[str, Any],
                   timeout_s: float = 30.0) -> Any:
        """Raises OSError, ConnectionError, TimeoutError or LookupError when it cannot."""
        lock = self.locks.setdefault(broker_id, asyncio.Lock())
        async with lock:
            conn = self.conns.get(broker_id)
            if conn is None:
                host, port = self.broker.broker_endpoint(broker_id)
                conn = self.conns[broker_id] = await AsyncConnection.open(
                    host, port, f"broker-{self.broker.broker_id}", security=self.broker.inter_broker_security)
            try:
                return await conn.call(api_key, version, fields, timeout_s)
            except BaseException:
                conn.close()
                self.conns.pop(broker_id, None)
                raise

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()


class ConnectionPool:
    """Up to `size` connections to each broker, one request at a time on each: a bound on the
    calls in flight to a broker that still lets them overlap (the share Persister's). A failed
    call closes its connection and the idle ones to that broker, which likely failed too."""

    def __init__(self, broker, size: int) -> None:
        self.broker = broker
        self.size = size
        self.idle: dict[int, list[AsyncConnection]] = {}
        self.slots: dict[int, asyncio.Semaphore] = {}

    async def call(self, broker_id: int, api_key: int, version: int, fields: dict[str, Any],
                   timeout_s: float = 30.0) -> Any:
        """Raises OSError, ConnectionError, TimeoutError or LookupError when it cannot."""
        async with self.slots.setdefault(broker_id, asyncio.Semaphore(self.size)):
            idle = self.idle.setdefault(broker_id, [])
            if idle:
                conn = idle.pop()
            else:
                host, port = self.broker.broker_endpoint(broker_id)
                conn = await AsyncConnection.open(host, port, f"broker-{self.broker.broker_id}",
                                                  timeout_s=min(timeout_s, 10.0),
                                                  security=self.broker.inter_broker_security)
            try:
                body = await conn.call(api_key, version, fields, timeout_s)
            except BaseException:
                conn.close()
                for other in self.idle.pop(broker_id, []):
                    other.close()
                raise
            self.idle.setdefault(broker_id, []).append(conn)
            return body

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()
