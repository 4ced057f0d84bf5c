"""The schema registry on one real broker process: confluent-kafka's SchemaRegistryClient and its
Avro serializer unchanged against it, Confluent's error bodies for bad input (the broker keeps
serving), references (missing, too deep, a cycle in records another registry wrote), and a
restart that keeps everything and goes on with new ids."""

from __future__ import annotations

import base64
import json
import socket
import time

import pytest
import requests
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import (
    Schema,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from strom.schemas.parsed import MAX_DEPTH
from strom.testing import BrokerProcess, closing, create_topic, free_ports, unique_name, wait_for

CT = {"Content-Type": "application/vnd.schemaregistry.v1+json"}


def avro(name: str, *fields: tuple[str, object], default: dict | None = None) -> str:
    out = []
    for field_name, field_type in fields:
        f = {"name": field_name, "type": field_type}
        if default and field_name in default:
            f["default"] = default[field_name]
        out.append(f)
    return json.dumps({"type": "record", "name": name, "fields": out})


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    port = free_ports(1)[0]
    with BrokerProcess(tmp_path_factory.mktemp("registry"), {
            "schema.registry.listeners": f"http://127.0.0.1:{port}",
            "schema.registry.request.max.bytes": str(1 << 20),
            "schema.registry.max.connections": "32"}) as b:
        b.registry_url = f"http://127.0.0.1:{port}"
        yield b


@pytest.fixture
def url(broker):
    return broker.registry_url


@pytest.fixture
def client(url):
    return SchemaRegistryClient({"url": url})


def serving(url: str) -> bool:
    try:
        return requests.get(f"{url}/subjects", timeout=5).status_code == 200
    except requests.ConnectionError:  # a connection of the moment past the limit
        return False


def error_of(call) -> tuple[int, int]:
    with pytest.raises(SchemaRegistryError) as info:
        call()
    return info.value.http_status_code, info.value.error_code


def test_register_lookup_and_read_back(client, url):
    subject, other = unique_name("orders") + "-value", unique_name("copy") + "-value"
    v1 = Schema(avro("Order", ("id", "long")), "AVRO")
    first = client.register_schema(subject, v1)
    # the same schema again (other whitespace): its id, no new version
    assert client.register_schema(subject, Schema(json.dumps(json.loads(v1.schema_str), indent=2), "AVRO")) == first
    assert client.get_versions(subject) == [1]
    # one id across subjects
    assert client.register_schema(other, v1) == first
    v2 = Schema(avro("Order", ("id", "long"), ("note", "string"), default={"note": ""}), "AVRO")
    second = client.register_schema(subject, v2)
    assert second > first
    assert client.get_versions(subject) == [1, 2]
    latest = client.get_latest_version(subject)
    assert (latest.version, latest.schema_id) == (2, second)
    assert client.get_version(subject, 1).schema_id == first
    assert json.loads(client.get_schema(first).schema_str) == json.loads(v1.schema_str)
    found = client.lookup_schema(subject, v1)
    assert (found.version, found.schema_id) == (1, first)
    assert set(client.get_subjects()) >= {subject, other}
    assert sorted(requests.get(f"{url}/schemas/ids/{first}/subjects").json()) == sorted([subject, other])
    assert {(v["subject"], v["version"]) for v in requests.get(f"{url}/schemas/ids/{first}/versions").json()} == {
        (subject, 1), (other, 1)}
    assert sorted(requests.get(f"{url}/schemas/types").json()) == ["AVRO", "JSON", "PROTOBUF"]
    for version in ("latest", "-1", "2"):
        answer = requests.get(f"{url}/subjects/{subject}/versions/{version}")
        assert answer.headers["Content-Type"].startswith("application/vnd.schemaregistry.v1+json")
        assert answer.json()["id"] == second
    assert json.loads(requests.get(f"{url}/subjects/{subject}/versions/1/schema").text) == json.loads(v1.schema_str)
    assert error_of(lambda: client.lookup_schema(subject, Schema('"string"', "AVRO"))) == (404, 40403)
    assert error_of(lambda: client.get_versions(unique_name("none"))) == (404, 40401)
    assert error_of(lambda: client.get_version(subject, 7)) == (404, 40402)
    assert error_of(lambda: client.get_schema(999_999)) == (404, 40403)


def test_compatibility_levels_and_config(client, url):
    subject = unique_name("compat") + "-value"
    client.register_schema(subject, Schema(avro("R", ("a", "int")), "AVRO"))
    breaking = Schema(avro("R", ("a", "int"), ("b", "string")), "AVRO")  # no default: not BACKWARD
    assert client.get_compatibility() == "BACKWARD"
    assert client.test_compatibility(subject, breaking) is False
    verbose = requests.post(f"{url}/compatibility/subjects/{subject}/versions/latest?verbose=true", headers=CT,
                            json={"schema": breaking.schema_str}).json()
    assert verbose["is_compatible"] is False and verbose["messages"]
    assert error_of(lambda: client.register_schema(subject, breaking)) == (409, 409)
    assert error_of(lambda: client.get_compatibility(subject)) == (404, 40408)
    assert requests.get(f"{url}/config/{subject}?defaultToGlobal=true").json() == {"compatibilityLevel": "BACKWARD"}
    assert client.set_compatibility(subject, "NONE") == {"compatibility": "NONE"}
    assert client.get_compatibility(subject) == "NONE"
    assert client.test_compatibility(subject, breaking) is True
    assert client.register_schema(subject, breaking) > 0
    assert client.get_versions(subject) == [1, 2]
    assert requests.delete(f"{url}/config/{subject}").json() == {"compatibilityLevel": "NONE"}
    assert error_of(lambda: client.get_compatibility(subject)) == (404, 40408)
    assert error_of(lambda: client.set_compatibility(subject, "SIDEWAYS")) == (422, 42203)


def test_soft_and_hard_deletes_follow_confluents_rules(client, url):
    subject = unique_name("deletes") + "-value"
    ids = [client.register_schema(subject, Schema(avro("D", ("a", "int"), *[(f"f{i}", "int")] * (i > 0),
                                                       default={f"f{i}": 0}), "AVRO")) for i in range(3)]
    assert client.get_versions(subject) == [1, 2, 3]
    # hard before soft: refused
    assert error_of(lambda: client.delete_version(subject, 3, permanent=True)) == (404, 40407)
    assert error_of(lambda: client.delete_subject(subject, permanent=True)) == (404, 40405)
    assert client.delete_version(subject, 3) == 3
    assert error_of(lambda: client.delete_version(subject, 3)) == (404, 40406)
    assert client.get_versions(subject) == [1, 2]
    assert requests.get(f"{url}/subjects/{subject}/versions?deleted=true").json() == [1, 2, 3]
    assert requests.get(f"{url}/subjects/{subject}/versions/3").json()["error_code"] == 40402
    assert requests.get(f"{url}/subjects/{subject}/versions/3?deleted=true").json()["id"] == ids[2]
    assert client.get_schema(ids[2]) is not None  # a soft-deleted schema stays readable by id
    assert client.delete_version(subject, 3, permanent=True) == 3
    assert requests.get(f"{url}/subjects/{subject}/versions?deleted=true").json() == [1, 2]
    assert requests.get(f"{url}/schemas/ids/{ids[2]}").json()["error_code"] == 40403
    # the subject: soft, again (refused), then hard
    assert client.delete_subject(subject) == [1, 2]
    assert error_of(lambda: client.delete_subject(subject)) == (404, 40404)
    assert subject not in client.get_subjects()
    assert subject in requests.get(f"{url}/subjects?deleted=true").json()
    assert client.delete_subject(subject, permanent=True) == [1, 2]
    assert subject not in requests.get(f"{url}/subjects?deleted=true").json()
    assert error_of(lambda: client.delete_subject(subject)) == (404, 40401)
    # ids are not given again after a hard delete; a schema registered again gets a new one
    again = client.register_schema(subject, Schema(avro("D", ("a", "int")), "AVRO"))
    assert again > max(ids)


def test_references_resolve_and_protect_what_they_name(client, url):
    base_subject, user_subject = unique_name("base") + "-value", unique_name("user") + "-value"
    base = Schema(json.dumps({"type": "record", "name": "Base", "namespace": "t", "fields": [
        {"name": "n", "type": "int"}]}), "AVRO")
    base_id = client.register_schema(base_subject, base)
    user = Schema(json.dumps({"type": "record", "name": "User", "namespace": "t", "fields": [
        {"name": "b", "type": "t.Base"}]}), "AVRO", [SchemaReference("t.Base", base_subject, 1)])
    user_id = client.register_schema(user_subject, user)
    got = client.get_latest_version(user_subject)
    assert [(r.name, r.subject, r.version) for r in got.schema.references] == [("t.Base", base_subject, 1)]
    assert requests.get(f"{url}/subjects/{base_subject}/versions/1/referencedby").json() == [user_id]
    assert error_of(lambda: client.delete_version(base_subject, 1)) == (422, 42206)
    assert error_of(lambda: client.delete_subject(base_subject)) == (422, 42206)
    missing = Schema(user.schema_str, "AVRO", [SchemaReference("t.Base", base_subject, 9)])
    assert error_of(lambda: client.register_schema(unique_name("m"), missing)) == (422, 42201)
    assert base_id != user_id


def test_references_nesting_too_deep_are_refused(url):
    prefix = unique_name("deep")
    previous = None
    for depth in range(MAX_DEPTH + 2):  # version `depth` reaches `depth` references deep
        fields = [{"name": "v", "type": "int"}]
        refs = []
        if previous is not None:
            fields.append({"name": "next", "type": f"n.R{depth - 1}"})
            refs = [{"name": f"n.R{depth - 1}", "subject": previous, "version": 1}]
        body = {"schema": json.dumps({"type": "record", "name": f"R{depth}", "namespace": "n", "fields": fields}),
                "references": refs}
        subject = f"{prefix}-{depth}"
        answer = requests.post(f"{url}/subjects/{subject}/versions", headers=CT, json=body)
        if depth <= MAX_DEPTH:
            assert answer.status_code == 200, answer.text
        else:
            assert answer.status_code == 422 and answer.json()["error_code"] == 42201, answer.text
            assert "deeper" in answer.json()["message"]
        previous = subject


def test_a_reference_cycle_another_registry_wrote_is_refused(broker, url):
    """Two versions referencing each other can only come from records written elsewhere: they are
    read, and a schema reaching the cycle is refused with 42201, not recursed into."""
    a, b = unique_name("cycle-a"), unique_name("cycle-b")
    ids = requests.get(f"{url}/schemas/ids/1").json()  # the topic exists: written to above
    assert "schema" in ids

    def record(subject, other, schema_id):
        return (json.dumps({"keytype": "SCHEMA", "subject": subject, "version": 1, "magic": 1}).encode(),
                json.dumps({"subject": subject, "version": 1, "id": schema_id, "schemaType": "JSON",
                            "references": [{"name": f"{other}.json", "subject": other, "version": 1}],
                            "schema": '{"type":"object"}', "deleted": False}).encode())
    with closing(Producer({"bootstrap.servers": broker.bootstrap})) as producer:
        for k, v in (record(a, b, 900_001), record(b, a, 900_002)):
            producer.produce("_schemas", key=k, value=v, partition=0)
        assert producer.flush(15) == 0
    wait_for(lambda: requests.get(f"{url}/subjects/{a}/versions").status_code == 200, what="records read")
    answer = requests.post(f"{url}/subjects/{unique_name('c')}/versions", headers=CT, json={
        "schemaType": "JSON", "schema": '{"type":"object"}',
        "references": [{"name": "a.json", "subject": a, "version": 1}]})
    assert answer.status_code == 422 and answer.json()["error_code"] == 42201
    assert "cycle" in answer.json()["message"]
    # a hand-written id counts: the next id given is past it
    fresh = requests.post(f"{url}/subjects/{unique_name('after')}/versions", headers=CT,
                          json={"schema": avro("AfterCycle", ("z", "int"))}).json()
    assert fresh["id"] > 900_002


@pytest.mark.parametrize("method, path, body, status, code", [
    ("post", "/subjects/{s}/versions", b"{not json", 400, 400),
    ("post", "/subjects/{s}/versions", b"[" * 200_000 + b"]" * 200_000, 400, 400),
    ("post", "/subjects/{s}/versions", b"[1, 2]", 422, 422),
    ("post", "/subjects/{s}/versions", b"", 422, 422),
    ("post", "/subjects/{s}/versions", json.dumps({"schema": '{"type": "record"}'}).encode(), 422, 42201),
    ("post", "/subjects/{s}/versions", json.dumps({"schema": "not avro at all"}).encode(), 422, 42201),
    ("post", "/subjects/{s}/versions", json.dumps({"schema": '"int"', "schemaType": "XML"}).encode(), 422, 422),
    ("post", "/subjects/{s}/versions", json.dumps({"schema": '"int"', "references": "x"}).encode(), 422, 42201),
    ("post", "/subjects/{s}/versions", json.dumps({"schema": "[" * 5000 + "]" * 5000}).encode(), 422, 42201),
    ("post", "/subjects/{s}/versions", json.dumps({"schema": '"int"', "id": 5}).encode(), 422, 42205),
    ("get", "/subjects/{s}/versions/abc", None, 422, 42202),
    ("get", "/subjects/{s}/versions/0", None, 422, 42202),
    ("get", "/subjects/{s}/versions/2147483648", None, 422, 42202),
    ("get", "/schemas/ids/abc", None, 404, 404),
    ("get", "/no/such/path", None, 404, 404),
    ("put", "/config", json.dumps({"compatibility": "MAYBE"}).encode(), 422, 42203),
    ("put", "/mode/{s}", json.dumps({"mode": "SOMETIMES"}).encode(), 422, 42204),
    ("get", "/mode/{s}", None, 404, 40409),
])
def test_bad_requests_get_confluents_error_bodies(url, method, path, body, status, code):
    subject = unique_name("bad")
    if "versions/" in path:  # a subject that exists, so the version is what is wrong
        requests.post(f"{url}/subjects/{subject}/versions", headers=CT, json={"schema": '"int"'}).raise_for_status()
    answer = requests.request(method, url + path.format(s=subject), data=body, headers=CT)
    assert answer.status_code == status, answer.text
    assert answer.json()["error_code"] == code and answer.json()["message"]
    assert requests.get(f"{url}/subjects").status_code == 200


def test_a_huge_body_gets_413_and_the_registry_keeps_serving(url):
    big = json.dumps({"schema": json.dumps({"type": "enum", "name": "E",
                                            "symbols": [f"S{i}" for i in range(200_000)]})})
    answer = requests.post(f"{url}/subjects/{unique_name('huge')}/versions", headers=CT, data=big)
    assert answer.status_code == 413 and answer.json()["error_code"] == 413
    assert requests.get(f"{url}/subjects").status_code == 200



def test_connections_past_the_limit_are_closed_and_the_registry_keeps_serving(url):
    host, port = url.removeprefix("http://").split(":")
    held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(48)]  # the limit is 32
    for sock in held:
        sock.setblocking(False)

    def closed(sock: socket.socket) -> bool:
        try:
            return sock.recv(1) == b""
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True

    try:
        wait_for(lambda: sum(map(closed, held)) >= 48 - 32, timeout=10, what="connections past the limit closed")
        assert sum(not closed(sock) for sock in held) >= 16  # those within it stay open
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: serving(url), what="serving again")

