"""Storage trouble a broker must survive: a corrupt batch in the middle of a segment, a full
disk, and file descriptors running short. Real broker processes; each test checks the client's
error, that nothing acknowledged is lost, and that the broker recovers by itself."""

from __future__ import annotations

import re
import struct
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from strom.protocol.records import HEADER_SIZE
from strom.testing import BrokerProcess, unique_name


def produce_acked(bootstrap: str, topic: str, values: list[bytes], **conf) -> list[int]:
    """Offsets of `values`, each acknowledged (one record per request with linger 0)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 0, **conf})
    offsets: list[int] = []
    failures: list = []

    def done(err, msg) -> None:
        (failures.append(err) if err else offsets.append(msg.offset()))

    for v in values:
        producer.produce(topic, v, on_delivery=done)
        producer.flush(30)
    assert not failures, failures
    assert len(offsets) == len(values)
    return offsets


def read_values(bootstrap: str, topic: str, expected: int, start: int = 0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("g"),
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, start)])
    out: list[bytes] = []
    try:
        for _ in range(300):
            msg = consumer.poll(0.1)
            if msg is not None:
                assert msg.error() is None, msg.error()
                out.append(msg.value())
            if len(out) >= expected:
                break
    finally:
        consumer.close()
    assert len(out) == expected, f"read {len(out)} of {expected}"
    return out


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
        offsets = produce_acked(broker.bootstrap, topic, [b"record-%d" % i for i in range(10)])
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
