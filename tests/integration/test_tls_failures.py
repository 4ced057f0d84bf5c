"""TLS handshakes that must fail, with real clients against a real broker: a client trusting
another CA than the one that signed the broker's certificate, a broker certificate that has
expired, and (ssl.client.auth=required) client certificates signed by a CA the broker does not
trust or expired. Each client (confluent-kafka, kafka-python, aiokafka) must fail with the error
that names the cause where it can see it, the broker must never accept the connection (its
`strom_connections_created` counter does not move), and afterwards the broker is still running,
still serves a TLS client with a good certificate, and has logged no traceback. Every case runs
on both event loops the broker can use (uvloop, asyncio), whose TLS layers fail handshakes on
different code.

Certificates: `make_pki` makes the stranger (another CA, with a server and a client certificate
of its own); the broker's CA is made here with trustme, because the expired certificates must be
signed by the CA the other side trusts (only expiry is wrong with them).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import ssl
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import KafkaError, Producer
from cryptography import x509

from strom.testing import (
    BrokerProcess,
    consume_all,
    create_topic,
    make_pki,
    produce_acked,
    scrape,
    unique_name,
    wait_for,
)

ATTEMPT_SECONDS = 10  # what each client gets to report its failure


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    """The broker's CA with a good and an expired server certificate and a good and an expired
    client certificate; the stranger's CA and client certificate (from make_pki)."""
    directory = tmp_path_factory.mktemp("tls-failures")
    (directory / "stranger").mkdir()
    stranger = make_pki(directory / "stranger")
    now = datetime.datetime.now(datetime.UTC)
    expired = {"not_before": now - datetime.timedelta(days=30), "not_after": now - datetime.timedelta(days=1)}
    ca = trustme.CA(organization_name="Strom tests")
    files = {name: directory / f"{name}.pem" for name in (
        "ca", "server", "expired_server", "client_cert", "client_key", "expired_client_cert", "expired_client_key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(files["server"]))
    ca.issue_cert("127.0.0.1", "localhost", **expired).private_key_and_cert_chain_pem.write_to_path(
        str(files["expired_server"]))
    for prefix, name, validity in (("", "alice", {}), ("expired_", "eve", expired)):
        cert = ca.issue_cert(f"{name}.example.com", common_name=name, organization_name="Acme", **validity)
        cert.private_key_pem.write_to_path(str(files[f"{prefix}client_key"]))
        cert.cert_chain_pems[0].write_to_path(str(files[f"{prefix}client_cert"]))
    files |= {"stranger_ca": stranger["ca"], "stranger_client_cert": stranger["client_cert"],
              "stranger_client_key": stranger["client_key"]}
    # Only the validity of the expired ones is wrong: they are past their notAfter, the others not.
    for name, past in (("expired_server", True), ("expired_client_cert", True), ("server", False),
                       ("client_cert", False)):
        cert = x509.load_pem_x509_certificates(files[name].read_bytes())[0]
        assert (cert.not_valid_after_utc < now) is past, name
    return files


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def broker(request, certs):
    """PLAINTEXT (for admin), SSL (the good certificate, ssl.client.auth=required) and EXPIRED
    (an SSL listener showing the expired certificate, no client authentication)."""
    overrides = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,EXPIRED://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,EXPIRED:SSL",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(certs["server"]),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(certs["ca"]),
        "ssl.client.auth": "required",
        "listener.name.expired.ssl.keystore.location": str(certs["expired_server"]),
        "listener.name.expired.ssl.client.auth": "none",
        "metrics.port": "0",
    }
    with BrokerProcess(overrides=overrides, env={"STROM_EVENT_LOOP": request.param}) as b:
        assert_still_serving(b, certs)  # and the SSL listener's counters exist from here on
        yield b


# --- what is checked after every refusal -----------------------------------------------------

def good_tls(certs: dict[str, Path]) -> dict[str, str]:
    return {"security.protocol": "SSL", "ssl.ca.location": str(certs["ca"]),
            "ssl.certificate.location": str(certs["client_cert"]), "ssl.key.location": str(certs["client_key"])}


def assert_still_serving(broker: BrokerProcess, certs: dict[str, Path]) -> None:
    """Alive, a record round-trips over SSL with the good client certificate, no traceback (nor
    asyncio's reports of failed callbacks or transports) in the broker's log."""
    assert broker.proc.poll() is None, "the broker exited"
    topic = unique_name("tls-after")
    create_topic(broker.bootstrap, topic)
    bootstrap = f"127.0.0.1:{broker.ports['SSL']}"
    value = uuid.uuid4().bytes
    assert produce_acked(bootstrap, topic, [value], **good_tls(certs)) == [0]
    assert [m.value() for m in consume_all(bootstrap, topic, count=1, **good_tls(certs))] == [value]
    log = broker.log_text()
    for bad in ("Traceback", "Exception in callback", "Fatal error", " ERROR "):
        assert bad not in log, f"{bad!r} in the broker's log:\n{log[-3000:]}"


def accepted(broker: BrokerProcess, listener: str) -> float:
    """Connections the listener has accepted (handshake done) since the broker started."""
    return scrape(broker.metrics_url).get(("strom_connections_created_total", frozenset({("listener", listener)})), 0.0)


def open_fds(broker: BrokerProcess) -> int:
    return len(os.listdir(f"/proc/{broker.proc.pid}/fd"))


# --- one connection attempt per client library ------------------------------------------------

class Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def librdkafka_attempt(port: int, conf: dict[str, str]) -> tuple[list[KafkaError], list[str]]:
    """A producer sends one record; returns the errors its error callback got and librdkafka's
    log lines, once there is an error (fails the test if none comes in ATTEMPT_SECONDS) or
    the record is acknowledged (which fails the caller's assertions)."""
    logger = logging.getLogger(unique_name("rdkafka"))
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = Collected()
    logger.addHandler(handler)
    errors: list[KafkaError] = []
    delivered: list[Any] = []
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "error_cb": errors.append,
                         "logger": logger, "message.timeout.ms": ATTEMPT_SECONDS * 1000, **conf})
    producer.produce(unique_name("refused"), b"refused", on_delivery=lambda err, _m: delivered.append(err))
    wait_for(lambda: (producer.poll(0.1), errors or delivered)[1], timeout=ATTEMPT_SECONDS,
             what="librdkafka to report the connection's failure")
    producer.purge()
    producer.flush(1)
    # (`None in delivered` would compare KafkaErrors with None, which they cannot take.)
    assert all(err is not None for err in delivered), "the record was acknowledged"
    return errors, handler.lines


