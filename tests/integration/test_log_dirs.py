"""Several log dirs: partitions spread over them, DescribeLogDirs sizes, and a dir that fails
taking only its own partitions offline (KAFKA_STORAGE_ERROR) while the broker keeps serving."""

from __future__ import annotations

import os
import shutil

import pytest
from kafka.admin import KafkaAdminClient

from strom.protocol.records import build_batch
from strom.testing import BrokerProcess, consume_all, create_topic, wait_for

from .conftest import Rec, ck_consume, ck_produce, wire_call

pytestmark = pytest.mark.timeout(90)

KAFKA_STORAGE_ERROR = 56
PRODUCE, FETCH = 0, 1


@pytest.fixture
def two_dir_broker(tmp_path):
    with BrokerProcess(data_dir=tmp_path, overrides={"log.dirs": f"{tmp_path}/a,{tmp_path}/b"}) as proc:
        yield proc


def log_dirs(bootstrap: str, topics=None) -> dict[str, dict]:
    """log dir -> {"error": code, "partitions": {(topic, p): size}} via kafka-python."""
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (answer,) = client.describe_log_dirs(topics)
    finally:
        client.close()
    return {d["log_dir"]: {"error": d["error_code"],
                           "partitions": {(t["name"], p["partition_index"]): p["partition_size"]
                                          for t in d["topics"] for p in t["partitions"]}}
            for d in answer["log_dirs"]}


def raw_produce(bootstrap: str, topic: str, partition: int, value: bytes) -> int:
    body = wire_call(bootstrap, PRODUCE, 8, {
        "transactional_id": None, "acks": 1, "timeout_ms": 5000,
        "topic_data": [{"name": topic, "partition_data": [
            {"index": partition, "records": build_batch([(None, value)])}]}],
    })
    return body.responses[0].partition_responses[0].error_code


