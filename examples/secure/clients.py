"""Each Python client library against a SASL_SSL + SCRAM listener (config/secure.properties):
write three records as a user and read them back.

    .venv/bin/python examples/secure/clients.py --client confluent-kafka
    .venv/bin/python examples/secure/clients.py --client kafka-python --bootstrap 127.0.0.1:9093
    .venv/bin/python examples/secure/clients.py --client aiokafka --user alice --password alice-secret
    .venv/bin/python examples/secure/clients.py --client pyspark

The security settings are each library's own names for the same four things: TLS with the CA
that signed the broker's certificate, SCRAM-SHA-512, a user, its password.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid

RUN = uuid.uuid4().hex[:8]  # this run's records, told apart from earlier runs' in the topic


def record(client: str, i: int) -> bytes:
    return f"{client}-{RUN}-{i}".encode()


def written_by(client: str, values: list[bytes]) -> int:
    """How many of this run's three records of `client` are among `values`."""
    return len({v for v in values if v.startswith(f"{client}-{RUN}-".encode())})


def confluent_kafka(bootstrap: str, ca: str, user: str, password: str, topic: str) -> list[bytes]:
    from confluent_kafka import Consumer, Producer

    secure = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": ca,
              "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password}
    producer = Producer(secure)
    failures = []
    for i in range(3):
        producer.produce(topic, value=record("confluent-kafka", i), on_delivery=lambda err, _m: err and failures.append(err))
    if producer.flush(30) or failures:
        sys.exit(f"confluent-kafka: records not delivered: {failures[:1]}")
    consumer = Consumer({**secure, "group.id": f"example-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values, deadline = [], time.monotonic() + 30
    # Until all three are read: they went to any of the topic's partitions, in any order.
    while time.monotonic() < deadline and written_by("confluent-kafka", values) < 3:
        values += [m.value() for m in consumer.consume(10, 1.0) if not m.error()]
    consumer.close()
    return values


def kafka_python(bootstrap: str, ca: str, user: str, password: str, topic: str) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer

    secure = {"bootstrap_servers": bootstrap, "security_protocol": "SASL_SSL", "ssl_cafile": ca,
              "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": user, "sasl_plain_password": password}
    producer = KafkaProducer(**secure)
    for i in range(3):
        producer.send(topic, record("kafka-python", i)).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, group_id=f"example-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest",
                             consumer_timeout_ms=5000, **secure)
    values = [m.value for m in consumer]
    consumer.close()
    return values


def aiokafka(bootstrap: str, ca: str, user: str, password: str, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    async def run() -> list[bytes]:
        secure = {"bootstrap_servers": bootstrap, "security_protocol": "SASL_SSL",
                  "ssl_context": create_ssl_context(cafile=ca), "sasl_mechanism": "SCRAM-SHA-512",
                  "sasl_plain_username": user, "sasl_plain_password": password}
        producer = AIOKafkaProducer(**secure)
        await producer.start()
        try:
            for i in range(3):
                await producer.send_and_wait(topic, record("aiokafka", i))
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, group_id=f"example-{uuid.uuid4().hex[:8]}",
                                    auto_offset_reset="earliest", **secure)
        await consumer.start()
        try:
            values: list[bytes] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and written_by("aiokafka", values) < 3:
                batch = await consumer.getmany(timeout_ms=1000)
                values += [m.value for messages in batch.values() for m in messages]
            return values
        finally:
            await consumer.stop()

    return asyncio.run(run())


def pyspark(bootstrap: str, ca: str, user: str, password: str, topic: str) -> list[bytes]:
    """The strom data source, with the security settings a Spark job gives Spark's Kafka
    connector: Java client names under `kafka.`."""
    import os

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need the Python with strom
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    secure = {"kafka.bootstrap.servers": bootstrap, "kafka.security.protocol": "SASL_SSL",
              "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": ca,
              "kafka.sasl.mechanism": "SCRAM-SHA-512",
              "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                                        f'username="{user}" password="{password}";'}
    rows = spark.createDataFrame([(record("pyspark", i).decode(),) for i in range(3)], "value string")
    rows.write.format("strom").options(**secure).option("topic", topic).mode("append").save()
    read = spark.read.format("strom").options(**secure).option("subscribe", topic) \
        .option("kafka.group.id", f"example-{uuid.uuid4().hex[:8]}").load()
    values = [r.value for r in read.select("value").collect()]
    spark.stop()
    return values


CLIENTS = {"confluent-kafka": confluent_kafka, "kafka-python": kafka_python, "aiokafka": aiokafka,
           "pyspark": pyspark}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=sorted(CLIENTS), required=True)
    parser.add_argument("--bootstrap", default="127.0.0.1:9093")
    parser.add_argument("--ca", default="secrets/ca.pem")
    parser.add_argument("--user", default="alice")
    parser.add_argument("--password", default="alice-secret")
    parser.add_argument("--topic", default="orders")
    args = parser.parse_args()
    values = CLIENTS[args.client](args.bootstrap, args.ca, args.user, args.password, args.topic)
    read_back = written_by(args.client, values)
    print(f"{args.client}: wrote 3 records to {args.topic} as {args.user} and read back {read_back}")
    return 0 if read_back == 3 else 1


if __name__ == "__main__":
    sys.exit(main())
