"""The broker's group and transaction coordinators and the partitions of their internal topics:
made and started once the broker knows the cluster (each loads every partition of its topic
this broker leads), handed a partition of `__consumer_offsets` or `__transaction_state` when
this broker becomes its leader (replayed off the event loop) and relieved of it when leadership
leaves (Kafka's
onLeadershipChange: onElection / onResignation), and the wait every coordinator write ends
with: acks=all on its internal topic."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from strom.coordinator import (
    GROUP_METADATA_TOPIC,
    SHARE_GROUP_STATE_TOPIC,
    TRANSACTION_STATE_TOPIC,
    partition_for,
)
from strom.coordinator.group import GroupCoordinator, create_group_coordinator
from strom.coordinator.transaction.coordinator import TransactionCoordinator
from strom.coordinator.transaction.manager import TransactionStateManager
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class Coordinators:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self._loads: set[asyncio.Task] = set()  # partitions being loaded off the event loop

    def start(self) -> tuple[GroupCoordinator, TransactionCoordinator]:
        """Make both coordinators and load what this broker leads (before it serves); the
        transaction coordinator finishes the transactions it finds prepared."""
        broker = self.broker
        group = create_group_coordinator(broker)
        group.group_overrides = lambda group_id: broker.group_configs.get(group_id, {})
        group.startup(group.store.load())
        # Finishing a transaction found prepared writes its markers, and one on a partition of
        # __consumer_offsets applies its offsets through the group coordinator: it must be in
        # place first (a kill -9 in the middle of a commit with offsets left one to finish).
        broker.group_coordinator = group
        store = TransactionStateManager(broker.replica_manager,
                                        lambda: broker.auto_topics.internal_partitions(TRANSACTION_STATE_TOPIC))
        txn = TransactionCoordinator(store, broker.producer_id_manager.generate, broker.txn_markers.send,
                                     broker.config["transaction.max.timeout.ms"],
                                     broker.config["transactional.id.expiration.ms"])
        txn.startup(txn.store.load())
        # The share coordinator's state: the share partitions of `__share_group_state` led here.
        broker.share_partitions.startup(broker.share_partitions.store.load())
        group.share_groups.member_listeners.append(broker.share_partitions.member_left)
        return group, txn

    def shutdown(self) -> None:
        """Held-back JoinGroup/SyncGroup and transaction waits are answered NOT_COORDINATOR."""
        for task in self._loads:
            task.cancel()
        if self.broker.group_coordinator is not None:
            self.broker.group_coordinator.shutdown()
            self.broker.group_coordinator.share_groups.shutdown()
        self.broker.share_partitions.shutdown()
        if self.broker.txn_coordinator is not None:
            self.broker.txn_coordinator.shutdown()

    def load(self, topic: str, index: int) -> None:
        """This broker now leads a partition of an internal topic: its coordinator takes over
        the groups or transactional ids stored there. (At start-up the coordinators are not
        running yet and load every led partition themselves.) A coordinator's partition is
        replayed off the event loop, as Kafka loads on a scheduler thread: its keys are
        answered COORDINATOR_LOAD_IN_PROGRESS until the replay is applied."""
        broker = self.broker
        if topic == GROUP_METADATA_TOPIC and broker.group_coordinator is not None:
            self._load_later(broker.group_coordinator, topic, index)
        elif topic == TRANSACTION_STATE_TOPIC and broker.txn_coordinator is not None:
            self._load_later(broker.txn_coordinator, topic, index)
        elif topic == SHARE_GROUP_STATE_TOPIC:
            self._load_later(broker.share_partitions, topic, index)

    def _load_later(self, coordinator: Any, topic: str, index: int) -> None:
        token = coordinator.loading[index] = object()
        task = asyncio.get_running_loop().create_task(self._load(coordinator, topic, index, token))
        self._loads.add(task)
        task.add_done_callback(self._loads.discard)

    async def _load(self, coordinator: Any, topic: str, index: int, token: object) -> None:
        """Replay the partition in the executor and hand the result to its coordinator, unless
        leadership left (or came back, with a newer load) meanwhile."""
        store = coordinator.store
        try:
            try:
                state = await store.load_off_loop(index)
            except Exception as e:  # e.g. a segment deleted under the read
                if coordinator.loading.get(index) is not token:
                    return
                log.warning("%s-%d: replaying it off the event loop failed (%s); replaying it here",
                            topic, index, e)
                state = store.load(only=index)
            if coordinator.loading.get(index) is not token:
                log.info("%s-%d: leadership moved while it was loading; its load is dropped", topic, index)
                return
            del coordinator.loading[index]
            if state is not None:
                coordinator.startup(state)
        except Exception:
            log.exception("%s-%d: loading the coordinator's state failed", topic, index)
        finally:
            if coordinator.loading.get(index) is token:  # never answered LOAD_IN_PROGRESS for ever
                del coordinator.loading[index]

    def unload(self, topic: str, index: int) -> None:
        broker = self.broker
        if topic == GROUP_METADATA_TOPIC and broker.group_coordinator is not None:
            broker.group_coordinator.unload_partition(index)
        elif topic == TRANSACTION_STATE_TOPIC and broker.txn_coordinator is not None:
            broker.txn_coordinator.unload_partition(index)
        elif topic == SHARE_GROUP_STATE_TOPIC:
            broker.share_partitions.unload(index)

    async def await_internal_replication(self, topic: str, key: str) -> ErrorCode:
        """Coordinators write with acks=all: before a commit, a transaction state change or
        a new producer id is answered, the ISR must have what was written to the key's
        partition of `topic` (COORDINATOR_NOT_AVAILABLE if not in time, as Kafka answers), and
        the fsync that flush.messages asks for must be done."""
        broker = self.broker
        tp = (topic, partition_for(key, broker.auto_topics.internal_partitions(topic)))
        partition = broker.replica_manager.get_partition(*tp)
        if partition is None or not partition.is_leader:
            return ErrorCode.NOT_COORDINATOR
        lg, end = partition.log, partition.log.log_end_offset
        if end - lg.recovery_point >= lg.config.flush_messages:
            # flush.messages applies to coordinators' writes as to a producer's: the commit is
            # answered once the fsync its append started is done.
            try:
                await broker.log_manager.flusher.wait_durable(lg, end)
            except OSError as e:
                log.error("%s-%d: a coordinator write could not be flushed: %s", *tp, e)
                return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = await broker.replica_manager.await_high_watermark(
            tp, partition.log.log_end_offset, broker.config["offsets.commit.timeout.ms"] / 1000)
        if error == ErrorCode.NONE:
            return error
        log.warning("%s-%d: a coordinator write was not replicated: %s", *tp, error.name)
        return ErrorCode.NOT_COORDINATOR if error == ErrorCode.NOT_LEADER_OR_FOLLOWER else \
            ErrorCode.COORDINATOR_NOT_AVAILABLE
