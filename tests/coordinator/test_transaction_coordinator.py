"""The transaction coordinator's state machine, with an in-memory store and marker channel."""

from __future__ import annotations

from dataclasses import replace

import pytest

from strom.coordinator.transaction import records
from strom.coordinator.transaction.coordinator import TransactionCoordinator
from strom.coordinator.transaction.records import TransactionLogValue, TxnState
from strom.protocol.errors import ErrorCode, KafkaError

E = ErrorCode


class FakeStore:
    def __init__(self) -> None:
        self.log: list[tuple[str, TransactionLogValue | None]] = []
        self.fail: ErrorCode | None = None
        self.local = True

    def is_local(self, transactional_id: str) -> bool:
        return self.local

    def coordinator_epoch(self, transactional_id: str) -> int:
        return 3

    def store(self, transactional_id: str, value: TransactionLogValue | None) -> ErrorCode:
        if self.fail is not None:
            return self.fail
        # What goes to the log must survive the round trip through Kafka's schema.
        self.log.append((transactional_id, None if value is None
                         else records.read_value(records.value(value))))
        return E.NONE

    def last(self, transactional_id: str) -> dict[str, TransactionLogValue]:
        return {tid: v for tid, v in self.log if tid == transactional_id}


class FakeMarkers:
    def __init__(self) -> None:
        self.written: list[tuple[int, int, int, bool, list]] = []
        self.errors: dict = {}

    def __call__(self, pid, epoch, coordinator_epoch, committed, partitions):
        partitions = list(partitions)
        self.written.append((pid, epoch, coordinator_epoch, committed, partitions))
        return {tp: self.errors.get(tp, E.NONE) for tp in partitions}


class Clock:
    now = 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def env():
    store, markers, clock = FakeStore(), FakeMarkers(), Clock()
    ids = iter(range(100, 200))
    coordinator = TransactionCoordinator(store, lambda: next(ids), markers, 900_000, 3_600_000, clock)
    coordinator.startup({})
    return coordinator, store, markers, clock


def test_init_gives_an_id_and_bumps_the_epoch_each_time(env):
    c, store, _, _ = env
    first = c.init_producer_id("tx", 60_000)
    second = c.init_producer_id("tx", 60_000)
    assert (first.error, first.producer_id, first.producer_epoch) == (E.NONE, 100, 0)
    assert (second.error, second.producer_id, second.producer_epoch) == (E.NONE, 100, 1)
    assert store.log[-1][1].state == TxnState.EMPTY and store.log[-1][1].producer_epoch == 1
    assert c.init_producer_id("other", 60_000).producer_id == 101
    assert c.init_producer_id("tx", 900_001).error == E.INVALID_TRANSACTION_TIMEOUT
    store.local = False
    assert c.init_producer_id("tx", 60_000).error == E.NOT_COORDINATOR


def test_commit_writes_markers_to_every_partition_then_completes(env):
    c, store, markers, _ = env
    init = c.init_producer_id("tx", 60_000)
    assert c.add_partitions("tx", init.producer_id, 0, [("a", 0), ("a", 1)]) == E.NONE
    assert c.add_partitions("tx", init.producer_id, 0, [("b", 0)]) == E.NONE
    assert c.txns["tx"].state == TxnState.ONGOING
    assert c.end_transaction("tx", init.producer_id, 0, committed=True).error == E.NONE
    assert markers.written == [(100, 0, 3, True, [("a", 0), ("a", 1), ("b", 0)])]
    states = [v.state for tid, v in store.log if tid == "tx"]
    assert states[-2:] == [TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT]
    assert store.log[-2][1].partitions == {("a", 0), ("a", 1), ("b", 0)}
    # A retried EndTxn is answered as the first one; the opposite decision is refused.
    assert c.end_transaction("tx", 100, 0, committed=True).error == E.NONE
    assert c.end_transaction("tx", 100, 0, committed=False).error == E.INVALID_TXN_STATE


def test_errors_for_unknown_ids_wrong_producers_and_empty_transactions(env):
    c, _, _, _ = env
    assert c.end_transaction("nobody", 1, 0, True).error == E.INVALID_PRODUCER_ID_MAPPING
    init = c.init_producer_id("tx", 60_000)
    assert c.add_partitions("tx", init.producer_id + 1, 0, [("a", 0)]) == E.INVALID_PRODUCER_ID_MAPPING
    assert c.end_transaction("tx", init.producer_id, 0, True).error == E.INVALID_TXN_STATE  # Empty
    c.init_producer_id("tx", 60_000)  # epoch 1 now: epoch 0 is a zombie
    assert c.add_partitions("tx", init.producer_id, 0, [("a", 0)]) == E.PRODUCER_FENCED
    assert c.end_transaction("tx", init.producer_id, 0, True).error == E.PRODUCER_FENCED


