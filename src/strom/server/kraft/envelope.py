"""Envelope (KIP-590): how a KRaft broker passes a client's request to the controller so that
the controller decides as whom it was made (Kafka's ForwardingManager and EnvelopeUtils).

The envelope carries the request as the client framed it (header and body, no size prefix),
the client's principal as Kafka's DefaultKafkaPrincipalBuilder serializes it (version-prefixed
DefaultPrincipalData: type, name, whether a delegation token authenticated it) and the
client's IP address as bytes. The answer carries the response with its header.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from strom.network.request import RequestContext
from strom.protocol.kraft_messages import DefaultPrincipalData
from strom.protocol.messages import (
    decode_response,
    encode_body,
    encode_request,
    parse_request,
    response_header,
)
from strom.security.authorizer import host_of

ENVELOPE = 58


@dataclass(slots=True)
class ForwardedContext(RequestContext):
    """A request that came in an Envelope: its principal and client are the original client's."""

    forwarded: bool = True


def wrap(ctx: RequestContext, fields: dict[str, Any]) -> dict[str, Any]:
    """EnvelopeRequest fields for the request `ctx` and `fields` describe."""
    header = ctx.header
    framed = encode_request(header.api_key, header.api_version, fields, header.correlation_id,
                            header.client_id or "")
    kind, _, name = ctx.principal.partition(":")
    principal = DefaultPrincipalData(type=kind, name=name, token_authenticated=ctx.token_authenticated)
    try:
        address = ipaddress.ip_address(host_of(ctx.client)).packed
    except ValueError:
        address = b"\x00\x00\x00\x00"
    return {"request_data": framed[4:], "request_principal": bytes(principal.encode(version=0)),
            "client_host_address": address}


def unwrap(outer: RequestContext, envelope: Any) -> tuple[ForwardedContext, Any]:
    """The forwarded request and its context: the client's principal and address, on the
    listener the envelope came by. ValueError when the envelope is not one."""
    try:
        inner = parse_request(bytes(envelope.request_data))
    except Exception as e:  # the parser's InvalidRequest / UnsupportedRequest
        raise ValueError(f"bad forwarded request: {e}") from None
    if envelope.request_principal is None:
        raise ValueError("a forwarded request without a principal")
    try:
        principal = DefaultPrincipalData.decode(bytes(envelope.request_principal), version=0)
        host = str(ipaddress.ip_address(bytes(envelope.client_host_address)))
    except Exception as e:  # the codec raises assorted errors on garbled bytes
        raise ValueError(f"bad forwarded principal or address: {e}") from None
    ctx = ForwardedContext(inner.header, outer.listener, f"{host}:0", f"{principal.type}:{principal.name}",
                           outer.security_protocol, bool(principal.token_authenticated))
    return ctx, inner.body


def response_data(ctx: RequestContext, fields: dict[str, Any]) -> bytes:
    """The forwarded request's response, with its header, as the envelope carries it."""
    return response_header(ctx.header) + encode_body(ctx.header.api_key, ctx.header.api_version, fields)


def unwrap_response(ctx: RequestContext, data: bytes) -> Any:
    return decode_response(ctx.header.api_key, ctx.header.api_version, data)[1]
