"""A follower's incremental fetch sessions (KIP-227), in process: the fetching end
(FetchSessionHandler) against the leader's real Fetch handler, session cache and
ReplicaManager over real logs, requests and responses going through the protocol codec."""

from __future__ import annotations

import asyncio
import functools
import uuid
from types import SimpleNamespace

import pytest

from strom.log import Log, LogConfig
from strom.protocol import messages
from strom.protocol.errors import ErrorCode
from strom.protocol.records import build_batch
from strom.replication import fetch_session
from strom.replication.fetch_session import (
    INITIAL_EPOCH,
    INVALID_SESSION,
    FetchSessionCache,
    FetchSessionHandler,
)
from strom.replication.partition import Partition
from strom.replication.replica_manager import ReplicaManager
from strom.server.apis.fetch import handle_fetch

FETCH, VERSION = 1, 12
LEADER, FOLLOWER, EPOCH = 0, 1, 3
TOPIC = "t"


def in_loop(test):
    """Run an async test on a fresh event loop (pytest's own arguments pass through)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


def state(offset: int, log_start: int = 0) -> tuple[int, int, int, int, int]:
    return (offset, EPOCH, -1, log_start, 1 << 20)


# -- the fetching end alone -----------------------------------------------------------------

def test_first_request_is_full_then_only_changes_are_named():
    handler = FetchSessionHandler()
    wanted = {(TOPIC, 0): state(0), (TOPIC, 1): state(0)}
    first = handler.build(wanted)
    assert (first.session_id, first.epoch) == (INVALID_SESSION, INITIAL_EPOCH)
    assert [tp for tp, _ in first.named] == [(TOPIC, 0), (TOPIC, 1)] and first.forgotten == []
    assert handler.handle_response(first, ErrorCode.NONE, 77)

    idle = handler.build(dict(wanted))
    assert (idle.session_id, idle.epoch, idle.named, idle.forgotten) == (77, 1, [], [])
    assert handler.handle_response(idle, ErrorCode.NONE, 77)

    moved = handler.build({(TOPIC, 0): state(5), (TOPIC, 1): state(0), (TOPIC, 2): state(0)})
    assert moved.epoch == 2
    assert moved.named == [((TOPIC, 0), state(5)), ((TOPIC, 2), state(0))] and moved.forgotten == []
    assert handler.handle_response(moved, ErrorCode.NONE, 77)

    # Left out this round (delayed, throttled, moved elsewhere): forgotten, and named whole
    # when it is fetched again.
    left_out = handler.build({(TOPIC, 0): state(5), (TOPIC, 2): state(0)})
    assert left_out.named == [] and left_out.forgotten == [(TOPIC, 1)]
    assert handler.handle_response(left_out, ErrorCode.NONE, 77)
    back = handler.build({(TOPIC, 0): state(5), (TOPIC, 1): state(0), (TOPIC, 2): state(0)})
    assert back.named == [((TOPIC, 1), state(0))] and back.forgotten == []


def test_session_errors_start_a_full_session_again():
    handler = FetchSessionHandler()
    wanted = {(TOPIC, 0): state(0)}
    handler.handle_response(handler.build(wanted), ErrorCode.NONE, 5)
    # The leader lost the session: a full request opening a new one.
    assert not handler.handle_response(handler.build(wanted), ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0)
    again = handler.build(wanted)
    assert (again.session_id, again.epoch, len(again.named)) == (INVALID_SESSION, INITIAL_EPOCH, 1)
    handler.handle_response(again, ErrorCode.NONE, 6)
    # The leader refused the epoch: a full request that also closes the session it had.
    assert not handler.handle_response(handler.build(wanted), ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0)
    closing = handler.build(wanted)
    assert (closing.session_id, closing.epoch, len(closing.named)) == (6, INITIAL_EPOCH, 1)
    # A lost connection: the same, as the request in flight may or may not have been seen.
    handler.handle_response(closing, ErrorCode.NONE, 8)
    handler.reset()
    assert (handler.build(wanted).session_id, handler.build(wanted).epoch) == (8, INITIAL_EPOCH)
    # The leader answered without a session (none free): full requests until one is granted.
    handler.handle_response(handler.build(wanted), ErrorCode.NONE, INVALID_SESSION)
    assert handler.build(wanted).epoch == INITIAL_EPOCH


def test_the_epoch_wraps_to_one():
    handler = FetchSessionHandler()
    wanted = {(TOPIC, 0): state(0)}
    handler.handle_response(handler.build(wanted), ErrorCode.NONE, 5)
    handler.epoch = 2**31 - 1
    handler.handle_response(handler.build(wanted), ErrorCode.NONE, 5)
    assert handler.epoch == 1


# -- against the leader's Fetch handler --------------------------------------------------------

class Leader:
    """The leader's side of Fetch: a ReplicaManager leading TOPIC's partitions (replicas
    LEADER and FOLLOWER, both in the ISR) over real logs, and its session cache."""

    def __init__(self, directory, partitions: int = 4, slots: int = 10) -> None:
        self.rm = ReplicaManager(LEADER, log_manager=None)
        self.logs = []
        for i in range(partitions):
            log = Log.open(directory / f"{TOPIC}-{i}", LogConfig())
            self.logs.append(log)
            partition = Partition(TOPIC, i, uuid.uuid4(), LEADER, log)
            partition.make_leader(EPOCH, [LEADER, FOLLOWER], [LEADER, FOLLOWER])
            self.rm._host(partition)
        self.broker = SimpleNamespace(replica_manager=self.rm, fetch_sessions=FetchSessionCache(slots),
                                      authorizer=None, stopping=False,
                                      metadata_cache=SimpleNamespace(names_by_id={}, topics={}))
        self.reads: list[tuple[str, int]] = []
        read = self.rm.read

        def counting_read(tp, *args, **kwargs):
            self.reads.append(tp)
            return read(tp, *args, **kwargs)
        self.rm.read = counting_read

    def close(self) -> None:
        for log in self.logs:
            log.close()

    async def fetch(self, handler: FetchSessionHandler, wanted: dict, max_wait_ms: int = 0):
        """One round as the replica fetcher makes it: the handler's request, through the codec
        to handle_fetch, and the response back through the codec into the handler."""
        request = handler.build(wanted)
        frame = messages.encode_request(FETCH, VERSION, {
            "replica_id": FOLLOWER, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": 10 << 20,
            "isolation_level": 0, **request.fields(),
            "rack_id": ""})
        parsed = messages.parse_request(frame[4:])
        self.reads.clear()
        raw = await handle_fetch(self.broker, SimpleNamespace(header=parsed.header), parsed.body)
        payload = b"\0\0\0\1\0" + b"".join(p if isinstance(p, bytes | bytearray) else p.data or b""
                                         for p in raw.parts)
        _, response = messages.decode_response(FETCH, VERSION, payload)
        usable = handler.handle_response(request, ErrorCode(response.error_code), response.session_id)
        answered = {(t.topic, p.partition_index): p for t in response.responses for p in t.partitions}
        return usable, ErrorCode(response.error_code), answered

    def append(self, index: int, count: int = 1) -> None:
        self.rm.append_records(1, [((TOPIC, index), bytearray(build_batch([(b"k", b"v")] * count)))])


@pytest.fixture
def leader(tmp_path):
    leader = Leader(tmp_path)
    yield leader
    leader.close()


def everything(offsets: dict[int, int]) -> dict:
    return {(TOPIC, i): state(o) for i, o in offsets.items()}


@in_loop
async def test_an_idle_session_reads_nothing_and_keeps_the_follower_caught_up(leader):
    handler = FetchSessionHandler()
    usable, _, answered = await leader.fetch(handler, everything({0: 0, 1: 0, 2: 0, 3: 0}))
    assert usable and len(answered) == 4 and len(leader.reads) == 4
    assert handler.session_id != INVALID_SESSION
    session = leader.broker.fetch_sessions.get(handler.session_id)
    assert session.follower and len(session.partitions) == 4

    for p in leader.rm.partitions.values():
        p.followers[FOLLOWER].last_caught_up_ms = 1
    usable, _, answered = await leader.fetch(handler, everything({0: 0, 1: 0, 2: 0, 3: 0}))
    assert usable and answered == {} and leader.reads == []  # no partition read, none answered
    # ... yet every follower counts as caught up now, as a read would have recorded.
    assert all(p.followers[FOLLOWER].last_caught_up_ms > 1 for p in leader.rm.partitions.values())
    assert leader.rm.partitions[(TOPIC, 0)].isr_to_shrink(p.followers[FOLLOWER].last_caught_up_ms, 1000) is None


@in_loop
async def test_only_partitions_with_news_are_read_and_answered(leader):
    handler = FetchSessionHandler()
    await leader.fetch(handler, everything({0: 0, 1: 0, 2: 0, 3: 0}))
    leader.append(1, count=3)
    usable, _, answered = await leader.fetch(handler, everything({0: 0, 1: 0, 2: 0, 3: 0}))
    assert usable and set(answered) == {(TOPIC, 1)} and leader.reads == [(TOPIC, 1)]
    assert len(answered[(TOPIC, 1)].records) > 0 and answered[(TOPIC, 1)].high_watermark == 0

    # The follower appended them: its new fetch offset moves the high watermark, which it
    # learns in the answer; nothing else is read.
    usable, _, answered = await leader.fetch(handler, everything({0: 0, 1: 3, 2: 0, 3: 0}))
    assert usable and set(answered) == {(TOPIC, 1)} and leader.reads == [(TOPIC, 1)]
    assert answered[(TOPIC, 1)].high_watermark == 3 and not answered[(TOPIC, 1)].records
    assert leader.rm.partitions[(TOPIC, 1)].high_watermark == 3
    _, _, answered = await leader.fetch(handler, everything({0: 0, 1: 3, 2: 0, 3: 0}))
    assert answered == {} and leader.reads == []


@in_loop
async def test_a_parked_fetch_wakes_for_an_append_to_any_session_partition(leader):
    handler = FetchSessionHandler()
    await leader.fetch(handler, everything({0: 0, 1: 0, 2: 0, 3: 0}))
    parked = asyncio.create_task(leader.fetch(handler, everything({0: 0, 1: 0, 2: 0, 3: 0}), max_wait_ms=60_000))
    while not len(leader.rm.fetch_purgatory):  # the fetch read nothing and waits
        await asyncio.sleep(0.01)
    assert not parked.done()
    leader.append(2)
    usable, _, answered = await asyncio.wait_for(parked, 30)
    assert usable and set(answered) == {(TOPIC, 2)} and len(answered[(TOPIC, 2)].records) > 0
    assert len(leader.rm.fetch_purgatory) == 0


@in_loop
async def test_changes_on_the_leader_are_told_to_an_idle_session(leader):
    handler = FetchSessionHandler()
    await leader.fetch(handler, everything({0: 0, 1: 0, 2: 0, 3: 0}))
    # A new leader epoch: the follower's session names the old one, so the partition is read
    # and answered with the error, which the follower acts on.
    leader.rm.partitions[(TOPIC, 3)].make_leader(EPOCH + 1, [LEADER, FOLLOWER], [LEADER, FOLLOWER])
    _, _, answered = await leader.fetch(handler, everything({0: 0, 1: 0, 2: 0, 3: 0}))
    assert set(answered) == {(TOPIC, 3)} and answered[(TOPIC, 3)].error_code == ErrorCode.FENCED_LEADER_EPOCH
    # A follower out of the ISR is read every time, so that it can join again.
    partition = leader.rm.partitions[(TOPIC, 0)]
    leader.rm.isr_changed(partition, [LEADER], partition.partition_epoch + 1)
    await leader.fetch(handler, everything({0: 0, 1: 0, 2: 0}))  # 3 forgotten
    assert leader.reads == [(TOPIC, 0)]
    assert (TOPIC, 3) not in leader.broker.fetch_sessions.get(handler.session_id).partitions


@in_loop
async def test_a_lost_or_refused_session_is_opened_again(leader):
    handler = FetchSessionHandler()
    wanted = everything({0: 0, 1: 0, 2: 0, 3: 0})
    await leader.fetch(handler, wanted)
    first = handler.session_id
    leader.broker.fetch_sessions.remove(first)  # evicted, or the leader restarted
    usable, error, _ = await leader.fetch(handler, wanted)
    assert not usable and error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    usable, _, answered = await leader.fetch(handler, wanted)
    assert usable and len(answered) == 4 and handler.session_id not in (first, INVALID_SESSION)

    second = handler.session_id
    handler.epoch += 5  # out of step with the leader's session
    usable, error, _ = await leader.fetch(handler, wanted)
    assert not usable and error == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    usable, _, answered = await leader.fetch(handler, wanted)
    assert usable and len(answered) == 4
    assert leader.broker.fetch_sessions.get(second) is None  # the full request closed it
    assert len(leader.broker.fetch_sessions) == 1


@in_loop
async def test_follower_sessions_take_consumer_slots_when_the_cache_is_full(tmp_path):
    leader = Leader(tmp_path, slots=1)
    try:
        cache = leader.broker.fetch_sessions
        consumer = cache.create(False, {})
        assert consumer is not None and len(cache) == 1
        handler = FetchSessionHandler()
        await leader.fetch(handler, everything({0: 0, 1: 0}))
        assert handler.session_id != INVALID_SESSION and cache.get(consumer.id) is None
        # ... but a consumer never takes a follower's.
        assert cache.create(False, {}) is None and cache.get(handler.session_id) is not None
    finally:
        leader.close()


# -- quiet partitions: what an idle follower's fetch passes by ----------------------------------

class CountingPartitions(dict):
    """The leader's partitions, counting the lookups a fetch makes."""

    lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)


