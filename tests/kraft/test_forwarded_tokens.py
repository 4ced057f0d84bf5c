"""In-process pieces of delegation tokens on the quorum: the Envelope a KRaft broker wraps a
client's request in (and the controller opens), and a broker's token store fed by the image."""

from __future__ import annotations

import base64
import hmac as hmac_lib

import pytest

from strom.config.broker import BrokerConfig
from strom.network.request import RequestContext
from strom.protocol.kraft_messages import EnvelopeRequest
from strom.protocol.messages import RequestHeader
from strom.protocol.scram import salted_password, scram_credential
from strom.security.delegation_tokens import QuorumTokens, TokenInformation, _now_ms
from strom.server.kraft import envelope

RENEW = 39


def test_an_envelope_carries_the_request_the_principal_and_the_address():
    header = RequestHeader(RENEW, 2, 77, "client-1", True)
    ctx = RequestContext(header, "SASL_SSL", "10.1.2.3:50000", "User:alice", "SASL_SSL", False)
    fields = envelope.wrap(ctx, {"hmac": b"\x01\x02", "renew_period_ms": 5000})
    # Over the wire as the broker sends it, and opened as the controller does.
    wire = EnvelopeRequest.decode(EnvelopeRequest(**fields).encode(version=0), version=0)
    outer = RequestContext(RequestHeader(58, 0, 5, "broker-1", True), "CONTROLLER", "127.0.0.1:9", "User:broker",
                           "PLAINTEXT", False)
    inner, body = envelope.unwrap(outer, wire)
    assert isinstance(inner, envelope.ForwardedContext) and inner.forwarded
    assert (inner.header.api_key, inner.header.api_version, inner.header.correlation_id,
            inner.header.client_id) == (RENEW, 2, 77, "client-1")
    assert (inner.principal, inner.client, inner.token_authenticated) == ("User:alice", "10.1.2.3:0", False)
    assert (inner.listener, inner.security_protocol) == ("CONTROLLER", "PLAINTEXT")
    assert (bytes(body.hmac), body.renew_period_ms) == (b"\x01\x02", 5000)
    answer = envelope.unwrap_response(ctx, envelope.response_data(
        inner, {"error_code": 0, "expiry_timestamp_ms": 1234, "throttle_time_ms": 0}))
    assert (answer.error_code, answer.expiry_timestamp_ms) == (0, 1234)


def test_a_garbled_envelope_is_refused():
    outer = RequestContext(RequestHeader(58, 0, 5, "b", True), "CONTROLLER", "127.0.0.1:9", "User:broker",
                           "PLAINTEXT", False)
    good = envelope.wrap(RequestContext(RequestHeader(RENEW, 2, 1, "c", True), "L", "::1:5", "User:a"),
                         {"hmac": b"", "renew_period_ms": 1})
    for broken in ({**good, "request_data": good["request_data"][:-3]}, {**good, "request_principal": None},
                   {**good, "request_principal": b"\x00"}, {**good, "client_host_address": b"\x01\x02"}):
        with pytest.raises(ValueError):
            envelope.unwrap(outer, EnvelopeRequest(**broken))


def test_the_token_store_follows_the_image():
    tokens = QuorumTokens(BrokerConfig({"delegation.token.secret.key": "s3cret"}))
    now = _now_ms()
    a = TokenInformation("tokA", "User:alice", "User:alice", (), now, now + 60_000, now + 30_000)
    b = TokenInformation("tokB", "User:bob", "User:admin", ("User:carol",), now, now + 60_000, now + 30_000)
    tokens.publish([a.to_record(), b.to_record()])
    hmac_a = hmac_lib.digest(b"s3cret", b"tokA", "sha512")
    assert tokens.by_hmac(hmac_a) == a
    credential, owner, expiry = tokens.credential("SCRAM-SHA-256", "tokA")
    assert (owner, expiry) == ("User:alice", now + 30_000)
    password = base64.b64encode(hmac_a).decode()
    assert credential == scram_credential("SCRAM-SHA-256", salted_password(
        "SCRAM-SHA-256", password, credential.salt, credential.iterations), credential.salt, credential.iterations)
    renewed = TokenInformation(**{**a.__dict__, "expiry_ms": now + 50_000})
    tokens.publish([renewed.to_record()])  # b removed, a renewed
    assert tokens.credential("SCRAM-SHA-256", "tokB") is None and "tokB" not in tokens.tokens
    assert tokens.credential("SCRAM-SHA-256", "tokA")[2] == now + 50_000
    expired = TokenInformation(**{**a.__dict__, "expiry_ms": now - 1})
    tokens.publish([expired.to_record()])
    assert tokens.credential("SCRAM-SHA-256", "tokA") is None  # known, but past its expiry


def test_without_a_secret_a_broker_knows_no_tokens():
    tokens = QuorumTokens(BrokerConfig({}))
    tokens.publish([TokenInformation("t", "User:a", "User:a", (), 0, 2**62, 2**62).to_record()])
    assert not tokens.enabled and tokens.tokens == {}
