"""Followers copy their leaders' logs (seed 003's ReplicaFetcherManager and fetcher threads).

One fetcher task per (leader broker, fetcher index): `num.replica.fetchers` spreads a
leader's partitions over that many connections. A partition that just became a follower
first finds where its log diverges from the leader's (OffsetsForLeaderEpoch with its latest
leader epoch, KIP-101 / KIP-279) and truncates there; then it fetches from its log end offset,
appends the leader's batches unchanged (offsets and epochs kept, never decoded), and takes the
leader's high watermark as far as its own log reaches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from strom.client import AsyncConnection
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import HEADER_SIZE, read_header
from strom.replication.fetch_session import FetchSessionHandler
from strom.replication.quota import ReplicationQuota

log = logging.getLogger(__name__)

FETCH, OFFSET_FOR_LEADER_EPOCH = 1, 23
FETCH_VERSION, OFFSET_FOR_LEADER_EPOCH_VERSION = 12, 3
TopicPartition = tuple[str, int]
# Errors after which a partition waits for the controller to say who leads now.
_WAIT_FOR_METADATA = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                      ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}


_LEADER_CATCHING_UP = {ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.NOT_LEADER_OR_FOLLOWER}
_LEADER_CATCHING_UP_S = 0.05
# Whole-request errors after which the next request opens a new session at once.
_SESSION_ERRORS = {ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH}
_NOT_SENT = (-1,)
# Fetches that may reuse the last fetch states unchanged (see ReplicaFetcher._reusable) before
# they are built again from the logs: how many fetches late a change this fetcher did not make
# itself is sent (the log start moved by the follower's own retention, a throttle set).
REBUILD_EVERY = 10
# How often the broker looks for partitions not fetched for replica.lag.time.max.ms (see
# ReplicaFetcherManager.check_stalls), and how often a fetcher says so again while they stay so.
STALL_CHECK_MS = 1000
STALL_WARN_EVERY_S = 60.0


@dataclass(slots=True)
class FetchState:
    partition: object  # strom.replication.replica_manager.Partition
    truncating: bool = True  # until the divergence with the leader is settled
    delayed_until: float = 0.0
    building: asyncio.Task | None = None  # its state from remote storage (KIP-405), under way


def whole_batches(data: bytes) -> memoryview:
    """The complete record batches at the start of `data` (a response may end mid-batch)."""
    pos = 0
    while len(data) - pos >= HEADER_SIZE:
        size = read_header(data, pos).size
        if pos + size > len(data):
            break
        pos += size
    return memoryview(data)[:pos]


class ReplicaFetcher:
    def __init__(self, manager: ReplicaFetcherManager, leader_id: int, index: int) -> None:
        self.manager = manager
        self.broker = manager.broker
        self.leader_id = leader_id
        self.name = f"replica-fetcher-{leader_id}-{index}"
        self.partitions: dict[TopicPartition, FetchState] = {}
        self.truncating: set[TopicPartition] = set()  # those of `partitions` still truncating
        self.changed = asyncio.Event()
        self.conn: AsyncConnection | None = None
        self.session = FetchSessionHandler()
        # The fetch states of the last request, while nothing this fetcher does has changed
        # them (None: build them again); an idle follower of 30,000 partitions would otherwise
        # rebuild and compare 30,000 of them twice a second to send nothing new.
        self._wanted: dict[TopicPartition, tuple[int, int, int, int, int]] | None = None
        self._reused = 0
        self._delays_end = 0.0  # until then some partition waits, and the states are rebuilt
        # Partitions not fetched since (monotonic time, why): newly added ones until their first
        # fetch, those refused, delayed, diverging or left out of the requests. A partition
        # leaves when its answer is applied, or a request that carried it is answered without
        # it (nothing new). What
        # stays longer than replica.lag.time.max.ms is stalled: logged and counted (a follower
        # that stops fetching a partition shows here before its leader drops it from the ISR).
        self.unfetched: dict[TopicPartition, tuple[float, str]] = {}
        self.last_answer = asyncio.get_running_loop().time()  # the last usable Fetch response
        self._last_sent: dict[TopicPartition, tuple] = {}
        self._scanned: dict[TopicPartition, tuple] | None = None  # the last states check_stalls saw
        self.last_failure: str | None = None
        self._next_stall_warning = 0.0
        # Set by stop(), and checked after each call as well as the cancellation: a step that
        # swallows a cancellation must not keep a stopped fetcher going.
        self.stopped = False
        self.task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    def add(self, partition) -> None:
        tp = (partition.topic, partition.index)
        self.partitions[tp] = FetchState(partition)
        self.truncating.add(tp)
        self._unfetched(tp, "new leader")
        self._wanted = None
        self.changed.set()

    def remove(self, tp: TopicPartition) -> None:
        self.partitions.pop(tp, None)
        self.truncating.discard(tp)
        self.unfetched.pop(tp, None)
        self._wanted = None

    def stop(self) -> None:
        self.stopped = True
        self.task.cancel()
        self._close()

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        # What the leader's session holds is unknown after a lost request: start a new one.
        self.session.reset()
        self._wanted = None

    async def _run(self) -> None:
        config = self.broker.config
        backoff = config["replica.fetch.backoff.ms"] / 1000
        failures = 0
        task = asyncio.current_task()
        # A cancellation swallowed inside a step still counts as requested: without this check
        # a fetcher nobody stopped (the event loop's own cancellation of what is left at exit)
        # fetched on for ever, and the process never exited.
        while not self.stopped and not task.cancelling():
            if not self.partitions:
                self.changed.clear()
                await self.changed.wait()
                continue
            try:
                if self.conn is None:
                    host, port = self.broker.broker_endpoint(self.leader_id)
                    self.conn = await AsyncConnection.open(host, port, f"broker-{self.broker.broker_id}-fetcher",
                                                           security=self.broker.inter_broker_security)
                if self.truncating:
                    await self._truncate()
                    if self.stopped:
                        return
                await self._fetch()
                failures = 0
            except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError) as e:
                self._close()
                if failures == 0:
                    log.warning("%s: cannot fetch from broker %d (%s); retrying", self.name,
                                self.leader_id, e or type(e).__name__)
                failures += 1
                self.last_failure = str(e) or type(e).__name__
                await asyncio.sleep(backoff)

    def _ready(self, truncating: bool, over_quota: bool = False) -> list[FetchState]:
        """The partitions to truncate (or to fetch) now: not delayed, still led by this
        fetcher's leader, and when `over_quota`, not throttled."""
        now = asyncio.get_running_loop().time()
        return [s for s in self.partitions.values()
                if s.truncating == truncating and s.delayed_until <= now
                and s.partition.leader_id == self.leader_id
                and not (over_quota and self._throttled(s.partition))]

    def _throttled(self, partition) -> bool:
        return partition.log.config.replication_throttled(True, partition.index, self.broker.broker_id)

    def _delay(self, state: FetchState, error: ErrorCode) -> None:
        # The new leader has not heard of its epoch yet: it will in a moment, so ask again
        # soon rather than after the full backoff (a stall every acks=all producer would see).
        backoff = _LEADER_CATCHING_UP_S if error in _LEADER_CATCHING_UP else \
            self.broker.config["replica.fetch.backoff.ms"] / 1000
        state.delayed_until = asyncio.get_running_loop().time() + backoff
        self._delays_end = max(self._delays_end, state.delayed_until)
        self._unfetched((state.partition.topic, state.partition.index), error.name)
        self._wanted = None
        log.debug("%s: %s-%d got %s", self.name, state.partition.topic, state.partition.index, error.name)

    def _build_from_remote(self, state: FetchState, leader_log_start: int) -> None:
        """KIP-405: the leader keeps below its local log start only in remote storage: this
        replica starts its log there, with the leader epochs and producer state the remote
        segment before it carries. The partition waits until that is done (or failed)."""
        p = state.partition
        builder = self.manager.tiered_state_builder
        self._delay(state, ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE)
        if builder is None or (state.building is not None and not state.building.done()):
            return
        state.delayed_until = float("inf")

        async def build() -> None:
            loop = asyncio.get_running_loop()
            try:
                await builder(p, self.leader_id, leader_log_start)
                state.delayed_until = 0.0
            except Exception as e:
                log.warning("%s-%d: cannot build the state below leader %d's local log from remote "
                            "storage (%s); retrying", p.topic, p.index, self.leader_id, e)
                state.delayed_until = loop.time() + self.broker.config["replica.fetch.backoff.ms"] / 1000
                self._delays_end = max(self._delays_end, state.delayed_until)
            self._wanted = None
            self.changed.set()

        state.building = asyncio.get_running_loop().create_task(build(), name=f"tiered state {p.topic}-{p.index}")

    # -- partitions not fetched -------------------------------------------------------------

    def _unfetched(self, tp: TopicPartition, why: str) -> None:
        since = self.unfetched.get(tp)
        self.unfetched[tp] = (asyncio.get_running_loop().time() if since is None else since[0], why)

    def stalled(self, now: float | None = None) -> dict[TopicPartition, str]:
        """The partitions not fetched for longer than replica.lag.time.max.ms, and why: all
        of them when no response came for that long."""
        now = asyncio.get_running_loop().time() if now is None else now
        lag_s = self.broker.config["replica.lag.time.max.ms"] / 1000
        stalled = {tp: why for tp, (since, why) in self.unfetched.items() if now - since > lag_s}
        if now - self.last_answer > lag_s:
            for tp in self.partitions:
                stalled.setdefault(tp, "no answer from the leader")
        return stalled

    def check_stalls(self) -> None:
        """Partitions the last usable request left out are unfetched from now (delayed, or led
        by another broker than this fetcher's); those unfetched too long are logged, at most
        once a minute. Run by the broker's scheduler: a fetch hung on a stopped leader must not
        keep it from being said."""
        now = asyncio.get_running_loop().time()
        sent = self._last_sent
        if sent is not self._scanned:  # an idle fetcher reuses its states: nothing new to look at
            self._scanned = sent
            for tp, state in self.partitions.items():
                if tp not in sent and tp not in self.unfetched:
                    leader = state.partition.leader_id
                    self._unfetched(tp, "left out of the fetches" if leader == self.leader_id
                                    else f"led by broker {leader}")
        stalled = self.stalled(now)
        if not stalled or now < self._next_stall_warning:
            return
        self._next_stall_warning = now + STALL_WARN_EVERY_S
        shown = ", ".join(f"{t}-{i} ({why})" for (t, i), why in list(stalled.items())[:5])
        log.warning("%s: %d partition(s) not fetched from broker %d for over replica.lag.time.max.ms: %s%s",
                    self.name, len(stalled), self.leader_id, shown,
                    f" (last failure: {self.last_failure})" if self.last_failure else "")

    # -- finding the divergence point -----------------------------------------------------------

    async def _truncate(self) -> None:
        states = self._ready(truncating=True)
        if not states:
            return
        self._wanted = None
        topics: dict[str, list[dict]] = {}
        for s in states:
            p = s.partition
            topics.setdefault(p.topic, []).append({
                "partition": p.index, "current_leader_epoch": p.leader_epoch,
                "leader_epoch": p.log.leader_epoch_cache.latest_epoch()})
        response = await self.conn.call(OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_VERSION, {
            "replica_id": self.broker.broker_id,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]})
        if self.stopped:
            return
        by_tp = {(t.topic, p.partition): p for t in response.topics for p in t.partitions}
        for s in states:
            p = s.partition
            answer = by_tp.get((p.topic, p.index))
            if answer is None:
                continue
            if answer.error_code != ErrorCode.NONE:
                self._delay(s, ErrorCode(answer.error_code))
                continue
            self._truncate_partition(p, answer.leader_epoch, answer.end_offset)
            s.truncating = False
            self.truncating.discard((p.topic, p.index))

    def _truncate_partition(self, partition, leader_epoch: int, leader_end: int) -> None:
        """KIP-279: keep what both logs have for the last epoch they share."""
        log_ = partition.log
        requested = log_.leader_epoch_cache.latest_epoch()
        end = log_.log_end_offset
        if requested < 0 or leader_epoch < 0 or leader_end < 0:
            target = min(partition.high_watermark, end) if requested >= 0 else end
        elif leader_epoch == requested:
            target = min(leader_end, end)
        else:
            target = min(leader_end, log_.end_offset_for_epoch(leader_epoch)[1])
        # Called even at the log end: the log still drops an epoch the leader does not have.
        if partition.truncate_to(target):
            log.warning("%s-%d: truncated the log from %d to %d to match leader %d (epoch %d): "
                        "%d offsets the leader does not have were removed", partition.topic,
                        partition.index, end, target, self.leader_id, partition.leader_epoch, end - target)

    # -- fetching -------------------------------------------------------------------------

    def _reusable(self) -> dict[TopicPartition, tuple[int, int, int, int, int]] | None:
        """The last request's fetch states, if they are still every partition's: nothing was
        added, removed, answered, delayed or truncated since (each of those drops them), and
        they were reused fewer than REBUILD_EVERY times."""
        if self._wanted is None or self._reused >= REBUILD_EVERY:
            return None
        self._reused += 1
        return self._wanted

    def _build_wanted(self) -> dict[TopicPartition, tuple[int, int, int, int, int]]:
        """Each ready partition's fetch state, read from its log; kept for reuse unless a
        throttle took part (the quota's budget changes by the second) or a delay runs."""
        config = self.broker.config
        over_quota = self.manager.quota.exceeded()
        budget = self.manager.quota.available()
        max_bytes = config["replica.fetch.max.bytes"]
        wanted: dict[TopicPartition, tuple[int, int, int, int, int]] = {}
        throttled = False
        for s in self._ready(truncating=False, over_quota=over_quota):
            p = s.partition
            limit = max_bytes
            log_ = p.log
            if log_.config.follower_replication_throttled_replicas and self._throttled(p):
                throttled = True
                limit = max(1, min(limit, int(budget)))  # at least one batch comes anyway
            wanted[(p.topic, p.index)] = (log_.log_end_offset, p.leader_epoch,
                                          log_.leader_epoch_cache.latest_epoch(), log_.log_start_offset, limit)
        # Not kept while a partition is left out for a time (delayed, or throttled over the
        # quota): it must be back in the next states once its time is up.
        waiting = asyncio.get_running_loop().time() < self._delays_end
        self._wanted = None if throttled or over_quota or waiting else wanted
        self._reused = 0
        return wanted

    async def _fetch(self) -> None:
        wanted = self._reusable()
        if wanted is None:
            wanted = self._build_wanted()
        if not wanted:
            self._last_sent = wanted  # every partition is left out
            await asyncio.sleep(0.05 if self.truncating else 0.2)
            return
        config = self.broker.config
        request = self.session.build(wanted)
        wait_ms = config["replica.fetch.wait.max.ms"]
        response = await self.conn.call(FETCH, FETCH_VERSION, {
            "replica_id": self.broker.broker_id, "max_wait_ms": wait_ms,
            "min_bytes": config["replica.fetch.min.bytes"],
            "max_bytes": config["replica.fetch.response.max.bytes"], "isolation_level": 0,
            **request.fields(),
            "rack_id": ""}, timeout_s=wait_ms / 1000 + 30)
        if self.stopped:
            return
        error = ErrorCode(response.error_code)
        if not self.session.handle_response(request, error, response.session_id):
            if error not in _SESSION_ERRORS:
                log.warning("%s: fetch from broker %d failed: %s", self.name, self.leader_id, error.name)
                await asyncio.sleep(config["replica.fetch.backoff.ms"] / 1000)
            return
        self.last_answer = asyncio.get_running_loop().time()
        self.last_failure = None
        self._last_sent = request.sent
        if self.unfetched:  # carried by this request and not answered: nothing new, fetched
            answered = {(t.topic, a.partition_index) for t in response.responses for a in t.partitions}
            for tp in [tp for tp in self.unfetched if tp in request.sent and tp not in answered]:
                del self.unfetched[tp]
        if response.responses:
            self._wanted = None  # answered partitions change their states
            await self.broker.replica_manager.make_files(
                (t.topic, answer.partition_index) for t in response.responses for answer in t.partitions
                if answer.records)
            if self.stopped:
                return
        for t in response.responses:
            for answer in t.partitions:
                tp = (t.topic, answer.partition_index)
                state = self.partitions.get(tp)
                # Only an answer to the fetch state the partition still has: a truncation or
                # a new leader since the request was built makes it stale.
                if state is not None and state.partition.leader_id == self.leader_id and not state.truncating \
                        and request.sent.get(tp, _NOT_SENT)[0] == state.partition.log.log_end_offset:
                    self._apply(state, answer)

    def _apply(self, state: FetchState, answer) -> None:
        p = state.partition
        error = ErrorCode(answer.error_code)
        if error == ErrorCode.OFFSET_OUT_OF_RANGE:
            if p.log.log_end_offset < answer.log_start_offset:
                log.warning("%s-%d: behind the leader's log start %d; starting over there", p.topic,
                            p.index, answer.log_start_offset)
                p.log.truncate_fully_and_start_at(answer.log_start_offset)
                p.producer_state.rebuild(p.log)
            else:
                state.truncating = True  # ahead of the leader: find the divergence again
                self.truncating.add((p.topic, p.index))
                self._unfetched((p.topic, p.index), error.name)
            return
        if error == ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE:
            self._build_from_remote(state, answer.log_start_offset)
            return
        if error != ErrorCode.NONE:
            self._delay(state, error)
            if error not in _WAIT_FOR_METADATA:
                log.warning("%s-%d: fetch from leader %d failed: %s", p.topic, p.index, self.leader_id,
                            error.name)
            return
        diverging = answer.diverging_epoch
        if diverging is not None and diverging.end_offset >= 0:  # absent: epoch and offset -1
            self._truncate_partition(p, diverging.epoch, diverging.end_offset)
            self._unfetched((p.topic, p.index), "diverging epoch")
            return
        records = whole_batches(answer.records or b"")
        try:
            if len(records):
                p.append_as_follower(records)
                self.manager.broker.replica_manager.topic_stats.replication_bytes_in += len(records)
                if self._throttled(p):
                    self.manager.quota.record(len(records))
        except KafkaError as e:
            log.error("%s-%d: cannot append what leader %d sent: %s", p.topic, p.index, self.leader_id, e)
            self._delay(state, e.code)
            return
        except OSError as e:
            log.error("%s-%d: cannot write the log: %s", p.topic, p.index, e)
            self._delay(state, ErrorCode.KAFKA_STORAGE_ERROR)
            return
        self.unfetched.pop((p.topic, p.index), None)  # answered without a problem: fetched
        before = p.high_watermark
        p.follower_high_watermark(answer.high_watermark)
        if p.high_watermark != before:
            self.broker.replica_manager.high_watermark_moved((p.topic, p.index))