async def settled_session(leader) -> tuple[FetchSessionHandler, dict]:
    """A follower session of all four partitions, idle, after its first incremental fetch
    (which looks at every partition and finds the follower up to date on each)."""
    handler = FetchSessionHandler()
    wanted = everything({0: 0, 1: 0, 2: 0, 3: 0})
    await leader.fetch(handler, wanted)
    await leader.fetch(handler, wanted)
    return handler, wanted


@in_loop
async def test_partitions_a_follower_is_up_to_date_on_are_passed_by_until_they_change(leader):
    handler, wanted = await settled_session(leader)
    session = leader.broker.fetch_sessions.get(handler.session_id)
    assert set(session.quiet) == {(TOPIC, i) for i in range(4)} and not session.active
    leader.rm.partitions = counting = CountingPartitions(leader.rm.partitions)
    _, _, answered = await leader.fetch(handler, wanted)
    assert answered == {} and counting.lookups == 0  # not one partition looked at

    leader.append(2)  # told: only that partition is looked at, read and answered
    _, _, answered = await leader.fetch(handler, wanted)
    assert set(answered) == {(TOPIC, 2)} and leader.reads == [(TOPIC, 2)]
    assert list(session.active) == [(TOPIC, 2)]  # until a fetch finds it up to date

    # A change nobody announces (retention moving a log start does not): seen at the latest
    # at the next full look, FULL_SCAN_EVERY fetches on.
    leader.logs[1].increment_log_start_offset(0)  # nothing to move: still quiet
    leader.append(1, count=2)
    await leader.fetch(handler, everything({0: 0, 1: 0, 2: 1, 3: 0}))
    await leader.fetch(handler, everything({0: 0, 1: 2, 2: 1, 3: 0}))
    await leader.fetch(handler, everything({0: 0, 1: 2, 2: 1, 3: 0}))
    assert (TOPIC, 1) in session.quiet
    leader.logs[1].increment_log_start_offset(1)  # unannounced, as retention's
    seen_after = None
    for n in range(1, fetch_session.FULL_SCAN_EVERY + 2):
        _, _, answered = await leader.fetch(handler, everything({0: 0, 1: 2, 2: 1, 3: 0}))
        if (TOPIC, 1) in answered:
            assert answered[(TOPIC, 1)].log_start_offset == 1
            seen_after = n
            break
    assert seen_after is not None and seen_after > 1  # passed by first, then seen