def test_a_new_producer_aborts_and_fences_the_open_transaction(env):
    c, _, markers, _ = env
    old = c.init_producer_id("tx", 60_000)
    c.add_partitions("tx", old.producer_id, 0, [("a", 0)])
    new = c.init_producer_id("tx", 60_000)
    assert new.error == E.NONE and new.producer_epoch == 2
    # The abort marker went out under epoch 1, which partitions then require.
    assert markers.written == [(100, 1, 3, False, [("a", 0)])]
    assert c.txns["tx"].state == TxnState.EMPTY
    assert c.end_transaction("tx", old.producer_id, 0, True).error == E.PRODUCER_FENCED


def test_timed_out_transactions_are_aborted_with_a_bumped_epoch(env):
    c, _, markers, clock = env
    init = c.init_producer_id("tx", 10_000)
    c.add_partitions("tx", init.producer_id, 0, [("a", 0)])
    clock.now += 9_000
    assert c.abort_timed_out() == 0
    clock.now += 2_000
    assert c.abort_timed_out() == 1
    assert markers.written == [(100, 1, 3, False, [("a", 0)])]
    assert c.txns["tx"].state == TxnState.COMPLETE_ABORT
    assert c.end_transaction("tx", init.producer_id, 0, True).error == E.PRODUCER_FENCED


def test_failed_markers_keep_the_transaction_prepared_until_a_retry_succeeds(env):
    c, _, markers, _ = env
    init = c.init_producer_id("tx", 60_000)
    c.add_partitions("tx", init.producer_id, 0, [("a", 0), ("a", 1)])
    markers.errors = {("a", 1): E.KAFKA_STORAGE_ERROR, ("a", 0): E.NONE}
    assert c.end_transaction("tx", init.producer_id, 0, True).error == E.NONE  # the decision is durable
    assert c.txns["tx"].state == TxnState.PREPARE_COMMIT
    assert c.end_transaction("tx", init.producer_id, 0, True).error == E.CONCURRENT_TRANSACTIONS
    assert c.init_producer_id("tx", 60_000).error == E.CONCURRENT_TRANSACTIONS
    markers.errors = {}
    c.abort_timed_out()
    assert markers.written[-1][4] == [("a", 1)]  # only the partition still missing its marker
    assert c.txns["tx"].state == TxnState.COMPLETE_COMMIT


def test_a_failed_state_write_changes_nothing(env):
    c, store, markers, _ = env
    init = c.init_producer_id("tx", 60_000)
    store.fail = E.NOT_COORDINATOR
    assert c.add_partitions("tx", init.producer_id, 0, [("a", 0)]) == E.NOT_COORDINATOR
    assert c.txns["tx"].state == TxnState.EMPTY and not markers.written


def test_restart_finishes_prepared_transactions(env):
    _, store, _, clock = env
    markers = FakeMarkers()
    loaded = {
        "prepared": TransactionLogValue(7, 2, 60_000, TxnState.PREPARE_ABORT, {("a", 0)}, 1, 1),
        "open": TransactionLogValue(8, 0, 60_000, TxnState.ONGOING, {("b", 0)}, 1, 1),
    }
    c = TransactionCoordinator(store, lambda: 500, markers, 900_000, now_ms=clock)
    c.startup(loaded)
    assert markers.written == [(7, 2, 3, False, [("a", 0)])]
    assert c.txns["prepared"].state == TxnState.COMPLETE_ABORT
    assert c.txns["open"].state == TxnState.ONGOING  # its producer may still commit it
    assert c.end_transaction("open", 8, 0, True).error == E.NONE


def test_describe_and_list(env):
    c, _, _, _ = env
    init = c.init_producer_id("tx", 60_000)
    c.add_partitions("tx", init.producer_id, 0, [("a", 0)])
    c.init_producer_id("idle", 60_000)
    error, meta = c.describe("tx")
    assert error == E.NONE and meta.state.display == "Ongoing" and meta.partitions == {("a", 0)}
    assert c.describe("missing")[0] == E.TRANSACTIONAL_ID_NOT_FOUND
    found, unknown = c.list(["Ongoing", "Bogus"])
    assert [m.transactional_id for m in found] == ["tx"] and unknown == ["Bogus"]
    assert {m.transactional_id for m in c.list()[0]} == {"tx", "idle"}
    assert [m.transactional_id for m in c.list(producer_ids=[101])[0]] == ["idle"]


