"""Direct reads of tiered offsets (strom.spark.remote) against a real broker and a real S3
server (SeaweedFS): a topic's rolled segments, as the broker wrote them, are copied to the store
with their indexes and their COPY_SEGMENT_STARTED / FINISHED records written to
`__remote_log_metadata`, as a tiering broker does; then the log start is moved past them
(DeleteRecords), so that only the store still has those offsets: a read that returns them read
them from the store."""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from strom.client import Connection
from strom.log.remote import (
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
)
from strom.log.remote.records import serialize
from strom.remote import storage_from_config
from strom.s3_server import S3Server
from strom.spark import remote
from strom.spark.fetch import Rows, read_range
from strom.spark.options import StromDataLossError, StromOptionError, source_options
from strom.spark.ranges import Range
from strom.testing import (
    BrokerProcess,
    create_topic,
    free_ports,
    produce_acked,
    unique_name,
    wait_for,
)

PLAIN, ABORTED, COMMITTED, TAIL = 400, 40, 40, 100


@pytest.fixture(scope="module")
def s3():
    with S3Server(ports=free_ports) as server:
        yield server


def _produce(bootstrap: str, topic: str) -> None:
    for begin in range(0, PLAIN, 50):  # batches of 50: segments of a few batches each
        produce_acked(bootstrap, topic, [b"plain-%05d" % i for i in range(begin, begin + 50)])
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("txn"), "linger.ms": 0})
    p.init_transactions(30)
    for kind, n in (("aborted", ABORTED), ("committed", COMMITTED)):
        p.begin_transaction()
        for i in range(n):
            p.produce(topic, b"%s-%05d" % (kind.encode(), i), partition=0)
            if i % 7 == 0:
                p.flush(10)  # several batches per transaction
        p.flush(10)
        (p.abort_transaction if kind == "aborted" else p.commit_transaction)(30)
    for begin in range(0, TAIL, 10):
        produce_acked(bootstrap, topic, [b"tail-%05d" % i for i in range(begin, begin + 10)])


def _tier(broker, topic: str, store, metadata_topic_producer: Producer) -> int:
    """Copy every rolled segment of topic-0 to the store, FINISHED; returns the first offset not tiered."""
    conn = Connection("127.0.0.1", broker.port, 10, "test")
    try:
        body = remote._metadata(conn, [topic])
    finally:
        conn.close()
    topic_id = body.topics[0].topic_id
    epoch = body.topics[0].partitions[0].leader_epoch
    directory = Path(broker.data_dir) / "logs" / f"{topic}-0"
    logs = sorted(directory.glob("*.log"))
    starts = [int(p.stem) for p in logs]
    for path, start, nxt in zip(logs[:-1], starts, starts[1:], strict=False):
        meta = RemoteLogSegmentMetadata(RemoteLogSegmentId(topic_id, topic, 0), start, nxt - 1, 0, 0,
                                        int(time.time() * 1000), ((epoch, start),), path.stat().st_size)
        txn = path.with_suffix(".txnindex")
        store.copy_log_segment_data(meta, LogSegmentData(
            path, path.with_suffix(".index"), path.with_suffix(".timeindex"),
            txn if txn.exists() and txn.stat().st_size else None, b"", b""))
        for record in (meta, RemoteLogSegmentMetadataUpdate(meta.segment_id, int(time.time() * 1000),
                                                            RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0)):
            metadata_topic_producer.produce(remote.METADATA_TOPIC, serialize(record), partition=0)
    metadata_topic_producer.flush(10)
    return starts[-1]


