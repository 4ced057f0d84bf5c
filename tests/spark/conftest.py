"""PySpark against a real broker process: one broker for the whole session, and one
SparkSession at a time (a process holds one SparkContext): local[2,2] for most tests, shared
until a module on a standalone cluster (`spark_on`) replaces it with the cluster's for its
tests; the next test that asks for `spark` gets local[2,2] back. Each test uses its own,
uniquely named topics and checkpoint directories; a failed task is retried once (local[2,2]).

Helpers: `produce` (confluent-kafka, delivery reports back), `read` (a batch read through the
`strom` source), `end_offsets`, `finished`; `create_topic` and `consume_all` come from
`strom.testing`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import IsolationLevel, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql import SparkSession

import strom.spark
from strom.testing import BrokerProcess, free_ports, report_broker_logs, unique_name

pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)


@pytest.fixture(scope="session")
def broker():
    # With the schema registry on (typed columns, test_schema_registry.py): `registry_url`.
    registry_url = f"http://127.0.0.1:{free_ports(1)[0]}"
    with BrokerProcess(overrides={"auto.create.topics.enable": "true", "num.partitions": "2",
                                  "schema.registry.listeners": registry_url}) as proc:
        proc.registry_url = registry_url
        yield proc


_current: dict[str, object] = {}  # the live session, and what it is for


def spark_on(kind: str, make: Callable[[], SparkSession]) -> SparkSession:
    """The session for `kind` ("local", or a cluster's name), made by `make` unless it is the
    live one; another kind's session is stopped first."""
    if _current.get("kind") == kind:
        return _current["session"]
    if _current:
        _current.pop("session").stop()
        _current.clear()
    session = make()
    session.sparkContext.setLogLevel("ERROR")
    _current.update(kind=kind, session=session)
    return session


def release(kind: str) -> None:
    """Stop the live session if it is `kind`'s."""
    if _current.get("kind") == kind:
        _current.pop("session").stop()
        _current.clear()


def _local() -> SparkSession:
    # local[2,2]: two threads, and one retry of a failed task (as on a cluster, Spark retries).
    return strom.spark.local_session("local[2,2]", "strom-tests", **{"spark.sql.shuffle.partitions": "2"})


@pytest.fixture(scope="session", autouse=True)
def _stop_spark():
    yield
    if _current:
        _current.pop("session").stop()


@pytest.fixture
def spark():
    return spark_on("local", _local)


@contextmanager
def one_row_batches(spark: SparkSession) -> Iterator[None]:
    """Rows go to Python workers (the check, the sink) in batches of one, not of 100 or 10,000."""
    settings = {"spark.sql.execution.arrow.maxRecordsPerBatch": "1",
                "spark.sql.execution.python.udf.maxRecordsPerBatch": "1"}
    before = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


@pytest.fixture
def row_at_a_time(spark):
    with one_row_batches(spark):
        yield


@pytest.fixture
def topic(request) -> str:
    return unique_name(request.node.name)



def produce(bootstrap: str, topic: str, records: Iterable[dict], **conf) -> list[Message]:
    """Produce dicts of produce() keyword arguments; the delivery reports, in produce order."""
    reports: dict[int, tuple] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    n = 0
    for n, record in enumerate(records, 1):
        producer.produce(topic, on_delivery=lambda err, msg, i=n: reports.__setitem__(i, (err, msg)), **record)
    assert producer.flush(30) == 0
    assert [err for err, _ in reports.values() if err] == []
    return [reports[i][1] for i in range(1, n + 1)]


def read(spark, bootstrap: str, **options):
    """A batch DataFrame of the `strom` source."""
    reader = spark.read.format("strom").option("kafka.bootstrap.servers", bootstrap)
    return reader.options(**options).load()


def end_offsets(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """(last stable offset, high watermark) of each partition."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    parts = [TopicPartition(topic, p) for p in admin.list_topics(topic, timeout=10).topics[topic].partitions]
    out = []
    for tp in parts:
        lso, hw = (admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level)[tp].result(15).offset
                   for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED))
        out.append((lso, hw))
    return out


def finished(query):
    """Wait for a Trigger.AvailableNow query to end (failing after 120 s); the query."""
    try:
        assert query.awaitTermination(120), "query did not finish in 120 s"
    finally:
        query.stop()
    return query