def test_log_value_reads_kafkas_flexible_version_too():
    v = TransactionLogValue(5, 1, 30_000, TxnState.ONGOING, {("t", 0), ("t", 2), ("u", 1)}, 10, 9)
    assert records.read_value(records.value(v)) == v
    assert records.read_key(records.key("tx-é")) == "tx-é"
    # The same value in v1: compact strings/arrays (length + 1) and empty tagged-field sections.
    flexible = (b"\x00\x01" + (5).to_bytes(8, "big") + (1).to_bytes(2, "big") + (30_000).to_bytes(4, "big")
                + b"\x01" + b"\x02" + b"\x02u" + b"\x02" + (1).to_bytes(4, "big") + b"\x00"
                + (10).to_bytes(8, "big") + (9).to_bytes(8, "big") + b"\x00")
    assert records.read_value(flexible) == TransactionLogValue(5, 1, 30_000, TxnState.ONGOING,
                                                               {("u", 1)}, 10, 9)


def test_idle_transactional_ids_expire_with_a_tombstone(env):
    c, store, _, clock = env
    c.init_producer_id("idle", 60_000)
    busy = c.init_producer_id("busy", 60_000)
    c.add_partitions("busy", busy.producer_id, 0, [("a", 0)])
    clock.now += 3_600_000
    assert c.remove_expired() == 1
    assert store.log[-1] == ("idle", None) and set(c.txns) == {"busy"}


# --- transactions version 2 (KIP-890 part 2) ---------------------------------------------------

def _tv2_transaction(c, pid: int, epoch: int, partitions=(("t", 0), ("t", 1))):
    """What the leaders do for a TV2 producer: add the partitions on its behalf."""
    assert c.add_partitions("tx", pid, epoch, partitions, transaction_version=2) == E.NONE


def test_tv2_end_bumps_the_epoch_and_the_markers_carry_it(env):
    c, store, markers, _ = env
    init = c.init_producer_id("tx", 60_000)
    pid, epoch = init.producer_id, init.producer_epoch
    _tv2_transaction(c, pid, epoch)
    assert store.log[-1][1].client_transaction_version == 2
    end = c.end_transaction("tx", pid, epoch, committed=True, transaction_version=2)
    assert (end.error, end.producer_id, end.producer_epoch) == (E.NONE, pid, epoch + 1)
    assert markers.written[-1][:2] == (pid, epoch + 1)
    assert c.txns["tx"].state == TxnState.COMPLETE_COMMIT and c.txns["tx"].producer_epoch == epoch + 1
    # A retry of that EndTxn comes one epoch behind and gets the same answer.
    retry = c.end_transaction("tx", pid, epoch, committed=True, transaction_version=2)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.NONE, pid, epoch + 1)
    # ... but not as an abort, and an epoch further behind is a fenced producer.
    assert c.end_transaction("tx", pid, epoch, committed=False, transaction_version=2).error == E.INVALID_TXN_STATE
    assert c.end_transaction("tx", pid, epoch - 1, committed=True, transaction_version=2).error == E.PRODUCER_FENCED
    # The next transaction runs at the bumped epoch; the old epoch can no longer add.
    assert c.add_partitions("tx", pid, epoch, [("t", 0)], transaction_version=2) == E.PRODUCER_FENCED
    _tv2_transaction(c, pid, epoch + 1, [("t", 0)])
    end = c.end_transaction("tx", pid, epoch + 1, committed=False, transaction_version=2)
    assert (end.error, end.producer_epoch) == (E.NONE, epoch + 2)
    assert markers.written[-1][:4] == (pid, epoch + 2, 3, False)


