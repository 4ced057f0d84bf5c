"""Storage trouble a broker must survive: a corrupt batch in the middle of a segment, a full
disk, and file descriptors running short. Real broker processes; each test checks the client's
error, that nothing acknowledged is lost, and that the broker recovers by itself."""

from __future__ import annotations

import contextlib
import re
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from strom.protocol.records import HEADER_SIZE, build_batch
from strom.testing import BrokerProcess, RawClient, produce_acked, read_values, unique_name


def segment_batches(path: Path) -> list[tuple[int, int]]:
    """(byte position, base offset) of each batch in a segment file."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos + HEADER_SIZE <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        out.append((pos, base))
        pos += length + 12
    return out


# --- item 12: a corrupt batch in the middle of a segment is reported with what it costs ---------
def test_a_corrupt_batch_mid_segment_is_reported_with_the_offsets_it_makes_unreadable():
    with BrokerProcess(overrides={"num.partitions": "1"}) as broker:
        topic = unique_name("mid")
        offsets = produce_acked(broker.bootstrap, topic, [b"record-%d" % i for i in range(10)],
                                batch_each=True)
        assert offsets == list(range(10))
        broker.kill()  # unclean: the segment is re-validated at start-up
        segment = next((broker.data_dir / "logs").glob(f"{topic}-0/*.log"))
        batches = segment_batches(segment)
        position, base = batches[4]
        data = bytearray(segment.read_bytes())
        data[position + HEADER_SIZE + 2] ^= 0xFF  # a record byte: the CRC no longer matches
        segment.write_bytes(bytes(data))
        broker.start()
        line = next((ln for ln in broker.log_text().splitlines() if "corrupt batch" in ln), None)
        assert line is not None, broker.log_text()[-2000:]
        assert segment.name in line and f"at byte {position}" in line
        assert re.search(rf"offsets {base} to the log end are unreadable", line), line
        # What came before is served, and new records follow it.
        assert read_values(broker.bootstrap, topic, base) == [b"record-%d" % i for i in range(base)]
        assert produce_acked(broker.bootstrap, topic, [b"after"]) == [base]


# --- item 9: a full disk refuses writes, keeps reads, and recovers by itself -----------------
@contextlib.contextmanager
def small_disk(size_mb: int):
    """A tmpfs of `size_mb` MiB: a disk that really fills. Needs root, as CI has."""
    path = Path(tempfile.mkdtemp(prefix="strom-small-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        path.rmdir()


def create_topic(broker: BrokerProcess, topic: str, configs: dict[str, str]) -> None:
    with RawClient(broker) as client:
        body = client.call(19, 5, {"topics": [{
            "name": topic, "num_partitions": 1, "replication_factor": 1, "assignments": [],
            "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
            "timeout_ms": 30_000, "validate_only": False})
    assert body.topics[0].error_code == 0, body.topics[0]


class RawProducer:
    """acks=all produce of one record per request, answering the broker's error code as is."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.client = RawClient(broker)

    def send(self, topic: str, value: bytes) -> tuple[int, int]:
        body = self.client.call(0, 9, {
            "transactional_id": None, "acks": -1, "timeout_ms": 10_000,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": 0, "records": build_batch([(None, value)], timestamp=int(time.time() * 1000))}]}]})
        answer = body.responses[0].partition_responses[0]
        return answer.error_code, answer.base_offset

    def close(self) -> None:
        self.client.close()


def fill_until_refused(producer: RawProducer, topic: str, limit: int = 400) -> dict[int, bytes]:
    """Produce 256 KiB records until the broker refuses one; the acknowledged ones by offset."""
    acked: dict[int, bytes] = {}
    for i in range(limit):
        value = b"%06d" % i + bytes(256 << 10)
        error, offset = producer.send(topic, value)
        if error:
            assert error == KAFKA_STORAGE_ERROR, error
            return acked
        acked[offset] = value
    raise AssertionError(f"{limit} records of 256 KiB fit on the small disk")


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def read_all(bootstrap: str, topic: str, offsets: dict[int, bytes]) -> None:
    """Every acknowledged record is served, byte for byte."""
    first = min(offsets)
    values = read_values(bootstrap, topic, len(offsets), start=first)
    assert values == [offsets[o] for o in sorted(offsets)]


KAFKA_STORAGE_ERROR = 56


def test_below_the_free_space_threshold_writes_are_refused_reads_served_and_deletion_recovers():
    with small_disk(48) as disk, BrokerProcess(data_dir=disk, overrides={
            "num.partitions": "1", "log.dir.min.free.bytes": str(16 << 20),
            "log.segment.bytes": str(4 << 20)}) as broker:
        create_topic(broker, "fill", {})
        create_topic(broker, "other", {})
        producer = RawProducer(broker)
        try:
            acked = fill_until_refused(producer, "fill")
            assert len(acked) > 20
            # Every partition of the dir refuses, with the reason; reads go on.
            assert producer.send("other", b"x")[0] == KAFKA_STORAGE_ERROR
            read_all(broker.bootstrap, "fill", acked)
            wait_for(lambda: "below log.dir.min.free.bytes" in broker.log_text(), what="the refusal line")
            assert " failed (" not in broker.log_text()  # the dir did not go offline
            # Deleting the topic frees the space: writes resume with nobody's help.
            client = AdminClient({"bootstrap.servers": broker.bootstrap})
            client.delete_topics(["fill"], operation_timeout=30)["fill"].result(timeout=60)
            wait_for(lambda: producer.send("other", b"back")[0] == 0, what="writes to resume")
        finally:
            producer.close()
        wait_for(lambda: "writes accepted" in broker.log_text(), what="the resume line")
        broker.stop()
        broker.start()
        assert read_values(broker.bootstrap, "other", 1)[-1] == b"back"


def test_a_disk_that_really_fills_refuses_writes_until_retention_frees_it():
    # No threshold: the broker meets ENOSPC itself. The dir must not go offline; retention
    # (normally every 5 minutes) runs at once and writes come back.
    with small_disk(24) as disk, BrokerProcess(data_dir=disk, overrides={
            "num.partitions": "1", "log.dir.min.free.bytes": "0"}) as broker:
        create_topic(broker, "rolling", {"segment.bytes": str(1 << 20),
                                         "retention.bytes": str(4 << 20)})
        producer = RawProducer(broker)
        try:
            acked = fill_until_refused(producer, "rolling")
            wait_for(lambda: "out of space" in broker.log_text(), what="the out-of-space line")
            # The newest acknowledged records are still served.
            newest = dict(sorted(acked.items())[-4:])
            read_all(broker.bootstrap, "rolling", newest)
            error, offset = wait_for(lambda: (lambda r: r if r[0] == 0 else None)(
                producer.send("rolling", b"after")), what="writes to resume")
            assert offset == max(acked) + 1  # nothing half-written in between
        finally:
            producer.close()
        wait_for(lambda: "writes accepted" in broker.log_text(), what="the resume line")
        assert " failed (" not in broker.log_text()  # the dir did not go offline
        broker.stop()
        broker.start()
        assert read_values(broker.bootstrap, "rolling", 1, start=max(acked) + 1) == [b"after"]


# --- items 4 and 5: partitions are not capped by the open-file limit ---------------------------
def low_fd_python(tmp_path: Path, limit: int) -> str:
    """A python that starts with an open-file limit of `limit` (soft and hard), for a broker."""
    wrapper = tmp_path / "python-low-fds"
    wrapper.write_text(
        f"#!{sys.executable}\n"
        "import os, resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}] + sys.argv[1:])\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_thousands_of_partitions_under_a_low_open_file_limit(tmp_path, monkeypatch):
    from confluent_kafka.admin import NewTopic

    partitions = 2000
    monkeypatch.setattr(sys, "executable", low_fd_python(tmp_path, 300))
    with BrokerProcess(overrides={"log.segment.bytes": "4096"}) as broker:
        assert "log files keep at most 150 open" in broker.log_text()
        client = AdminClient({"bootstrap.servers": broker.bootstrap})
        client.create_topics([NewTopic("wide", partitions, 1)])["wide"].result(timeout=120)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50})
        failures: list = []
        for rounds in range(3):  # a few records each, so segments roll and indexes are written
            for p in range(partitions):
                producer.produce("wide", b"%d-%d" % (p, rounds) + bytes(1500), partition=p,
                                 on_delivery=lambda err, _m: err and failures.append(err))
            assert producer.flush(120) == 0
        assert not failures, failures[:3]

        def read_all_partitions() -> dict[int, list[bytes]]:
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_name("g"),
                                 "enable.auto.commit": False})
            consumer.assign([TopicPartition("wide", p, 0) for p in range(partitions)])
            got: dict[int, list[bytes]] = {}
            try:
                deadline = time.monotonic() + 180
                while sum(map(len, got.values())) < 3 * partitions and time.monotonic() < deadline:
                    msg = consumer.poll(0.5)
                    if msg is not None:
                        assert msg.error() is None, msg.error()
                        got.setdefault(msg.partition(), []).append(msg.value()[:12])
            finally:
                consumer.close()
            return got

        expected = {p: [b"%d-%d" % (p, r) + bytes(12 - len(b"%d-%d" % (p, r))) for r in range(3)]
                    for p in range(partitions)}
        assert read_all_partitions() == expected
        log = broker.log_text()
        assert " failed (" not in log and "out of file descriptors" not in log
        broker.stop()
        broker.start()  # loading 2,000 logs with 150 descriptors for them
        assert read_all_partitions() == expected
