"""Typed columns: records framed by confluent-kafka's registry serializers, against the session
broker's own schema registry, read by the `strom` source as structs (Avro, Protobuf, JSON
Schema), with Avro schema evolution across a stream and a read; the sink encoding a struct
value as Avro that confluent-kafka's deserializer reads back; undecodable records failing
the query, or null with mode=PERMISSIVE."""

from __future__ import annotations

import datetime
import json
import zoneinfo
from decimal import Decimal

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from strom.schemas import schema_id_of
from strom.spark.options import StromOptionError, source_options
from strom.testing import consume_all, create_topic

from .conftest import read

CUSTOMER = {"type": "record", "name": "Customer", "fields": [
    {"name": "name", "type": "string"},
    {"name": "email", "type": ["null", "string"], "default": None}]}
ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": CUSTOMER},
    {"name": "items", "type": {"type": "array", "items": "string"}},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "counts", "type": {"type": "map", "values": "int"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}

ORDER_TYPE = StructType([
    StructField("id", LongType(), False),
    StructField("customer", StructType([StructField("name", StringType(), False),
                                        StructField("email", StringType(), True)]), False),
    StructField("items", ArrayType(StringType(), False), False),
    StructField("status", StringType(), False),
    StructField("note", StringType(), True),
    StructField("counts", MapType(StringType(), IntegerType(), False), False),
    StructField("amount", DecimalType(9, 2), False),
    StructField("day", DateType(), False),
    StructField("at", TimestampType(), False)])


def order(i: int) -> dict:
    return {"id": i, "customer": {"name": f"c{i}", "email": None if i % 2 else f"c{i}@example.com"},
            "items": [f"sku-{j}" for j in range(i % 3)], "status": ["NEW", "PAID", "SHIPPED"][i % 3],
            "note": None if i % 3 else "fragile", "counts": {"a": i, "b": -i} if i % 2 else {},
            "amount": Decimal(f"{i}.25"), "day": datetime.date(2024, 1, 1) + datetime.timedelta(days=i),
            "at": datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=i)}


@pytest.fixture
def registry(broker) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": broker.registry_url})


def write_avro(broker, registry, topic: str, schema: dict, values: list, keys: list | None = None) -> None:
    """Values framed by confluent-kafka's AvroSerializer (which registers `schema` under
    <topic>-value), in one partition so their order is the offsets' order."""
    serialize = AvroSerializer(registry, json.dumps(schema))
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i, value in enumerate(values):
        data = value if isinstance(value, bytes) or value is None else serialize(value, ctx)
        producer.produce(topic, data, key=keys[i] if keys else None, partition=0)
    assert producer.flush(30) == 0


def typed(spark, broker, topic: str, **options):
    return read(spark, broker.bootstrap, subscribe=topic,
                **{"valueFormat": "avro", "schema.registry.url": broker.registry_url, **options})


def as_dicts(rows) -> list:
    return [None if r.value is None else r.value.asDict(recursive=True) for r in rows]


def utc(value: dict) -> dict:
    """Spark gives timestamps in the session's zone, without tzinfo: compare in UTC."""
    return {**value, "at": value["at"].astimezone(datetime.UTC)} if value else value


def test_avro_values_become_typed_columns(spark, broker, registry, topic):
    create_topic(broker.bootstrap, topic)
    values = [order(i) for i in range(6)] + [None]  # a tombstone stays null
    write_avro(broker, registry, topic, ORDER_V1, values, keys=[b"k%d" % i for i in range(7)])

    df = typed(spark, broker, topic)
    assert df.schema["value"].dataType == ORDER_TYPE
    assert df.schema["key"].dataType == BinaryType()  # keyFormat unset: binary as ever
    rows = df.orderBy("offset").collect()
    assert [r.key for r in rows] == [b"k%d" % i for i in range(7)]
    got = [utc(v) if v else v for v in as_dicts(rows)]
    assert got == values


