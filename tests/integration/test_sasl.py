"""SASL with real clients against a real broker: PLAIN (users from the listener's JAAS line),
SCRAM-SHA-256/512 (credentials made with `strom users`, kept in the metadata store),
OAUTHBEARER with unsecured tokens, over SASL_PLAINTEXT and SASL_SSL; failures, the state
machine seen from a raw client, re-authentication (KIP-368), the bound on password guesses
(per user and address, never locking out a correct password), and malformed exchanges."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer

from strom.client import Connection
from strom.jaas import parse_jaas
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import decode_response, encode_request
from strom.testing import BrokerProcess, create_topic, unique_name, wait_for

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
              'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
OAUTH_JAAS = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
MECHANISMS = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER"


def sasl_overrides(pki, **extra: str) -> dict[str, str]:
    return {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
            "sasl.enabled.mechanisms": MECHANISMS,
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
            "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
            "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": OAUTH_JAAS,
            "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config": OAUTH_JAAS,
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki["server"]),
            "group.initial.rebalance.delay.ms": "0", **extra}


def strom(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strom", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def broker(pki):
    with BrokerProcess(overrides=sasl_overrides(pki), env={"STROM_LOG_LEVEL": "strom.request=DEBUG"}) as b:
        server = ("--bootstrap-server", b.bootstrap)
        for mechanism, password in (("SCRAM-SHA-256", "bob-256"), ("SCRAM-SHA-512", "bob-512")):
            done = strom("users", "scram-set", "bob", "--mechanism", mechanism, "--password", password, *server)
            assert done.returncode == 0, done.stderr
        yield b


def librdkafka(broker, listener: str, pki, mechanism: str, **conf: str) -> dict[str, str]:
    out = {"bootstrap.servers": f"127.0.0.1:{broker.ports[listener]}", "security.protocol": listener,
           "sasl.mechanisms": mechanism, **conf}
    if listener == "SASL_SSL":
        out["ssl.ca.location"] = str(pki["ca"])
    return out


def round_trip(conf: dict[str, str], bootstrap: str, count: int = 10) -> list[bytes]:
    topic = unique_name("sasl")
    create_topic(bootstrap, topic)
    producer = Producer(conf)
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i)
    assert producer.flush(30) == 0
    consumer = Consumer({**conf, "group.id": unique_name("g"), "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    wait_for(lambda: got.extend(m.value() for m in consumer.consume(count, 0.5) if not m.error())
             or len(got) >= count, timeout=30, what="the records back")
    consumer.close()
    return got


def principal_logged(broker, principal: str) -> bool:
    return any(f", {principal}): " in line and "strom.request" in line for line in broker.stderr_lines)


@pytest.mark.parametrize(("listener", "mechanism", "user", "password"), [
    ("SASL_PLAINTEXT", "PLAIN", "alice", "alice-secret"),
    ("SASL_SSL", "PLAIN", "admin", "admin-secret"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256", "bob", "bob-256"),
    ("SASL_SSL", "SCRAM-SHA-512", "bob", "bob-512"),
])
def test_confluent_kafka(broker, pki, listener, mechanism, user, password):
    conf = librdkafka(broker, listener, pki, mechanism, **{"sasl.username": user, "sasl.password": password})
    assert round_trip(conf, broker.bootstrap) == [b"v%d" % i for i in range(10)]
    wait_for(lambda: principal_logged(broker, f"User:{user}"), timeout=10, what=f"requests as User:{user}")


def test_oauthbearer_unsecured_token(broker, pki):
    conf = librdkafka(broker, "SASL_PLAINTEXT", pki, "OAUTHBEARER", **{
        "enable.sasl.oauthbearer.unsecure.jwt": "true", "sasl.oauthbearer.config": "principal=carol"})
    assert len(round_trip(conf, broker.bootstrap, 3)) == 3
    assert principal_logged(broker, "User:carol")
    # Said at start-up, once per listener: the unsecured validator takes any token.
    said = [line for line in broker.stderr_lines if "OAUTHBEARER takes unsecured tokens" in line]
    assert sorted(line.split("listener ")[1].split(":")[0] for line in said) == ["SASL_PLAINTEXT", "SASL_SSL"]


@pytest.mark.parametrize(("mechanism", "user", "password"), [
    ("PLAIN", "alice", "wrong"), ("SCRAM-SHA-256", "bob", "bob-512"), ("SCRAM-SHA-512", "nobody", "x")])
def test_wrong_credentials_fail_and_the_broker_carries_on(broker, pki, mechanism, user, password):
    errors = []
    producer = Producer({**librdkafka(broker, "SASL_PLAINTEXT", pki, mechanism, **{
        "sasl.username": user, "sasl.password": password}), "error_cb": errors.append})
    producer.produce(unique_name("nope"), value=b"x")
    wait_for(lambda: (producer.poll(0.1), errors)[1], timeout=15, what="an authentication error")
    assert "Authentication failed" in str(errors[0])
    # One line per address per second at most: a flood of failures is not a flood of lines.
    assert any("failed authentication with 127.0.0.1:" in line for line in broker.stderr_lines)
    conf = librdkafka(broker, "SASL_PLAINTEXT", pki, "PLAIN", **{"sasl.username": "alice", "sasl.password": "alice-secret"})
    assert len(round_trip(conf, broker.bootstrap, 2)) == 2


def test_kafka_python(broker, pki):
    from kafka import KafkaConsumer, KafkaProducer

    topic = unique_name("sasl-kafka-python")
    create_topic(broker.bootstrap, topic)
    common = {"bootstrap_servers": f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}", "security_protocol": "SASL_PLAINTEXT",
              "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "bob", "sasl_plain_password": "bob-512"}
    producer = KafkaProducer(**common)
    for i in range(5):
        producer.send(topic, value=b"kp%d" % i).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=10_000,
                             **{**common, "sasl_mechanism": "PLAIN", "sasl_plain_username": "alice",
                                "sasl_plain_password": "alice-secret"})
    assert [m.value for _, m in zip(range(5), consumer, strict=False)] == [b"kp%d" % i for i in range(5)]
    consumer.close()


def test_aiokafka_over_sasl_ssl(broker, pki):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    topic = unique_name("sasl-aiokafka")
    create_topic(broker.bootstrap, topic)

    async def run() -> list[bytes]:
        common = {"bootstrap_servers": f"127.0.0.1:{broker.ports['SASL_SSL']}", "security_protocol": "SASL_SSL",
                  "ssl_context": create_ssl_context(cafile=str(pki["ca"])), "sasl_mechanism": "SCRAM-SHA-256",
                  "sasl_plain_username": "bob", "sasl_plain_password": "bob-256"}
        producer = AIOKafkaProducer(**common)
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait(topic, b"ak%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **common)
        await consumer.start()
        try:
            out: list[bytes] = []
            while len(out) < 5:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
                out += [m.value for messages in batch.values() for m in messages]
            return out
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [b"ak%d" % i for i in range(5)]


def test_the_exchange_seen_from_a_raw_client(broker):
    port = broker.ports["SASL_PLAINTEXT"]
    with Connection("127.0.0.1", port) as conn:
        assert conn.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == 0
        refused = conn.call(17, 1, {"mechanism": "GSSAPI"})
        assert refused.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert sorted(refused.mechanisms) == sorted(MECHANISMS.split(","))
        assert conn.call(17, 1, {"mechanism": "PLAIN"}).error_code == 0
        answer = conn.call(36, 2, {"auth_bytes": b"\0alice\0alice-secret"})
        assert answer.error_code == 0
        assert conn.call(3, 9, {"topics": [], "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False}).brokers
    with Connection("127.0.0.1", port) as conn:  # a request other than those three first: closed
        assert closed_by_broker(conn, _metadata_v0())
    with Connection("127.0.0.1", port) as conn:  # v0 handshake: bare tokens follow
        assert conn.call(17, 0, {"mechanism": "PLAIN"}).error_code == 0
        conn.send_raw(struct.pack(">i", 19) + b"\0alice\0alice-secret")
        assert conn.read_frame() == b""
        assert conn.call(3, 1, {"topics": []}).brokers
    with Connection("127.0.0.1", broker.ports["PLAINTEXT"]) as conn:  # no SASL on this listener
        assert conn.call(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.ILLEGAL_SASL_STATE


def _metadata_v0() -> bytes:
    body = struct.pack(">hhih", 3, 0, 7, -1) + struct.pack(">i", 0)
    return struct.pack(">i", len(body)) + body


def closed_by_broker(conn: Connection, data: bytes) -> bool:
    try:
        conn.send_raw(data)
        return conn.read_frame() is None
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_a_large_frame_before_authentication_closes_the_connection(broker):
    with Connection("127.0.0.1", broker.ports["SASL_PLAINTEXT"]) as conn:
        assert closed_by_broker(conn, struct.pack(">i", 10 << 20) + b"\0" * 65536)
    assert broker.proc.poll() is None


def test_scram_credentials_are_managed_with_strom_users(broker, pki):
    server = ("--bootstrap-server", broker.bootstrap)
    listed = strom("users", "list", *server)
    assert listed.returncode == 0
    assert "bob: SCRAM-SHA-256 (iterations=4096), SCRAM-SHA-512 (iterations=4096)" in listed.stdout
    missing = strom("users", "list", "nobody", *server)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert strom("users", "scram-set", "dave", "--password", "d1", "--iterations", "8192", *server).returncode == 0
    conf = librdkafka(broker, "SASL_PLAINTEXT", pki, "SCRAM-SHA-256", **{"sasl.username": "dave", "sasl.password": "d1"})
    assert len(round_trip(conf, broker.bootstrap, 1)) == 1
    gone = strom("users", "scram-delete", "dave", "--mechanism", "SCRAM-SHA-256", *server)
    assert gone.returncode == 0, gone.stderr
    again = strom("users", "scram-delete", "dave", "--mechanism", "SCRAM-SHA-256", *server)
    assert again.returncode == 1 and "does not exist" in again.stderr
    with Connection("127.0.0.1", broker.port) as conn:  # what the CLI cannot send: Kafka's checks
        results = conn.call(51, 0, {"deletions": [], "upsertions": [
            {"name": "erin", "mechanism": 1, "iterations": 100, "salt": b"s", "salted_password": b"p"},
            {"name": "frank", "mechanism": 3, "iterations": 4096, "salt": b"s", "salted_password": b"p"},
            {"name": "", "mechanism": 1, "iterations": 4096, "salt": b"s", "salted_password": b"p"}]}).results
        assert [(r.user, r.error_code) for r in results] == [
            ("erin", ErrorCode.UNACCEPTABLE_CREDENTIAL), ("frank", ErrorCode.UNSUPPORTED_SASL_MECHANISM),
            ("", ErrorCode.UNACCEPTABLE_CREDENTIAL)]


def test_sessions_expire_and_librdkafka_reauthenticates(pki):
    """connections.max.reauth.ms (KIP-368): SaslAuthenticate tells the session's lifetime; a
    client that re-authenticates keeps its connection, one that does not is cut off."""
    with BrokerProcess(overrides=sasl_overrides(pki, **{"connections.max.reauth.ms": "1500"}),
                       env={"STROM_LOG_LEVEL": "strom.network.socket_server=DEBUG"}) as b:
        port = b.ports["SASL_PLAINTEXT"]
        with Connection("127.0.0.1", port) as conn:
            conn.call(17, 1, {"mechanism": "PLAIN"})
            answer = conn.call(36, 2, {"auth_bytes": b"\0alice\0alice-secret"})
            assert answer.error_code == 0 and answer.session_lifetime_ms == 1500
            time.sleep(1.8)
            assert closed_by_broker(conn, _metadata_v0())  # expired, not renewed: closed
        topic = unique_name("reauth")
        create_topic(b.bootstrap, topic)
        producer = Producer(librdkafka(b, "SASL_PLAINTEXT", pki, "PLAIN", **{
            "sasl.username": "alice", "sasl.password": "alice-secret"}))
        for _ in range(4):
            producer.produce(topic, value=b"x")
            assert producer.flush(30) == 0
            time.sleep(1.0)
        renewed = [line for line in b.stderr_lines if re.search(r"authenticated as User:alice with PLAIN", line)]
        peers = [line.split(" authenticated as")[0].rsplit(" ", 1)[1] for line in renewed]
        assert any(peers.count(p) >= 2 for p in peers), renewed  # one connection, several sessions


def _handshaken(port: int, source: str = "127.0.0.1", mechanism: str = "PLAIN") -> socket.socket:
    """A connection from `source` that has sent ApiVersions and SaslHandshake v1 and read the
    answers: the next frame is evaluated as a credential."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    for api_key, version, fields in ((18, 0, {}), (17, 1, {"mechanism": mechanism})):
        sock.sendall(encode_request(api_key, version, fields))
        (size,) = struct.unpack(">i", _read_exactly(sock, 4))
        _read_exactly(sock, size)
    return sock


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _authenticate(sock: socket.socket, token: bytes) -> int:
    """SaslAuthenticate v2 with `token`: the answer's error code."""
    sock.sendall(encode_request(36, 2, {"auth_bytes": token}, correlation_id=9))
    (size,) = struct.unpack(">i", _read_exactly(sock, 4))
    payload = _read_exactly(sock, size)
    return decode_response(36, 2, payload)[1].error_code


