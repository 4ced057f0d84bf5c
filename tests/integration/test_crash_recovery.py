"""What the storage engine promises about damaged files, through a real broker restart: a torn
tail is cut off, a corrupt batch in the middle of an unflushed segment ends the log there, and
missing or damaged indexes are rebuilt; each time the broker comes back, serves what survived
and takes new appends right after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from strom.log.checkpoint import read_checkpoint
from strom.protocol.records import HEADER_SIZE, build_batch, read_header
from strom.testing import BrokerProcess, consume_all, create_topic

from .conftest import Rec, ck_produce, offsets_for_times, watermarks

pytestmark = pytest.mark.timeout(120)

T0 = 1_650_000_000_000


def partition_dir(broker: BrokerProcess, topic: str) -> Path:
    return broker.data_dir / "logs" / f"{topic}-0"


def batches_of(path: Path) -> list[tuple[int, object]]:
    """(file position, header) of every batch in a segment file, which must hold whole batches
    only."""
    data, pos, out = path.read_bytes(), 0, []
    while pos + HEADER_SIZE <= len(data):
        header = read_header(data, pos)
        if pos + header.size > len(data):
            break
        out.append((pos, header))
        pos += header.size
    assert pos == len(data), f"{path.name}: {len(data) - pos} bytes after the last whole batch"
    return out


def produce_batches(bootstrap: str, topic: str, batches: int, per_batch: int) -> list[bytes]:
    """`batches` produce requests of `per_batch` records each, acknowledged by acks=all; the
    values, in offset order."""
    values = []
    for b in range(batches):
        chunk = [b"batch-%02d-record-%02d" % (b, i) for i in range(per_batch)]
        reports = ck_produce(bootstrap, topic, [Rec(v, partition=0, timestamp=T0 + len(values) + i)
                                                for i, v in enumerate(chunk)],
                             acks="all", **{"linger.ms": 30_000})  # one batch each: flush sends it
        assert [m.offset() for m in reports] == list(range(len(values), len(values) + per_batch))
        values += chunk
    return values


def assert_serves(broker: BrokerProcess, topic: str, values: list[bytes]) -> None:
    """The partition holds exactly `values` from offset 0, and the next append lands right
    after them and reads back."""
    bootstrap = broker.bootstrap
    assert watermarks(bootstrap, topic, 0) == (0, len(values))
    assert [(m.offset(), m.value()) for m in consume_all(bootstrap, topic, allow_empty=not values)] == \
        list(enumerate(values))
    [report] = ck_produce(bootstrap, topic, [Rec(b"after the restart", partition=0)], acks="all")
    assert report.offset() == len(values)
    got = consume_all(bootstrap, topic, start=len(values))
    assert [(m.offset(), m.value()) for m in got] == [(len(values), b"after the restart")]
    assert "Traceback" not in broker.log_text()


@pytest.mark.parametrize("shutdown", ["kill", "clean"])
def test_torn_tail_is_cut_off_at_restart(fresh_broker, topic, shutdown):
    """Half a batch at the end of the active segment (a write the crash interrupted) is cut
    off, even when the shutdown was clean and the broker would otherwise trust the files."""
    create_topic(fresh_broker.bootstrap, topic)
    values = produce_batches(fresh_broker.bootstrap, topic, 6, 5)
    if shutdown == "kill":
        fresh_broker.kill()
    else:
        assert fresh_broker.stop() == 0
    [segment] = sorted(partition_dir(fresh_broker, topic).glob("*.log"))
    size = segment.stat().st_size
    torn = build_batch([(b"k", b"never acknowledged %d" % i) for i in range(5)], base_offset=len(values))
    with open(segment, "ab") as f:
        f.write(torn[: len(torn) // 2])

    fresh_broker.start()
    assert_serves(fresh_broker, topic, values)
    # The torn bytes are gone: the new record's batch starts where the whole batches ended.
    assert [(pos, h.base_offset) for pos, h in batches_of(segment)][-1] == (size, 30)


def test_corrupt_batch_mid_segment_ends_the_log_there(fresh_broker, topic):
    """A batch whose bytes no longer match its CRC, in the middle of a segment written since the
    last flush: the broker starts, keeps every record before it and appends after them."""
    create_topic(fresh_broker.bootstrap, topic)
    values = produce_batches(fresh_broker.bootstrap, topic, 10, 4)
    fresh_broker.kill()
    [segment] = sorted(partition_dir(fresh_broker, topic).glob("*.log"))
    batches = batches_of(segment)
    assert [h.base_offset for _, h in batches] == list(range(0, 40, 4))
    pos, victim = batches[5]
    # Recovery re-validates what was written since the recovery point: this batch is among it.
    recovery_points = read_checkpoint(fresh_broker.data_dir / "logs" / "recovery-point-offset-checkpoint")
    assert recovery_points.get((topic, 0), 0) <= victim.base_offset
    with open(segment, "r+b") as f:
        f.seek(pos + HEADER_SIZE + 3)  # inside the records, framing intact: only the CRC can tell
        original = f.read(2)
        f.seek(pos + HEADER_SIZE + 3)
        f.write(bytes(b ^ 0xFF for b in original))

    fresh_broker.start()
    assert_serves(fresh_broker, topic, values[: victim.base_offset])


def test_deleted_and_damaged_indexes_are_rebuilt(fresh_broker, topic):
    """Indexes removed (and one overwritten with noise) while the broker was stopped cleanly:
    it rebuilds them, and lookups by offset and by time answer as before."""
    bootstrap = fresh_broker.bootstrap
    create_topic(bootstrap, topic, config={"segment.bytes": "4096", "index.interval.bytes": "256"})
    values = produce_batches(bootstrap, topic, 40, 10)
    assert fresh_broker.stop() == 0
    directory = partition_dir(fresh_broker, topic)
    assert len(list(directory.glob("*.log"))) >= 4
    # The segments before the active one, which the appends below leave alone.
    inactive = sorted(directory.glob("*.index"))[:-1]
    before = {p.name: p.read_bytes() for p in inactive}
    assert all(before.values()), "no index entries to lose"
    indexes = sorted(directory.glob("*.index")) + sorted(directory.glob("*.timeindex"))
    for path in indexes[1:]:
        path.unlink()
    indexes[0].write_bytes(os.urandom(max(len(before[indexes[0].name]), 16)))

    fresh_broker.start()
    for start in (0, 137, 255, 399):
        got = consume_all(bootstrap, topic, start=start)
        assert [(m.offset(), m.value()) for m in got] == list(enumerate(values))[start:]
    wanted = [T0 + 3, T0 + 150, T0 + 333, T0 + 399, T0 + 400]
    assert offsets_for_times(bootstrap, topic, wanted) == [3, 150, 333, 399, -1]
    assert_serves(fresh_broker, topic, values)
    # Rebuilt as they were written (a clean stop trims them to their entries).
    assert fresh_broker.stop() == 0
    assert {p.name: p.read_bytes() for p in inactive} == before


def test_only_logs_of_topics_the_store_no_longer_has_are_deleted_at_restart(fresh_broker, topic):
    """A partition directory of a topic the metadata store does not have (its deletion was cut
    short) goes at start-up; every partition of the topics it has stays, whether or not the
    controller's LeaderAndIsr for it has been applied yet."""
    create_topic(fresh_broker.bootstrap, topic, 3)
    for p in range(3):
        ck_produce(fresh_broker.bootstrap, topic, [Rec(b"kept-%d" % p, partition=p, timestamp=T0)], acks="all")
    assert fresh_broker.stop() == 0
    logs = fresh_broker.data_dir / "logs"
    gone = logs / "gone-topic-0"
    gone.mkdir()
    (gone / ("0" * 20 + ".log")).write_bytes(b"")
    fresh_broker.start()
    assert not gone.exists()
    assert sorted(p.name for p in logs.glob(f"{topic}-*")) == [f"{topic}-{p}" for p in range(3)]
    for p in range(3):
        assert watermarks(fresh_broker.bootstrap, topic, p) == (0, 1)
