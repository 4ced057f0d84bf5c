"""SSL listeners with real clients: certificates made by the test (`pki` in conftest: a CA,
the broker's certificate for 127.0.0.1, a client certificate), records through confluent-kafka,
kafka-python and aiokafka, fetches large enough to go through the copied-region path, client
authentication and the principal it gives, and what the broker does with clients that do not
speak TLS."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import subprocess

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from strom.testing import BrokerProcess, create_topic, unique_name, wait_for

VALUE = bytes(range(256)) * 200  # 51,200 bytes: fetch regions over 32 KiB are copied chunks


def ssl_overrides(pki, **extra: str) -> dict[str, str]:
    return {"listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki["server"]),
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki["ca"]), **extra}


@pytest.fixture(scope="module")
def broker(pki):
    overrides = ssl_overrides(pki, **{"ssl.client.auth": "requested", "group.initial.rebalance.delay.ms": "0",
                                      "ssl.key.password": "not-for-your-eyes"})
    with BrokerProcess(overrides=overrides) as b:
        yield b


def tls_bootstrap(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.ports['SSL']}"


def librdkafka_tls(pki, with_cert: bool = True) -> dict[str, str]:
    conf = {"security.protocol": "SSL", "ssl.ca.location": str(pki["ca"])}
    if with_cert:
        conf |= {"ssl.certificate.location": str(pki["client_cert"]), "ssl.key.location": str(pki["client_key"])}
    return conf


def test_confluent_kafka_over_tls(broker, pki):
    topic = unique_name("tls-confluent")
    create_topic(broker.bootstrap, topic)
    producer = Producer({"bootstrap.servers": tls_bootstrap(broker), **librdkafka_tls(pki)})
    for i in range(40):
        producer.produce(topic, key=str(i).encode(), value=VALUE)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": tls_bootstrap(broker), "group.id": unique_name("g"),
                         "auto.offset.reset": "earliest", **librdkafka_tls(pki)})
    consumer.subscribe([topic])
    got = []
    wait_for(lambda: got.extend(m for m in consumer.consume(40, 0.5) if not m.error()) or len(got) >= 40,
             timeout=30, what="40 records over TLS")
    consumer.close()
    assert [m.key() for m in got] == [str(i).encode() for i in range(40)]
    assert all(m.value() == VALUE for m in got)


def test_kafka_python_over_tls(broker, pki):
    from kafka import KafkaConsumer, KafkaProducer

    topic = unique_name("tls-kafka-python")
    create_topic(broker.bootstrap, topic)
    tls = {"security_protocol": "SSL", "ssl_cafile": str(pki["ca"]), "ssl_certfile": str(pki["client_cert"]),
           "ssl_keyfile": str(pki["client_key"])}
    producer = KafkaProducer(bootstrap_servers=tls_bootstrap(broker), **tls)
    for i in range(20):
        producer.send(topic, value=VALUE + bytes([i])).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=tls_bootstrap(broker), auto_offset_reset="earliest",
                             consumer_timeout_ms=10_000, **tls)
    values = [m.value for _, m in zip(range(20), consumer, strict=False)]
    consumer.close()
    assert values == [VALUE + bytes([i]) for i in range(20)]


def test_aiokafka_over_tls(broker, pki):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    topic = unique_name("tls-aiokafka")
    create_topic(broker.bootstrap, topic)

    async def run() -> list[bytes]:
        context = create_ssl_context(cafile=str(pki["ca"]), certfile=str(pki["client_cert"]),
                                     keyfile=str(pki["client_key"]))
        common = {"bootstrap_servers": tls_bootstrap(broker), "security_protocol": "SSL", "ssl_context": context}
        producer = AIOKafkaProducer(**common)
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait(topic, VALUE + bytes([i]))
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **common)
        await consumer.start()
        try:
            out = []
            while len(out) < 20:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
                out += [m.value for messages in batch.values() for m in messages]
            return out
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [VALUE + bytes([i]) for i in range(20)]


def test_the_client_certificate_names_the_principal(pki):
    """ssl.client.auth=required: a client without a certificate is turned away, one with a
    certificate is served as User:<its subject>, as Kafka names it."""
    overrides = ssl_overrides(pki, **{"ssl.client.auth": "required"})
    with BrokerProcess(overrides=overrides, env={"STROM_LOG_LEVEL": "strom.request=DEBUG"}) as b:
        topic = unique_name("tls-required")
        create_topic(b.bootstrap, topic)
        anonymous = Producer({"bootstrap.servers": tls_bootstrap(b), "message.timeout.ms": 3000,
                              **librdkafka_tls(pki, with_cert=False)})
        failures = []
        anonymous.produce(topic, value=b"x", on_delivery=lambda err, _m: failures.append(err))
        anonymous.flush(10)
        assert failures and failures[0] is not None
        producer = Producer({"bootstrap.servers": tls_bootstrap(b), **librdkafka_tls(pki)})
        producer.produce(topic, value=b"signed")
        assert producer.flush(30) == 0
        # RFC 2253 order, most specific first (trustme adds an OU of its own, ending in
        # URL-safe base64: letters, digits, '-' and '_').
        principal = re.compile(r"Produce v\d+ .*\(SSL, User:CN=alice,OU=Testing cert #[\w-]+,O=Acme\)")
        wait_for(lambda: any(principal.search(line) for line in b.stderr_lines),
                 timeout=10, what="a Produce logged with the certificate's principal")


def test_inline_pem_stores(pki):
    """ssl.keystore.certificate.chain / ssl.keystore.key / ssl.truststore.certificates instead
    of files, given per listener (listener.name.ssl.*) as Kafka allows."""
    overrides = {"listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                 "listener.name.ssl.ssl.keystore.type": "PEM",
                 "listener.name.ssl.ssl.keystore.certificate.chain": pki["server_chain_text"].replace("\n", "\\n"),
                 "listener.name.ssl.ssl.keystore.key": pki["server_key_text"].replace("\n", "\\n"),
                 "listener.name.ssl.ssl.truststore.type": "PEM",
                 "listener.name.ssl.ssl.truststore.certificates": pki["ca_text"].replace("\n", "\\n")}
    with BrokerProcess(overrides=overrides) as b:
        topic = unique_name("tls-inline")
        create_topic(b.bootstrap, topic)
        producer = Producer({"bootstrap.servers": tls_bootstrap(b), **librdkafka_tls(pki)})
        producer.produce(topic, value=b"inline")
        assert producer.flush(30) == 0
        assert not any("ignored" in line for line in b.stderr_lines)


def test_plaintext_bytes_on_the_tls_port_do_not_disturb_the_broker(broker, pki):
    api_versions_v0 = struct.pack(">ihhih", 10, 18, 0, 1, -1)
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", broker.ports["SSL"]), timeout=5) as s:
            s.sendall(api_versions_v0 + b"\x00" * 300)
            try:
                assert s.recv(100) == b""  # the handshake fails: closed without an answer
            except ConnectionResetError:
                pass
    test_confluent_kafka_over_tls(broker, pki)  # still serving TLS clients
    assert broker.proc.poll() is None


def test_describe_configs_hides_passwords(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.BROKER, "0")
    configs = admin.describe_configs([resource])[resource].result(30)
    password = configs["ssl.key.password"]
    assert password.is_sensitive and password.value is None
    assert configs["ssl.keystore.type"].value == "PEM" and not configs["ssl.keystore.type"].is_sensitive
    assert "not-for-your-eyes" not in "\n".join(broker.stderr_lines)


def test_old_protocols_in_ssl_enabled_protocols_are_dropped_with_one_warning(pki):
    """`ssl.enabled.protocols=TLSv1.2,TLSv1.1,TLSv1`, as many real configs say: the broker
    starts, offers TLSv1.2 only, and says once that it does not offer the others."""
    import ssl

    overrides = ssl_overrides(pki, **{"ssl.enabled.protocols": "TLSv1.2,TLSv1.1,TLSv1"})
    with BrokerProcess(overrides=overrides) as broker:
        warnings = [line for line in broker.stderr_lines if "ssl.enabled.protocols" in line]
        assert len(warnings) == 1 and "TLSv1.1, TLSv1" in warnings[0] and "TLSv1.2 only" in warnings[0]
        topic = unique_name("tls-old-protocols")
        create_topic(broker.bootstrap, topic)
        producer = Producer({"bootstrap.servers": tls_bootstrap(broker), **librdkafka_tls(pki)})
        producer.produce(topic, b"over TLSv1.2")
        assert producer.flush(30) == 0
        context = ssl.create_default_context(cafile=str(pki["ca"]))
        with socket.create_connection(("127.0.0.1", broker.ports["SSL"])) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.version() == "TLSv1.2"  # TLSv1.3 was not enabled
        context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_1
        with socket.create_connection(("127.0.0.1", broker.ports["SSL"])) as raw:
            with pytest.raises(ssl.SSLError):
                context.wrap_socket(raw, server_hostname="127.0.0.1")
        broker.stop()
        broker.start()  # and again after a restart, with the same single warning
        assert len([line for line in broker.stderr_lines if "ssl.enabled.protocols" in line]) == 2


@pytest.mark.parametrize(("overrides", "message"), [
    ({"ssl.keystore.type": "BCFKS", "ssl.keystore.location": "/nonexistent"}, "ssl.keystore.type=BCFKS is not supported"),
    ({"ssl.keystore.type": "JKS", "ssl.keystore.location": "/nonexistent.jks"}, "cannot load its certificate and key"),
    ({"ssl.keystore.location": ""}, "has no certificate"),
    ({"ssl.client.auth": "required"}, "needs a truststore"),
    ({"ssl.enabled.protocols": "TLSv1.1"}, "ssl.enabled.protocols"),
    ({"ssl.enabled.protocols": "TLSv1.2,TLSv1.4"}, "not TLSv1.4"),
])
def test_bad_tls_settings_stop_the_start_with_one_line(pki, overrides, message):
    base = {"listeners": "SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki["server"])}
    broker = BrokerProcess(overrides={**base, **overrides})
    with pytest.raises(RuntimeError, match="did not become ready"):
        broker.start(timeout=20)
    broker.close()
    assert any(message in line for line in broker.stderr_lines), broker.stderr_lines[-5:]



# --- Kafka's store types, made by Java's keytool as operators make them ----------------------------

def keytool(*args: str) -> None:
    done = subprocess.run(["keytool", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def java_stores(pki, tmp_path_factory):
    """The broker's key in a PKCS12 keystore and a JKS one (its key under a password of its own),
    the CA in a JKS and a PKCS12 truststore."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    d = tmp_path_factory.mktemp("stores")
    pem = pki["server"].read_bytes()
    key = serialization.load_pem_private_key(pem, password=None)
    cert, *chain = x509.load_pem_x509_certificates(pem)
    (d / "server.p12").write_bytes(pkcs12.serialize_key_and_certificates(
        b"broker", key, cert, chain, serialization.BestAvailableEncryption(b"p12-secret")))
    keytool("-importkeystore", "-noprompt", "-srckeystore", str(d / "server.p12"), "-srcstoretype", "PKCS12",
            "-srcstorepass", "p12-secret", "-destkeystore", str(d / "server.jks"), "-deststoretype", "JKS",
            "-deststorepass", "jks-secret", "-destkeypass", "key-secret")
    for kind, name in (("JKS", "ca.jks"), ("PKCS12", "ca.p12")):
        keytool("-importcert", "-noprompt", "-alias", "ca", "-file", str(pki["ca"]), "-keystore", str(d / name),
                "-storetype", kind, "-storepass", "trust-secret")
    return d