def test_password_guesses_are_bounded_per_user_and_address_and_never_lock_out(pki):
    """100 connections opened first, then used together to guess alice's password: five
    guesses are evaluated per window (5 s here), the rest wait their turn. Other users, and alice from
    another address, are answered at once, and a correct password is never refused."""
    import selectors

    limits = {"connection.failed.authentication.delay.ms": "0",
              "sasl.server.failed.authentication.limit": "5",
              "sasl.server.failed.authentication.window.ms": "5000"}
    with BrokerProcess(overrides=sasl_overrides(pki, **limits)) as b:
        port = b.ports["SASL_PLAINTEXT"]
        guessers = [_handshaken(port) for _ in range(100)]
        for i, sock in enumerate(guessers):
            sock.sendall(encode_request(36, 2, {"auth_bytes": b"\0alice\0guess-%d" % i}))
        answered = []
        with selectors.DefaultSelector() as sel:
            for sock in guessers:
                sel.register(sock, selectors.EVENT_READ)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                for key, _ in sel.select(0.2):
                    sel.unregister(key.fileobj)
                    answered.append(key.fileobj)
        assert len(answered) == 5  # one window's worth of guesses, whatever the connections
        # Not locked out: admin from the same address, alice from another one, right away.
        for source, user, password in (("127.0.0.1", b"admin", b"admin-secret"),
                                       ("127.0.0.2", b"alice", b"alice-secret")):
            with _handshaken(port, source) as sock:
                started = time.monotonic()
                assert _authenticate(sock, b"\0" + user + b"\0" + password) == 0
                assert time.monotonic() - started < 2
        # From the guessers' address alice's correct password waits its turn, and succeeds:
        # here once the other guessers have gone and the window has passed.
        for sock in guessers:
            sock.close()
        with _handshaken(port) as sock:
            assert _authenticate(sock, b"\0alice\0alice-secret") == 0
        with Connection("127.0.0.1", b.port) as conn:  # other listeners are not affected
            assert conn.call(3, 1, {"topics": []}).brokers
        assert b.proc.poll() is None