@pytest.fixture(scope="module")
def tiered(broker, s3):
    """Two topics tiered alike: `gone` has its log start moved past its tiered segments, `kept` not."""
    try:
        create_topic(broker.bootstrap, remote.METADATA_TOPIC, 1)
    except Exception:  # noqa: BLE001 - another module's test made it first
        pass
    config = s3.rsm_config(key_prefix=f"{uuid.uuid4().hex[:8]}/")
    store = storage_from_config(config)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    out = {"config": config, "store": store}
    for name in ("gone", "kept"):
        topic = unique_name(f"tiered-{name}")
        create_topic(broker.bootstrap, topic, 1, config={"segment.bytes": "3000"})
        _produce(broker.bootstrap, topic)
        top = _tier(broker, topic, store, producer)
        assert top > PLAIN  # the transactions are in tiered segments
        out[name] = (topic, top)
    # What the broker has of both, before `gone` loses its tiered part.
    out["expected"] = {level: _broker_rows(broker, out["kept"][0], level)
                       for level in ("read_uncommitted", "read_committed")}
    topic, top = out["gone"]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_records([TopicPartition(topic, 0, top)])[TopicPartition(topic, 0, top)].result(30)
    yield out
    store.close()


def _options(broker, topic: str, config: dict, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic,
            "startingoffsets": f'{{"{topic}":{{"0":0}}}}', **config, **{k.lower(): v for k, v in extra.items()}}


def _broker_rows(broker, topic: str, level: str) -> list[tuple]:
    opts = source_options({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic,
                           "kafka.isolation.level": level}, batch=True)
    end = _end(broker, topic, level)
    return _rows(read_range(opts, Range(topic, 0, 0, end)))


def _end(broker, topic: str, level: str) -> int:
    from strom.spark.wire import PartitionClient

    client = PartitionClient(broker.bootstrap, topic, 0, 10)
    try:
        return client.watermarks(1 if level == "read_committed" else 0)[1]
    finally:
        client.close()


def _rows(batches) -> list[tuple]:
    table = pa.Table.from_batches(list(batches))
    return sorted(zip(*(table.column(c).to_pylist() for c in ("offset", "key", "value", "timestamp",
                                                                  "timestampType")), strict=True))


def _values(rows: list[tuple]) -> list[bytes]:
    return [r[2] for r in rows]


def _spark_rows(spark, options: dict) -> list[tuple]:
    df = spark.read.format("strom").options(**options).load()
    return sorted((r.offset, r.key, bytes(r.value), r.timestamp, r.timestampType) for r in df.collect())


def _direct(broker, tiered, name: str, level: str = "read_uncommitted", **extra: str):
    topic, _ = tiered[name]
    opts = source_options(_options(broker, topic, tiered["config"], **{"kafka.isolation.level": level}, **extra),
                          batch=True)
    end = _end(broker, topic, level)
    planned = remote.plan(opts, [Range(topic, 0, 0, end)])
    return opts, planned


def _read_planned(opts, planned) -> list[tuple]:
    out = []
    for part in planned:
        if isinstance(part, remote.TieredRange):
            out += _rows(remote.read_tiered(opts, part, lambda r: read_range(opts, r), Rows, 500))
        else:
            out += _rows(read_range(opts, part))
    return sorted(out)


def test_spark_reads_tiered_offsets_from_the_store_as_the_broker_gave_them(spark, broker, tiered):
    topic, top = tiered["gone"]
    for level in ("read_uncommitted", "read_committed"):
        got = _spark_rows(spark, _options(broker, topic, tiered["config"], **{"kafka.isolation.level": level}))
        expected = tiered["expected"][level]
        # Same offsets, keys, values and timestamp types as the kept topic's, produced alike.
        assert [(o, k, v, t) for o, k, v, _, t in got] == [(o, k, v, t) for o, k, v, _, t in expected]
        assert got[0][0] == 0 and top > 0
        values = _values(got)
        assert sum(v.startswith(b"committed") for v in values) == COMMITTED
        assert sum(v.startswith(b"aborted") for v in values) == (ABORTED if level == "read_uncommitted" else 0)
        assert len(values) == PLAIN + COMMITTED + TAIL + (ABORTED if level == "read_uncommitted" else 0)
    # Through the broker alone, the tiered offsets are gone: the direct read did not use it for them.
    with pytest.raises(Exception, match="Some data may have been lost"):
        _spark_rows(spark, _options(broker, topic, tiered["config"], directRemoteReads="false"))


