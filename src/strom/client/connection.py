"""A blocking connection that speaks Kafka's protocol through `strom.protocol`: one request in
flight at a time. Tools, tests and the Spark connector's raw fetch path use it where a client
library would hide the bytes (or cost more than the bytes). Both it and AsyncConnection (the
brokers' connections to each other) can speak TLS and authenticate with SASL (ClientSecurity)."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from strom.client.security import ClientSecurity, reauthentication_time
from strom.protocol.frames import FrameDecoder
from strom.protocol.messages import decode_response, encode_request

MAX_FRAME = 1 << 30


class Connection:
    def __init__(self, host: str, port: int, timeout_s: float = 10.0, client_id: str = "strom",
                 security: ClientSecurity | None = None) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if security is not None and security.ssl is not None:
            self.sock = security.ssl.wrap_socket(self.sock, server_hostname=host)
        self.decoder = FrameDecoder(MAX_FRAME, trusted=True)
        self.client_id = client_id
        self.correlation = 0
        self.security = security
        self.reauthenticate_at: float | None = None  # KIP-368: when the SASL session is renewed
        if security is not None:
            self._authenticate()

    def _authenticate(self) -> None:
        steps = self.security.exchange()
        try:
            request = next(steps)
            while True:
                request = steps.send(self._call(*request))
        except StopIteration as done:
            self.reauthenticate_at = reauthentication_time(done.value)

    def call(self, api_key: int, version: int, fields: dict[str, Any]) -> Any:
        """Send one request and return the decoded response body. A SASL session whose time has
        come is renewed first, between requests, as Kafka's clients do (KIP-368)."""
        if self.reauthenticate_at is not None and time.monotonic() >= self.reauthenticate_at:
            self._authenticate()
        return self._call(api_key, version, fields)

    def _call(self, api_key: int, version: int, fields: dict[str, Any]) -> Any:
        self.correlation += 1
        self.send_raw(encode_request(api_key, version, fields, self.correlation, self.client_id))
        payload = self.read_frame()
        if payload is None:
            raise ConnectionError("the broker closed the connection")
        correlation, body = decode_response(api_key, version, payload)
        if correlation != self.correlation:
            raise ConnectionError(f"response to request {correlation} where {self.correlation} was expected")
        return body

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytearray | None:
        """The next response frame, or None if the broker closed the connection. Received into
        the decoder's buffer: a large Fetch response is filled in place, not copied."""
        while True:
            buf = self.decoder.get_buffer()
            n = self.sock.recv_into(buf)
            if not n:
                return None
            frames = self.decoder.buffer_updated(n)
            if frames:
                return frames[0]

    def is_closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncConnection:
    """One request at a time over asyncio streams: the controller's channel to a broker and
    (later) a follower's fetcher use it. Not thread-safe; one user at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 client_id: str, security: ClientSecurity | None = None, timeout_s: float = 10.0) -> None:
        self.reader = reader
        self.writer = writer
        self.client_id = client_id
        self.correlation = 0
        self.security = security
        self.timeout_s = timeout_s  # for each request of a (re-)authentication
        self.reauthenticate_at: float | None = None  # KIP-368: when the SASL session is renewed

    @classmethod
    async def open(cls, host: str, port: int, client_id: str = "strom", timeout_s: float = 10.0,
                   security: ClientSecurity | None = None) -> AsyncConnection:
        context = security.ssl if security is not None else None
        async with asyncio.timeout(timeout_s):  # not wait_for: see `call`
            reader, writer = await asyncio.open_connection(host, port, ssl=context,
                                                           server_hostname=host if context else None)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = cls(reader, writer, client_id, security, timeout_s)
        if security is not None:
            try:
                await conn._authenticate()
            except BaseException:
                conn.close()
                raise
        return conn

    async def _authenticate(self) -> None:
        steps = self.security.exchange()
        try:
            request = next(steps)
            while True:
                request = steps.send(await self._call(*request, timeout_s=self.timeout_s))
        except StopIteration as done:
            self.reauthenticate_at = reauthentication_time(done.value)

    async def call(self, api_key: int, version: int, fields: dict[str, Any],
                   timeout_s: float = 30.0) -> Any:
        """Send one request and return the decoded response body. Requests go one at a time, so
        a SASL session whose time has come is renewed here, before the next one and never
        between a request and its answer (KIP-368): otherwise the broker closes the connection
        at the first request after the session's end (connections.max.reauth.ms)."""
        if self.reauthenticate_at is not None and time.monotonic() >= self.reauthenticate_at:
            await self._authenticate()
        return await self._call(api_key, version, fields, timeout_s)

    async def _call(self, api_key: int, version: int, fields: dict[str, Any], timeout_s: float) -> Any:
        self.correlation += 1
        self.writer.write(encode_request(api_key, version, fields, self.correlation, self.client_id))
        await self.writer.drain()
        # asyncio.timeout, not wait_for: in Python 3.11 wait_for returns an answer that arrives
        # as the caller is cancelled, and the cancellation is lost.
        async with asyncio.timeout(timeout_s):
            size = int.from_bytes(await self.reader.readexactly(4), "big")
        if not 0 <= size <= MAX_FRAME:
            raise ConnectionError(f"response frame of {size} bytes")
        async with asyncio.timeout(timeout_s):
            payload = await self.reader.readexactly(size)
        correlation, body = decode_response(api_key, version, payload)
        if correlation != self.correlation:
            raise ConnectionError(f"response to request {correlation} where {self.correlation} was expected")
        return body

    def close(self) -> None:
        self.writer.close()


class ConnectionCache:
    """AsyncConnections kept open by key, one request at a time per key: a connection is opened
    on first use (`address(key)`, at call time) and dropped on any failure, so the next call
    opens a fresh one. For the brokers' and controllers' calls to each other."""

    def __init__(self, client_id: str, security: ClientSecurity | None, connect_timeout_s: float) -> None:
        self.client_id = client_id
        self.security = security
        self.connect_timeout_s = connect_timeout_s
        self._conns: dict[Any, AsyncConnection] = {}
        self._locks: dict[Any, asyncio.Lock] = {}

    async def call(self, key: Any, address: tuple[str, int] | Any, api_key: int, version: int,
                   fields: dict[str, Any], timeout_s: float, connect_timeout_s: float | None = None) -> Any:
        """`address` is (host, port) or a function giving it (asked only when a connection opens)."""
        async with self._locks.setdefault(key, asyncio.Lock()):
            conn = self._conns.get(key)
            if conn is None:
                host, port = address() if callable(address) else address
                conn = await AsyncConnection.open(host, port, self.client_id,
                                                  connect_timeout_s or self.connect_timeout_s, security=self.security)
                self._conns[key] = conn
            try:
                return await conn.call(api_key, version, fields, timeout_s=timeout_s)
            except BaseException:
                self._conns.pop(key, None)
                conn.close()
                raise

    def close(self) -> None:
        for conn in self._conns.values():
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._conns.clear()
