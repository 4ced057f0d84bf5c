"""QuorumController (KIP-631): the controller of a KRaft cluster, on the metadata quorum.

Every controller replays the committed records of `__cluster_metadata` into its MetadataImage
(from its latest snapshot on, so a restart or a failover reloads nothing from elsewhere), and
the one that leads the quorum is the active controller. Requests that change metadata are
events on one queue, taken one at a time: an event reads the committed image, decides with the
ZooKeeper controller's rules (replication_control, cluster_control), appends the resulting
records as one batch and is answered once the quorum has committed them, when the image shows
them. A controller that is not active answers NOT_CONTROLLER.

The controller runs on its own event loop (the node's controller thread, with its Raft driver
and its listener), so its work never holds a broker's produce and fetch in a combined node.
Snapshots are taken when the Raft core asks (metadata.log.max.record.bytes.between.snapshots,
metadata.log.max.snapshot.interval.ms), from a copy of the image, encoded in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from strom.controller import cluster_control, replication_control
from strom.controller.cluster_control import BrokerSession
from strom.controller.replication_control import Change, Limits
from strom.controller.token_control import TokenControl
from strom.metadata import records as r
from strom.metadata.image import MetadataImage
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.raft_records import data_values
from strom.raft import effects as fx
from strom.raft.core import NotLeader
from strom.raft.driver import RaftDriver
from strom.raft.snapshots import read_snapshot
from strom.raft.state import Role

log = logging.getLogger(__name__)

T = TypeVar("T")
# Records per Raft batch: a change larger than this (a topic of 100,000 partitions) is written
# as several batches between BeginTransaction and EndTransaction records (KIP-868), which the
# image applies only once the transaction ends.
MAX_RECORDS_PER_BATCH = 10_000
# Above this many records a batch is encoded, or a committed one decoded and replayed, in a
# worker thread: the loop keeps answering the quorum's fetches meanwhile.
_REPLAY_OFF_LOOP = 2_000
PREFERRED_ELECTION = 0  # ElectLeaders' election type


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def _encode(records: list[Any]) -> list[bytes]:
    return [r.encode(rec) for rec in records]


async def snapshot_image(driver: RaftDriver, image: MetadataImage | None) -> None:
    """Snapshot a copy of a metadata image taken between two applied batches (a controller's,
    or a broker's own), or let the Raft core ask again later when there was none to take (in
    the middle of a metadata transaction)."""
    if image is None:
        driver.core.snapshot_failed()
        return
    started = time.monotonic()
    if await driver.snapshot(image.end_offset, image.encode):
        log.info("metadata snapshot at offset %d (%d partitions) in %.0f ms", image.end_offset,
                 image.partition_count, (time.monotonic() - started) * 1000)


class NotController(KafkaError):
    def __init__(self, leader_id: int = -1) -> None:
        super().__init__("This is not the correct controller for this cluster.", ErrorCode.NOT_CONTROLLER)
        self.leader_id = leader_id


@dataclass
class ControllerSettings:
    node_id: int
    cluster_id: str | None = None
    limits: Limits = field(default_factory=Limits)
    session_timeout_ms: int = 9000  # broker.session.timeout.ms
    bootstrap_features: dict[str, int] = field(default_factory=dict)  # from bootstrap.checkpoint
    bootstrap_records: list[Any] = field(default_factory=list)  # e.g. SCRAM users of --add-scram
    validate_configs: Callable[[int, str, dict[str, str]], None] = lambda _t, _n, _c: None
    list_config: Callable[[str], bool] = lambda _key: False
    # auto.leader.rebalance.enable and leader.imbalance.check.interval.seconds (0: off).
    leader_rebalance_interval_s: float = 0.0
    # Delegation tokens (delegation.token.secret.key, max lifetime, expiry time); off by default.
    tokens: TokenControl = field(default_factory=lambda: TokenControl(None, 0, 0))
    token_expiry_check_s: float = 3600.0  # delegation.token.expiry.check.interval.ms


class QuorumController:
    def __init__(self, settings: ControllerSettings, driver: RaftDriver) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.driver = driver
        driver.listener = self._on_raft
        self.image = MetadataImage()
        self.active = False
        self.leader_id = -1
        self.epoch = 0
        self.sessions: dict[int, BrokerSession] = {}
        self._queue: asyncio.Queue[tuple[asyncio.Future, str, Callable[[MetadataImage], Change]]] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        # The records this controller appended, by batch base offset: applied as they are when
        # they commit instead of being decoded again.
        self._appended: dict[int, list[Any]] = {}
        self.writes = 0  # committed write events (for metrics and tests)

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Take events (the Raft driver is started by the caller, after this)."""
        self._tasks = [asyncio.create_task(self._take_events(), name="quorum-controller-events"),
                       asyncio.create_task(self._expire_sessions(), name="broker-sessions")]
        if self.settings.leader_rebalance_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._rebalance_leaders(), name="leader-rebalance"))
        if self.settings.tokens.enabled:
            self._tasks.append(asyncio.create_task(self._expire_tokens(), name="delegation-token-expiration"))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._fail_queued()

    # --- events ---------------------------------------------------------------------------------

    async def write(self, name: str, op: Callable[[MetadataImage], Change]) -> Any:
        """Queue a change: `op(image)` says which records carry it out and what to answer; the
        answer comes once they are committed and applied. NotController when not active."""
        return await self._enqueue(name, op)

    def _enqueue(self, name: str, op: Callable[[MetadataImage], Change]) -> asyncio.Future:
        if not self.active:
            raise NotController(self.leader_id)
        fut = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((fut, name, op))
        return fut

    async def _take_events(self) -> None:
        while True:
            fut, name, op = await self._queue.get()
            if fut.done():
                continue
            try:
                if not self.active:
                    raise NotController(self.leader_id)
                change = op(self.image)
                if change.records:
                    await self._append(change.records)
                    self.writes += 1
                fut.set_result(change.result)
            except NotLeader:
                if not fut.done():
                    fut.set_exception(NotController(self.leader_id))
            except Exception as e:  # KafkaError: the answer; anything else: logged, and answered
                if not isinstance(e, KafkaError):
                    log.exception("controller event %s failed", name)
                if not fut.done():
                    fut.set_exception(e)

    async def _append(self, records: list[Any]) -> None:
        if len(records) > MAX_RECORDS_PER_BATCH:
            records = [r.BeginTransactionRecord(name=f"{len(records)} records"), *records, r.EndTransactionRecord()]
        chunks = [records[i:i + MAX_RECORDS_PER_BATCH] for i in range(0, len(records), MAX_RECORDS_PER_BATCH)]
        try:
            for i, chunk in enumerate(chunks):
                last = i == len(chunks) - 1
                encoded = await asyncio.to_thread(_encode, chunk) if len(chunk) > _REPLAY_OFF_LOOP else _encode(chunk)
                if not self.active:
                    raise NotLeader("leadership changed while the records were encoded")
                self._appended[self.driver.core.log.end_offset] = chunk  # no await from here to the append
                await self.driver.append(encoded, wait=last)
                if not last:
                    await asyncio.sleep(0)
        finally:
            if not self.active:
                self._appended.clear()

    def _fail_queued(self) -> None:
        while not self._queue.empty():
            fut, _, _ = self._queue.get_nowait()
            if not fut.done():
                fut.set_exception(NotController(self.leader_id))

    # --- the Raft log ---------------------------------------------------------------------------

    async def _on_raft(self, e: fx.Effect) -> None:
        if isinstance(e, fx.Committed):
            await self._apply_batches(e.batches)
            core = self.driver.core
            if (not self.active and core.role is Role.LEADER and self.leader_id == self.node_id
                    and e.high_watermark > core.epoch_start_offset):
                self._activate()
        elif isinstance(e, fx.LoadSnapshot):
            await self._load_snapshot(e.snapshot_id.offset, e.data)
        elif isinstance(e, fx.LeaderChanged):
            self._leader_changed(e.leader_id, e.epoch)
        elif isinstance(e, fx.SnapshotDue):
            asyncio.get_running_loop().create_task(self._snapshot())

    async def _apply_batches(self, batches) -> None:
        data = [b for b in batches if not b.is_control]
        count = sum(b.last_offset - b.base_offset + 1 for b in data)
        if count > _REPLAY_OFF_LOOP:
            await asyncio.to_thread(self._replay, data)
        else:
            self._replay(data)
        if batches:
            self.image.end_offset = batches[-1].end_offset

    def _replay(self, batches) -> None:
        for batch in batches:
            mine = self._appended.pop(batch.base_offset, None)
            if mine is not None and len(mine) == batch.last_offset - batch.base_offset + 1:
                for rec in mine:  # this controller's own records: the same bytes it encoded
                    self.image.replay(rec)
                continue
            for value in data_values(batch.data):
                self.image.replay(r.decode(value))

    async def _load_snapshot(self, end_offset: int, data: bytes) -> None:
        def load() -> MetadataImage:
            image = MetadataImage()
            image.replay_values(read_snapshot(data).values)
            return image

        started = time.monotonic()
        image = await asyncio.to_thread(load)
        image.end_offset = end_offset
        self.image = image
        log.info("loaded the metadata snapshot at offset %d (%d topics, %d partitions, %d brokers) in %.0f ms",
                 end_offset, len(image.topics), image.partition_count, len(image.brokers),
                 (time.monotonic() - started) * 1000)

    def _leader_changed(self, leader_id: int, epoch: int) -> None:
        was_active = self.active
        self.leader_id, self.epoch = leader_id, epoch
        if leader_id != self.node_id:
            self.active = False
            self._appended.clear()
            self._fail_queued()
            if was_active:
                log.info("controller %d is no longer active (epoch %d, leader %d)", self.node_id, epoch, leader_id)

    def _activate(self) -> None:
        """This node leads the quorum and has applied everything before its epoch: it is the
        active controller. A new cluster gets its bootstrap records; a metadata transaction the
        last controller left open is aborted; every broker gets a fresh session."""
        self.active = True
        now = time.monotonic()
        self.sessions = {b: BrokerSession(now, reg.epoch) for b, reg in self.image.brokers.items()}
        log.info("controller %d is active in epoch %d (metadata at offset %d: %d topics, %d brokers)",
                 self.node_id, self.epoch, self.image.end_offset, len(self.image.topics), len(self.image.brokers))
        # Queued now, ahead of any request: no broker registers before metadata.version is set.
        if self.image.transaction is not None:
            self._first("abort-transaction", lambda _img: Change([r.AbortTransactionRecord(reason="failover")]))
        if "metadata.version" not in self.image.features:
            records = [*cluster_control.bootstrap_records(self.settings.bootstrap_features),
                       *self.settings.bootstrap_records]
            self._first("bootstrap", lambda _img: Change(records))

    def _first(self, name: str, op: Callable[[MetadataImage], Change]) -> None:
        fut = self._enqueue(name, op)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception() is None or log.info(
            "controller event %s not written: %s", name, f.exception()))

    async def _safe_write(self, name: str, op: Callable[[MetadataImage], Change]) -> None:
        try:
            await self.write(name, op)
        except KafkaError as e:
            log.info("controller event %s not written: %s", name, e)

    async def _snapshot(self) -> None:
        await snapshot_image(self.driver, None if self.image.transaction is not None else self.image.copy())

    # --- broker sessions ------------------------------------------------------------------------

    async def _expire_sessions(self) -> None:
        timeout = self.settings.session_timeout_ms / 1000
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            if not self.active:
                continue
            now = time.monotonic()
            for broker_id, reg in list(self.image.brokers.items()):
                session = self.sessions.get(broker_id)
                if reg.fenced or session is None or self._heard_from(session):
                    continue
                log.info("broker %d: no heartbeat for %.1f s; fencing it", broker_id, now - session.last_heartbeat)
                await self._safe_write(f"fence-{broker_id}", lambda img, b=broker_id: self._expire(img, b))

    def _heard_from(self, session: BrokerSession) -> bool:
        """Within broker.session.timeout.ms of the broker's last heartbeat."""
        return time.monotonic() - session.last_heartbeat < self.settings.session_timeout_ms / 1000

    def _expire(self, image: MetadataImage, broker_id: int) -> Change:
        session = self.sessions.get(broker_id)
        if session is not None and self._heard_from(session):
            return Change()  # it was heard from while this event waited its turn
        return Change(cluster_control.expire_session(image, broker_id, self.settings.limits))

    async def _rebalance_leaders(self) -> None:
        """Kafka's periodic preferred leader election: a partition whose first replica is in
        its ISR but does not lead gets it back as leader."""
        while True:
            await asyncio.sleep(self.settings.leader_rebalance_interval_s)
            if not self.active:
                continue
            await self._safe_write("rebalance-leaders", lambda img: replication_control.elect_leaders(
                img, PREFERRED_ELECTION, [(topic.name, index) for topic, index, s in img.partitions()
                                          if s.replicas and s.leader != s.replicas[0] and s.replicas[0] in s.isr],
                self.settings.limits))

    async def _expire_tokens(self) -> None:
        """Kafka's periodic sweep of delegation tokens past their expiry or max time."""
        tokens = self.settings.tokens
        while True:
            await asyncio.sleep(self.settings.token_expiry_check_s)
            if self.active:
                await self._safe_write("expire-tokens", lambda img: tokens.sweep(img, wall_clock_ms()))

    # --- what the controller APIs call ------------------------------------------------------------

    def check_active(self) -> None:
        if not self.active:
            raise NotController(self.leader_id)

    async def register_broker(self, request: Any) -> int:
        """BrokerRegistration: the broker's new epoch (the offset its record is written at)."""
        def op(image: MetadataImage) -> Change:
            epoch = self.driver.core.log.end_offset
            change = cluster_control.register_broker(image, request, self.settings.cluster_id, epoch,
                                                     self.sessions, time.monotonic(),
                                                     self.settings.session_timeout_ms / 1000, self.settings.limits)
            self.sessions[request.broker_id] = BrokerSession(time.monotonic(), epoch)
            return change

        return await self.write(f"register-broker-{request.broker_id}", op)

    async def heartbeat(self, request: Any) -> cluster_control.Heartbeat:
        # The session is kept alive on arrival, not when the event's turn comes: behind a large
        # change (fencing a broker of 100,000 partitions) a queued heartbeat must not let its
        # broker's session run out. One that changes nothing is answered at once.
        self.check_active()
        session = self.sessions.get(request.broker_id)
        registered = self.image.brokers.get(request.broker_id)
        if session is not None and registered is not None and registered.epoch == request.broker_epoch:
            session.last_heartbeat = time.monotonic()
            steady = cluster_control.steady_heartbeat(self.image, request, session)
            if steady is not None:
                return steady

        def op(image: MetadataImage) -> Change:
            session = self.sessions.get(request.broker_id)
            change = cluster_control.heartbeat(image, request, session, self.settings.limits)
            session.last_heartbeat = time.monotonic()
            session.let_go = session.let_go or change.result.should_shut_down
            return change

        return await self.write(f"heartbeat-{request.broker_id}", op)