def test_modes_readonly_and_import(client, url):
    subject = unique_name("modes") + "-value"
    assert requests.get(f"{url}/mode").json() == {"mode": "READWRITE"}
    assert client.update_mode(subject, "READONLY") == "READONLY"
    assert client.get_mode(subject) == "READONLY"
    assert error_of(lambda: client.register_schema(subject, Schema('"int"', "AVRO"))) == (422, 42205)
    assert client.delete_mode(subject) == "READONLY"
    # IMPORT: a given id and version are kept
    assert client.update_mode(subject, "IMPORT") == "IMPORT"
    answer = requests.post(f"{url}/subjects/{subject}/versions", headers=CT,
                           json={"schema": avro("Imported", ("q", "int")), "id": 500_000, "version": 7})
    assert answer.json() == {"id": 500_000}, answer.text
    assert requests.get(f"{url}/subjects/{subject}/versions/7").json()["id"] == 500_000
    clash = requests.post(f"{url}/subjects/{subject}/versions", headers=CT,
                          json={"schema": '"string"', "id": 500_000, "version": 8})
    assert clash.status_code == 422 and clash.json()["error_code"] == 42207
    # IMPORT over a subject that has schemas needs force
    taken = requests.put(f"{url}/mode/{subject}", headers=CT, json={"mode": "IMPORT"})
    assert taken.status_code == 422 and taken.json()["error_code"] == 42205
    client.delete_mode(subject)
    assert requests.get(f"{url}/mode/{subject}?defaultToGlobal=true").json() == {"mode": "READWRITE"}
    # the global mode: READONLY refuses every registration until it is deleted (READWRITE again)
    assert requests.put(f"{url}/mode", headers=CT, json={"mode": "READONLY"}).json() == {"mode": "READONLY"}
    refused = requests.post(f"{url}/subjects/{unique_name('ro')}/versions", headers=CT, json={"schema": '"long"'})
    assert refused.status_code == 422 and refused.json()["error_code"] == 42205
    assert requests.delete(f"{url}/mode").json() == {"mode": "READONLY"}
    assert requests.get(f"{url}/mode").json() == {"mode": "READWRITE"}


