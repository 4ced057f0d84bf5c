"""Transactions in one partition: open transactions bound the last stable offset, markers
close them, aborts are indexed in `.txnindex`, and all of it is rebuilt from the log."""

from __future__ import annotations

from pathlib import Path

from strom.log import LogConfig
from strom.log.producer_state import ProducerStateManager
from strom.log.txn_index import ENTRY_SIZE, AbortedTxn, TransactionIndex
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import build_batch, build_marker_batch, read_header


def _txn_batch(pid: int, n: int = 2, epoch: int = 0, seq: int = 0) -> bytearray:
    return bytearray(build_batch([(b"k", b"v")] * n, producer_id=pid, producer_epoch=epoch,
                                 base_sequence=seq, transactional=True))


def _append_data(log, psm: ProducerStateManager, pid: int, n: int = 2) -> int:
    batch = _txn_batch(pid, n)
    info = log.append(batch)
    psm.update(read_header(batch), info.first_offset)
    return info.first_offset


def _append_marker(log, psm: ProducerStateManager, pid: int, committed: bool, epoch: int = 0):
    info = log.append(bytearray(build_marker_batch(pid, epoch, committed, 5, 0)))
    aborted = psm.complete_txn(pid, epoch, 5, info.first_offset, committed)
    if aborted is not None:
        log.add_aborted_txn(aborted)
    return info.first_offset, aborted


def test_index_appends_collects_truncates_and_ignores_a_torn_entry(tmp_path: Path):
    index = TransactionIndex(tmp_path / "0.txnindex")
    assert index.collect(0, 100) == [] and not index.path.exists()  # created on first abort only
    a, b = AbortedTxn(1, 0, 5, 6), AbortedTxn(2, 3, 9, 10)
    assert index.append(a) and index.append(b)
    assert not index.append(AbortedTxn(1, 0, 5, 6))  # replayed by recovery: already there
    assert TransactionIndex(index.path).entries == [a, b]
    assert index.collect(6, 100) == [b] and index.collect(0, 3) == [a]
    with open(index.path, "ab") as f:
        f.write(b"\x00" * (ENTRY_SIZE // 2))
    assert TransactionIndex(index.path).entries == [a, b]
    index.truncate_to(9)
    assert TransactionIndex(index.path).entries == [a]
    index.truncate_to(0)
    assert not index.path.exists()


def test_last_stable_offset_follows_open_transactions(open_log, tmp_path: Path):
    log = open_log()
    psm = ProducerStateManager(log.dir)
    assert psm.first_unstable_offset is None
    first_a = _append_data(log, psm, pid=1)        # 0-1
    first_b = _append_data(log, psm, pid=2)        # 2-3
    _append_data(log, psm, pid=1)                   # 4-5: same transaction, first offset stays
    assert psm.first_unstable_offset == first_a == 0
    _, aborted = _append_marker(log, psm, 1, committed=False)  # 6
    assert psm.first_unstable_offset == first_b == 2
    assert aborted == AbortedTxn(1, 0, 6, 2)
    _, none = _append_marker(log, psm, 2, committed=True)    # 7
    assert none is None and psm.first_unstable_offset is None
    assert log.collect_aborted_txns(0, 8) == [aborted]
    assert log.collect_aborted_txns(7, 8) == []


def test_markers_from_fenced_producers_or_old_coordinators_are_refused(tmp_path: Path):
    psm = ProducerStateManager(tmp_path)
    psm.update(read_header(_txn_batch(1, epoch=3)), 0)
    psm.complete_txn(1, 3, 7, 2, committed=True)
    for epoch, coordinator_epoch, code in ((2, 7, ErrorCode.INVALID_PRODUCER_EPOCH),
                                           (3, 6, ErrorCode.TRANSACTION_COORDINATOR_FENCED)):
        try:
            psm.check_marker(1, epoch, coordinator_epoch)
        except KafkaError as e:
            assert e.code == code
        else:
            raise AssertionError("marker accepted")
    psm.check_marker(1, 4, 7)  # a bumped epoch (fencing abort) is fine


def test_state_and_index_are_rebuilt_from_the_log(open_log, tmp_path: Path):
    config = LogConfig(segment_bytes=300)  # several segments, so aborts land in different ones
    log = open_log(config)
    psm = ProducerStateManager(log.dir)
    aborts = []
    for pid in range(1, 6):
        _append_data(log, psm, pid)
        _append_data(log, psm, 100 + pid)  # each pid 100+ stays open at the end
        _, aborted = _append_marker(log, psm, pid, committed=pid % 2 == 0)
        if aborted:
            aborts.append(aborted)
    assert len(log.segments) > 2
    assert log.collect_aborted_txns(0, log.log_end_offset) == aborts
    open_first = dict(psm.ongoing)
    # Snapshot half-way state is not needed: a state built from the log alone agrees.
    for segment in log.segments:
        segment.txn_index.path.unlink(missing_ok=True)
        segment.txn_index._entries = None
    rebuilt = ProducerStateManager(log.dir)
    rebuilt.rebuild(log)
    assert rebuilt.ongoing == open_first
    assert rebuilt.first_unstable_offset == psm.first_unstable_offset
    assert log.collect_aborted_txns(0, log.log_end_offset) == aborts
    # A snapshot keeps open transactions and coordinator epochs across a restart.
    offset = log.log_end_offset
    psm.write_snapshot(offset, psm.encode_snapshot())
    loaded = ProducerStateManager(log.dir)
    assert loaded.load(offset) == offset
    assert loaded.ongoing == open_first
    assert loaded.producers[1].coordinator_epoch == 5


def test_idle_producers_expire_but_not_with_an_open_transaction(tmp_path: Path):
    psm = ProducerStateManager(tmp_path)
    for pid, ts in ((1, 1_000), (2, 5_000)):
        psm.update(read_header(bytearray(build_batch([(b"k", b"v")], timestamp=ts, producer_id=pid,
                                                     producer_epoch=0, base_sequence=0))), pid)
    open_txn = _txn_batch(3)  # timestamp 0, but its transaction is open
    psm.update(read_header(open_txn), 10)
    assert psm.remove_expired(now_ms=6_000, expiration_ms=3_000) == 1
    assert set(psm.producers) == {2, 3}
