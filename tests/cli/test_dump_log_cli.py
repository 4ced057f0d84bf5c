"""`strom dump-log` (kafka-dump-log.sh) on the files a real broker wrote: what it shows of
segments, indexes, transaction indexes and checkpoints, and the damage its consistency check
finds in copies that were corrupted on purpose."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from crc32c import crc32c

from strom.log.checkpoint import write_checkpoint
from strom.testing import create_topic, reading_consumer, unique_name, wait_for

from .conftest import fails, ok, strom

pytestmark = pytest.mark.timeout(120)

RECORDS = 40


@pytest.fixture(scope="module")
def partition_dir(cli_broker) -> Path:
    """A partition of several segments, every batch indexed, holding RECORDS keyed records one
    batch each, then an aborted and a committed transaction."""
    bootstrap = cli_broker.bootstrap
    topic = unique_name("dump")
    create_topic(bootstrap, topic, 1, config={"segment.bytes": "1500", "index.interval.bytes": "0"})
    ok("produce", topic, "--bootstrap-server", bootstrap, "--sync", "--property", "parse.key=true",
       "--property", "parse.headers=true", input="".join(f"h:{i}\tk{i}\tv{i}\n" for i in range(RECORDS)))
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("dump-txn")})
    producer.init_transactions(30)
    for value, commit in ((b"aborted", False), (b"committed", True)):
        producer.begin_transaction()
        producer.produce(topic, value)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    # A coordinator may write the markers after it answers EndTxn (Kafka's does): wait for the
    # last one, so the tests read a partition that is complete.
    wait_for(lambda: end_offset(bootstrap, topic) == RECORDS + 4, 30, what="both transaction markers")
    return cli_broker.data_dir / "logs" / f"{topic}-0"


def end_offset(bootstrap: str, topic: str) -> int:
    consumer = reading_consumer(bootstrap)
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def segment_files(directory: Path, suffix: str) -> list[Path]:
    return sorted(directory.glob(f"*{suffix}"))


def test_dumps_a_healthy_partition(partition_dir, tmp_path):
    logs = segment_files(partition_dir, ".log")
    assert len(logs) > 2  # several segments
    # Every file there before and after is dumped (the broker may write one meanwhile, as a
    # producer-state snapshot after a roll), and nothing that was not there.
    before = {str(p) for p in partition_dir.iterdir()}
    out = ok("dump-log", str(partition_dir))
    after = {str(p) for p in partition_dir.iterdir()}
    dumped = re.findall(r"^Dumping (\S+)$", out, re.MULTILINE)
    assert len(dumped) == len(set(dumped)) and before & after <= set(dumped) <= before | after, (before, after, dumped)
    batches = [line for line in out.splitlines() if line.startswith("baseOffset: ")]
    assert len(batches) == RECORDS + 4  # one per record, two transactional records, two markers
    first = dict(re.findall(r"(\w+): (\S+)", batches[0]))
    assert (first["baseOffset"], first["lastOffset"], first["count"], first["magic"], first["isvalid"],
            first["position"]) == ("0", "0", "1", "2", "true", "0")
    assert sum("isControl: true" in b and "isTransactional: true" in b for b in batches) == 2

    deep = ok("dump-log", str(logs[0]), "--print-data-log")
    records = [line for line in deep.splitlines() if line.startswith("| offset: ")]
    assert records[0].startswith("| offset: 0 CreateTime: ") and records[0].endswith(
        "keySize: 2 valueSize: 2 sequence: -1 headerKeys: [h] key: k0 payload: v0")
    tail = ok("dump-log", str(logs[-1]), "--deep-iteration")
    assert "endTxnMarker: ABORT" in tail and "endTxnMarker: COMMIT" in tail and "payload:" not in tail

    index = ok("dump-log", str(segment_files(partition_dir, ".index")[0]))
    entries = [tuple(map(int, re.findall(r"\d+", line))) for line in index.splitlines()[1:]]
    assert entries and all(position > 0 for _, position in entries)  # the first batch is not indexed
    times = ok("dump-log", str(segment_files(partition_dir, ".timeindex")[0])).splitlines()[1:]
    assert times and all(line.startswith("timestamp: ") for line in times)
    txn = segment_files(partition_dir, ".txnindex")
    assert len(txn) == 1
    assert re.fullmatch(r"Dumping \S+\nversion: 0 producerId: \d+ firstOffset: (\d+) lastOffset: (\d+) "
                        r"lastStableOffset: \d+\n", ok("dump-log", str(txn[0])))
    assert ok("dump-log", str(partition_dir / "leader-epoch-checkpoint")).splitlines()[1] == "epoch: 0 startOffset: 0"

    # Checking only: no entries printed, nothing wrong.
    quiet = ok("dump-log", str(partition_dir), "--verify-index-only", "--deep-iteration")
    assert all(line.startswith(("Dumping ", "Log starting offset: ")) for line in quiet.splitlines())
    sane = ok("dump-log", "--files", ",".join(str(p) for p in segment_files(partition_dir, "index")),
              "--index-sanity-check")
    assert sane.count("passed sanity check.") == 2 * len(logs)
    assert ok("dump-log", str(logs[0]), "--max-bytes", "100").count("baseOffset: ") == 1

    checkpoint = tmp_path / "recovery-point-offset-checkpoint"
    write_checkpoint(checkpoint, {("orders", 0): 42, ("orders", 1): 7})
    assert ok("dump-log", str(checkpoint)).splitlines()[1:] == [
        "topic: orders partition: 0 offset: 42", "topic: orders partition: 1 offset: 7"]
    (tmp_path / "notes.txt").write_text("hello")
    done = strom("dump-log", str(tmp_path / "notes.txt"))
    assert (done.returncode, done.stderr.strip()) == (0, f"Ignoring {tmp_path / 'notes.txt'}: not a file this tool reads")
    assert "does not exist" in fails("dump-log", str(tmp_path / "nothing.log"), code=2)


def damage(partition_dir: Path, tmp_path: Path) -> Path:
    """A copy of the partition to break."""
    copy = tmp_path / partition_dir.name
    shutil.copytree(partition_dir, copy)
    return copy


def problems(*args: str) -> tuple[list[str], str]:
    """The problem lines of a dump-log that must fail, and its last line."""
    done = strom("dump-log", *args)
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("Problems in ") and "Traceback" not in done.stderr, done
    return [line.strip() for line in lines if line.startswith("  ")], lines[-1]


def test_finds_damaged_logs(partition_dir, tmp_path):
    copy = damage(partition_dir, tmp_path)
    log = segment_files(copy, ".log")[0]
    data = bytearray(log.read_bytes())
    second = struct.unpack_from(">i", data, 8)[0] + 12  # where the second batch starts
    data[second + 70] ^= 0xFF  # a byte of its records
    log.write_bytes(data)
    found, last = problems(str(log))
    assert found == [f"batch at position {second} (offsets 1-1): CRC mismatch"]
    assert last == "Error: 1 problem(s) found in 1 file(s)"
    # The next segment cut in the middle of its last batch: the walk stops there.
    torn = segment_files(copy, ".log")[1]
    size = torn.stat().st_size
    with open(torn, "r+b") as f:
        f.truncate(size - 5)
    found, _ = problems(str(torn))
    assert len(found) == 1 and re.fullmatch(r"\d+ bytes at position \d+ are not a whole batch \(a batch of "
                                            r"\d+ bytes runs past the end\)", found[0]), found
    # Deep iteration checks records too: a batch whose record count exceeds its offset range.
    third = segment_files(copy, ".log")[2]
    data = bytearray(third.read_bytes())
    struct.pack_into(">i", data, 57, 5)  # record count 5 where the offset range is 1...
    size = struct.unpack_from(">i", data, 8)[0] + 12
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:size])))  # ...under a valid CRC
    third.write_bytes(data)
    found, _ = problems(str(third), "--deep-iteration")
    assert "5 records in an offset range of 1" in found[0]


def test_finds_damaged_indexes(partition_dir, tmp_path):
    copy = damage(partition_dir, tmp_path)
    index = segment_files(copy, ".index")[0]
    data = bytearray(index.read_bytes())
    assert len(data) >= 24
    rel, position = struct.unpack_from(">ii", data, 8)
    struct.pack_into(">ii", data, 8, rel, position + 1)  # the second entry points inside a batch
    index.write_bytes(data)
    found, _ = problems(str(index), "--verify-index-only")
    assert found == [f"entry (offset {rel}, position {position + 1}): no batch starts at that position of the log"]
    # The broker's quick start-up check does not look into the log: it passes.
    assert "passed sanity check." in ok("dump-log", str(index), "--index-sanity-check")
    # Entries out of order fail the broker's own start-up check too.
    struct.pack_into(">ii", data, 0, *struct.unpack_from(">ii", data, 16))
    index.write_bytes(data)
    found, _ = problems(str(index), "--index-sanity-check")
    assert found and "sanity check" in found[0]

    times = segment_files(copy, ".timeindex")[0]
    data = bytearray(times.read_bytes())
    ts, rel = struct.unpack_from(">qi", data, 0)
    struct.pack_into(">qi", data, 0, ts - 1, rel)  # not the batch's max timestamp any more
    times.write_bytes(data)
    found, _ = problems(str(times))
    assert found == [f"entry (timestamp {ts - 1}, offset {rel + int(times.stem)}): the batch holding it "
                     f"has max timestamp {ts}"]

    txn = segment_files(copy, ".txnindex")[0]
    data = bytearray(txn.read_bytes())
    struct.pack_into(">q", data, 18, 0)  # lastOffset: offset 0, not a marker
    txn.write_bytes(bytes(data) + b"junk")
    found, _ = problems(str(txn))
    assert len(found) == 3, found
    assert "4 bytes after the last readable entry" in found[0]
    assert found[1].endswith("its first offset is after its last")
    assert found[2].endswith("offset 0 of the log is not that producer's transaction marker")

    (copy / "leader-epoch-checkpoint").write_text("0\n2\n3 10\n1 20\n")
    found, _ = problems(str(copy / "leader-epoch-checkpoint"))
    assert found[0].startswith("unreadable: entries out of order")

    segment_files(copy, ".log")[1].unlink()
    orphan = segment_files(copy, ".index")[1]
    found, _ = problems(str(orphan))
    assert found == [f"its log {orphan.stem}.log is missing: entries cannot be checked"]


def test_decodes_internal_topics(cli_broker):
    bootstrap = cli_broker.bootstrap
    topic, group = unique_name("decoded"), unique_name("decoded-group")
    create_topic(bootstrap, topic, 1)
    ok("groups", "reset-offsets", group, "--bootstrap-server", bootstrap, "--topic", topic,
       "--to-offset", "0", "--execute")
    logs = cli_broker.data_dir / "logs"
    partitions = sorted(str(p) for p in logs.glob("__consumer_offsets-*"))
    out = ok("dump-log", *partitions, "--offsets-decoder")
    line = next(line for line in out.splitlines() if group in line)
    assert f'key: {{"type": "OffsetCommitKey", "group": "{group}", "topic": "{topic}", "partition": 0}}' in line
    assert 'payload: {"offset": 0, "leader_epoch": -1, "metadata": ""' in line


def test_dumps_a_producer_snapshot(tmp_path):
    """A `.snapshot` file (what a partition's producers had done at that offset), as
    kafka-dump-log.sh shows one; a damaged one is a problem."""
    from strom.log.producer_state import BatchMetadata, ProducerStateEntry, ProducerStateManager

    manager = ProducerStateManager(tmp_path)
    entry = ProducerStateEntry(4000, 2, coordinator_epoch=5, current_txn_first_offset=17, last_timestamp=1234)
    entry.batches.append(BatchMetadata(10, 14, 13, 17, 1234))
    manager.producers[4000] = entry
    path = manager.write_snapshot(18, manager.encode_snapshot())
    out = ok("dump-log", str(path)).splitlines()
    assert out[1:] == ["producerId: 4000 producerEpoch: 2 coordinatorEpoch: 5 currentTxnFirstOffset: 17 "
                       "lastTimestamp: 1234 firstSequence: 10 lastSequence: 14 lastOffset: 17 offsetDelta: 4"]
    path.write_bytes(path.read_bytes()[:-3])
    found, _ = problems(str(path))
    assert found == ["unreadable: bad version or checksum"]
