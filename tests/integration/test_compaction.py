"""Log compaction as clients see it: the latest value per key survives, in offset order;
tombstones go after delete.retention.ms; kill -9 in the middle of cleaning loses nothing."""

from __future__ import annotations

import random
import time

import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from strom.log import Log, LogConfig
from strom.log.checkpoint import read_checkpoint
from strom.log.cleaner import (
    CLEANER_CHECKPOINT,
    DELETE_HORIZON_MASK,
    Cleaner,
    CleanerConfig,
    LogCleaner,
    LogToClean,
    cleanable_offsets,
)
from strom.protocol.records import build_batch, read_header
from strom.testing import BrokerProcess, consume_all, create_topic, wait_for

from .conftest import Rec, ck_produce, consumer, set_topic_configs, stored_batches, watermarks

pytestmark = pytest.mark.timeout(120)

FAST_CLEANER = {"log.cleaner.backoff.ms": "100", "log.retention.check.interval.ms": "200"}


@pytest.fixture
def cleaner_broker():
    with BrokerProcess(overrides=FAST_CLEANER) as proc:
        yield proc


def compacted_config(**extra: str) -> dict[str, str]:
    return {"cleanup.policy": "compact", "segment.bytes": "8192", "min.cleanable.dirty.ratio": "0.01",
            **extra}


def view(messages) -> list[tuple[int, bytes, bytes | None]]:
    return [(m.offset(), m.key(), m.value()) for m in messages]


def test_latest_value_per_key_survives_and_tombstones_expire(cleaner_broker, topic):
    bootstrap = cleaner_broker.bootstrap
    create_topic(bootstrap, topic, config=compacted_config(**{"delete.retention.ms": "3000"}))
    records = []
    for i in range(10_000):
        key = i % 100
        deleted = i >= 9900 and key < 10  # the last write of keys 0..9 is a tombstone
        records.append(Rec(None if deleted else b"v%d" % i, b"k%d" % key, partition=0))
    produced_at = time.time() * 1000
    ck_produce(bootstrap, topic, records, **{"batch.num.messages": 200})
    # Then a record larger than segment.bytes, of another key, in a request of its own: it rolls
    # the segment, so all 10,000 become cleanable (the active segment is never cleaned).
    ck_produce(bootstrap, topic, [Rec(b"x" * 9000, b"sentinel", partition=0)])

    expected = [(9900 + k, b"k%d" % k, None if k < 10 else b"v%d" % (9900 + k)) for k in range(100)]
    sentinel = (10_000, b"sentinel", b"x" * 9000)
    got = wait_for(lambda: (v := view(consume_all(bootstrap, topic))) == [*expected, sentinel] and v,
                   timeout=30, interval=0.3, what="compaction of the 10,000 records")
    assert got == [*expected, sentinel]

    # The tombstones' batch carries a delete horizon of about now + delete.retention.ms ...
    stamped = [h for h in all_batches(bootstrap, topic) if h.attributes & DELETE_HORIZON_MASK]
    assert stamped, "no batch carries a delete horizon"
    horizon = min(h.base_timestamp for h in stamped)
    assert produced_at + 3000 <= horizon <= time.time() * 1000 + 3000
    # ... and they disappear once it has passed, never before.
    live = [r for r in expected if r[2] is not None]
    wait_for(lambda: view(consume_all(bootstrap, topic)) == [*live, sentinel], timeout=30, interval=0.3,
             what="tombstones to expire")
    assert time.time() * 1000 >= horizon
    assert len(live) == 90


def all_batches(bootstrap: str, topic: str) -> list:
    """Every batch header of partition 0 (a fetch returns one segment's worth at a time)."""
    _, high = watermarks(bootstrap, topic, 0)
    out, offset = [], 0
    while offset < high:
        got = stored_batches(bootstrap, topic, 0, offset)
        out += got
        offset = got[-1].last_offset + 1
    return out


