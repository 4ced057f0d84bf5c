"""Options, columns and failures as Spark's own Kafka connector takes them, with real PySpark
and brokers: what a job written for `format("kafka")` passes must work, or fail naming the
job's own option and the brokers' own reason."""

from __future__ import annotations

import json

import pytest
import trustme
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import functions as F

from strom.spark.offsets import Admin
from strom.spark.options import source_options
from strom.testing import BrokerProcess, consume_all, create_topic

from .conftest import produce, read

PASSWORD = "alice-secret"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A broker with a SASL_PLAINTEXT listener (PLAIN user alice) and an SSL listener whose
    certificate names broker.example.com only, so a client checking host names refuses it at
    127.0.0.1."""
    pki = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(pki / "ca.pem"))
    ca.issue_cert("broker.example.com").private_key_and_cert_chain_pem.write_to_path(str(pki / "server.pem"))
    jaas = f'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="{PASSWORD}";'
    with BrokerProcess(overrides={
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki / "server.pem")}) as broker:
        broker.ca = str(pki / "ca.pem")
        yield broker


def sasl(broker: BrokerProcess, password: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}",
            "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                                      f'username="alice" password="{password}";'}


# --- options -------------------------------------------------------------------------------

def test_min_partitions_rounds_as_java_does(spark, broker, topic):
    """4 partitions x 100 records, minPartitions=10: each partition's share is 2.5 tasks,
    which Spark rounds (Math.round) to 3: 12 tasks, each a contiguous piece."""
    create_topic(broker.bootstrap, topic, partitions=4)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i, partition=i % 4) for i in range(400)])
    df = read(spark, broker.bootstrap, subscribe=topic, minPartitions="10")
    assert df.rdd.getNumPartitions() == 12
    pieces = df.rdd.mapPartitions(lambda rows: [sorted((r.partition, r.offset) for r in rows)]).collect()
    assert sorted(len(p) for p in pieces) == [33] * 8 + [34] * 4
    assert all(p[-1][1] - p[0][1] == len(p) - 1 and len({tp for tp, _ in p}) == 1 for p in pieces)
    both = read(spark, broker.bootstrap, subscribe=topic, minPartitions="10", maxRecordsPerPartition="30")
    assert both.rdd.getNumPartitions() == 16  # 4 pieces of 25 per partition, already more than 10


def test_one_options_dict_for_source_and_sink(spark, broker, topic):
    """Spark jobs often keep one options dict for reading and writing: the sink ignores the
    source's options and consumer settings, the source the sink's, as Spark's connector does;
    and Java settings Spark users pass are taken."""
    create_topic(broker.bootstrap, topic + "-in", partitions=2)
    create_topic(broker.bootstrap, topic + "-out")
    produce(broker.bootstrap, topic + "-in", [dict(value=b"%d" % i, partition=i % 2) for i in range(50)])
    shared = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic + "-in", "startingOffsets": "earliest",
              "failOnDataLoss": "false", "includeHeaders": "true", "kafka.group.id": "etl-" + topic,
              "kafka.auto.offset.reset": "earliest", "kafka.key.serializer": "org.apache.kafka.common.StringSerializer",
              "kafka.max.poll.records": "7", "kafka.fetch.max.bytes": "65536", "kafka.fetch.min.bytes": "1",
              "kafka.max.partition.fetch.bytes": "4096", "kafka.ssl.endpoint.identification.algorithm": "",
              "kafka.partition.assignment.strategy": "org.apache.kafka.clients.consumer.RangeAssignor",
              "kafka.exclude.internal.topics": "true", "kafka.linger.ms": "5", "topic": topic + "-out"}
    source = {k: v for k, v in shared.items() if k != "kafka.auto.offset.reset"}
    sink = {k: v for k, v in shared.items() if k != "kafka.key.serializer"}
    df = spark.read.format("strom").options(**source).load()
    df.select("value").write.format("strom").options(**sink).save()
    assert sorted(int(m.value()) for m in consume_all(broker.bootstrap, topic + "-out")) == list(range(50))
    # Each role still refuses what Spark's connector refuses for it.
    with pytest.raises(Exception, match="'kafka.auto.offset.reset' is not supported"):
        spark.read.format("strom").options(**shared).load()
    with pytest.raises(Exception, match="'kafka.key.serializer' is not supported"):
        df.select("value").write.format("strom").options(**shared).save()


def test_exclude_internal_topics_for_patterns(broker, topic):
    """subscribePattern leaves Kafka's internal topics out unless kafka.exclude.internal.topics
    is false, as the Java consumer does."""
    create_topic(broker.bootstrap, topic)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-" + topic})
    c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)  # __consumer_offsets exists now
    c.close()
    pattern = f"(__consumer_offsets|{topic})"

    def topics(**extra: str) -> set[str]:
        opts = source_options({"kafka.bootstrap.servers": broker.bootstrap, "subscribepattern": pattern, **extra},
                              batch=True)
        return {t for t, _ in Admin.of(opts).partitions(opts, batch=True)}

    assert topics() == {topic}
    assert topics(**{"kafka.exclude.internal.topics": "false"}) == {topic, "__consumer_offsets"}
    with pytest.raises(ValueError, match="kafka.exclude.internal.topics must be true or false"):
        topics(**{"kafka.exclude.internal.topics": "sometimes"})


def test_max_request_size_below_librdkafkas_minimum(spark, broker, topic):
    """max.request.size=500 is a valid Java setting that librdkafka cannot take (its
    message.max.bytes starts at 1000): the sink checks it itself, naming the option."""
    create_topic(broker.bootstrap, topic)
    sink = {"kafka.bootstrap.servers": broker.bootstrap, "topic": topic, "kafka.max.request.size": "500"}
    spark.createDataFrame([("x" * 300,)], "value string").write.format("strom").options(**sink).save()
    assert [len(m.value()) for m in consume_all(broker.bootstrap, topic)] == [300]
    with pytest.raises(Exception, match=r"larger than kafka.max.request.size=500") as refused:
        spark.createDataFrame([("x" * 600,)], "value string").write.format("strom").options(**sink).save()
    assert "message.max.bytes" not in str(refused.value)
    with pytest.raises(Exception, match='Invalid value for configuration property "kafka.batch.size"'):
        spark.createDataFrame([("x",)], "value string").write.format("strom") \
            .options(**sink, **{"kafka.batch.size": "lots"}).save()


def test_headers_built_in_spark_are_accepted(spark, broker, topic):
    """F.array(F.struct(...)) of literals makes non-nullable fields; the sink compares types as
    Spark's KafkaWriter does, nullability aside."""
    create_topic(broker.bootstrap, topic)
    df = spark.range(3).select(F.col("id").cast("string").alias("value"),
                               F.array(F.struct(F.lit("a").alias("key"), F.lit(b"1").alias("value"))).alias("headers"))
    assert "headers" in df.schema.names and not df.schema["headers"].dataType.elementType["key"].nullable
    df.write.format("strom").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic).save()
    got = consume_all(broker.bootstrap, topic)
    assert sorted((m.value(), m.headers()) for m in got) == [(b"%d" % i, [("a", b"1")]) for i in range(3)]
    wrong = spark.range(1).select(F.lit("v").alias("value"), F.array(F.lit("h")).alias("headers"))
    with pytest.raises(Exception, match="headers column must be of type array<struct<key:string,value:binary>>"):
        wrong.write.format("strom").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic).save()


