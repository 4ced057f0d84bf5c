"""The ShareCoordinator's decisions (KIP-932's share-state operations) over a
ShareStateStore on real logs: initialization, reads that record a newer leader epoch, writes
fenced by leader and state epochs, partial writes merged into the stored state, deletion, and
keys this broker does not coordinate."""

from __future__ import annotations

import uuid

from tests.coordinator.coordinator_support import LogReplicaManager

from strom.coordinator.share.coordinator import ShareCoordinator, WriteState, merge_batches
from strom.coordinator.share.share_partition import (
    ACKNOWLEDGED,
    ARCHIVED,
    AVAILABLE,
    ShareState,
    StateBatch,
)
from strom.coordinator.share.state_store import SharePartitionKey, ShareStateStore
from strom.log import Log
from strom.log.config import LogConfig
from strom.protocol.errors import ErrorCode

TOPIC = "__share_group_state"


def coordinator(tmp_path, partitions: int = 2) -> tuple[ShareCoordinator, LogReplicaManager]:
    logs = {p: Log.open(tmp_path / f"{TOPIC}-{p}", LogConfig()) for p in range(partitions)}
    rm = LogReplicaManager(TOPIC, logs)
    store = ShareStateStore(rm, lambda: partitions)
    store.apply(store.load())
    return ShareCoordinator(store), rm


def errors(results) -> dict:
    return {k: r.error for k, r in results.items()}


KEY = SharePartitionKey("g", uuid.UUID(int=7), 0)


