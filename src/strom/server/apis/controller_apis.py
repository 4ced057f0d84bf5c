"""LeaderAndIsr, UpdateMetadata and StopReplica: what the controller tells a broker;
AlterPartition and ControlledShutdown, what brokers ask of it; ElectLeaders and partition
reassignments (KIP-455), what admins ask.

Who may send the first five is checked before anything else, as only brokers and their
controller speak them. An embedded broker (no zookeeper.connect) has no other broker: its
controller reaches it in process, so these requests never come over a socket and are refused
there. In a cluster they are taken only on the inter-broker listener (control.plane.listener.name,
else the inter-broker one), with CLUSTER_ACTION, and from a broker the metadata knows: a
controller's request names the controller and epoch that /controller and /controller_epoch of the
metadata store hold (read once per new controller), a broker's names a live broker and its
epoch. Anything else gets CLUSTER_AUTHORIZATION_FAILED in a well-formed response.

A request from a controller older than the newest one this broker has heard from is refused
with STALE_CONTROLLER_EPOCH, and one addressed to an earlier registration of this broker
(a broker epoch below its current one) with STALE_BROKER_EPOCH, so a deposed controller or a
delayed request cannot undo newer decisions.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from strom.controller import znodes
from strom.heap import settle_after_bulk_change
from strom.protocol.errors import ErrorCode, StorageError
from strom.security.authorizer import ALTER, CLUSTER, CLUSTER_ACTION, DESCRIBE, INTERNAL, allowed
from strom.server.apis import RequestContext, api, by_topic
from strom.server.tiered_storage import topic_deleted

log = logging.getLogger(__name__)

LEADER_AND_ISR, STOP_REPLICA, UPDATE_METADATA, CONTROLLED_SHUTDOWN = 4, 5, 6, 7
STATE_CHANGES_PER_TURN = 500  # partitions changed between two turns of the event loop
ELECT_LEADERS, ALTER_PARTITION_REASSIGNMENTS, LIST_PARTITION_REASSIGNMENTS, ALTER_PARTITION = 43, 45, 46, 56
# A controller's epoch above what the store shows may be a read from a ZooKeeper server that
# lags: read again a few times before refusing.
STORE_READS, STORE_READ_INTERVAL_S = 3, 0.2
# The (controller id, epoch) each broker last found in its store: its requests need no read.
_verified: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fenced(broker, request, api_name: str) -> ErrorCode:
    cache = broker.metadata_cache
    if request.controller_epoch < cache.controller_epoch:
        log.warning("ignoring %s from controller %d with stale epoch %d (current %d)", api_name,
                    request.controller_id, request.controller_epoch, cache.controller_epoch)
        return ErrorCode.STALE_CONTROLLER_EPOCH
    if 0 <= request.broker_epoch < broker.broker_epoch:
        log.warning("ignoring %s for broker epoch %d (current %d)", api_name, request.broker_epoch,
                    broker.broker_epoch)
        return ErrorCode.STALE_BROKER_EPOCH
    return ErrorCode.NONE


def _not_from_a_broker(broker, ctx: RequestContext) -> str | None:
    """Why this connection may not send inter-broker requests at all (None: it may)."""
    if ctx.principal == INTERNAL:
        return None  # this broker's own controller, in process
    if not broker.clustered:
        return "an embedded broker takes controller requests only from its own controller, in process"
    listener = broker.inter_broker_listener
    if ctx.listener != listener:
        return f"controller requests are taken on the inter-broker listener {listener} only"
    if not allowed(broker, ctx, CLUSTER_ACTION, CLUSTER):
        return f"{ctx.principal} may not do CLUSTER_ACTION"
    return None


async def _not_from_the_controller(broker, ctx: RequestContext, request) -> str | None:
    """Why a LeaderAndIsr, UpdateMetadata or StopReplica is not the controller's (None: it
    is). A stale epoch passes here, to be answered STALE_CONTROLLER_EPOCH by `_fenced`."""
    why = _not_from_a_broker(broker, ctx)
    if why is not None or ctx.principal == INTERNAL:
        return why
    claimed = (request.controller_id, request.controller_epoch)
    if request.controller_epoch < broker.metadata_cache.controller_epoch or _verified.get(broker) == claimed:
        return None
    for attempt in range(STORE_READS):
        controller = await broker.store_io(broker.store.get, znodes.CONTROLLER)
        epoch = await broker.store_io(broker.store.get, znodes.CONTROLLER_EPOCH)
        found = ((controller[0] or {}).get("brokerid") if controller else None, epoch[0] if epoch else None)
        if found == claimed:
            _verified[broker] = claimed
            return None
        if found[1] is None or request.controller_epoch < found[1] or attempt == STORE_READS - 1:
            break
        await asyncio.sleep(STORE_READ_INTERVAL_S)
    return (f"controller {claimed[0]} at epoch {claimed[1]} is not the metadata store's "
            f"(controller {found[0]}, epoch {found[1]})")


def _not_a_live_broker(broker, broker_id: int, broker_epoch: int) -> str | None:
    """For a broker's request to the controller: why it is not one of the live brokers."""
    if broker_epoch < 0 or broker_id not in broker.metadata_cache.live_brokers:
        return f"broker {broker_id} (epoch {broker_epoch}) is not a live broker"
    return None