@pytest.mark.parametrize("keystore, truststore", [("JKS", "PKCS12"), ("PKCS12", "JKS")])
def test_java_keystores_and_truststores(pki, java_stores, keystore, truststore):
    """A broker configured as Kafka's are, with keytool's stores and their passwords, serves TLS
    with client authentication: a client with a certificate from the CA in the truststore gets in."""
    keys = {"JKS": {"ssl.keystore.location": str(java_stores / "server.jks"), "ssl.keystore.password": "jks-secret",
                    "ssl.key.password": "key-secret"},
            "PKCS12": {"ssl.keystore.location": str(java_stores / "server.p12"), "ssl.keystore.password": "p12-secret"}}
    trust = {"JKS": "ca.jks", "PKCS12": "ca.p12"}
    overrides = {"listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0", "ssl.client.auth": "required",
                 "ssl.keystore.type": keystore, **keys[keystore], "ssl.truststore.type": truststore,
                 "ssl.truststore.location": str(java_stores / trust[truststore]), "ssl.truststore.password": "trust-secret"}
    with BrokerProcess(overrides=overrides) as broker:
        topic = unique_name("java-stores")
        create_topic(broker.bootstrap, topic)
        producer = Producer({"bootstrap.servers": tls_bootstrap(broker), **librdkafka_tls(pki)})
        producer.produce(topic, value=b"over tls")
        assert producer.flush(30) == 0
        refused = Producer({"bootstrap.servers": tls_bootstrap(broker), "message.timeout.ms": 3000,
                            **librdkafka_tls(pki, with_cert=False)})
        reports = []
        refused.produce(topic, value=b"no certificate", on_delivery=lambda err, _msg: reports.append(err))
        refused.flush(10)
        assert len(reports) == 1 and reports[0] is not None  # client authentication is required


