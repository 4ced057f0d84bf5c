"""A blocking connection that speaks Kafka's protocol through `strom.protocol`: one request in
flight at a time. Tools, tests and the Spark connector's raw fetch path use it where a client
library would hide the bytes (or cost more than the bytes). Both it and AsyncConnection (the
brokers' connections to each other) can speak TLS and authenticate with SASL (ClientSecurity)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from strom.jaas import parse_jaas
from strom.protocol.frames import FrameDecoder
from strom.protocol.messages import decode_response, encode_request
from strom.protocol.scram import SCRAM_MECHANISMS, ScramClient

MAX_FRAME = 1 << 30
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


class AuthenticationError(ConnectionError):
    pass


@dataclass(frozen=True)
class ClientSecurity:
    """How a client reaches a secured listener: a TLS context, and a SASL mechanism (PLAIN,
    SCRAM-SHA-256/512, the latter also with a delegation token) with its credentials."""

    ssl: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None
    username: str = ""
    password: str = ""
    token: bool = False

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> ClientSecurity | None:
        """From Kafka client properties (Java's names, or librdkafka's where they differ):
        security.protocol, ssl.truststore.location / ssl.ca.location (PEM),
        ssl.keystore.location / ssl.certificate.location + ssl.key.location, ssl.key.password,
        ssl.endpoint.identification.algorithm, sasl.mechanism(s), sasl.jaas.config /
        sasl.username + sasl.password. None for PLAINTEXT; ValueError for what cannot work."""
        protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
        if protocol == "PLAINTEXT":
            return None
        if protocol not in ("SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise ValueError(f"security.protocol={protocol} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
        context = None
        if protocol in ("SSL", "SASL_SSL"):
            context = ssl.create_default_context(
                cafile=props.get("ssl.truststore.location") or props.get("ssl.ca.location") or None)
            context.check_hostname = props.get("ssl.endpoint.identification.algorithm", "https").strip() != ""
            chain = props.get("ssl.keystore.location") or props.get("ssl.certificate.location")
            if chain:
                context.load_cert_chain(chain, props.get("ssl.key.location") or None,
                                        password=props.get("ssl.key.password") or None)
        if not protocol.startswith("SASL_"):
            return cls(ssl=context)
        mechanism = (props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "GSSAPI").strip().upper()
        options = parse_jaas(props["sasl.jaas.config"]) if props.get("sasl.jaas.config") else {}
        return cls(context, mechanism, options.get("username", props.get("sasl.username", "")),
                   options.get("password", props.get("sasl.password", "")),
                   options.get("tokenauth", "").lower() == "true")

    def exchange(self) -> Generator[tuple[int, int, dict], Any, None]:
        """The SASL requests to send, each answered by the response sent back in (sans-I/O, so
        the blocking and the asyncio connection share it)."""
        if self.sasl_mechanism is None:
            return
        handshake = yield SASL_HANDSHAKE, 1, {"mechanism": self.sasl_mechanism}
        if handshake.error_code:
            raise AuthenticationError(f"SASL mechanism {self.sasl_mechanism} refused (error {handshake.error_code}); "
                                      f"the broker offers {', '.join(handshake.mechanisms)}")
        if self.sasl_mechanism == "PLAIN":
            tokens = [f"\0{self.username}\0{self.password}".encode()]
            scram = None
        elif self.sasl_mechanism in SCRAM_MECHANISMS:
            scram = ScramClient(self.sasl_mechanism, self.username, self.password, self.token)
            tokens = [scram.first()]
        else:
            raise AuthenticationError(f"SASL mechanism {self.sasl_mechanism} is not one this client speaks")
        answer = yield SASL_AUTHENTICATE, 2, {"auth_bytes": tokens[0]}
        if not answer.error_code and scram is not None:
            answer = yield SASL_AUTHENTICATE, 2, {"auth_bytes": scram.final(answer.auth_bytes)}
            if not answer.error_code and not scram.verify(answer.auth_bytes):
                raise AuthenticationError("the broker's SCRAM signature is wrong: it does not know the password")
        if answer.error_code:
            raise AuthenticationError(answer.error_message or f"SASL authentication failed (error {answer.error_code})")


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
        if security is not None:
            steps = security.exchange()
            try:
                request = next(steps)
                while True:
                    request = steps.send(self.call(*request))
            except StopIteration:
                pass

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

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncConnection:
    """One request at a time over asyncio streams: the controller's channel to a broker and
    (later) a follower's fetcher use it. Not thread-safe; one user at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 client_id: str) -> None:
        self.reader = reader
        self.writer = writer
        self.client_id = client_id
        self.correlation = 0

    @classmethod
    async def open(cls, host: str, port: int, client_id: str = "strom", timeout_s: float = 10.0,
                   security: ClientSecurity | None = None) -> AsyncConnection:
        context = security.ssl if security is not None else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context, server_hostname=host if context else None), timeout_s)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = cls(reader, writer, client_id)
        if security is not None:
            steps = security.exchange()
            try:
                request = next(steps)
                while True:
                    request = steps.send(await conn.call(*request, timeout_s=timeout_s))
            except StopIteration:
                pass
            except BaseException:
                conn.close()
                raise
        return conn

    async def call(self, api_key: int, version: int, fields: dict[str, Any],
                   timeout_s: float = 30.0) -> Any:
        self.correlation += 1
        self.writer.write(encode_request(api_key, version, fields, self.correlation, self.client_id))
        await self.writer.drain()
        size = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(4), timeout_s), "big")
        if not 0 <= size <= MAX_FRAME:
            raise ConnectionError(f"response frame of {size} bytes")
        payload = await asyncio.wait_for(self.reader.readexactly(size), timeout_s)
        correlation, body = decode_response(api_key, version, payload)
        if correlation != self.correlation:
            raise ConnectionError(f"response to request {correlation} where {self.correlation} was expected")
        return body

    def close(self) -> None:
        self.writer.close()