def kafka_python_attempt(port: int, cafile: Path, certfile: Path | None, keyfile: Path | None,
                         caplog: pytest.LogCaptureFixture) -> str:
    """A KafkaProducer that must fail to bootstrap within its bootstrap timeout; what
    kafka-python logged while trying."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KafkaPythonError

    caplog.clear()
    producer = None
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="kafka"), pytest.raises(KafkaPythonError):
        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", security_protocol="SSL",
                                 ssl_cafile=str(cafile), ssl_certfile=certfile and str(certfile),
                                 ssl_keyfile=keyfile and str(keyfile), bootstrap_timeout_ms=3000,
                                 request_timeout_ms=3000, max_block_ms=3000)
        producer.send(unique_name("refused"), b"refused").get(timeout=5)
    if producer is not None:
        producer.close(timeout=1)
    assert time.monotonic() - started < ATTEMPT_SECONDS
    return caplog.text


def aiokafka_attempt(port: int, cafile: Path, certfile: Path | None, keyfile: Path | None,
                     caplog: pytest.LogCaptureFixture) -> str:
    """An AIOKafkaProducer whose start() must fail; what aiokafka logged while trying."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError
    from aiokafka.helpers import create_ssl_context

    async def attempt() -> None:
        context = create_ssl_context(cafile=str(cafile), certfile=certfile and str(certfile),
                                     keyfile=keyfile and str(keyfile))
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", security_protocol="SSL",
                                    ssl_context=context, request_timeout_ms=5000)
        try:
            await asyncio.wait_for(producer.start(), ATTEMPT_SECONDS)
            await asyncio.wait_for(producer.send_and_wait(unique_name("refused"), b"refused"), ATTEMPT_SECONDS)
        finally:
            await producer.stop()

    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        asyncio.run(attempt())
    return caplog.text