def test_state_starts_with_initialize_and_is_read_back_after_a_replay(tmp_path):
    c, rm = coordinator(tmp_path)
    (read, _) = c.read([(KEY, 3)])
    assert read[KEY].error == ErrorCode.NONE and read[KEY].state is None  # not initialized
    assert errors(c.write([(KEY, WriteState(0, 3, 5, []))])[0]) == {KEY: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    results, written = c.initialize([(KEY, 0, 5)])
    assert errors(results) == {KEY: ErrorCode.NONE} and written == {c.store.partition_for(KEY.coordinator_key)}
    assert errors(c.initialize([(KEY, 0, 9)])[0]) == {KEY: ErrorCode.FENCED_STATE_EPOCH}  # already there
    batches = [StateBatch(5, 6, ACKNOWLEDGED, 1), StateBatch(7, 9, AVAILABLE, 2)]
    assert errors(c.write([(KEY, WriteState(0, 3, 5, batches))])[0]) == {KEY: ErrorCode.NONE}
    replayed = ShareCoordinator(ShareStateStore(rm, lambda: 2))
    replayed.store.apply(replayed.store.load())
    (read, _) = replayed.read([(KEY, 3)])
    assert read[KEY].state == ShareState(5, batches, 0, 3)


def test_leader_and_state_epochs_fence_writes(tmp_path):
    c, _ = coordinator(tmp_path)
    c.initialize([(KEY, 0, 0)])
    assert errors(c.write([(KEY, WriteState(0, 4, 0, []))])[0]) == {KEY: ErrorCode.NONE}
    # A new leader reads with epoch 5: recorded (and written), so the leader of epoch 4 is fenced.
    (read, written) = c.read([(KEY, 5)])
    assert read[KEY].state.leader_epoch == 5 and written
    assert errors(c.write([(KEY, WriteState(0, 4, 1, []))])[0]) == {KEY: ErrorCode.FENCED_LEADER_EPOCH}
    assert errors(c.read([(KEY, 4)])[0]) == {KEY: ErrorCode.FENCED_LEADER_EPOCH}
    # AlterShareGroupOffsets starts the state over under state epoch 1: epoch-0 writes are fenced.
    assert errors(c.initialize([(KEY, 1, 100)])[0]) == {KEY: ErrorCode.NONE}
    assert errors(c.write([(KEY, WriteState(0, 5, 1, []))])[0]) == {KEY: ErrorCode.FENCED_STATE_EPOCH}
    assert errors(c.write([(KEY, WriteState(1, 5, 101, []))])[0]) == {KEY: ErrorCode.NONE}
    (summary, _) = c.read([(KEY, -1)], summary=True)
    assert summary[KEY].state == ShareState(101, [], 1, 5)


def test_delete_and_keys_led_elsewhere(tmp_path):
    c, rm = coordinator(tmp_path)
    c.initialize([(KEY, 0, 0)])
    assert errors(c.delete([KEY])[0]) == {KEY: ErrorCode.NONE}
    assert c.read([(KEY, 0)])[0][KEY].state is None
    assert errors(c.delete([KEY])[0]) == {KEY: ErrorCode.NONE}  # nothing left: still fine
    rm.partitions[(TOPIC, c.store.partition_for(KEY.coordinator_key))].is_leader = False
    assert errors(c.read([(KEY, 0)])[0]) == {KEY: ErrorCode.NOT_COORDINATOR}
    bad = SharePartitionKey("g", uuid.UUID(int=0), 0)
    assert errors(c.initialize([(bad, 0, 0)])[0]) == {bad: ErrorCode.INVALID_REQUEST}


def test_a_write_replaces_what_its_batches_cover():
    old = [StateBatch(10, 19, AVAILABLE, 1), StateBatch(20, 29, ACKNOWLEDGED, 1)]
    new = [StateBatch(12, 13, ARCHIVED, 2), StateBatch(25, 34, AVAILABLE, 1)]
    assert merge_batches(old, new, 11) == [
        StateBatch(11, 11, AVAILABLE, 1), StateBatch(12, 13, ARCHIVED, 2), StateBatch(14, 19, AVAILABLE, 1),
        StateBatch(20, 24, ACKNOWLEDGED, 1), StateBatch(25, 34, AVAILABLE, 1)]
    # A whole window (what Strom's leaders send) is the new state as it is.
    assert merge_batches(old, [StateBatch(15, 40, AVAILABLE, 3)], 15) == [StateBatch(15, 40, AVAILABLE, 3)]
    assert merge_batches(old, [], 30) == []


def test_not_before_times_survive_a_merge_and_the_state_rpcs():
    """Strom's own not-before of a state batch (delayed delivery): kept by a partial write's
    merge, and carried by WriteShareGroupState and ReadShareGroupState (a tagged field)."""
    from strom.coordinator.share.coordinator import StateResult
    from strom.coordinator.share.share_partition import ShareState
    from strom.protocol import messages
    from strom.share.coordinator_service import (
        READ,
        WRITE,
        request_fields,
        request_items,
        response_fields,
        response_results,
    )

    old = [StateBatch(10, 19, AVAILABLE, 1, 5000)]
    assert merge_batches(old, [StateBatch(12, 13, ACKNOWLEDGED, 1)], 11) == [
        StateBatch(11, 11, AVAILABLE, 1, 5000), StateBatch(12, 13, ACKNOWLEDGED, 1),
        StateBatch(14, 19, AVAILABLE, 1, 5000)]
    key = SharePartitionKey("g", uuid.uuid4(), 0)
    batches = [StateBatch(5, 6, AVAILABLE, 1, 1_767_225_600_000), StateBatch(7, 7, ACKNOWLEDGED, 1)]
    frame = messages.encode_request(85, 0, request_fields(WRITE, "g", {key: WriteState(0, 1, 5, batches)}))
    assert request_items(WRITE, messages.parse_request(frame[4:]).body)[key].batches == batches
    read = {key: StateResult(state=ShareState(5, batches, 0, 1))}
    body = messages.build(messages.RESPONSES[84], 0, response_fields(READ, read)).encode(version=0)
    answer = response_results(READ, "g", messages.RESPONSES[84].decode(memoryview(body), version=0))
    assert answer[key].state.batches == batches


def test_a_state_partition_taken_on_election_loads_off_the_event_loop(tmp_path):
    """As the group and transaction coordinators' partitions: replayed in the executor, its keys
    answered COORDINATOR_LOAD_IN_PROGRESS until the replay is applied, a load overtaken by an
    unload dropped."""
    import asyncio
    from types import SimpleNamespace

    from strom.server.coordinators import Coordinators

    c, rm = coordinator(tmp_path)
    c.initialize([(KEY, 0, 5)])
    index = c.store.partition_for(KEY.coordinator_key)
    successor = ShareCoordinator(ShareStateStore(rm, lambda: 2))
    manager = SimpleNamespace(loading={}, store=successor.store, startup=successor.store.apply)

    def unload(i: int) -> None:
        manager.loading.pop(i, None)
        successor.store.unload(i)

    async def main() -> None:
        coordinators = Coordinators(SimpleNamespace(share_partitions=manager, group_coordinator=None,
                                                    txn_coordinator=None))
        coordinators.load(TOPIC, index)
        (read, _) = successor.read([(KEY, 3)])
        assert read[KEY].error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        await asyncio.gather(*coordinators._loads)
        (read, _) = successor.read([(KEY, 3)])
        assert read[KEY].error == ErrorCode.NONE and read[KEY].state.start_offset == 5
        unload(index)
        coordinators.load(TOPIC, index)
        unload(index)
        await asyncio.gather(*coordinators._loads)
        assert successor.read([(KEY, 3)])[0][KEY].error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS

    asyncio.run(main())


def test_a_summary_read_answers_the_delivery_complete_count(tmp_path):
    """KIP-1226: ReadShareGroupStateSummary v1's count of records at or after the start offset
    that are done with (ACKNOWLEDGED or ARCHIVED), derived from the stored runs; a dead letter
    not yet written and an available record are not done. -1 at v0 and without state."""
    from strom.coordinator.share.share_partition import (
        DEAD_LETTER_REJECTED,
        delivery_complete_count,
    )
    from strom.protocol import messages
    from strom.share.coordinator_service import READ_SUMMARY, response_fields, response_results

    c, _ = coordinator(tmp_path)
    assert c.read([(KEY, -1)], summary=True)[0][KEY].delivery_complete_count == -1  # no state
    c.initialize([(KEY, 0, 10)])
    batches = [StateBatch(10, 11, AVAILABLE, 1), StateBatch(12, 14, ACKNOWLEDGED, 1),
               StateBatch(15, 15, DEAD_LETTER_REJECTED, 1), StateBatch(16, 19, ARCHIVED, 5)]
    assert errors(c.write([(KEY, WriteState(0, 1, 10, batches))])[0]) == {KEY: ErrorCode.NONE}
    (summary, _) = c.read([(KEY, -1)], summary=True)
    assert summary[KEY].delivery_complete_count == 3 + 4
    # A run the start offset cuts counts from the start offset on.
    assert delivery_complete_count(ShareState(13, batches)) == 2 + 4
    assert delivery_complete_count(ShareState(-1, batches)) == -1

    def over_the_wire(version: int) -> int:
        body = messages.build(messages.RESPONSES[87], version, response_fields(READ_SUMMARY, summary)).encode(
            version=version)
        decoded = messages.RESPONSES[87].decode(memoryview(body), version=version)
        return response_results(READ_SUMMARY, "g", decoded)[KEY].delivery_complete_count

    assert (over_the_wire(1), over_the_wire(0)) == (7, -1)