def test_plan_keeps_finished_segments_and_reads_in_small_chunks(broker, tiered):
    topic, top = tiered["kept"]
    opts, planned = _direct(broker, tiered, "kept", remoteReadChunkBytes="700")
    assert opts.remote_chunk_bytes == 700  # less than a batch: every batch takes more than one GET
    [part] = planned
    assert isinstance(part, remote.TieredRange)
    assert part.segments[0].start_offset == 0 and max(s.end_offset for s in part.segments) == top - 1
    assert _read_planned(opts, planned) == tiered["expected"]["read_uncommitted"]


def test_read_committed_drops_aborted_transactions_by_the_transaction_index(broker, tiered):
    opts, planned = _direct(broker, tiered, "gone", "read_committed")
    [part] = planned
    assert part.aborted and all(last < tiered["gone"][1] for _, _, last in part.aborted)
    got = _read_planned(opts, planned)
    assert [r[:3] for r in got] == [r[:3] for r in tiered["expected"]["read_committed"]]
    assert not any(v.startswith(b"aborted") for v in _values(got))


def test_a_segment_missing_or_corrupt_in_the_store_is_read_through_the_broker(broker, tiered):
    topic, _ = tiered["kept"]
    opts, planned = _direct(broker, tiered, "kept")
    [part] = planned
    store = tiered["store"]
    assert len(part.segments) >= 3, part.segments
    missing, corrupt = part.segments[1], part.segments[2]
    key = store.key(corrupt, ".log")
    data = bytearray(store.get(key))
    data[-3] ^= 0xFF  # a record's byte: the batch's CRC no longer matches
    store.put(key, bytes(data))
    store.delete(store.key(missing, ".log"))
    assert _read_planned(opts, planned) == tiered["expected"]["read_uncommitted"]


def test_a_segment_gone_from_the_store_and_the_broker_is_data_loss(broker, tiered):
    opts, planned = _direct(broker, tiered, "gone")
    [part] = planned
    store = tiered["store"]
    gone = part.segments[0]
    store.delete(store.key(gone, ".log"))
    with pytest.raises(StromDataLossError, match="log now starts at"):
        _read_planned(opts, planned)
    lenient = dataclasses.replace(opts, fail_on_data_loss=False)
    got = _read_planned(lenient, planned)
    assert [r[0] for r in got] == [r[0] for r in tiered["expected"]["read_uncommitted"] if r[0] > gone.end_offset]


def test_segments_outside_the_leaders_epoch_lineage_are_not_planned(broker, tiered):
    topic, _ = tiered["kept"]
    _, before = _direct(broker, tiered, "kept")
    first = before[0].segments[0]
    # A copy of the first offsets by a leader of epoch 7, which this partition never had (an
    # unclean election's lost lineage): finished, but never used.
    stray = RemoteLogSegmentMetadata(
        RemoteLogSegmentId(first.segment_id.topic_id, topic, 0), 0, first.end_offset + 5, 0, 0,
        int(time.time() * 1000), ((7, 0),), first.size_bytes)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for record in (stray, RemoteLogSegmentMetadataUpdate(stray.segment_id, int(time.time() * 1000),
                                                         RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0)):
        producer.produce(remote.METADATA_TOPIC, serialize(record), partition=0)
    producer.flush(10)
    _, after = _direct(broker, tiered, "kept")
    assert {s.segment_id.id for s in after[0].segments} == {s.segment_id.id for s in before[0].segments}
    assert stray.segment_id.id not in {s.segment_id.id for s in after[0].segments}