# --- (1) the client trusts another CA; (2) the broker's certificate has expired ---------------

SERVER_CASES = {
    # listener, the CA file the client trusts, what Python's ssl says of the broker's certificate
    "another-ca": ("SSL", "stranger_ca", "self-signed certificate in certificate chain"),
    "expired-broker-certificate": ("EXPIRED", "ca", "certificate has expired"),
}


@pytest.mark.parametrize("case", SERVER_CASES)
def test_librdkafka_refuses_the_brokers_certificate(broker, certs, case):
    listener, trusted, _ = SERVER_CASES[case]
    before = accepted(broker, listener)
    errors, _ = librdkafka_attempt(broker.ports[listener], {**good_tls(certs), "ssl.ca.location": str(certs[trusted])})
    # _SSL or _TRANSPORT (librdkafka's choice varies), from the handshake. librdkafka says the
    # same for both causes; the good listener, with the same CA file in the expired case, is
    # what shows the certificate alone is at fault.
    assert any(e.code() in (KafkaError._SSL, KafkaError._TRANSPORT) and "certificate verify failed" in e.str()
               and ("SSL handshake failed" in e.str() or "state SSL_HANDSHAKE" in e.str()) for e in errors), errors
    assert accepted(broker, listener) == before
    assert_still_serving(broker, certs)


@pytest.mark.parametrize("case", SERVER_CASES)
def test_kafka_python_refuses_the_brokers_certificate(broker, certs, caplog, case):
    listener, trusted, reason = SERVER_CASES[case]
    before = accepted(broker, listener)
    logged = kafka_python_attempt(broker.ports[listener], certs[trusted], certs["client_cert"], certs["client_key"],
                                  caplog)
    assert "CERTIFICATE_VERIFY_FAILED" in logged and reason in logged, logged[-2000:]
    assert accepted(broker, listener) == before
    assert_still_serving(broker, certs)


@pytest.mark.parametrize("case", SERVER_CASES)
def test_aiokafka_refuses_the_brokers_certificate(broker, certs, caplog, case):
    listener, trusted, reason = SERVER_CASES[case]
    before = accepted(broker, listener)
    logged = aiokafka_attempt(broker.ports[listener], certs[trusted], certs["client_cert"], certs["client_key"],
                              caplog)
    assert "CERTIFICATE_VERIFY_FAILED" in logged and reason in logged, logged[-2000:]
    assert accepted(broker, listener) == before
    assert_still_serving(broker, certs)


# --- (3) ssl.client.auth=required: client certificates the broker must refuse ----------------

CLIENT_CASES = {"unknown-ca": "stranger_client", "expired": "expired_client"}


@pytest.mark.parametrize("case", CLIENT_CASES)
def test_broker_refuses_the_client_certificate_librdkafka(broker, certs, case):
    prefix = CLIENT_CASES[case]
    before = accepted(broker, "SSL")
    errors, logged = librdkafka_attempt(broker.ports["SSL"], {
        **good_tls(certs), "ssl.certificate.location": str(certs[f"{prefix}_cert"]),
        "ssl.key.location": str(certs[f"{prefix}_key"])})
    assert {e.code() for e in errors} <= {KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}, errors
    # TLS 1.3: the client's side of the handshake ends before the broker has checked its
    # certificate; the broker's refusal is the connection closing under the first request.
    failures = [line for line in logged if "FAIL" in line or "Disconnected" in line]
    assert any(("closed by peer" in line or "reset by peer" in line or "SSL handshake failed" in line)
               for line in failures), logged[-20:]
    assert accepted(broker, "SSL") == before
    assert_still_serving(broker, certs)


