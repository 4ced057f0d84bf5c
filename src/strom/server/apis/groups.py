"""Group membership and group admin: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups,
DescribeGroups, DeleteGroups (classic groups; ListGroups and DeleteGroups also KIP-932 share
groups) and ConsumerGroupHeartbeat, ConsumerGroupDescribe (KIP-848 consumer groups).

The handlers translate between the wire versions and the coordinator
(`strom.coordinator.group`); a JoinGroup or SyncGroup held back for a rebalance is an awaited
future, so only its own connection waits.
"""

from __future__ import annotations

from strom.controller.features import GROUP_VERSION
from strom.coordinator.group.consumer_group import HeartbeatRequest
from strom.coordinator.group.coordinator import JoinRequest
from strom.protocol.errors import ErrorCode, KafkaError
from strom.security.authorizer import (
    CLUSTER,
    DELETE,
    DESCRIBE,
    GROUP,
    NOT_REQUESTED,
    READ,
    allowed,
    as_int32,
    authorized_operations,
)
from strom.server.apis import RequestContext, api

JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 15, 16, 42
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69


def client_host(ctx: RequestContext) -> str:
    """The client address as Kafka shows it (InetAddress.toString: "/127.0.0.1")."""
    return "/" + ctx.client.rsplit(":", 1)[0].strip("[]")

# What Kafka answers a group request its principal may not make.
GROUP_DENIED = {"throttle_time_ms": 0, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED}


@api(JOIN_GROUP, 0, 9)
async def handle_join_group(broker, ctx: RequestContext, request) -> dict:
    if not allowed(broker, ctx, READ, GROUP, request.group_id):
        return GROUP_DENIED
    version = ctx.header.api_version
    instance_id = request.group_instance_id if version >= 5 else None
    result = await broker.group_coordinator.join_group(JoinRequest(
        group_id=request.group_id,
        member_id=request.member_id or "",
        group_instance_id=instance_id,
        protocol_type=request.protocol_type,
        protocols=[(p.name, bytes(p.metadata or b"")) for p in request.protocols],
        session_timeout_ms=request.session_timeout_ms,
        # v0 has one timeout for both.
        rebalance_timeout_ms=request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms,
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
        require_known_member_id=version >= 4 and instance_id is None,
        support_skip_assignment=version >= 9,
        reason=request.reason if version >= 8 else None,
    ))
    return {
        "throttle_time_ms": 0,
        "error_code": result.error,
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        # Nullable from v7; before that "no protocol" is the empty string.
        "protocol_name": result.protocol_name if version >= 7 else (result.protocol_name or ""),
        "leader": result.leader_id,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [{"member_id": m, "group_instance_id": i, "metadata": md}
                    for m, i, md in result.members],
    }


@api(SYNC_GROUP, 0, 5)
async def handle_sync_group(broker, ctx: RequestContext, request) -> dict:
    if not allowed(broker, ctx, READ, GROUP, request.group_id):
        return GROUP_DENIED
    version = ctx.header.api_version
    protocol_type = request.protocol_type if version >= 5 else None
    protocol_name = request.protocol_name if version >= 5 else None
    if version >= 5 and (protocol_type is None or protocol_name is None):
        # Mandatory from v5: a client that omits them gets Kafka's answer.
        return {"throttle_time_ms": 0, "error_code": ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                "protocol_type": None, "protocol_name": None, "assignment": b""}
    result = await broker.group_coordinator.sync_group(
        request.group_id, request.generation_id, request.member_id, protocol_type, protocol_name,
        request.group_instance_id if version >= 3 else None,
        {a.member_id: bytes(a.assignment or b"") for a in request.assignments})
    return {"throttle_time_ms": 0, "error_code": result.error, "protocol_type": result.protocol_type,
            "protocol_name": result.protocol_name, "assignment": result.assignment}


