"""A blocking connection that speaks Kafka's protocol through `strom.protocol`: one request in
flight at a time. Tools, tests and the Spark connector's raw fetch path use it where a client
library would hide the bytes (or cost more than the bytes)."""

from __future__ import annotations

import socket
from typing import Any

from strom.protocol.frames import FrameDecoder
from strom.protocol.messages import decode_response, encode_request

MAX_FRAME = 1 << 30


class Connection:
    def __init__(self, host: str, port: int, timeout_s: float = 10.0, client_id: str = "strom") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(MAX_FRAME)
        self.client_id = client_id
        self.correlation = 0

    def call(self, api_key: int, version: int, fields: dict[str, Any]) -> Any:
        """Send one request and return the decoded response body."""
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
