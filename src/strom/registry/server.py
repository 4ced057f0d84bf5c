"""The registry's HTTP listener: aiohttp's server on the broker's loop, plain or TLS, with a
bound on open connections (one past it is closed as it arrives)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from urllib.parse import urlsplit

from aiohttp import web

log = logging.getLogger(__name__)


class ListenerError(ValueError):
    pass


def parse_listener(text: str) -> tuple[str, str, int]:
    """(scheme, host, port) of the first of `schema.registry.listeners`."""
    first = text.split(",")[0].strip()
    parts = urlsplit(first)
    if parts.scheme not in ("http", "https") or parts.port is None:
        raise ListenerError(f"schema.registry.listeners={text}: expected http://host:port or https://host:port")
    return parts.scheme, parts.hostname or "", parts.port


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class HttpListener:
    def __init__(self, app: web.Application, max_connections: int) -> None:
        self.runner = web.AppRunner(app, access_log=None, keepalive_timeout=30.0)
        self.max_connections = max_connections
        self.server: asyncio.AbstractServer | None = None
        self.bound: tuple[str, int] | None = None

    async def start(self, host: str, port: int, context: ssl.SSLContext | None) -> None:
        await self.runner.setup()
        handler = self.runner.server

        def connection() -> asyncio.BaseProtocol:
            if len(handler.connections) >= self.max_connections:
                return _Refused()
            return handler()

        self.server = await asyncio.get_running_loop().create_server(
            connection, host=host or None, port=port, reuse_address=True, backlog=128, ssl=context,
            ssl_handshake_timeout=10 if context is not None else None)
        self.bound = self.server.sockets[0].getsockname()[:2]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        await self.runner.cleanup()