@pytest.mark.parametrize("case", CLIENT_CASES)
def test_broker_refuses_the_client_certificate_kafka_python(broker, certs, caplog, case):
    prefix = CLIENT_CASES[case]
    before = accepted(broker, "SSL")
    logged = kafka_python_attempt(broker.ports["SSL"], certs["ca"], certs[f"{prefix}_cert"], certs[f"{prefix}_key"],
                                  caplog)
    assert "CERTIFICATE_VERIFY_FAILED" not in logged  # the client trusted the broker: the broker refused
    assert "disconnected" in logged or "EOF" in logged, logged[-2000:]
    assert accepted(broker, "SSL") == before
    assert_still_serving(broker, certs)


@pytest.mark.parametrize("case", CLIENT_CASES)
def test_broker_refuses_the_client_certificate_aiokafka(broker, certs, caplog, case):
    prefix = CLIENT_CASES[case]
    before = accepted(broker, "SSL")
    logged = aiokafka_attempt(broker.ports["SSL"], certs["ca"], certs[f"{prefix}_cert"], certs[f"{prefix}_key"], caplog)
    assert "CERTIFICATE_VERIFY_FAILED" not in logged
    assert "closed" in logged or "EOF" in logged, logged[-2000:]
    assert accepted(broker, "SSL") == before
    assert_still_serving(broker, certs)


# --- many refusals: nothing is left behind -----------------------------------------------------

def refused_handshake(port: int, context: ssl.SSLContext) -> str:
    """One TLS connection the broker must refuse: how it ended for the client. TLS 1.2 fails in
    the handshake; under TLS 1.3 the handshake completes on the client's side and the first read
    finds the connection closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"\x00\x00\x00\x04ping")
                return "closed" if tls.recv(100) == b"" else "answered"
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
            return type(e).__name__


def client_context(certs: dict[str, Path], prefix: str | None, version: ssl.TLSVersion) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs["ca"]))
    context.maximum_version = version
    if prefix is not None:
        context.load_cert_chain(str(certs[f"{prefix}_cert"]), str(certs[f"{prefix}_key"]))
    return context


def test_refused_handshakes_leave_no_connection_behind(broker, certs):
    """Refused client certificates (and none at all) over TLS 1.2 and 1.3, and connections that
    never start their handshake (closed by the broker after its 10 s handshake timeout): every
    socket is closed, none counted as accepted."""
    port = broker.ports["SSL"]
    baseline, before = open_fds(broker), accepted(broker, "SSL")
    stalled = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(10)]
    outcomes: dict[str, set[str]] = {}
    for prefix in ("stranger_client", "expired_client", None):
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            context = client_context(certs, prefix, version)
            outcomes[f"{prefix} {version.name}"] = {refused_handshake(port, context) for _ in range(15)}
    assert all("answered" not in ends for ends in outcomes.values()), outcomes
    assert all(outcomes[f"{p} TLSv1_3"] == {"closed"} for p in ("stranger_client", "expired_client", None)), outcomes
    assert all(ends and "closed" not in ends for name, ends in outcomes.items() if name.endswith("TLSv1_2")), outcomes
    assert accepted(broker, "SSL") == before
    for sock in stalled:  # the broker drops them after its handshake timeout
        sock.settimeout(20)
        try:
            assert sock.recv(1) == b""
        except ConnectionResetError:
            pass
        sock.close()
    wait_for(lambda: open_fds(broker) <= baseline, timeout=10,
             what=f"the broker's open files back to {baseline} (now {open_fds(broker)})")
    assert accepted(broker, "SSL") == before
    assert_still_serving(broker, certs)
