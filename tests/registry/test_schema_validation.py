"""Schema validation on produce (confluent.value.schema.validation / confluent.key.schema.validation)
on a real broker running the schema registry: records framed with a registered id go in, a batch
with any other record is refused whole with INVALID_RECORD naming each bad record, whichever
client sends it."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from strom.client import Connection
from strom.protocol import compression
from strom.protocol.errors import ErrorCode
from strom.protocol.records import build_batch
from strom.schemas import frame
from strom.testing import BrokerProcess, closing, create_topic, free_ports, list_offset, unique_name

PRODUCE = 0
LATEST = -1
ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "shop",
                    "fields": [{"name": "id", "type": "long"}]})
PAYMENT = json.dumps({"type": "record", "name": "Payment", "namespace": "shop",
                      "fields": [{"name": "amount", "type": "double"}]})


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    port = free_ports(1)[0]
    with BrokerProcess(tmp_path_factory.mktemp("validation"),
                       {"schema.registry.listeners": f"http://127.0.0.1:{port}"}) as b:
        b.registry = SchemaRegistryClient({"url": f"http://127.0.0.1:{port}"})
        yield b


def validated_topic(broker, **configs: str) -> str:
    topic = unique_name("validated")
    create_topic(broker.bootstrap, topic, config={"confluent.value.schema.validation": "true", **configs})
    return topic


def produce(broker, topic: str, rows: list[tuple[bytes | None, bytes | None]], codec: int = compression.NONE):
    """One batch through a raw Produce v9 (whose answer carries record_errors)."""
    with Connection("127.0.0.1", broker.port) as conn:
        body = conn.call(PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 10000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": build_batch(rows, codec=codec)}]}]})
    return body.responses[0].partition_responses[0]


def register(broker, subject: str, schema: str = ORDER) -> int:
    return broker.registry.register_schema(subject, Schema(schema, "AVRO"))


def test_the_serializers_records_go_in_others_are_refused(broker):
    topic = validated_topic(broker)
    serialize = AvroSerializer(broker.registry, ORDER)  # registers <topic>-value on first use
    with closing(Producer({"bootstrap.servers": broker.bootstrap})) as producer:
        for i in range(5):
            producer.produce(topic, serialize({"id": i}, SerializationContext(topic, MessageField.VALUE)))
        assert producer.flush(30) == 0
        delivered = []
        producer.produce(topic, b"plain bytes", on_delivery=lambda e, m: delivered.append(e))
        producer.flush(30)
    assert len(delivered) == 1 and delivered[0].code() == ErrorCode.INVALID_RECORD
    assert list_offset(broker.bootstrap, topic, LATEST) == 5


@pytest.mark.parametrize("codec", [compression.NONE, compression.ZSTD])
def test_each_bad_record_is_named_and_nothing_of_the_batch_is_written(broker, codec):
    topic = validated_topic(broker)
    good = register(broker, f"{topic}-value")
    elsewhere = register(broker, unique_name("other") + "-value", PAYMENT)
    rows = [(None, frame(good, b"\x02")), (None, b"unframed"), (None, frame(good, b"\x04")),
            (None, frame(2_000_000_000, b"")), (None, None), (None, frame(elsewhere, b"\x00"))]
    answer = produce(broker, topic, rows, codec)
    assert answer.error_code == ErrorCode.INVALID_RECORD
    named = {e.batch_index: e.batch_index_error_message for e in answer.record_errors}
    assert sorted(named) == [1, 3, 5]  # the null value (a tombstone) passes
    assert "not framed" in named[1]
    assert "2000000000 is not registered" in named[3]
    assert f"not registered under subject {topic}-value" in named[5]
    assert list_offset(broker.bootstrap, topic, LATEST) == 0
    assert produce(broker, topic, [rows[0], rows[2], rows[4]], codec).error_code == ErrorCode.NONE
    assert list_offset(broker.bootstrap, topic, LATEST) == 3


def test_keys_and_record_name_strategy(broker):
    topic = validated_topic(broker, **{"confluent.value.schema.validation": "false",
                                       "confluent.key.schema.validation": "true",
                                       "confluent.key.subject.name.strategy": "RecordNameStrategy"})
    key_id = register(broker, "shop.Order")  # the record's full name is the subject
    assert produce(broker, topic, [(frame(key_id, b"\x02"), b"any value"), (None, b"x")]).error_code == ErrorCode.NONE
    by_topic = register(broker, f"{topic}-key", PAYMENT)  # not the subject RecordNameStrategy names
    answer = produce(broker, topic, [(frame(by_topic, b"\0" * 8), b"v")])
    assert answer.error_code == ErrorCode.INVALID_RECORD
    assert "not registered under subject shop.Payment" in answer.record_errors[0].batch_index_error_message


def test_turned_on_and_off_at_runtime(broker):
    topic = unique_name("toggled")
    create_topic(broker.bootstrap, topic)
    assert produce(broker, topic, [(None, b"free")]).error_code == ErrorCode.NONE
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def set_validation(value: str) -> None:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry("confluent.value.schema.validation", value, incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(15)

    set_validation("true")
    deadline = time.monotonic() + 15
    while produce(broker, topic, [(None, b"free")]).error_code == ErrorCode.NONE:
        assert time.monotonic() < deadline, "validation never took effect"
        time.sleep(0.2)
    set_validation("false")
    deadline = time.monotonic() + 15
    while produce(broker, topic, [(None, b"free")]).error_code != ErrorCode.NONE:
        assert time.monotonic() < deadline, "validation never went off"
        time.sleep(0.2)
    with pytest.raises(KafkaException, match="TopicNameStrategy"):
        bad = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[ConfigEntry(
            "confluent.value.subject.name.strategy", "NoSuchStrategy", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([bad])[bad].result(15)


def test_a_broker_without_the_registry_refuses_validated_topics(tmp_path):
    with BrokerProcess(tmp_path) as plain:
        topic = unique_name("no-registry")
        create_topic(plain.bootstrap, topic, config={"confluent.value.schema.validation": "true"})
        answer = produce(plain, topic, [(None, frame(1, b""))])
        assert answer.error_code == ErrorCode.INVALID_RECORD
        assert "schema.registry.listeners" in answer.error_message