def test_malformed_exchanges_are_failures_like_any_other(broker):
    """A SCRAM channel binding that is not base64, OAUTHBEARER tokens whose exp is Infinity or
    1e400: each is answered SASL_AUTHENTICATION_FAILED (after the failure delay), not a
    connection dropped by an exception; a far but finite exp is a session capped to int64."""
    port = broker.ports["SASL_PLAINTEXT"]
    with _handshaken(port, mechanism="SCRAM-SHA-256") as sock:
        sock.sendall(encode_request(36, 2, {"auth_bytes": b"n,,n=bob,r=abcdef"}, correlation_id=9))
        (size,) = struct.unpack(">i", _read_exactly(sock, 4))
        first = decode_response(36, 2, _read_exactly(sock, size))[1].auth_bytes.decode()
        nonce = first.split(",")[0][2:]
        assert _authenticate(sock, f"c=not*base64!,r={nonce},p=AAAA".encode()) == ErrorCode.SASL_AUTHENTICATION_FAILED

    def token(exp: str) -> bytes:
        """An unsecured JWS whose exp is `exp` as written (JSON numbers Python reads as floats)."""
        import base64

        def part(text: str) -> str:
            return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
        claims = '{"sub": "carol", "exp": ' + exp + "}"
        jws = f"{part(json.dumps({'alg': 'none'}))}.{part(claims)}."
        return b"n,,\x01auth=Bearer " + jws.encode() + b"\x01\x01"

    for exp in ("Infinity", "1e400", "NaN"):
        with _handshaken(port, mechanism="OAUTHBEARER") as sock:
            sock.sendall(encode_request(36, 2, {"auth_bytes": token(exp)}, correlation_id=9))
            (size,) = struct.unpack(">i", _read_exactly(sock, 4))
            challenge = decode_response(36, 2, _read_exactly(sock, size))[1]
            assert challenge.error_code == 0 and b"invalid_token" in challenge.auth_bytes, exp
            assert _authenticate(sock, b"\x01") == ErrorCode.SASL_AUTHENTICATION_FAILED, exp
    with _handshaken(port, mechanism="OAUTHBEARER") as sock:
        sock.sendall(encode_request(36, 2, {"auth_bytes": token("1" + "0" * 30)}, correlation_id=9))
        (size,) = struct.unpack(">i", _read_exactly(sock, 4))
        answer = decode_response(36, 2, _read_exactly(sock, size))[1]
        assert answer.error_code == 0 and answer.session_lifetime_ms == 2**63 - 1
    assert not [line for line in broker.stderr_lines if "request failed with" in line]