def cleaning_started(proc: BrokerProcess, topic: str, since: int) -> bool:
    return any(f"beginning cleaning of {topic}-0" in line for line in proc.stderr_lines[since:])


@pytest.mark.timeout(300)
def test_kill_9_during_cleaning_loses_no_record(cleaner_broker, topic):
    proc = cleaner_broker
    bootstrap = proc.bootstrap
    create_topic(bootstrap, topic, config=compacted_config(**{"segment.bytes": "4096"}))
    acked: dict[bytes, list[tuple[int, bytes | None]]] = {}
    rng = random.Random(7)
    interrupted, round_ = 0, 0
    # Rounds until three kills have landed in a pass in progress (where a kill lands is up to
    # the machine's speed; twelve rounds bound it).
    while interrupted < 3:
        assert round_ < 12, f"only {interrupted} of {round_} kills hit a pass in progress"
        round_ += 1
        # Hold cleaning off while producing (no log is dirtier than a ratio of 1), then let it
        # go, so that the kill below lands in a pass over the whole round.
        set_topic_configs(bootstrap, topic, {"min.cleanable.dirty.ratio": "1"})
        batch = []
        for i in range(3000):
            key = b"k%d" % rng.randrange(60)
            value = None if rng.random() < 0.05 else b"r%d-%d" % (round_, i)
            batch.append(Rec(value, key, partition=0))
        reports = ck_produce(bootstrap, topic, batch, acks="all", **{"batch.num.messages": 100})
        for r, m in zip(batch, reports, strict=True):
            acked.setdefault(r.key, []).append((m.offset(), r.value))
        mark = len(proc.stderr_lines)
        set_topic_configs(bootstrap, topic, {"min.cleanable.dirty.ratio": "0.01"})
        wait_for(lambda mark=mark: cleaning_started(proc, topic, mark), timeout=60, interval=0.002,
                 what="a cleaning pass to start")
        time.sleep(rng.uniform(0, 0.04))
        proc.kill()  # returns once the dead broker's last log lines are read
        lines = proc.stderr_lines[mark:]
        begun = sum(f"beginning cleaning of {topic}-0" in line for line in lines)
        done = sum(f"cleaned {topic}-0 up to" in line for line in lines)
        interrupted += begun > done
        proc.start()
        check_compacted_log(proc, topic, acked)


def check_compacted_log(proc: BrokerProcess, topic: str, acked: dict[bytes, list]) -> None:
    """Every key's last record is its last acknowledged write; no acknowledged write is missing
    that compaction could not have removed; below the cleaner checkpoint keys are unique."""
    # Read first: a pass running meanwhile moves the checkpoint, and only ever removes records.
    checkpoint = read_checkpoint(proc.data_dir / "logs" / CLEANER_CHECKPOINT).get((topic, 0), 0)
    got = consume_all(proc.bootstrap, topic)
    offsets = [m.offset() for m in got]
    assert offsets == sorted(set(offsets)), "offsets out of order or repeated"
    by_offset = {m.offset(): (m.key(), m.value()) for m in got}
    last_seen: dict[bytes, int] = {}
    for m in got:
        last_seen[m.key()] = m.offset()
    for key, writes in acked.items():
        last_offset, last_value = writes[-1]
        if last_value is not None:
            assert by_offset.get(last_offset) == (key, last_value), f"latest value of {key!r} lost"
        else:
            assert last_seen.get(key, last_offset) == last_offset, f"{key!r} resurrected after delete"
        # Whatever older versions remain are real acknowledged writes, at their own offsets.
        for offset, value in writes:
            if offset in by_offset:
                assert by_offset[offset] == (key, value)
    cleaned_keys = [by_offset[o][0] for o in offsets if o < checkpoint]
    assert len(cleaned_keys) == len(set(cleaned_keys)), "duplicate key versions in the cleaned part"