def raw_fetch_error(bootstrap: str, topic: str, partition: int) -> int:
    body = wire_call(bootstrap, FETCH, 4, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "topics": [{"topic": topic, "partitions": [
            {"partition": partition, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
    })
    return body.responses[0].partitions[0].error_code


def test_partitions_spread_and_sizes(two_dir_broker, topic, tmp_path):
    bootstrap = two_dir_broker.bootstrap
    create_topic(bootstrap, topic, partitions=4)
    ck_produce(bootstrap, topic, [Rec(b"v" * (100 * (p + 1)), partition=p) for p in range(4)])
    dirs = log_dirs(bootstrap)
    assert set(dirs) == {str(tmp_path / "a"), str(tmp_path / "b")}
    placed = {d: sorted(p for t, p in v["partitions"] if t == topic) for d, v in dirs.items()}
    assert sorted(len(ps) for ps in placed.values()) == [2, 2]  # the least loaded dir gets the next
    for d, info in dirs.items():
        assert info["error"] == 0
        for (t, p), size in info["partitions"].items():
            if t == topic:
                files = (tmp_path / os.path.basename(d) / f"{t}-{p}").glob("*.log")
                assert size == sum(f.stat().st_size for f in files) > 100 * (p + 1)
    only = log_dirs(bootstrap, {topic: [1]})
    assert [k for v in only.values() for k in v["partitions"]] == [(topic, 1)]


def test_failed_dir_takes_only_its_partitions_offline(two_dir_broker, topic, tmp_path):
    proc = two_dir_broker
    bootstrap = proc.bootstrap
    create_topic(bootstrap, topic, partitions=4, config={"segment.bytes": "1024"})
    ck_produce(bootstrap, topic, [Rec(b"before-%d" % p, partition=p) for p in range(4)])
    dirs = log_dirs(bootstrap)
    in_b = sorted(p for t, p in dirs[str(tmp_path / "b")]["partitions"] if t == topic)
    in_a = sorted(p for t, p in dirs[str(tmp_path / "a")]["partitions"] if t == topic)
    assert len(in_a) == len(in_b) == 2

    os.rename(tmp_path / "b", tmp_path / "b.gone")  # the disk goes away under the broker
    errors = [raw_produce(bootstrap, topic, in_b[0], b"x" * 700) for _ in range(4)]
    assert KAFKA_STORAGE_ERROR in errors  # the first roll cannot create its segment
    assert raw_produce(bootstrap, topic, in_b[1], b"y") == KAFKA_STORAGE_ERROR  # the whole dir
    assert raw_fetch_error(bootstrap, topic, in_b[0]) == KAFKA_STORAGE_ERROR
    assert log_dirs(bootstrap)[str(tmp_path / "b")] == {"error": KAFKA_STORAGE_ERROR, "partitions": {}}
    # The broker is still up and the other dir's partitions work as before.
    assert proc.proc.poll() is None
    for p in in_a:
        ck_produce(bootstrap, topic, [Rec(b"after-%d" % p, partition=p)])
        got = ck_consume(bootstrap, [(topic, p, 0)], 2)
        assert [m.value() for m in got] == [b"before-%d" % p, b"after-%d" % p]
    assert "log dir" in proc.log_text() and "failed" in proc.log_text()
    assert "Traceback" not in proc.log_text(), proc.log_text()[-3000:]
    assert proc.stop() == 0  # a clean shutdown skips the failed dir

    # Restart with b unusable (a file where the dir was): it starts, b stays offline, and b's
    # partitions are not silently recreated empty in a.
    (tmp_path / "b").write_bytes(b"not a directory")
    proc.start()
    assert log_dirs(bootstrap)[str(tmp_path / "b")]["error"] == KAFKA_STORAGE_ERROR
    assert raw_fetch_error(bootstrap, topic, in_b[0]) == KAFKA_STORAGE_ERROR
    assert not (tmp_path / "a" / f"{topic}-{in_b[0]}").exists()
    assert [m.value() for m in ck_consume(bootstrap, [(topic, in_a[0], 0)], 2)] == \
        [b"before-%d" % in_a[0], b"after-%d" % in_a[0]]
    assert proc.stop() == 0

    # The disk comes back: everything written before the failure is there.
    (tmp_path / "b").unlink()
    shutil.move(tmp_path / "b.gone", tmp_path / "b")
    proc.start()
    # (Appends acknowledged before the failure was found count as written before it.)
    kept = {in_b[0]: [b"before-%d" % in_b[0]] + [b"x" * 700] * errors.count(0), in_b[1]: [b"before-%d" % in_b[1]]}
    for p in in_b:
        assert [m.value() for m in consume_all(bootstrap, topic, [p])] == kept[p]
    assert "Traceback" not in proc.log_text(), proc.log_text()[-3000:]


def test_replica_moves_to_another_log_dir_while_serving(two_dir_broker, topic, tmp_path):
    """AlterReplicaLogDirs: the partition is copied to the other dir while a producer keeps
    writing; every record is there afterwards, in the new dir, and after a restart."""
    import threading

    from confluent_kafka import Producer

    bootstrap = two_dir_broker.bootstrap
    create_topic(bootstrap, topic, 1)
    source = next(d for d, info in log_dirs(bootstrap).items() if (topic, 0) in info["partitions"])
    target = next(d for d in log_dirs(bootstrap) if d != source)
    stop, acked = threading.Event(), []

    def produce() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, b"%07d" % i, partition=0,
                                 on_delivery=lambda err, msg: acked.append(msg.value()) if err is None else None)
                i += 1
            except BufferError:
                pass
            producer.poll(0.001)
        assert producer.flush(30) == 0

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        wait_for(lambda: len(acked) >= 20000, timeout=60, what="20,000 records before the move")
        body = wire_call(bootstrap, 34, 2, {"dirs": [{"path": target, "topics": [{"name": topic, "partitions": [0]}]}]})
        assert body.results[0].partitions[0].error_code == 0
        wait_for(lambda: (topic, 0) in log_dirs(bootstrap)[target]["partitions"], timeout=60,
                 what="the partition in its new dir")
        mark = len(acked)
        wait_for(lambda: len(acked) >= mark + 5000, timeout=60, what="5,000 records after the move")
    finally:
        stop.set()
        writer.join(60)
    dirs = log_dirs(bootstrap)
    assert (topic, 0) in dirs[target]["partitions"] and (topic, 0) not in dirs[source]["partitions"]
    assert len(acked) > mark
    got = ck_consume(bootstrap, [(topic, 0, 0)], len(acked), timeout=60)
    assert [m.value() for m in got] == [b"%07d" % i for i in range(len(acked))]
    assert two_dir_broker.stop() == 0
    two_dir_broker.start()
    assert (topic, 0) in log_dirs(two_dir_broker.bootstrap)[target]["partitions"]
    again = ck_consume(two_dir_broker.bootstrap, [(topic, 0, 0)], len(acked), timeout=60)
    assert len(again) == len(acked)
    bad = wire_call(bootstrap, 34, 2, {"dirs": [{"path": "/nowhere", "topics": [{"name": topic, "partitions": [0]}]}]})
    assert bad.results[0].partitions[0].error_code == 57  # LOG_DIR_NOT_FOUND


DESCRIBE_LOG_DIRS = 35


def cordoned(bootstrap: str) -> dict[str, bool]:
    """log dir -> IsCordoned, from DescribeLogDirs v5 (KIP-1066)."""
    body = wire_call(bootstrap, DESCRIBE_LOG_DIRS, 5, {"topics": None})
    return {r.log_dir: r.is_cordoned for r in body.results}


def dirs_of(bootstrap: str, topic: str) -> set[str]:
    return {d for d, info in log_dirs(bootstrap).items() if any(t == topic for t, _ in info["partitions"])}


def test_new_partitions_land_only_on_uncordoned_dirs(tmp_path):
    """cordoned.log.dirs (KIP-1066): a new topic's partitions all go to the dir that is not
    cordoned, and stay where they are when the cordon moves (a dynamic change); the dirs say
    IsCordoned; a dir that is not one of log.dirs is refused."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    a, b = str((tmp_path / "a").absolute()), str((tmp_path / "b").absolute())
    with BrokerProcess(data_dir=tmp_path, overrides={"log.dirs": f"{a},{b}", "cordoned.log.dirs": a}) as proc:
        create_topic(proc.bootstrap, "cordon-first", partitions=6)
        wait_for(lambda: len(log_dirs(proc.bootstrap)[b]["partitions"]) == 6, 10, "the partitions in b")
        assert dirs_of(proc.bootstrap, "cordon-first") == {b}
        assert cordoned(proc.bootstrap) == {a: True, b: False}

        admin = AdminClient({"bootstrap.servers": proc.bootstrap})

        def set_cordoned(value: str) -> None:
            entry = ConfigEntry("cordoned.log.dirs", value, incremental_operation=AlterConfigOpType.SET)
            future = admin.incremental_alter_configs([ConfigResource("BROKER", "0", incremental_configs=[entry])])
            next(iter(future.values())).result(10)

        set_cordoned(b)
        wait_for(lambda: cordoned(proc.bootstrap) == {a: False, b: True}, 10, "the cordon moved to b")
        create_topic(proc.bootstrap, "cordon-second", partitions=4)
        wait_for(lambda: dirs_of(proc.bootstrap, "cordon-second") == {a}, 10, "the new partitions in a")
        assert len(log_dirs(proc.bootstrap)[a]["partitions"]) == 4
        assert dirs_of(proc.bootstrap, "cordon-first") == {b}  # what was there stays

        with pytest.raises(Exception, match="not one of log.dirs"):
            set_cordoned(str(tmp_path / "elsewhere"))
        assert cordoned(proc.bootstrap) == {a: False, b: True}
