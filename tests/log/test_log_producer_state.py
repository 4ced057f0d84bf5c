from pathlib import Path

import pytest

from strom.log.config import LogConfig
from strom.log.log import Log
from strom.log.producer_state import ProducerStateManager
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import build_batch, read_header


def _header(pid: int, epoch: int, seq: int, n: int = 2):
    return read_header(build_batch([(b"k", b"v")] * n, producer_id=pid, producer_epoch=epoch,
                                   base_sequence=seq))


def test_retry_of_recent_batch_is_a_duplicate(tmp_path: Path):
    psm = ProducerStateManager(tmp_path)
    offset = 0
    for seq in range(0, 14, 2):  # seven batches: only the last five are remembered
        h = _header(7, 0, seq)
        assert psm.check(h) is None
        psm.update(h, offset)
        offset += 2
    dup = psm.check(_header(7, 0, 12))
    assert dup is not None and (dup.first_offset, dup.last_offset) == (12, 13)
    assert psm.check(_header(7, 0, 4)) is not None  # fifth from last
    with pytest.raises(KafkaError) as e:
        psm.check(_header(7, 0, 2))  # forgotten: no longer a duplicate, and out of order
    assert e.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_gap_old_epoch_and_new_epoch(tmp_path: Path):
    psm = ProducerStateManager(tmp_path)
    psm.update(_header(1, 3, 0), 0)
    with pytest.raises(KafkaError) as e:
        psm.check(_header(1, 3, 5))
    assert e.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    with pytest.raises(KafkaError) as e:
        psm.check(_header(1, 2, 2))
    assert e.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    with pytest.raises(KafkaError) as e:
        psm.check(_header(1, 4, 9))
    assert e.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert psm.check(_header(1, 4, 0)) is None
    assert psm.check(_header(99, 0, 1234)) is None  # unknown producers start anywhere


def test_snapshot_round_trip_and_bad_snapshot_ignored(tmp_path: Path):
    psm = ProducerStateManager(tmp_path)
    psm.update(_header(5, 1, 0, n=3), 10)
    psm.write_snapshot(13, psm.encode_snapshot())
    loaded = ProducerStateManager(tmp_path)
    assert loaded.load(13) == 13
    assert loaded.check(_header(5, 1, 0, n=3)).first_offset == 10
    (tmp_path / f"{20:020d}.snapshot").write_bytes(b"garbage")
    assert ProducerStateManager(tmp_path).load(25) == 13  # the bad newer one is skipped
    assert ProducerStateManager(tmp_path).load(12) == 0  # snapshots past the log end are dropped
    assert not (tmp_path / f"{13:020d}.snapshot").exists()


def test_rebuild_from_log_after_snapshot(tmp_path: Path):
    log_dir = tmp_path / "t-0"
    log = Log.open(log_dir, LogConfig(), recovery_point=0)
    psm = ProducerStateManager(log_dir)
    for seq in (0, 2):
        batch = bytearray(build_batch([(b"k", b"v")] * 2, producer_id=3, producer_epoch=0,
                                      base_sequence=seq))
        info = log.append(batch)
        psm.update(read_header(batch), info.first_offset)
        if seq == 0:
            psm.write_snapshot(log.log_end_offset, psm.encode_snapshot())
    log.append(bytearray(build_batch([(b"plain", b"x")])))  # non-idempotent batches are ignored
    rebuilt = ProducerStateManager(log_dir)
    rebuilt.rebuild(log)
    assert rebuilt.check(_header(3, 0, 2)).first_offset == 2
    assert rebuilt.check(_header(3, 0, 4)) is None
    log.close()