def _refused(ctx: RequestContext, api_name: str, why: str) -> dict:
    """CLUSTER_AUTHORIZATION_FAILED, every other field its default: a response any schema
    version encodes. The log line is rate-limited per cause (log_levels.RateLimit)."""
    log.warning("refused %s from %s: %s", api_name, ctx.client, why)
    return {"error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED}


# Administrative requests need ALTER or DESCRIBE on the cluster; Kafka answers others with this.
CLUSTER_DENIED = {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED}

@api(LEADER_AND_ISR, 7, 7)
async def handle_leader_and_isr(broker, ctx: RequestContext, request) -> dict:
    if (why := await _not_from_the_controller(broker, ctx, request)) is not None:
        return _refused(ctx, "LeaderAndIsr", why)
    error = _fenced(broker, request, "LeaderAndIsr")
    if error != ErrorCode.NONE:
        return {"error_code": error, "topics": []}
    broker.metadata_cache.controller_epoch = request.controller_epoch
    broker.leader_endpoints.update({leader.broker_id: (leader.host_name, leader.port)
                                    for leader in request.live_leaders})
    for t in request.topic_states:
        await _refresh_topic_configs(broker, t.topic_name)
    # New logs are made off the loop in batches first; then each partition's change is memory
    # only, and the loop is given back every STATE_CHANGES_PER_TURN partitions.
    await broker.replica_manager.prepare_partitions([
        (t.topic_name, p.partition_index, t.topic_id, broker.log_config_for(t.topic_name),
         p.leader != broker.broker_id) for t in request.topic_states for p in t.partition_states])
    topics, done = [], 0
    for t in request.topic_states:
        errors = []
        for p in t.partition_states:
            errors.append({"partition_index": p.partition_index,
                           "error_code": _become_leader_or_follower(broker, t.topic_name, t.topic_id, p)})
            done += 1
            if done % STATE_CHANGES_PER_TURN == 0:
                await asyncio.sleep(0)
        topics.append({"topic_id": t.topic_id, "partition_errors": errors})
    settle_after_bulk_change(done)
    return {"error_code": ErrorCode.NONE, "topics": topics}


async def _refresh_topic_configs(broker, topic: str) -> None:
    """A LeaderAndIsr for a topic this broker hosts nothing of yet: read its configs before
    creating its logs (it may have been created, or re-created, a moment ago)."""
    if not broker.replica_manager.hosts_topic(topic):
        broker.config_repository.topics[topic] = await broker.read_topic_configs(topic)


def _become_leader_or_follower(broker, topic: str, topic_id, p) -> ErrorCode:
    """One partition of a LeaderAndIsr request (Kafka's becomeLeaderOrFollower)."""
    current = broker.replica_manager.get_partition(topic, p.partition_index)
    was_leader = current is not None and current.is_leader
    if current is not None and p.leader_epoch < current.leader_epoch:
        log.warning("ignoring LeaderAndIsr for %s-%d: leader epoch %d is older than %d", topic,
                    p.partition_index, p.leader_epoch, current.leader_epoch)
        return ErrorCode.STALE_CONTROLLER_EPOCH
    if current is not None and p.leader_epoch == current.leader_epoch and p.leader == current.leader_id:
        if current.is_leader and p.partition_epoch > current.partition_epoch:
            # The ISR changed without a new leader (a KRaft controller fenced a follower).
            broker.replica_manager.isr_changed(current, list(p.isr), p.partition_epoch)
        return ErrorCode.NONE  # already in this state (a new controller repeats it)
    try:
        partition = broker.replica_manager.become_leader_or_follower(
            topic, p.partition_index, topic_id, p.leader, p.leader_epoch, list(p.replicas),
            list(p.isr), broker.log_config_for(topic), p.partition_epoch)
    except (OSError, StorageError) as e:
        log.error("cannot open the log of %s-%d: %s", topic, p.partition_index, e)
        broker.replica_manager.unmade[(topic, p.partition_index)] = str(e)
        return ErrorCode.KAFKA_STORAGE_ERROR
    if p.leader == broker.broker_id or p.leader < 0:
        broker.replica_fetchers.remove_partition((topic, p.partition_index))
    else:
        broker.replica_fetchers.add_partition(partition)
    if znodes.is_internal(topic):
        if p.leader == broker.broker_id and not was_leader:
            broker.coordinators.load(topic, p.partition_index)
        elif p.leader != broker.broker_id and was_leader:
            broker.coordinators.unload(topic, p.partition_index)
    if was_leader and p.leader != broker.broker_id:
        broker.share_partitions.leadership_left(topic_id, p.partition_index)
    return ErrorCode.NONE


def _update_metadata(broker, request) -> None:
    deleted = broker.metadata_cache.update(request)
    if deleted:
        for topic in {t for t, _ in deleted}:
            if topic not in broker.metadata_cache.topics:
                broker.config_repository.topics.pop(topic, None)
        if broker.group_coordinator is not None:
            # Kafka's handleDeletedPartitions: committed offsets of deleted partitions go.
            broker.group_coordinator.on_partitions_deleted(deleted)
        broker.share_partitions.topics_deleted()  # and share groups' state of deleted topics


def _stop_replica(broker, topic: str, partition: int, delete: bool) -> ErrorCode:
    broker.replica_fetchers.remove_partition((topic, partition))
    current = broker.replica_manager.get_partition(topic, partition)
    if znodes.is_internal(topic) and current is not None and current.is_leader:
        broker.coordinators.unload(topic, partition)
    if current is not None and current.is_leader:
        broker.share_partitions.leadership_left(current.topic_id, partition)
    if delete and current is not None:
        topic_deleted(broker, current)
    try:
        broker.replica_manager.stop_replica(topic, partition, delete)
    except OSError as e:
        log.error("cannot delete the log of %s-%d: %s", topic, partition, e)
        return ErrorCode.KAFKA_STORAGE_ERROR
    return ErrorCode.NONE


@api(UPDATE_METADATA, 8, 8)
async def handle_update_metadata(broker, ctx: RequestContext, request) -> dict:
    if (why := await _not_from_the_controller(broker, ctx, request)) is not None:
        return _refused(ctx, "UpdateMetadata", why)
    error = _fenced(broker, request, "UpdateMetadata")
    if error == ErrorCode.NONE:
        _update_metadata(broker, request)
        settle_after_bulk_change(sum(len(t.partition_states) for t in request.topic_states))
    return {"error_code": error}


@api(STOP_REPLICA, 4, 4)
async def handle_stop_replica(broker, ctx: RequestContext, request) -> dict:
    if (why := await _not_from_the_controller(broker, ctx, request)) is not None:
        return _refused(ctx, "StopReplica", why)
    error = _fenced(broker, request, "StopReplica")
    if error != ErrorCode.NONE:
        return {"error_code": error, "partition_errors": []}
    broker.metadata_cache.controller_epoch = request.controller_epoch
    errors = []
    for t in request.topic_states:
        for p in t.partition_states:
            code = _stop_replica(broker, t.topic_name, p.partition_index, p.delete_partition)
            errors.append({"topic_name": t.topic_name, "partition_index": p.partition_index,
                           "error_code": code})
            if len(errors) % STATE_CHANGES_PER_TURN == 0:
                await asyncio.sleep(0)
    return {"error_code": ErrorCode.NONE, "partition_errors": errors}


@api(ALTER_PARTITION, 0, 1)
async def handle_alter_partition(broker, ctx: RequestContext, request) -> dict:
    """A leader asks the controller for a new ISR."""
    why = _not_from_a_broker(broker, ctx)
    if why is None and ctx.principal != INTERNAL:
        why = _not_a_live_broker(broker, request.broker_id, request.broker_epoch)
    if why is not None:
        return _refused(ctx, "AlterPartition", why)
    if broker.controller is None or not broker.controller.is_active:
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NOT_CONTROLLER, "topics": []}
    return await broker.controller.alter_partition(request)