class ReplicaFetcherManager:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.fetchers: dict[tuple[int, int], ReplicaFetcher] = {}
        self.assigned: dict[TopicPartition, tuple[int, int]] = {}
        self.quota = ReplicationQuota(lambda: broker.config["follower.replication.throttled.rate"])
        self.closed = False
        # Tiered storage's builder of a follower's state from remote storage (partition, leader
        # id, leader's log start offset); None without remote.log.storage.system.enable.
        self.tiered_state_builder: Callable[[object, int, int], Awaitable[None]] | None = None

    def add_partition(self, partition) -> None:
        """Fetch `partition` from its leader, first truncating to where the two logs agree.
        Once shut down, nothing more is fetched (a metadata change applied while the broker
        stops may still make it a follower)."""
        if self.closed:
            return
        tp = (partition.topic, partition.index)
        self.remove_partition(tp)
        count = max(1, self.broker.config["num.replica.fetchers"])
        key = (partition.leader_id, hash(tp) % count)
        fetcher = self.fetchers.get(key)
        if fetcher is None:
            fetcher = self.fetchers[key] = ReplicaFetcher(self, *key)
        fetcher.add(partition)
        self.assigned[tp] = key

    def remove_partition(self, tp: TopicPartition) -> None:
        key = self.assigned.pop(tp, None)
        if key is None:
            return
        fetcher = self.fetchers.get(key)
        if fetcher is not None:
            fetcher.remove(tp)
            if not fetcher.partitions:
                fetcher.stop()
                del self.fetchers[key]

    def check_stalls(self) -> None:
        for fetcher in list(self.fetchers.values()):
            fetcher.check_stalls()

    def stalled_partitions(self) -> int:
        """Followed partitions not fetched from their leader for longer than
        replica.lag.time.max.ms (the follower's own view of under-replication)."""
        now = asyncio.get_running_loop().time()
        return sum(len(f.stalled(now)) for f in self.fetchers.values())

    def shutdown(self) -> None:
        self.closed = True
        for fetcher in self.fetchers.values():
            fetcher.stop()
        self.fetchers.clear()
        self.assigned.clear()