def test_tv2_end_while_markers_are_pending_is_concurrent_and_then_done(env):
    c, _, markers, _ = env
    init = c.init_producer_id("tx", 60_000)
    pid, epoch = init.producer_id, init.producer_epoch
    _tv2_transaction(c, pid, epoch)
    markers.errors[("t", 1)] = E.NOT_ENOUGH_REPLICAS  # one leader cannot take its marker yet
    end = c.end_transaction("tx", pid, epoch, committed=True, transaction_version=2)
    assert (end.error, end.producer_epoch) == (E.NONE, epoch + 1)
    assert c.txns["tx"].state == TxnState.PREPARE_COMMIT
    assert c.end_transaction("tx", pid, epoch, True, transaction_version=2).error == E.CONCURRENT_TRANSACTIONS
    # The producer's next transaction must wait for the previous one's markers.
    assert c.add_partitions("tx", pid, epoch + 1, [("t", 0)], transaction_version=2) == E.CONCURRENT_TRANSACTIONS
    markers.errors.clear()
    c.abort_timed_out()  # retries pending markers
    assert c.txns["tx"].state == TxnState.COMPLETE_COMMIT
    _tv2_transaction(c, pid, epoch + 1, [("t", 0)])


def test_tv2_epoch_exhaustion_moves_the_producer_to_a_new_id(env):
    c, store, markers, _ = env
    init = c.init_producer_id("tx", 60_000)
    pid = init.producer_id
    c.txns["tx"] = replace(c.txns["tx"], producer_epoch=32766)  # many transactions later
    _tv2_transaction(c, pid, 32766)
    end = c.end_transaction("tx", pid, 32766, committed=True, transaction_version=2)
    new_pid = end.producer_id
    assert end.error == E.NONE and new_pid != pid and end.producer_epoch == 0
    assert markers.written[-1][:2] == (pid, 32767)  # the old id's batches get the marker
    prepared = [v for tid, v in store.log if tid == "tx" and v.state == TxnState.PREPARE_COMMIT][-1]
    assert prepared.next_producer_id == new_pid  # recorded before acting, for a new coordinator
    assert (c.txns["tx"].producer_id, c.txns["tx"].producer_epoch) == (new_pid, 0)
    # A retry from the old id and last epoch is recognised.
    retry = c.end_transaction("tx", pid, 32766, committed=True, transaction_version=2)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.NONE, new_pid, 0)
    _tv2_transaction(c, new_pid, 0)


def test_tv1_end_keeps_the_epoch(env):
    c, _, markers, _ = env
    init = c.init_producer_id("tx", 60_000)
    assert c.add_partitions("tx", init.producer_id, init.producer_epoch, [("t", 0)]) == E.NONE
    end = c.end_transaction("tx", init.producer_id, init.producer_epoch, committed=True)
    assert (end.error, end.producer_epoch) == (E.NONE, init.producer_epoch)
    assert markers.written[-1][1] == init.producer_epoch
    assert c.txns["tx"].client_transaction_version == 0


def test_a_new_coordinator_keeps_tv2_rules(env):
    c, store, markers, clock = env
    init = c.init_producer_id("tx", 60_000)
    pid, epoch = init.producer_id, init.producer_epoch
    _tv2_transaction(c, pid, epoch)
    c.end_transaction("tx", pid, epoch, committed=True, transaction_version=2)
    loaded = {tid: v for tid, v in store.log if v is not None}
    successor = TransactionCoordinator(store, lambda: 999, markers, 900_000, 3_600_000, clock)
    successor.startup(loaded)
    retry = successor.end_transaction("tx", pid, epoch, committed=True, transaction_version=2)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.NONE, pid, epoch + 1)


def test_tv2_epoch_exhaustion_without_an_id_to_give_is_retriable(env):
    """The new producer id for a spent epoch may not be there yet (a KRaft broker waiting for
    its block from the controller): EndTxn answers the retriable error and changes nothing, and
    a retry once ids are there ends the transaction."""
    c, store, _, _ = env
    init = c.init_producer_id("tx", 60_000)
    pid = init.producer_id
    c.txns["tx"] = replace(c.txns["tx"], producer_epoch=32766)
    _tv2_transaction(c, pid, 32766)
    before, written = c.txns["tx"], len(store.log)
    ids_ready = False

    def generate() -> int:
        if not ids_ready:
            raise KafkaError("no producer id block yet", E.COORDINATOR_LOAD_IN_PROGRESS)
        return 555

    c.generate_producer_id = generate
    end = c.end_transaction("tx", pid, 32766, committed=True, transaction_version=2)
    assert end.error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert c.txns["tx"] == before and len(store.log) == written
    ids_ready = True
    end = c.end_transaction("tx", pid, 32766, committed=True, transaction_version=2)
    assert (end.error, end.producer_id, end.producer_epoch) == (E.NONE, 555, 0)
