"""What passes between the socket server and the request handlers (Kafka's RequestChannel):
a request's context, the kinds of answer a handler may give, and the handler side's
interface. The network layer sees handlers only through `RequestHandler`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from strom.protocol.messages import RequestHeader

API_VERSIONS = 18  # answered before SASL authentication, and at v0 when its version is unknown


@dataclass(slots=True)
class RequestContext:
    header: RequestHeader
    listener: str
    client: str
    principal: str = "User:ANONYMOUS"  # who the connection authenticated as (TLS certificate, SASL)
    security_protocol: str = "PLAINTEXT"  # of the listener the request came on
    token_authenticated: bool = False  # SASL with a delegation token


@dataclass(slots=True)
class RawResponse:
    """A response body already encoded: bytes and regions with `fd`, `position`, `size`.
    `throttle_at`: where in its first part throttle_time_ms lies (None: the version has none)."""

    parts: list[Any]
    throttle_at: int | None = 0


class CloseConnection(Exception):
    """Raised by a handler when Kafka answers by closing the connection (e.g. a failed acks=0
    produce, which has no response to carry the error)."""


class RequestHandler(Protocol):
    def supports(self, api_key: int, version: int) -> bool:
        """Whether a request of this api key and version has a handler (a fixed answer: the
        socket server keeps the pairs that have one)."""

    async def handle(self, ctx: RequestContext, body: Any) -> Any:
        """The response as plain dicts, a RawResponse, or None (no response, acks=0)."""

    def unsupported_version_response(self) -> dict:
        """ApiVersions' v0 answer to a version it does not know."""