def test_consumer_offsets_topic_is_compacted_too(topic):
    overrides = {**FAST_CLEANER, "offsets.topic.num.partitions": "1", "offsets.topic.segment.bytes": "2048",
                 "group.initial.rebalance.delay.ms": "0"}
    proc = BrokerProcess(overrides=overrides)
    proc.start()
    try:
        bootstrap = proc.bootstrap
        create_topic(bootstrap, topic)
        ck_produce(bootstrap, topic, [Rec(b"x", partition=0)])
        c = consumer(bootstrap, **{"group.id": "compacted-offsets"})
        try:
            for i in range(1, 301):
                c.commit(offsets=[TopicPartition(topic, 0, i)], asynchronous=False)
        finally:
            c.close()
        # 300 commits of one key: cleaning leaves the latest, plus what the active segment
        # holds (a 2 KB segment takes about 15 commits).
        wait_for(lambda: len(consume_all(bootstrap, "__consumer_offsets")) < 50, timeout=30,
                 interval=0.5, what="__consumer_offsets to be cleaned")
        assert "cleaned __consumer_offsets-0" in proc.log_text()
        assert watermarks(bootstrap, "__consumer_offsets", 0)[1] >= 300
        assert proc.stop() == 0
        proc.start()
        c = consumer(bootstrap, **{"group.id": "compacted-offsets"})
        try:
            (committed,) = c.committed([TopicPartition(topic, 0)], timeout=15)
        finally:
            c.close()
        assert committed.offset == 300  # the group coordinator reloads the latest commit
    finally:
        proc.close()