def _not_controller(broker) -> bool:
    return broker.controller is None or not broker.controller.is_active


@api(CONTROLLED_SHUTDOWN, 3, 3)
async def handle_controlled_shutdown(broker, ctx: RequestContext, request) -> dict:
    why = _not_from_a_broker(broker, ctx)
    if why is None and ctx.principal != INTERNAL:
        why = _not_a_live_broker(broker, request.broker_id, request.broker_epoch)
    if why is not None:
        return _refused(ctx, "ControlledShutdown", why)
    if _not_controller(broker):
        return {"error_code": ErrorCode.NOT_CONTROLLER, "remaining_partitions": []}
    return await broker.controller.controlled_shutdown(request.broker_id, request.broker_epoch)


@api(ELECT_LEADERS, 0, 2)
async def handle_elect_leaders(broker, ctx: RequestContext, request) -> dict:
    """Preferred (0) or unclean (1) leader election on demand (kafka-leader-election)."""
    if not allowed(broker, ctx, ALTER, CLUSTER):
        return CLUSTER_DENIED
    version = ctx.header.api_version
    if _not_controller(broker):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NOT_CONTROLLER, "replica_election_results": []}
    wanted = None if request.topic_partitions is None else [
        (t.topic, p) for t in request.topic_partitions for p in t.partitions]
    election_type = request.election_type if version >= 1 else 0
    if election_type not in (0, 1):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REQUEST, "replica_election_results": []}
    results = await broker.controller.elect_leaders(election_type, wanted)
    entries = {tp: {"partition_id": tp[1], "error_code": error, "error_message": message}
               for tp, (error, message) in results.items()}
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE,
            "replica_election_results": by_topic(entries, "partition_result", "topic")}