def test_evolution_across_a_stream_and_a_read(spark, broker, registry, topic, tmp_path):
    create_topic(broker.bootstrap, topic)
    write_avro(broker, registry, topic, ORDER_V1, [order(i) for i in range(3)])
    stream = (spark.readStream.format("strom").option("kafka.bootstrap.servers", broker.bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("valueFormat", "avro").option("schema.registry.url", broker.registry_url).load())
    assert stream.schema["value"].dataType == ORDER_TYPE  # the reader: v1, the latest at load()
    name = topic.replace("-", "_")
    query = (stream.select("offset", "value").writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        query.processAllAvailable()
        # mid-stream: v2 (a field added, with a default) registered and written
        v2 = [{**order(i), "channel": "app"} for i in range(3, 5)]
        write_avro(broker, registry, topic, ORDER_V2, v2)
        query.processAllAvailable()
    finally:
        query.stop()
    rows = spark.sql(f"select * from {name} order by offset").collect()
    # every record, typed as the stream's reader (v1): v2's added field is dropped
    assert [r.offset for r in rows] == list(range(5))
    assert [utc(v) for v in as_dicts(rows)] == [order(i) for i in range(5)]
    assert len(registry.get_versions(f"{topic}-value")) == 2

    # A read planned now has v2 as its reader: older records get the added field's default.
    df = typed(spark, broker, topic)
    assert df.schema["value"].dataType == StructType(
        [*ORDER_TYPE.fields, StructField("channel", StringType(), False)])
    got = [utc(v) for v in as_dicts(df.orderBy("offset").collect())]
    assert got == [{**order(i), "channel": "web"} for i in range(3)] + v2


def _order_proto():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3")
    msg = fdp.message_type.add(name="Order")
    msg.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    msg.field.add(name="tags", number=2, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    msg.field.add(name="state", number=3, type=F.TYPE_ENUM, type_name=".shop.State", label=F.LABEL_OPTIONAL)
    msg.field.add(name="line", number=4, type=F.TYPE_MESSAGE, type_name=".shop.Order.Line",
                  label=F.LABEL_OPTIONAL)
    line = msg.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    line.field.add(name="qty", number=2, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    enum = fdp.enum_type.add(name="State")
    enum.value.add(name="NEW", number=0)
    enum.value.add(name="PAID", number=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def test_protobuf_values_read_typed(spark, broker, registry, topic):
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    create_topic(broker.bootstrap, topic)
    order_class = _order_proto()
    serialize = ProtobufSerializer(order_class, registry, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    first = order_class(id=7, tags=["a", "b"], state=1)
    first.line.sku, first.line.qty = "x", 2**64 - 1
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for message in (first, order_class(id=8)):
        producer.produce(topic, serialize(message, ctx), partition=0)
    assert producer.flush(30) == 0

    df = typed(spark, broker, topic, valueFormat="protobuf")
    line = StructType([StructField("sku", StringType()), StructField("qty", DecimalType(20, 0))])
    assert df.schema["value"].dataType == StructType([
        StructField("id", LongType()), StructField("tags", ArrayType(StringType())),
        StructField("state", StringType()), StructField("line", line)])
    assert as_dicts(df.orderBy("offset").collect()) == [
        {"id": 7, "tags": ["a", "b"], "state": "PAID", "line": {"sku": "x", "qty": Decimal(2**64 - 1)}},
        {"id": 8, "tags": [], "state": "NEW", "line": None}]  # proto3: scalars default, a message unset


def test_json_schema_values_read_typed(spark, broker, registry, topic):
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    create_topic(broker.bootstrap, topic)
    schema = {"type": "object", "properties": {
        "id": {"type": "integer"}, "price": {"type": "number"}, "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"$ref": "#/definitions/Place"}, "extra": {}},
        "definitions": {"Place": {"type": "object", "properties": {"city": {"type": ["string", "null"]}}}}}
    serialize = JSONSerializer(json.dumps(schema), registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = [{"id": 1, "price": 2, "ok": True, "tags": ["t"], "where": {"city": "Oslo"}, "extra": {"a": [1]}},
              {"id": 2, "price": 2.5, "ok": False, "tags": [], "where": {"city": None}}]
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for value in values:
        producer.produce(topic, serialize(value, ctx), partition=0)
    assert producer.flush(30) == 0

    df = typed(spark, broker, topic, valueFormat="json")
    assert df.schema["value"].dataType == StructType([
        StructField("id", LongType()), StructField("price", DoubleType()), StructField("ok", BooleanType()),
        StructField("tags", ArrayType(StringType())),
        StructField("where", StructType([StructField("city", StringType())])),
        StructField("extra", StringType())])  # a free-form property: its JSON text
    assert as_dicts(df.orderBy("offset").collect()) == [
        {"id": 1, "price": 2.0, "ok": True, "tags": ["t"], "where": {"city": "Oslo"}, "extra": '{"a":[1]}'},
        {"id": 2, "price": 2.5, "ok": False, "tags": [], "where": {"city": None}, "extra": None}]


def test_sink_encodes_registers_and_frames_avro(spark, broker, registry, topic):
    create_topic(broker.bootstrap, topic)
    point = StructType([StructField("x", DoubleType(), False), StructField("label", StringType(), True)])
    schema = StructType([StructField("key", StringType()),
                         StructField("value", StructType([
                             StructField("id", LongType(), False), StructField("at", point, True),
                             StructField("tags", ArrayType(StringType(), False), True),
                             StructField("counts", MapType(StringType(), LongType(), True), True)]))])
    rows = [(f"k{i}", (i, None if i == 4 else (i / 2, None if i % 2 else f"p{i}"), [f"t{i}"] * (i % 3),
                       {"n": i, "none": None})) for i in range(5)]
    (spark.createDataFrame(rows, schema).coalesce(1).write.format("strom")
     .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic)
     .option("valueFormat", "avro").option("schema.registry.url", broker.registry_url).save())

    latest = registry.get_latest_version(f"{topic}-value")
    assert [f["name"] for f in json.loads(latest.schema.schema_str)["fields"]] == ["id", "at", "tags", "counts"]
    deserialize = AvroDeserializer(registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    messages = consume_all(broker.bootstrap, topic)
    assert {schema_id_of(m.value()) for m in messages} == {latest.schema_id}
    got = sorted((m.key(), deserialize(m.value(), ctx)) for m in messages)
    assert got == [(f"k{i}".encode(), {"id": i, "at": None if i == 4 else {"x": i / 2,
                                                                           "label": None if i % 2 else f"p{i}"},
                                       "tags": [f"t{i}"] * (i % 3), "counts": {"n": i, "none": None}})
                   for i in range(5)]


def test_sink_writes_json_values_and_avro_keys(spark, broker, registry, topic):
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer

    create_topic(broker.bootstrap, topic)
    df = spark.sql("select named_struct('id', id) as key, named_struct('id', id, 'name', concat('n', id), "
                   "'at', timestamp'2024-05-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id), "
                   "'tags', array('a'), 'price', cast(id as decimal(10, 2)) / 4) as value from range(3)")
    (df.coalesce(1).write.format("strom").option("kafka.bootstrap.servers", broker.bootstrap)
     .option("topic", topic).option("valueFormat", "json").option("keyFormat", "avro")
     .option("schema.registry.url", broker.registry_url).save())

    value_schema = registry.get_latest_version(f"{topic}-value").schema
    assert value_schema.schema_type == "JSON"
    assert set(json.loads(value_schema.schema_str)["properties"]) == {"id", "name", "at", "tags", "price"}
    keys = AvroDeserializer(registry)
    values = JSONDeserializer(value_schema.schema_str, schema_registry_client=registry)
    got = sorted(((keys(m.key(), SerializationContext(topic, MessageField.KEY)),
                   values(m.value(), SerializationContext(topic, MessageField.VALUE)))
                  for m in consume_all(broker.bootstrap, topic)), key=lambda kv: kv[0]["id"])
    spark_zone = spark.conf.get("spark.sql.session.timeZone")
    expected_at = [datetime.datetime(2024, 5, 1, 0, 0, i, tzinfo=zoneinfo.ZoneInfo(spark_zone))
                   .astimezone(datetime.UTC).isoformat() for i in range(3)]
    assert got == [({"id": i}, {"id": i, "name": f"n{i}", "at": expected_at[i], "tags": ["a"], "price": i / 4})
                   for i in range(3)]

    # and back through the source: a typed key beside a typed value
    back = typed(spark, broker, topic, keyFormat="avro", valueFormat="json")
    assert back.schema["key"].dataType == StructType([StructField("id", LongType(), False)])
    rows = sorted(back.select("key.id", "value.name", "value.price", "value.tags").collect())
    assert [tuple(r) for r in rows] == [(i, f"n{i}", i / 4, ["a"]) for i in range(3)]


def test_sink_encodes_protobuf_with_the_subjects_message(broker, registry, topic):
    import pyarrow as pa
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

    from strom.spark.formats import column_formats
    from strom.spark.registry import RegistryError
    from strom.spark.typed_sink import encode_batches, plan_sink

    order_class = _order_proto()
    ctx = SerializationContext(topic, MessageField.VALUE)
    formats = column_formats({"valueformat": "protobuf", "schema.registry.url": broker.registry_url},
                             (topic,), "sink")
    line = StructType([StructField("sku", StringType()), StructField("qty", DecimalType(20, 0))])
    schema = StructType([StructField("value", StructType([
        StructField("id", LongType()), StructField("state", StringType()), StructField("line", line)]))])
    with pytest.raises(RegistryError, match="not found"):  # no .proto registered: none is made up
        plan_sink(formats, schema)
    ProtobufSerializer(order_class, registry, {"use.deprecated.format": False})(order_class(id=1), ctx)
    plans = plan_sink(formats, schema)
    assert plans[0].schema.schema_id == registry.get_latest_version(f"{topic}-value").schema_id
    batch = pa.RecordBatch.from_pylist(
        [{"value": {"id": 5, "state": "PAID", "line": {"sku": "x", "qty": Decimal(2**64 - 1)}}},
         {"value": {"id": 6, "state": None, "line": None}}, {"value": None}],
        schema=pa.schema([("value", pa.struct([("id", pa.int64()), ("state", pa.string()), ("line", pa.struct(
            [("sku", pa.string()), ("qty", pa.decimal128(20, 0))]))]))]))
    [encoded] = encode_batches(iter([batch]), plans, schema)
    framed = encoded.column("value").to_pylist()
    assert framed[2] is None
    read = ProtobufDeserializer(order_class, {"use.deprecated.format": False})
    first, second = (read(v, ctx) for v in framed[:2])
    assert (first.id, first.state, first.line.sku, first.line.qty) == (5, 1, "x", 2**64 - 1)
    assert (second.id, second.HasField("line")) == (6, False)
    wrong = StructType([StructField("value", StructType([StructField("nope", LongType())]))])
    with pytest.raises(RegistryError, match="nope"):
        plan_sink(formats, wrong)


def test_unframed_record_fails_the_query_or_is_null_when_permissive(spark, broker, registry, topic):
    create_topic(broker.bootstrap, topic)
    write_avro(broker, registry, topic, ORDER_V1, [order(1), b"not framed", order(2)])

    with pytest.raises(Exception, match=r"offset 1 is not framed by a schema registry serializer.*mode=PERMISSIVE"):
        typed(spark, broker, topic).collect()
    rows = typed(spark, broker, topic, mode="PERMISSIVE").orderBy("offset").collect()
    assert [utc(v) if v else v for v in as_dicts(rows)] == [order(1), None, order(2)]


def test_bad_typed_options_are_refused_at_load(spark, broker, topic):
    with pytest.raises(Exception, match="schema.registry.url' must be specified"):
        read(spark, broker.bootstrap, subscribe=topic, valueFormat="avro")
    with pytest.raises(Exception, match="valueSubject"):
        read(spark, broker.bootstrap, subscribePattern=f"{topic}.*", valueFormat="avro",
             **{"schema.registry.url": broker.registry_url})
    with pytest.raises(Exception, match="subject .*-value"):  # nothing registered for the topic yet
        read(spark, broker.bootstrap, subscribe=topic, valueFormat="avro",
             **{"schema.registry.url": broker.registry_url})


def test_format_options_parse():
    from strom.spark.formats import FormatOptionError, Registry, column_formats

    got = column_formats({"valueformat": "Avro", "schema.registry.url": "http://r:8081/", "keyformat": "json",
                          "keysubject": "k", "valueschemaversion": "3", "mode": "permissive"}, ("t",), "source")
    assert [(f.column, f.kind, f.subject, f.version, f.permissive) for f in got] == [
        ("key", "json", "k", None, True), ("value", "avro", "t-value", 3, True)]
    assert got[0].registry == Registry("http://r:8081")
    for bad in ({"valueformat": "xml"}, {"valueformat": "avro", "schema.registry.url": "r:8081"},
                {"valueformat": "avro", "schema.registry.url": "http://r", "valueschemaversion": "0"},
                {"valueformat": "avro", "schema.registry.url": "http://r", "mode": "dropmalformed"}):
        with pytest.raises(FormatOptionError):
            column_formats(bad, ("t",), "source")
    with pytest.raises(FormatOptionError, match="valueSubject"):  # a sink writing a topic column
        column_formats({"valueformat": "json", "schema.registry.url": "http://r"}, (), "sink")
    with pytest.raises(StromOptionError, match="'valueFormat' must be one of"):  # as the source reports it
        source_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "valueformat": "xml"}, batch=True)


# -- the decoders alone (no Spark, no registry): bad schemas and payloads are clear errors ----------

def _fetched(schema_id: int, schema: dict, kind: str = "AVRO"):
    from strom.spark.registry import FetchedSchema

    return FetchedSchema(schema_id, kind, json.dumps(schema))


def test_avro_types_without_a_spark_column_are_refused():
    from strom.schemas.parsed import SchemaError
    from strom.spark.typed_avro import AvroColumn

    node = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
    with pytest.raises(SchemaError, match="recursive"):
        AvroColumn(_fetched(1, node))
    mixed = {"type": "record", "name": "M", "fields": [{"name": "v", "type": ["null", "int", "string"]}]}
    with pytest.raises(SchemaError, match="union of int, string"):
        AvroColumn(_fetched(2, mixed))
    numbers = {"type": "record", "name": "N", "fields": [{"name": "v", "type": ["int", "double"]}]}
    assert AvroColumn(_fetched(3, numbers)).data_type == StructType([StructField("v", DoubleType(), False)])


def test_avro_payloads_that_do_not_fit_are_schema_errors():
    from strom.schemas.parsed import SchemaError
    from strom.spark.typed_avro import AvroColumn

    reader = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"},
                                                      {"name": "tag", "type": "string", "default": "none"}]}
    column = AvroColumn(_fetched(10, reader))
    same = column.decoder(_fetched(10, reader))
    assert same(b"\x02\x02a") == {"id": 1, "tag": "a"}
    for garbage in (b"", b"\x02", b"\x02\x02a\x00", b"\x02\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"):
        with pytest.raises(SchemaError):
            same(garbage)
    older = column.decoder(_fetched(11, {"type": "record", "name": "R", "fields": [{"name": "id", "type": "int"}]}))
    assert older(b"\x04") == {"id": 2, "tag": "none"}  # int promoted to long, the default filled in
    with pytest.raises(SchemaError, match="cannot be read with the reader schema"):
        column.decoder(_fetched(12, {"type": "record", "name": "R", "fields": [{"name": "id", "type": "string"}]}))
    # A writer whose array items take no bytes: a count of a billion nulls is refused, not allocated.
    nulls = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"},
                                                     {"name": "x", "type": {"type": "array", "items": "null"}}]}
    billion = b"\x80\xa8\xd6\xb9\x07"  # zigzag varint of 10**9
    with pytest.raises(SchemaError):
        column.decoder(_fetched(13, nulls))(b"\x02" + billion + b"\x00")