@api(HEARTBEAT, 0, 4)
async def handle_heartbeat(broker, ctx: RequestContext, request) -> dict:
    if not allowed(broker, ctx, READ, GROUP, request.group_id):
        return GROUP_DENIED
    version = ctx.header.api_version
    error = broker.group_coordinator.heartbeat(
        request.group_id, request.member_id, request.group_instance_id if version >= 3 else None,
        request.generation_id)
    return {"throttle_time_ms": 0, "error_code": error}


@api(LEAVE_GROUP, 0, 5)
async def handle_leave_group(broker, ctx: RequestContext, request) -> dict:
    if not allowed(broker, ctx, READ, GROUP, request.group_id):
        return GROUP_DENIED
    version = ctx.header.api_version
    if version < 3:
        leaving = [(request.member_id, None, None)]
    else:
        leaving = [(m.member_id, m.group_instance_id, m.reason if version >= 5 else None)
                   for m in request.members]
    error, member_errors = broker.group_coordinator.leave_group(request.group_id, leaving)
    if version < 3:
        # One member, one error code: the group's, else the member's.
        if error == ErrorCode.NONE and member_errors:
            error = member_errors[0]
        return {"throttle_time_ms": 0, "error_code": error}
    return {"throttle_time_ms": 0, "error_code": error, "members": [
        {"member_id": member_id, "group_instance_id": instance_id, "error_code": code}
        for (member_id, instance_id, _), code in zip(leaving, member_errors, strict=False)]}


@api(LIST_GROUPS, 0, 5)
async def handle_list_groups(broker, ctx: RequestContext, request) -> dict:
    version = ctx.header.api_version
    coordinator = broker.group_coordinator
    if not coordinator.active:
        return {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "groups": []}
    groups = coordinator.list_groups(request.states_filter if version >= 4 else (),
                                     request.types_filter if version >= 5 else ())
    listed = [{"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state,
               "group_type": g.group_type} for g in groups]
    listed += _share_groups(broker, request.states_filter if version >= 4 else (),
                            request.types_filter if version >= 5 else ())
    if not allowed(broker, ctx, DESCRIBE, CLUSTER):  # else only the groups it may describe
        listed = [g for g in listed if allowed(broker, ctx, DESCRIBE, GROUP, g["group_id"])]
    # As Kafka: what is loaded so far, and that more may come (a partition still loading).
    error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if coordinator.loading else ErrorCode.NONE
    return {"throttle_time_ms": 0, "error_code": error, "groups": sorted(listed, key=lambda g: g["group_id"])}


def _share_groups(broker, states, types) -> list[dict]:
    """KIP-932 share groups: those with members, and those only `__share_group_state` knows
    (Empty since this broker started)."""
    if types and "share" not in {t.lower() for t in types}:
        return []
    wanted = {s.lower() for s in states}
    share_groups = broker.group_coordinator.share_groups
    found = {g.group_id: g.state.value for g in share_groups.groups.values()}
    for group_id in broker.share_partitions.group_ids():
        if group_id not in broker.group_coordinator.groups:
            found.setdefault(group_id, "Empty")
    return [{"group_id": g, "protocol_type": "share", "group_state": state, "group_type": "share"}
            for g, state in found.items() if not wanted or state.lower() in wanted]


@api(DESCRIBE_GROUPS, 0, 6)
async def handle_describe_groups(broker, ctx: RequestContext, request) -> dict:
    described = []
    for group_id in request.groups:
        if not allowed(broker, ctx, DESCRIBE, GROUP, group_id):
            described.append({"error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED, "group_id": group_id,
                              "group_state": "", "protocol_type": "", "protocol_data": "", "members": []})
            continue
        error, summary = broker.group_coordinator.describe_group(group_id)
        message = None
        if ctx.header.api_version >= 6 and error == ErrorCode.NONE and summary.state == "Dead":
            # KIP-1043: v6 says a group that does not exist is not found, not Dead.
            error, message = ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found."
        described.append({
            "error_code": error, "error_message": message, "group_id": group_id, "group_state": summary.state,
            "protocol_type": summary.protocol_type, "protocol_data": summary.protocol,
            "members": summary.members,
            "authorized_operations": _operations(broker, ctx, request, group_id)})
    return {"throttle_time_ms": 0, "groups": described}


