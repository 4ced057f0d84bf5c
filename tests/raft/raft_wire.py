"""A tiny Raft transport over real sockets for tests and benchmarks: an asyncio server that
decodes requests with strom.protocol.messages and hands them to a RaftDriver, and a `send`
that keeps one strom.client.AsyncConnection per (node, api key)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from strom.client import AsyncConnection
from strom.protocol.messages import encode_response, parse_request
from strom.raft.driver import RaftDriver


class RaftServer:
    def __init__(self) -> None:
        self.driver: RaftDriver | None = None
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                request = parse_request(await reader.readexactly(size))
                h = request.header
                body = await self.driver.handle_request(h.api_key, h.api_version, request.body)
                writer.write(encode_response(h, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the peer went away, or this server is closing
        finally:
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()


class Sender:
    """`send(node, api_key, version, fields)` for RaftDriver: one connection per (node, api)."""

    def __init__(self, ports: dict[int, int]) -> None:
        self.ports = ports
        self.conns: dict[tuple[int, int], AsyncConnection] = {}
        self.locks: dict[tuple[int, int], asyncio.Lock] = {}

    async def __call__(self, node: int, api_key: int, version: int, fields: dict[str, Any]) -> Any:
        key = (node, api_key)
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            conn = self.conns.get(key)
            if conn is None:
                conn = self.conns[key] = await AsyncConnection.open("127.0.0.1", self.ports[node], timeout_s=2)
            try:
                return await conn.call(api_key, version, fields, timeout_s=5)
            except BaseException:
                self.conns.pop(key, None)
                conn.close()
                raise

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()
