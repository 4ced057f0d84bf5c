"""StateWriter, how a leader writes its share partitions' state: batched, pipelined, one write
per share partition at a time, each waiter answered by a write that holds its change. With a
fake WriteShareGroupState that the test answers when it wants."""

from __future__ import annotations

import asyncio
import uuid

from strom.coordinator.share.coordinator import StateResult
from strom.coordinator.share.share_partition import ACCEPT, LogBatch, SharePartition
from strom.coordinator.share.state_store import SharePartitionKey
from strom.protocol.errors import ErrorCode
from strom.share.state_writer import MAX_IN_FLIGHT, StateWriter

TOPIC = uuid.uuid4()


class Coordinator:
    """Records each write's items; each write is answered when the test says."""

    def __init__(self) -> None:
        self.writes: list[dict] = []
        self.answers: list[asyncio.Future] = []

    async def write(self, items: dict) -> dict:
        self.writes.append(items)
        answer = asyncio.get_running_loop().create_future()
        self.answers.append(answer)
        error = await answer
        if isinstance(error, Exception):
            raise error
        return {k: StateResult(error) for k in items}


def setup(count: int) -> tuple[Coordinator, dict, StateWriter, list[SharePartitionKey]]:
    coordinator = Coordinator()
    partitions: dict[SharePartitionKey, SharePartition] = {}
    keys = [SharePartitionKey("g", TOPIC, p) for p in range(count)]
    for key in keys:
        sp = partitions[key] = SharePartition(0, delivery_limit=5, max_in_flight=100)
        sp.acquire("m", [LogBatch(0, 9)], 10, 0, 1000)
    writer = StateWriter(coordinator.write, partitions, lambda key, sp: partitions.pop(key, None))
    return coordinator, partitions, writer, keys


def accept(sp: SharePartition, first: int, last: int) -> None:
    assert sp.acknowledge("m", [(first, last, [ACCEPT])]) == ErrorCode.NONE and sp.dirty


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_changes_made_in_one_turn_share_a_write_and_a_partition_is_in_one_write_at_a_time():
    async def run() -> None:
        coordinator, partitions, writer, (a, b) = setup(2)
        accept(partitions[a], 0, 1)
        accept(partitions[b], 0, 4)
        first = asyncio.ensure_future(writer.persist([a]))
        second = asyncio.ensure_future(writer.persist([b]))
        await settle()
        assert [set(w) for w in coordinator.writes] == [{a, b}]  # one write for both
        assert coordinator.writes[0][a].start_offset == 2 and coordinator.writes[0][b].start_offset == 5
        accept(partitions[a], 2, 3)  # changed while its write is out
        third = asyncio.ensure_future(writer.persist([a]))
        await settle()
        assert len(coordinator.writes) == 1  # a waits for its write to end
        coordinator.answers[0].set_result(ErrorCode.NONE)
        await settle()
        assert first.result() == {a: ErrorCode.NONE} and second.result() == {b: ErrorCode.NONE}
        assert not third.done() and len(coordinator.writes) == 2 and coordinator.writes[1][a].start_offset == 4
        coordinator.answers[1].set_result(ErrorCode.NONE)
        await settle()
        assert third.result() == {a: ErrorCode.NONE}
        # Nothing changed since: answered by the last write, no new one.
        assert await writer.persist([a]) == {a: ErrorCode.NONE} and len(coordinator.writes) == 2

    asyncio.run(run())


def test_writes_are_pipelined_up_to_the_bound():
    async def run() -> None:
        coordinator, partitions, writer, keys = setup(MAX_IN_FLIGHT + 1)
        waits = []
        for key in keys:
            accept(partitions[key], 0, 0)
            waits.append(asyncio.ensure_future(writer.persist([key])))
            await settle()  # each in a turn of its own
        assert [set(w) for w in coordinator.writes] == [{k} for k in keys[:MAX_IN_FLIGHT]]
        coordinator.answers[0].set_result(ErrorCode.NONE)
        await settle()
        assert [set(w) for w in coordinator.writes][-1] == {keys[-1]}
        for answer in coordinator.answers[1:]:
            answer.set_result(ErrorCode.NONE)
        await settle()
        assert all(w.result() == {k: ErrorCode.NONE} for w, k in zip(waits, keys, strict=True))

    asyncio.run(run())


def test_a_fenced_partition_is_dropped_and_a_failed_write_is_retried_with_the_next():
    async def run() -> None:
        coordinator, partitions, writer, (a, b) = setup(2)
        accept(partitions[a], 0, 0)
        accept(partitions[b], 0, 0)
        sp_b = partitions[b]
        waiting = asyncio.ensure_future(writer.persist([a, b]))
        await settle()
        accept(partitions[a], 1, 1)
        behind = asyncio.ensure_future(writer.persist([a]))  # waits for the next write of a
        await settle()
        coordinator.answers[0].set_result(ErrorCode.FENCED_STATE_EPOCH)
        await settle()
        assert waiting.result() == {a: ErrorCode.FENCED_STATE_EPOCH, b: ErrorCode.FENCED_STATE_EPOCH}
        assert a not in partitions and b not in partitions and not sp_b.dirty
        assert behind.result() == {a: ErrorCode.NOT_LEADER_OR_FOLLOWER}  # its change went with a

        coordinator, partitions, writer, (c,) = setup(1)
        accept(partitions[c], 0, 0)
        failing = asyncio.ensure_future(writer.persist([c]))
        await settle()
        coordinator.answers[0].set_result(OSError("coordinator gone"))
        await settle()
        assert failing.result() == {c: ErrorCode.UNKNOWN_SERVER_ERROR} and partitions[c].dirty
        again = asyncio.ensure_future(writer.persist([c]))
        await settle()
        assert coordinator.writes[1][c].start_offset == 1  # the change is written with the next
        coordinator.answers[1].set_result(ErrorCode.NONE)
        await settle()
        assert again.result() == {c: ErrorCode.NONE}

    asyncio.run(run())