def _operations(broker, ctx: RequestContext, request, group_id: str) -> set[int] | None:
    if getattr(request, "include_authorized_operations", False):
        return authorized_operations(broker, ctx, GROUP, group_id)
    return NOT_REQUESTED


@api(DELETE_GROUPS, 0, 2)
async def handle_delete_groups(broker, ctx: RequestContext, request) -> dict:
    permitted = [g for g in request.groups_names if allowed(broker, ctx, DELETE, GROUP, g)]
    share_ids = broker.group_coordinator.share_groups.groups.keys() | broker.share_partitions.group_ids()
    shares = [g for g in permitted if g in share_ids and g not in broker.group_coordinator.groups]
    results = broker.group_coordinator.delete_groups([g for g in permitted if g not in shares])
    for group_id in shares:  # a share group goes with its share-partition state
        error = broker.group_coordinator.share_groups.delete(group_id)
        if error in (ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND):
            error = await broker.share_partitions.delete_group_state(group_id)
        results[group_id] = error
    return {"throttle_time_ms": 0, "results": [
        {"group_id": group_id, "error_code": results.get(group_id, ErrorCode.GROUP_AUTHORIZATION_FAILED)}
        for group_id in request.groups_names]}


@api(CONSUMER_GROUP_HEARTBEAT, 0, 1)
async def handle_consumer_group_heartbeat(broker, ctx: RequestContext, request) -> dict:
    if not allowed(broker, ctx, READ, GROUP, request.group_id):
        return GROUP_DENIED
    version = ctx.header.api_version
    if broker.finalized_features.level(GROUP_VERSION) < 1:
        # Kafka 4.0: the KIP-848 protocol needs group.version 1 finalized as well as the config.
        return {"throttle_time_ms": 0, "error_code": ErrorCode.UNSUPPORTED_VERSION,
                "error_message": "The new consumer group protocol is not enabled: group.version is "
                                 "not finalized at 1 or more.", "member_id": None, "member_epoch": 0,
                "heartbeat_interval_ms": 0, "assignment": None}
    owned = None if request.topic_partitions is None else [
        (tp.topic_id, list(tp.partitions)) for tp in request.topic_partitions]
    try:
        response = broker.group_coordinator.consumer_groups.heartbeat(HeartbeatRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            subscribed_topic_names=None if request.subscribed_topic_names is None
            else list(request.subscribed_topic_names),
            subscribed_topic_regex=request.subscribed_topic_regex if version >= 1 else None,
            server_assignor=request.server_assignor,
            owned=owned,
            client_id=ctx.header.client_id or "",
            client_host=client_host(ctx),
            version=version,
        ))
    except KafkaError as e:
        return {"throttle_time_ms": 0, "error_code": e.code, "error_message": str(e) or None,
                "member_id": None, "member_epoch": 0, "heartbeat_interval_ms": 0,
                "assignment": None}
    assignment = None if response.assignment is None else {"topic_partitions": [
        {"topic_id": topic_id, "partitions": sorted(partitions)}
        for topic_id, partitions in response.assignment.items()]}
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None,
            "member_id": response.member_id, "member_epoch": response.member_epoch,
            "heartbeat_interval_ms": response.heartbeat_interval_ms, "assignment": assignment}


@api(CONSUMER_GROUP_DESCRIBE, 0, 1)
async def handle_consumer_group_describe(broker, ctx: RequestContext, request) -> dict:
    consumer_groups = broker.group_coordinator.consumer_groups
    return {"throttle_time_ms": 0, "groups": [
        {**consumer_groups.describe(group_id),
         "authorized_operations": as_int32(_operations(broker, ctx, request, group_id))}
        if allowed(broker, ctx, DESCRIBE, GROUP, group_id)
        else {"group_id": group_id, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED}
        for group_id in request.group_ids]}