@api(ALTER_PARTITION_REASSIGNMENTS, 0, 1)
async def handle_alter_partition_reassignments(broker, ctx: RequestContext, request) -> dict:
    """Move partitions to new replicas (null replicas: cancel an ongoing move)."""
    if not allowed(broker, ctx, ALTER, CLUSTER):
        return CLUSTER_DENIED
    if _not_controller(broker):
        return {"throttle_time_ms": 0, "allow_replication_factor_change": True,
                "error_code": ErrorCode.NOT_CONTROLLER, "error_message": None, "responses": []}
    changes = [(t.name, p.partition_index, None if p.replicas is None else list(p.replicas))
               for t in request.topics for p in t.partitions]
    results = await broker.controller.alter_reassignments(changes)
    entries = {tp: {"partition_index": tp[1], "error_code": error, "error_message": message}
               for tp, (error, message) in results.items()}
    return {"throttle_time_ms": 0, "allow_replication_factor_change": True, "error_code": ErrorCode.NONE,
            "error_message": None, "responses": by_topic(entries)}


@api(LIST_PARTITION_REASSIGNMENTS, 0, 0)
async def handle_list_partition_reassignments(broker, ctx: RequestContext, request) -> dict:
    if not allowed(broker, ctx, DESCRIBE, CLUSTER):
        return CLUSTER_DENIED
    if _not_controller(broker):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NOT_CONTROLLER, "error_message": None,
                "topics": []}
    wanted = None if request.topics is None else [
        (t.name, p) for t in request.topics for p in t.partition_indexes]
    ongoing = await broker.controller.list_reassignments(wanted)
    entries = {tp: {"partition_index": tp[1], "replicas": s.replicas, "adding_replicas": s.adding,
                    "removing_replicas": s.removing} for tp, s in ongoing.items()}
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None,
            "topics": by_topic(entries)}
