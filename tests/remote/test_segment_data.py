"""What a copy uploads beside a segment's records: the producer state as of the segment's end,
the same whether replayed from the log's start or carried on from the previous copy (which is
what keeps each copy's work to its own segment), and the leader epochs up to its end."""

from __future__ import annotations

from strom.log import Log, LogConfig
from strom.log.producer_state import read_snapshot
from strom.protocol.records import build_batch
from strom.remote.segment_data import epoch_entries, parse_epoch_checkpoint, segment_data


def test_the_producer_state_carried_from_copy_to_copy_is_the_one_replayed_from_the_start(tmp_path):
    log = Log.open(tmp_path / "orders-0", LogConfig(segment_bytes=800))
    sequences: dict[int, int] = {}
    for i in range(60):
        pid = 1000 + i % 3
        seq = sequences.get(pid, 0)
        sequences[pid] = seq + 1
        log.append(bytearray(build_batch([(None, b"v%03d" % i + b"p" * 60)], producer_id=pid, producer_epoch=2,
                                         base_sequence=seq)), leader_epoch=4 if i < 30 else 6)
    log.roll()
    segments = log.segments
    assert len(segments) > 4
    carried = None
    for segment, nxt in zip(segments, segments[1:], strict=False):
        data, carried = segment_data(log, segment, nxt.base_offset, carried)
        fresh, _ = segment_data(log, segment, nxt.base_offset, None)
        assert data.producer_snapshot == fresh.producer_snapshot
        assert carried.offset == nxt.base_offset
        epochs = parse_epoch_checkpoint(data.leader_epoch_index)
        assert epochs == list(epoch_entries(log, None, nxt.base_offset)) and epochs[0] == (4, 0)
    snapshot = tmp_path / "last.snapshot"
    snapshot.write_bytes(data.producer_snapshot)
    producers = read_snapshot(snapshot)
    assert sorted(producers) == [1000, 1001, 1002]
    end = segments[-1].base_offset  # one record per batch: offset i is batch i
    for pid, entry in producers.items():
        assert entry.producer_epoch == 2
        assert entry.batches[-1].last_seq == max(i // 3 for i in range(end) if 1000 + i % 3 == pid)
    log.close()