def test_avro_serializer_round_trip_through_a_topic(broker, client):
    topic = unique_name("avro-topic")
    create_topic(broker.bootstrap, topic)
    schema = avro("Payment", ("id", "string"), ("amount", "double"))
    serialize = AvroSerializer(client, schema)
    deserialize = AvroDeserializer(client)
    values = [{"id": f"p{i}", "amount": i * 1.5} for i in range(5)]
    ctx = SerializationContext(topic, MessageField.VALUE)
    with closing(Producer({"bootstrap.servers": broker.bootstrap})) as producer:
        for value in values:
            producer.produce(topic, value=serialize(value, ctx))
        assert producer.flush(15) == 0
    assert client.get_versions(f"{topic}-value") == [1]
    got = []
    with closing(Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_name("g"),
                           "auto.offset.reset": "earliest"})) as consumer:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # no group rebalance to wait for
        deadline = time.monotonic() + 30
        while len(got) < len(values) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                got.append(deserialize(message.value(), ctx))
    assert got == values


def test_protobuf_serializer_round_trip_and_the_serialized_format(client, url):
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from google.protobuf import descriptor_pb2
    from google.protobuf.timestamp_pb2 import Timestamp

    topic = unique_name("proto-topic")
    ctx = SerializationContext(topic, MessageField.VALUE)
    serialize = ProtobufSerializer(Timestamp, client, {"use.deprecated.format": False})
    deserialize = ProtobufDeserializer(Timestamp, {"use.deprecated.format": False})
    value = Timestamp(seconds=1_700_000_000, nanos=5)
    assert deserialize(serialize(value, ctx), ctx) == value
    latest = client.get_latest_version(f"{topic}-value")
    assert latest.schema.schema_type == "PROTOBUF"
    serialized = requests.get(f"{url}/schemas/ids/{latest.schema_id}?format=serialized").json()
    descriptor = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(serialized["schema"]))
    assert [m.name for m in descriptor.message_type] == ["Timestamp"]
    assert serialized["schemaType"] == "PROTOBUF"