@in_loop
async def test_a_quiet_follower_is_caught_up_as_of_each_fetch_and_no_longer_once_it_stops(leader):
    handler, wanted = await settled_session(leader)
    partition = leader.rm.partitions[(TOPIC, 0)]
    state = partition.followers[FOLLOWER]
    assert state.quiet_in is not None
    first = state.caught_up_ms()
    await asyncio.sleep(0.01)
    await leader.fetch(handler, wanted)
    later = state.caught_up_ms()
    assert later > first  # each fetch counts, though it passed the partition by
    assert partition.isr_to_shrink(later + 500, 1000) is None
    assert partition.isr_to_shrink(later + 1500, 1000) == [LEADER]  # the follower went quiet

    # Forgotten by the follower (delayed, moved to another fetcher): no longer caught up as of
    # later fetches of the session.
    await leader.fetch(handler, everything({1: 0, 2: 0, 3: 0}))
    assert state.quiet_in is None and state.caught_up_ms() == later
    await asyncio.sleep(0.01)
    await leader.fetch(handler, everything({1: 0, 2: 0, 3: 0}))
    assert state.caught_up_ms() == later
    assert leader.rm.partitions[(TOPIC, 1)].followers[FOLLOWER].caught_up_ms() > later

    # An append the follower has not fetched yet: caught up as of the fetch before it.
    other = leader.rm.partitions[(TOPIC, 1)].followers[FOLLOWER]
    before = other.caught_up_ms()
    leader.append(1)
    assert other.quiet_in is None and other.last_caught_up_ms == before
    await asyncio.sleep(0.01)
    await leader.fetch(handler, everything({1: 0, 2: 0, 3: 0}))  # still at 0, the log at 1
    assert other.caught_up_ms() == before


@in_loop
async def test_a_new_session_of_the_follower_takes_its_partitions_from_the_old(leader):
    old, wanted = await settled_session(leader)
    stale = leader.broker.fetch_sessions.get(old.session_id)
    assert len(stale.quiet) == 4
    new = FetchSessionHandler()  # the follower restarted its fetcher: a full fetch, a new session
    await leader.fetch(new, wanted)
    states = [p.followers[FOLLOWER] for p in leader.rm.partitions.values()]
    assert not stale.quiet and all(s.quiet_in is None for s in states)
    await leader.fetch(new, wanted)
    fresh = leader.broker.fetch_sessions.get(new.session_id)
    assert all(s.quiet_in is fresh for s in states)