def test_clients_read_past_a_batch_left_empty_by_compaction(fresh_broker, topic):
    """The cleaner keeps an empty batch where a merged group's last segment lost every record
    (so crash recovery knows the group's extent), as Kafka keeps empty batches: consumers must
    step over it."""
    config = compacted_config(**{"segment.bytes": "3000"})
    create_topic(fresh_broker.bootstrap, topic, config=config)
    assert fresh_broker.stop() == 0
    log = Log.open(fresh_broker.data_dir / "logs" / f"{topic}-0",
                   LogConfig(index_interval_bytes=64).with_overrides(config))
    for keys, size in (([b"a%d" % i for i in range(5)], 10), ([b"b%d" % i for i in range(5)], 10),
                       ([b"b%d" % i for i in range(5)], 500), ([b"d"], 10)):
        log.append(bytearray(build_batch([(k, k * size) for k in keys])))
        log.roll()
    first_dirty, uncleanable = cleanable_offsets(log, None, int(time.time() * 1000))
    job = LogCleaner(None, CleanerConfig).plan(LogToClean((topic, 0), log, first_dirty, uncleanable, 0, 0), 0)
    Cleaner(1 << 20).clean(job, lambda base, old: bool(log.replace_segments(base, old)), lambda: False)
    job.close()
    empty = [s for s in log.segments[:1] if s.size and read_header(s.read_batch(s.size - 61, 61)).record_count == 0]
    assert empty, "expected the merged segment to end with an empty batch"
    log.close()
    fresh_broker.start()
    want = [(i, b"a%d" % i) for i in range(5)] + [(10 + i, b"b%d" % i) for i in range(5)] + [(15, b"d")]
    assert [(m.offset(), m.key()) for m in consume_all(fresh_broker.bootstrap, topic)] == want
    kc = KafkaConsumer(bootstrap_servers=fresh_broker.bootstrap, consumer_timeout_ms=3000,
                       auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        kc.assign([KafkaTopicPartition(topic, 0)])
        assert [(m.offset, m.key) for m in kc] == want
    finally:
        kc.close()


def cleaned_passes(proc: BrokerProcess, topic: str) -> int:
    return sum(f"cleaned {topic}-0 up to" in line for line in proc.stderr_lines)


def fill_compacted(bootstrap: str, topic: str, stamp_ms: int | None) -> list[tuple[bytes, bytes]]:
    """200 writes of 20 keys over several 2 KB segments, then a record bigger than a segment,
    of a key of its own, that rolls them all out of the active segment (which is never
    cleaned); stamped `stamp_ms` on (None: now). The (key, value)s written, in order."""
    writes = [(b"k%02d" % (i % 20), b"v%03d-" % i + b"x" * 40) for i in range(200)]
    ck_produce(bootstrap, topic, [Rec(v, k, partition=0, timestamp=None if stamp_ms is None else stamp_ms + i)
                                  for i, (k, v) in enumerate(writes)], **{"batch.num.messages": 10})
    roll = (b"roll", b"r" * 3000)
    ck_produce(bootstrap, topic, [Rec(roll[1], roll[0], partition=0)])
    return [*writes, roll]


def latest_per_key(writes: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    last = {k: i for i, (k, _) in enumerate(writes)}
    return [w for i, w in enumerate(writes) if last[w[0]] == i]


def test_max_compaction_lag_cleans_a_log_the_dirty_ratio_would_not(cleaner_broker, topic):
    """min.cleanable.dirty.ratio=1 holds cleaning off (no log is dirtier than that); a topic
    whose oldest dirty record is older than max.compaction.lag.ms is cleaned all the same, and
    the same topic without it is not."""
    proc = cleaner_broker
    bootstrap = proc.bootstrap
    two_hours_ago = int(time.time() * 1000) - 2 * 3_600_000
    held = {"min.cleanable.dirty.ratio": "1", "segment.bytes": "2048"}
    lagged, control, marker = topic + "-lag", topic + "-control", topic + "-marker"
    create_topic(bootstrap, lagged, config=compacted_config(**held, **{"max.compaction.lag.ms": "3600000"}))
    create_topic(bootstrap, control, config=compacted_config(**held))
    create_topic(bootstrap, marker, config=compacted_config(**{"segment.bytes": "2048"}))
    # The marker is cleaned once now, so that its next pass (below) has a dirty ratio under 1.
    fill_compacted(bootstrap, marker, None)
    wait_for(lambda: cleaned_passes(proc, marker) >= 1, timeout=60, what="the marker's first pass")

    written = fill_compacted(bootstrap, control, two_hours_ago)
    assert fill_compacted(bootstrap, lagged, two_hours_ago) == written
    wait_for(lambda: [(m.key(), m.value()) for m in consume_all(bootstrap, lagged)] == latest_per_key(written),
             timeout=60, interval=0.3, what="max.compaction.lag.ms to force a clean")

    # One thread cleans the dirtiest log first: the marker's second pass (dirty ratio < 1)
    # would come after the control's (ratio 1) had the control been cleanable.
    # (A pass may land while a fill is under way, so passes are counted from here on.)
    passes = cleaned_passes(proc, marker)
    fill_compacted(bootstrap, marker, None)
    wait_for(lambda: cleaned_passes(proc, marker) > passes, timeout=60, what="the marker's next pass")
    assert f"beginning cleaning of {control}-0" not in proc.log_text()
    assert [(m.key(), m.value()) for m in consume_all(bootstrap, control)] == written


def test_compacted_topic_refuses_records_without_a_key(broker, topic):
    create_topic(broker.bootstrap, topic, config={"cleanup.policy": "compact"})
    reports = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "retries": 0,
                         "enable.idempotence": False})
    producer.produce(topic, value=b"no key", partition=0,
                     on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(15) == 0
    assert reports and reports[0] is not None and reports[0].code() == KafkaError.INVALID_RECORD
    # The refused batch left nothing behind; keyed records still go in.
    assert watermarks(broker.bootstrap, topic, 0) == (0, 0)
    ck_produce(broker.bootstrap, topic, [Rec(b"v", key=b"k", partition=0)])
    assert watermarks(broker.bootstrap, topic, 0) == (0, 1)