def test_unknown_users_get_a_salt_as_stable_as_known_ones(broker):
    """The salt in SCRAM's server-first message: the same on every attempt, for a user that
    exists and for one that does not, so it does not tell them apart."""
    def salt(user: str) -> str:
        with _handshaken(broker.ports["SASL_PLAINTEXT"], mechanism="SCRAM-SHA-256") as sock:
            sock.sendall(encode_request(36, 2, {"auth_bytes": f"n,,n={user},r=abc".encode()}, correlation_id=9))
            (size,) = struct.unpack(">i", _read_exactly(sock, 4))
            first = decode_response(36, 2, _read_exactly(sock, size))[1].auth_bytes.decode()
        return dict(part.split("=", 1) for part in first.split(","))["s"]

    assert salt("bob") == salt("bob")
    assert salt("nobody") == salt("nobody") != salt("someone-else")


@pytest.mark.parametrize(("overrides", "message"), [
    ({"sasl.enabled.mechanisms": "GSSAPI"}, "names mechanisms Strom does not support (GSSAPI)"),
    ({"listener.name.sasl_plaintext.plain.sasl.jaas.config": ""}, "PLAIN needs listener.name.sasl_plaintext"),
    ({"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": ""},
     "OAUTHBEARER needs listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config"),
    ({"listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS[:-1]}, "must end with ';'"),
    ({"listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS.replace('"alice-secret"', '"alice-secret')},
     "a quote that does not close"),
])
def test_bad_sasl_settings_stop_the_start_with_one_line(pki, overrides, message):
    base = sasl_overrides(pki)
    base.update(overrides)
    base = {k: v for k, v in base.items() if v != ""}
    broker = BrokerProcess(overrides=base)
    with pytest.raises(RuntimeError, match="did not become ready"):
        broker.start(timeout=20)
    broker.close()
    assert any(message in line for line in broker.stderr_lines), broker.stderr_lines[-5:]


def test_a_bad_jaas_line_names_the_option_never_its_secret(pki):
    """The start-up error of a JAAS line cut short names what is wrong and the option, not the
    value: the value is a password, and the error goes to logs and terminals."""
    base = sasl_overrides(pki)
    base["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = PLAIN_JAAS.replace('"alice-secret"',
                                                                                     '"alice-secret')
    broker = BrokerProcess(overrides=base)
    with pytest.raises(RuntimeError, match="did not become ready"):
        broker.start(timeout=20)
    broker.close()
    errors = [line for line in broker.stderr_lines if "does not close" in line]
    assert errors and all("'user_alice'" in line for line in errors), broker.stderr_lines[-5:]
    assert not any("alice-secret" in line for line in broker.stderr_lines)


@pytest.mark.parametrize("line", [
    'M required user_alice="alice-secret;',  # the quote does not close
    'M required user_alice=alice secret;',  # a bare value cut at its space
    'M required user_alice="alice" "secret";',  # a value after a value
])
def test_jaas_errors_do_not_echo_values(line):
    with pytest.raises(ValueError) as raised:
        parse_jaas(line)
    assert "user_alice" in str(raised.value) and "secret" not in str(raised.value).replace("user_alice", "")
