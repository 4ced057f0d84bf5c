"""Delegation tokens against a real broker. No Python client library speaks SCRAM's
`tokenauth` extension (Kafka's Java client does), so the token side goes through
strom.client's SCRAM client: SCRAM-SHA-512 with the token's id and HMAC, as Kafka's
ScramLoginModule does with tokenauth="true"."""

from __future__ import annotations

import base64
import hmac
import time

import pytest

from strom.client import AuthenticationError, ClientSecurity, Connection
from strom.protocol.errors import ErrorCode
from strom.testing import BrokerProcess

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
              'user_alice="alice-secret" user_bob="bob-secret" user_carol="carol-secret";')
METADATA = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides={
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
            "delegation.token.secret.key": "the-cluster-secret",
            "delegation.token.max.lifetime.ms": "3600000", "delegation.token.expiry.time.ms": "600000"}) as b:
        yield b


def plain(broker, user: str) -> Connection:
    conn = Connection("127.0.0.1", broker.ports["SASL_PLAINTEXT"])
    assert conn.call(17, 1, {"mechanism": "PLAIN"}).error_code == 0
    password = f"{user}-secret".encode()
    assert conn.call(36, 2, {"auth_bytes": b"\0" + user.encode() + b"\0" + password}).error_code == 0
    return conn


def scram_with_token(broker, token_id: str, token_hmac: bytes) -> Connection:
    """SCRAM-SHA-512 as a token: user the token id, password base64(HMAC), tokenauth=true."""
    security = ClientSecurity(sasl_mechanism="SCRAM-SHA-512", username=token_id,
                              password=base64.b64encode(token_hmac).decode(), token=True)
    return Connection("127.0.0.1", broker.ports["SASL_PLAINTEXT"], security=security)


def create(conn: Connection, renewers: list[str] = (), max_lifetime_ms: int = -1):
    return conn.call(38, 3, {"owner_principal_type": None, "owner_principal_name": None,
                             "renewers": [{"principal_type": "User", "principal_name": r} for r in renewers],
                             "max_lifetime_ms": max_lifetime_ms})


def test_a_token_authenticates_as_its_owner(broker):
    with plain(broker, "alice") as alice:
        token = create(alice, renewers=["bob"])
        assert token.error_code == 0 and token.principal_name == "alice" and token.token_requester_principal_name == "alice"
        assert token.issue_timestamp_ms <= token.expiry_timestamp_ms <= token.max_timestamp_ms
        assert token.max_timestamp_ms - token.issue_timestamp_ms == 3_600_000
        assert token.expiry_timestamp_ms - token.issue_timestamp_ms == 600_000
        assert token.hmac == hmac.digest(b"the-cluster-secret", token.token_id.encode(), "sha512")
    with scram_with_token(broker, token.token_id, token.hmac) as conn:
        assert conn.call(3, 9, METADATA).brokers
        # A token-authenticated connection may not ask for more tokens.
        assert create(conn).error_code == ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
    with pytest.raises(AuthenticationError, match="invalid credentials"):
        scram_with_token(broker, token.token_id, b"not the hmac")


def test_renew_expire_and_describe(broker):
    with plain(broker, "alice") as alice, plain(broker, "bob") as bob, plain(broker, "carol") as carol:
        token = create(alice, renewers=["bob"])
        renewed = bob.call(39, 2, {"hmac": token.hmac, "renew_period_ms": 1_000_000})
        assert renewed.error_code == 0 and renewed.expiry_timestamp_ms > token.expiry_timestamp_ms
        assert renewed.expiry_timestamp_ms <= token.max_timestamp_ms
        assert carol.call(39, 2, {"hmac": token.hmac, "renew_period_ms": 1000}).error_code == \
            ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH
        assert alice.call(39, 2, {"hmac": b"unknown", "renew_period_ms": 1000}).error_code == \
            ErrorCode.DELEGATION_TOKEN_NOT_FOUND
        mine = alice.call(41, 3, {"owners": [{"principal_type": "User", "principal_name": "alice"}]}).tokens
        assert token.token_id in [t.token_id for t in mine]
        described = next(t for t in mine if t.token_id == token.token_id)
        assert [(r.principal_type, r.principal_name) for r in described.renewers] == [("User", "bob")]
        assert described.expiry_timestamp == renewed.expiry_timestamp_ms
        assert alice.call(41, 3, {"owners": [{"principal_type": "User", "principal_name": "dave"}]}).tokens == []
        gone = alice.call(40, 2, {"hmac": token.hmac, "expiry_time_period_ms": -1})
        assert gone.error_code == 0
        assert token.token_id not in [t.token_id for t in alice.call(41, 3, {"owners": None}).tokens]
    with pytest.raises(AuthenticationError):
        scram_with_token(broker, token.token_id, token.hmac)


def test_tokens_end_at_their_max_lifetime(broker):
    with plain(broker, "alice") as alice:
        token = create(alice, max_lifetime_ms=1000)
        assert token.max_timestamp_ms - token.issue_timestamp_ms == 1000
        time.sleep(1.2)
        assert alice.call(39, 2, {"hmac": token.hmac, "renew_period_ms": 1000}).error_code == \
            ErrorCode.DELEGATION_TOKEN_EXPIRED
    with pytest.raises(AuthenticationError):
        scram_with_token(broker, token.token_id, token.hmac)


def test_tokens_are_refused_without_real_authentication_or_a_secret(broker):
    with Connection("127.0.0.1", broker.port) as conn:  # PLAINTEXT
        assert create(conn).error_code == ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
        assert conn.call(41, 3, {"owners": None}).error_code == ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
    with BrokerProcess(overrides={"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                                  "sasl.enabled.mechanisms": "PLAIN",
                                  "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS}) as no_secret:
        with plain(no_secret, "alice") as alice:
            assert create(alice).error_code == ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED


def test_tokens_survive_a_restart(tmp_path):
    overrides = {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                 "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
                 "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
                 "delegation.token.secret.key": "the-cluster-secret"}
    first = BrokerProcess(data_dir=tmp_path, overrides=overrides).start()
    try:
        with plain(first, "alice") as alice:
            token = create(alice)
    finally:
        first.stop()
    second = BrokerProcess(data_dir=tmp_path, overrides=overrides).start()
    try:
        with scram_with_token(second, token.token_id, token.hmac) as conn:
            assert conn.call(3, 9, METADATA).brokers
    finally:
        second.close()