@pytest.mark.parametrize("overrides, message", [
    ({"ssl.keystore.type": "JKS", "ssl.keystore.password": "wrong", "ssl.key.password": "key-secret"},
     "password is wrong"),
    ({"ssl.keystore.type": "JKS", "ssl.keystore.password": "jks-secret", "ssl.key.password": "wrong"},
     "key's password is wrong"),
    ({"ssl.keystore.type": "PKCS12", "ssl.keystore.password": "jks-secret"}, "not a PKCS12 store"),
])
def test_a_store_that_cannot_be_read_is_one_line(java_stores, overrides, message):
    broker = BrokerProcess(overrides={"listeners": "SSL://127.0.0.1:0",
                                      "ssl.keystore.location": str(java_stores / "server.jks"), **overrides})
    with pytest.raises(RuntimeError, match="did not become ready"):
        broker.start(timeout=20)
    broker.close()
    assert any(message in line for line in broker.stderr_lines), broker.stderr_lines[-5:]
    assert not any("Traceback" in line for line in broker.stderr_lines)


def test_a_weak_signature_is_explained():
    import ssl as ssl_module

    from strom.security.tls import _explained

    text = _explained(ssl_module.SSLError(1, "[SSL: CA_MD_TOO_WEAK] ca md too weak"))
    assert "SHA-256" in text and "keytool -sigalg SHA256withRSA" in text