def test_lineage_rules():
    sid = remote.SegmentId(uuid.uuid4(), "t", 0, uuid.uuid4())
    seg = remote.Segment(sid, 100, 199, 1000, ((2, 100), (3, 150)))
    leader = {1: (1, 100), 2: (2, 150), 3: (3, 400)}  # epoch -> (epoch, end offset)
    assert remote.within_lineage(seg, leader.__getitem__)
    assert not remote.within_lineage(seg, {**leader, 2: (2, 140)}.__getitem__)  # epoch 3 starts elsewhere
    assert not remote.within_lineage(seg, {**leader, 3: (3, 180)}.__getitem__)  # truncated inside the segment
    assert not remote.within_lineage(seg, {**leader, 3: (2, 150)}.__getitem__)  # no epoch 3 at the leader
    assert not remote.within_lineage(seg, {**leader, 1: (1, 120)}.__getitem__)  # epoch 2 starts after 100
    assert remote.within_lineage(seg, {**leader, 1: (-1, -1)}.__getitem__)  # older epochs forgotten
    empty = remote.Segment(sid, 100, 199, 1000, ((2, 100), (3, 100)))  # epoch 2 holds nothing
    assert remote.within_lineage(empty, {2: (2, 100), 3: (3, 400)}.__getitem__)


def test_options(broker):
    base = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": "t"}
    opts = source_options({**base, "rsm.config.storage.root": "/tmp/x"}, batch=True)
    assert opts.direct_remote_reads and opts.remote_storage == {"rsm.config.storage.root": "/tmp/x"}
    assert not source_options({**base, "rsm.config.storage.root": "/x", "directremotereads": "false"},
                              batch=True).direct_remote_reads
    assert not source_options(base, batch=True).direct_remote_reads
    with pytest.raises(StromOptionError, match="needs the remote store"):
        source_options({**base, "directremotereads": "true"}, batch=True)
    with pytest.raises(StromOptionError, match="PLAINTEXT"):
        source_options({**base, "rsm.config.storage.root": "/x", "directremotereads": "true",
                        "kafka.security.protocol": "SSL"}, batch=True)
    with pytest.raises(StromOptionError, match="remoteReadChunk|remotereadchunkbytes"):
        source_options({**base, "remotereadchunkbytes": "0"}, batch=True)


# --- end to end: a broker that tiers the topic itself -------------------------------------------

EARLIEST_LOCAL = -4


@pytest.fixture(scope="module")
def tiering_broker(s3, tmp_path_factory):
    overrides = {"remote.log.storage.system.enable": "true", **s3.rsm_config(key_prefix="e2e/"),
                 "remote.log.manager.task.interval.ms": "200", "log.retention.check.interval.ms": "200",
                 "log.segment.delete.delay.ms": "0", "rlmm.config.remote.log.metadata.topic.num.partitions": "3"}
    with BrokerProcess(tmp_path_factory.mktemp("tiering"), overrides) as b:
        yield b


def test_a_topic_the_broker_tiered_reads_the_same_directly_and_through_the_broker(spark, tiering_broker, s3):
    b = tiering_broker
    topic = unique_name("tiered-e2e")
    create_topic(b.bootstrap, topic, 1, config={"remote.storage.enable": "true", "segment.bytes": "2048",
                                                 "local.retention.ms": "1"})
    _produce(b.bootstrap, topic)
    txns_end = PLAIN + ABORTED + COMMITTED + 2
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "offsets"})
    try:
        wait_for(lambda: consumer.offsets_for_times([TopicPartition(topic, 0, EARLIEST_LOCAL)],
                                                    timeout=10)[0].offset > txns_end, timeout=60)
    finally:
        consumer.close()
    config = s3.rsm_config(key_prefix="e2e/")
    opts = source_options(_options(b, topic, config), batch=True)
    [part] = remote.plan(opts, [Range(topic, 0, 0, _end(b, topic, "read_uncommitted"))])
    assert isinstance(part, remote.TieredRange) and part.segments[0].start_offset == 0
    for level in ("read_uncommitted", "read_committed"):
        direct = _spark_rows(spark, _options(b, topic, config, **{"kafka.isolation.level": level}))
        broker_only = _spark_rows(spark, _options(b, topic, config, directRemoteReads="false",
                                                  **{"kafka.isolation.level": level}))
        assert direct == broker_only
        aborted = sum(v.startswith(b"aborted") for v in _values(direct))
        assert aborted == (ABORTED if level == "read_uncommitted" else 0)
        assert len(direct) == PLAIN + COMMITTED + TAIL + aborted
