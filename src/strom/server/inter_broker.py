"""Requests from this broker to other brokers (transaction markers, transaction checks):
one connection per broker, one request at a time on it, reopened after a failure."""

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