def test_json_schema_serializer_round_trip(client):
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    topic = unique_name("json-topic")
    ctx = SerializationContext(topic, MessageField.VALUE)
    schema = json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "title": "Point", "type": "object",
                         "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x"]})
    serialize = JSONSerializer(schema, client)
    value = {"x": 1, "y": 2}
    assert JSONDeserializer(schema)(serialize(value, ctx), ctx) == value
    latest = client.get_latest_version(f"{topic}-value")
    assert latest.schema.schema_type == "JSON"
    assert client.lookup_schema(f"{topic}-value", Schema(schema, "JSON")).schema_id == latest.schema_id

def test_everything_is_there_after_a_restart_and_ids_go_on(broker, url, client):
    subject = unique_name("restart") + "-value"
    first = client.register_schema(subject, Schema(avro("Keep", ("k", "int")), "AVRO"))
    subjects = requests.get(f"{url}/subjects?deleted=true").json()
    highest = first  # the newest id: registered last
    client.set_compatibility(subject, "FULL")
    assert broker.stop() == 0
    broker.restart()
    wait_for(lambda: requests.get(f"{url}/subjects?deleted=true").json() == subjects, what="subjects read back")
    assert requests.get(f"{url}/subjects/{subject}/versions/1").json()["id"] == first
    assert requests.get(f"{url}/config/{subject}").json() == {"compatibilityLevel": "FULL"}
    fresh = SchemaRegistryClient({"url": url})
    later = fresh.register_schema(unique_name("after") + "-value", Schema(avro("New", ("n", "int")), "AVRO"))
    assert later > highest