# --- the brokers' reasons ------------------------------------------------------------------

def test_wrong_sasl_password_says_so(spark, secure, topic):
    create_topic(secure.bootstrap, topic)
    produce(secure.bootstrap, topic, [dict(value=b"x")])
    assert spark.read.format("strom").options(**sasl(secure, PASSWORD), subscribe=topic).load().count() == 1
    wrong = sasl(secure, "nope")
    with pytest.raises(Exception, match="Invalid username or password") as failed:
        spark.read.format("strom").options(**wrong, subscribe=topic).load().count()
    assert "transport failure" not in str(failed.value)
    with pytest.raises(Exception, match="Invalid username or password"):
        spark.createDataFrame([("v",)], "value string").write.format("strom").options(**wrong, topic=topic).save()


def test_ssl_endpoint_identification_algorithm_empty_turns_host_checks_off(spark, secure, topic):
    """Spark jobs set kafka.ssl.endpoint.identification.algorithm to "" to skip the host name
    check; librdkafka spells that "none". Left at its default, the check fails with TLS's
    reason, not a timeout."""
    create_topic(secure.bootstrap, topic)
    produce(secure.bootstrap, topic, [dict(value=b"%d" % i) for i in range(5)])
    tls = {"kafka.bootstrap.servers": f"127.0.0.1:{secure.ports['SSL']}", "kafka.security.protocol": "SSL",
           "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": secure.ca, "subscribe": topic}
    # (and a fetch.max.bytes below librdkafka's message.max.bytes, which Java takes)
    off = {**tls, "kafka.ssl.endpoint.identification.algorithm": "", "kafka.fetch.max.bytes": "65536"}
    assert sorted(int(r.value) for r in spark.read.format("strom").options(**off).load().collect()) == list(range(5))
    with pytest.raises(Exception, match="(?i)certificate verify failed|hostname|broker.example.com"):
        spark.read.format("strom").options(**tls).load().count()


# --- offsets JSON in the shared dict --------------------------------------------------------

def test_offsets_json_with_sink_options_present(spark, broker, topic):
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i, partition=i % 2) for i in range(10)])
    df = read(spark, broker.bootstrap, subscribe=topic, topic="somewhere-else", transactionalIdPrefix="p",
              startingOffsets=json.dumps({topic: {"0": 2, "1": -2}}))
    assert df.count() == 8
