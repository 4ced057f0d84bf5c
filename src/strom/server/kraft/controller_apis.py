"""ControllerApis: what a KRaft controller answers on its controller listener (Kafka's
ControllerApis): the Raft APIs (Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch, FetchSnapshot,
DescribeQuorum, Add/Remove/UpdateRaftVoter), ApiVersions, and the requests that change metadata
as a Kafka 4 controller takes them (CreateTopics, DeleteTopics, CreatePartitions,
IncrementalAlterConfigs, ElectLeaders, Alter/ListPartitionReassignments, UpdateFeatures,
DescribeCluster, BrokerRegistration, BrokerHeartbeat, UnregisterBroker, AlterPartition), and
Create/Renew/ExpireDelegationToken, which brokers forward in an Envelope so that the controller
knows the client's principal (envelope.py).

Any other request closes the connection, as Kafka's socket server does for an API its listener
does not enable. Handlers run on the controller's event loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from strom.controller import cluster_control, replication_control
from strom.controller.features import SAFE_DOWNGRADE, SUPPORTED, UPGRADE, FeatureUpdate
from strom.controller.quorum_controller import NotController, QuorumController, wall_clock_ms
from strom.controller.replication_control import Change, NewTopic
from strom.network.request import API_VERSIONS, RequestContext
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.scram import MECHANISM_BY_ID
from strom.raft.core import (
    ADD_RAFT_VOTER,
    BEGIN_QUORUM_EPOCH,
    DESCRIBE_QUORUM,
    END_QUORUM_EPOCH,
    FETCH,
    FETCH_SNAPSHOT,
    REMOVE_RAFT_VOTER,
    UPDATE_RAFT_VOTER,
    VOTE,
)
from strom.raft.driver import RaftDriver
from strom.security.authorizer import (
    ALTER,
    ALTER_CONFIGS,
    CLUSTER,
    CLUSTER_ACTION,
    CREATE,
    CREATE_TOKENS,
    DELETE,
    DESCRIBE,
    TOPIC,
    USER,
    allowed,
)
from strom.server.apis import acls, by_topic, delegation_tokens, features, quotas, scram
from strom.server.apis.configs import authorize_config_resource
from strom.server.apis.metadata import CONTROLLER_ENDPOINT, endpoint_type_error
from strom.server.kraft import envelope
from strom.server.kraft.forwarding import ENVELOPED
from strom.server.kraft.lifecycle import HEARTBEAT_VERSION  # the version the codec answers

log = logging.getLogger(__name__)

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS = 19, 20, 37, 44
ELECT_LEADERS, ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS, ALTER_PARTITION = 43, 45, 46, 56
UPDATE_FEATURES, DESCRIBE_CLUSTER, ENVELOPE = 57, 60, 58
CREATE_TOKEN, RENEW_TOKEN, EXPIRE_TOKEN = 38, 39, 40
BROKER_REGISTRATION, BROKER_HEARTBEAT, UNREGISTER_BROKER, ALLOCATE_PRODUCER_IDS = 62, 63, 64, 67
CREATE_ACLS, DELETE_ACLS, ALTER_CLIENT_QUOTAS, ALTER_USER_SCRAM_CREDENTIALS = 30, 31, 49, 51
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
RAFT_APIS = (VOTE, BEGIN_QUORUM_EPOCH, END_QUORUM_EPOCH, FETCH, FETCH_SNAPSHOT, DESCRIBE_QUORUM,
             ADD_RAFT_VOTER, REMOVE_RAFT_VOTER, UPDATE_RAFT_VOTER)

# api key -> (min, max) version served on a controller listener.
VERSIONS: dict[int, tuple[int, int]] = {
    FETCH: (13, 17), FETCH_SNAPSHOT: (0, 1), VOTE: (0, 2), BEGIN_QUORUM_EPOCH: (0, 1), END_QUORUM_EPOCH: (0, 1),
    DESCRIBE_QUORUM: (0, 2), ADD_RAFT_VOTER: (0, 0), REMOVE_RAFT_VOTER: (0, 0), UPDATE_RAFT_VOTER: (0, 0),
    API_VERSIONS: (0, 4), SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2),
    CREATE_TOPICS: (2, 7), DELETE_TOPICS: (1, 6), CREATE_PARTITIONS: (0, 3), INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ELECT_LEADERS: (0, 2), ALTER_REASSIGNMENTS: (0, 1), LIST_REASSIGNMENTS: (0, 0), ALTER_PARTITION: (0, 3),
    UPDATE_FEATURES: (0, 2), DESCRIBE_CLUSTER: (0, 2), BROKER_REGISTRATION: (0, 4), BROKER_HEARTBEAT: (0, HEARTBEAT_VERSION),
    UNREGISTER_BROKER: (0, 0), ALLOCATE_PRODUCER_IDS: (0, 0), CREATE_ACLS: (1, 3), DELETE_ACLS: (1, 3),
    ALTER_CLIENT_QUOTAS: (0, 1), ALTER_USER_SCRAM_CREDENTIALS: (0, 0), ENVELOPE: (0, 0),
    CREATE_TOKEN: (1, 3), RENEW_TOKEN: (1, 2), EXPIRE_TOKEN: (1, 2),
}
# What an Envelope may carry: the requests that change metadata, not Raft's nor the broker
# lifecycle's (a broker sends those as itself), except UnregisterBroker, which an admin sends
# to any broker and the broker forwards as the admin's.
FORWARDABLE = ENVELOPED | {CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS,
                           CREATE_TOKEN, RENEW_TOKEN, EXPIRE_TOKEN, UNREGISTER_BROKER}

# What a request needs on the cluster resource when a controller takes it, as Kafka's
# ControllerApis asks (Envelope and DescribeCluster check theirs in their handlers; requests
# naming topics or config resources are checked per item).
CLUSTER_OPERATION = {
    VOTE: CLUSTER_ACTION, BEGIN_QUORUM_EPOCH: CLUSTER_ACTION, END_QUORUM_EPOCH: CLUSTER_ACTION,
    FETCH: CLUSTER_ACTION, FETCH_SNAPSHOT: CLUSTER_ACTION, UPDATE_RAFT_VOTER: CLUSTER_ACTION,
    DESCRIBE_QUORUM: DESCRIBE, ADD_RAFT_VOTER: ALTER, REMOVE_RAFT_VOTER: ALTER,
    BROKER_REGISTRATION: CLUSTER_ACTION, BROKER_HEARTBEAT: CLUSTER_ACTION, ALTER_PARTITION: CLUSTER_ACTION,
    ALLOCATE_PRODUCER_IDS: CLUSTER_ACTION, UNREGISTER_BROKER: ALTER, ELECT_LEADERS: ALTER,
    ALTER_REASSIGNMENTS: ALTER, LIST_REASSIGNMENTS: DESCRIBE, UPDATE_FEATURES: ALTER,
    CREATE_ACLS: ALTER, DELETE_ACLS: ALTER, ALTER_CLIENT_QUOTAS: ALTER_CONFIGS, ALTER_USER_SCRAM_CREDENTIALS: ALTER,
}


def error_answer(key: int, version: int, request: Any, code: int, message: str | None = None) -> dict:
    """`code` as the whole answer to a request: its top-level error, or every item's where the
    answer has none (Kafka's getErrorResponse). Only the admin requests with items are read."""
    item = {"error_code": code, "error_message": message}
    if key == CREATE_ACLS:
        return {"throttle_time_ms": 0, "results": [item for _ in request.creations]}
    if key == DELETE_ACLS:
        return {"throttle_time_ms": 0, "filter_results": [{**item, "matching_acls": []} for _ in request.filters]}
    if key == ALTER_CLIENT_QUOTAS:
        return {"throttle_time_ms": 0, "entries": [
            {**item, "entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]}
            for entry in request.entries]}
    if key == ALTER_USER_SCRAM_CREDENTIALS:
        users = dict.fromkeys([*(d.name for d in request.deletions), *(u.name for u in request.upsertions)])
        return {"throttle_time_ms": 0, "results": [{**item, "user": user} for user in users]}
    if key == ELECT_LEADERS and version == 0:  # no top-level error before v1
        return {"throttle_time_ms": 0, "replica_election_results": [
            {"topic": t.topic, "partition_result": [{**item, "partition_id": p} for p in t.partitions]}
            for t in request.topic_partitions or ()]}
    return {"error_code": code}


def _token_requests_allowed(ctx: RequestContext) -> bool:
    return delegation_tokens.token_requests_allowed(ctx, isinstance(ctx, envelope.ForwardedContext))


def _error(e: KafkaError) -> tuple[int, str]:
    return int(e.code), str(e) or e.code.name


class ControllerApis:
    """The controller listener's RequestHandler (strom.network.request)."""

    def __init__(self, server: Any, controller: QuorumController, driver: RaftDriver) -> None:
        self.server = server  # ControllerServer: config, cluster id
        self.controller = controller
        self.driver = driver
        self._handlers: dict[int, Callable[[RequestContext, Any], Awaitable[Any]]] = {
            API_VERSIONS: self._api_versions, SASL_HANDSHAKE: self._sasl_handshake,
            SASL_AUTHENTICATE: self._sasl_authenticate, CREATE_TOPICS: self._create_topics,
            DELETE_TOPICS: self._delete_topics, CREATE_PARTITIONS: self._create_partitions,
            INCREMENTAL_ALTER_CONFIGS: self._incremental_alter_configs, ELECT_LEADERS: self._elect_leaders,
            ALTER_REASSIGNMENTS: self._alter_reassignments, LIST_REASSIGNMENTS: self._list_reassignments,
            ALTER_PARTITION: self._alter_partition, UPDATE_FEATURES: self._update_features,
            DESCRIBE_CLUSTER: self._describe_cluster, BROKER_REGISTRATION: self._broker_registration,
            BROKER_HEARTBEAT: self._broker_heartbeat, UNREGISTER_BROKER: self._unregister_broker,
            ALLOCATE_PRODUCER_IDS: self._allocate_producer_ids, CREATE_ACLS: self._create_acls,
            DELETE_ACLS: self._delete_acls, ALTER_CLIENT_QUOTAS: self._alter_client_quotas,
            ALTER_USER_SCRAM_CREDENTIALS: self._alter_user_scram_credentials, ENVELOPE: self._envelope,
            CREATE_TOKEN: self._create_token, RENEW_TOKEN: self._renew_token, EXPIRE_TOKEN: self._expire_token,
        }

    # --- RequestHandler ---------------------------------------------------------------------------

    def supports(self, api_key: int, version: int) -> bool:
        span = VERSIONS.get(api_key)
        return span is not None and span[0] <= version <= span[1]

    async def handle(self, ctx: RequestContext, body: Any) -> Any:
        key = ctx.header.api_key
        needed = CLUSTER_OPERATION.get(key)
        if needed is not None and not allowed(self.server, ctx, needed, CLUSTER):
            return error_answer(key, ctx.header.api_version, body, ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                "Cluster authorization failed.")
        if key in RAFT_APIS:
            return await self.driver.handle_request(key, ctx.header.api_version, body)
        return await self._handlers[key](ctx, body)

    def unsupported_version_response(self) -> dict:
        return {"error_code": ErrorCode.UNSUPPORTED_VERSION, "api_keys": self._api_keys()}

    # --- ApiVersions and SASL -------------------------------------------------------------------

    def _api_keys(self) -> list[dict]:
        return [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(VERSIONS.items())]

    async def _api_versions(self, ctx: RequestContext, request: Any) -> dict:
        response = {"error_code": ErrorCode.NONE, "api_keys": self._api_keys(), "throttle_time_ms": 0}
        if ctx.header.api_version >= 3:
            levels = self.controller.image.features
            response |= {
                # kraft.version too, as Kafka's controllers list it: a leader adding this node
                # as a voter reads it from here (KIP-853)
                "supported_features": [{"name": n, "min_version": f.min_level, "max_version": f.max_level}
                                       for n, f in SUPPORTED.items()]
                + [{"name": "kraft.version", "min_version": 0, "max_version": 1}],
                "finalized_features_epoch": self.controller.image.end_offset - 1,
                "finalized_features": [{"name": n, "max_version_level": v, "min_version_level": v}
                                       for n, v in sorted(levels.items())],
            }
        return response

    async def _sasl_handshake(self, ctx: RequestContext, request: Any) -> dict:
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": []}

    async def _sasl_authenticate(self, ctx: RequestContext, request: Any) -> dict:
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "auth_bytes": b"", "session_lifetime_ms": 0,
                "error_message": f"listener {ctx.listener} does not use SASL"}

    # --- topics ---------------------------------------------------------------------------------

    async def _write(self, name: str, op: Callable[[Any], Change]) -> Any:
        return await self.controller.write(name, op)

    async def _create_topics(self, ctx: RequestContext, request: Any) -> dict:
        version = ctx.header.api_version
        counts = Counter(t.name for t in request.topics)
        results: dict[str, dict] = {}
        wanted = []
        may_create_any = allowed(self.server, ctx, CREATE, CLUSTER, log_denied=False)
        for t in request.topics:
            results[t.name] = {"name": t.name, "error_code": ErrorCode.NONE, "error_message": None}
            if counts[t.name] > 1:
                results[t.name].update(error_code=ErrorCode.INVALID_REQUEST, error_message=(
                    f"Create topics request from client `{ctx.header.client_id}` contains multiple entries for "
                    f"the following topics: {t.name}"))
                continue
            if not (may_create_any or allowed(self.server, ctx, CREATE, TOPIC, t.name)):
                results[t.name].update(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                       error_message="Authorization failed.")
                continue
            wanted.append(NewTopic(t.name, t.num_partitions, t.replication_factor,
                                   {a.partition_index: list(a.broker_ids) for a in t.assignments},
                                   {c.name: c.value for c in t.configs}))
        limits = self.controller.settings.limits
        try:
            outcome = await self._write("create-topics", lambda image: replication_control.create_topics(
                image, wanted, limits, request.validate_only))
        except KafkaError as e:
            outcome = {t.name: e for t in wanted}
        for name, result in outcome.items():
            entry = results[name]
            if isinstance(result, KafkaError):
                entry["error_code"], entry["error_message"] = _error(result)
                continue
            topic_id, replicas = result
            if not request.validate_only:
                log.info("created topic %s with %d partitions", name, len(replicas))
            if version >= 5:
                entry.update(topic_id=topic_id, num_partitions=len(replicas),
                             replication_factor=len(next(iter(replicas.values()))), configs=[])
        return {"throttle_time_ms": 0, "topics": list(results.values())}

    async def _delete_topics(self, ctx: RequestContext, request: Any) -> dict:
        image = self.controller.image
        if ctx.header.api_version >= 6:
            by_id = {t.topic_id: name for name, t in image.topics.items()}
            wanted = [(t.name or by_id.get(t.topic_id), t.topic_id) for t in request.topics]
        else:
            wanted = [(name, None) for name in request.topic_names]
        limits = self.controller.settings.limits
        may_delete_any = allowed(self.server, ctx, DELETE, CLUSTER, log_denied=False)
        denied = {name for name, _ in wanted if name is not None and not may_delete_any
                  and not allowed(self.server, ctx, DELETE, TOPIC, name)}
        names = [name for name, _ in wanted if name is not None and name not in denied]
        try:
            outcome = await self._write("delete-topics",
                                        lambda img: replication_control.delete_topics(img, names, limits))
        except KafkaError as e:
            outcome = {n: e for n in names}
        responses = []
        for name, topic_id in wanted:
            entry = {"name": name, "topic_id": topic_id, "error_code": ErrorCode.NONE, "error_message": None}
            result = outcome.get(name) if name is not None else KafkaError("unknown topic id",
                                                                            ErrorCode.UNKNOWN_TOPIC_ID)
            if name in denied:
                result = KafkaError("Authorization failed.", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            if isinstance(result, KafkaError):
                entry["error_code"], entry["error_message"] = _error(result)
            else:
                entry["topic_id"] = result
            responses.append(entry)
        return {"throttle_time_ms": 0, "responses": responses}

    async def _create_partitions(self, ctx: RequestContext, request: Any) -> dict:
        limits = self.controller.settings.limits
        results = []
        for t in request.topics:
            entry = {"name": t.name, "error_code": ErrorCode.NONE, "error_message": None}
            results.append(entry)
            if not allowed(self.server, ctx, ALTER, TOPIC, t.name):
                entry["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            assignment = None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]

            def op(image, t=t, assignment=assignment) -> Change:
                change = replication_control.create_partitions(image, t.name, t.count, assignment, limits,
                                                               replication_control.replica_counts(image))
                return Change([] if request.validate_only else change.records)

            try:
                await self._write(f"create-partitions-{t.name}", op)
            except KafkaError as e:
                entry["error_code"], entry["error_message"] = _error(e)
        return {"throttle_time_ms": 0, "results": results}

    async def _incremental_alter_configs(self, ctx: RequestContext, request: Any) -> dict:
        settings = self.controller.settings
        responses = []
        for resource in request.resources:
            entry = {"error_code": ErrorCode.NONE, "error_message": None,
                     "resource_type": resource.resource_type, "resource_name": resource.resource_name}
            ops = [(c.config_operation, c.name, c.value) for c in resource.configs]
            try:
                authorize_config_resource(self.server, ctx, ALTER_CONFIGS, resource.resource_type,
                                          resource.resource_name)
                dupes = sorted(n for n, k in Counter(name for _, name, _ in ops).items() if k > 1)
                if dupes:
                    raise KafkaError(f"Error due to duplicate config keys: {', '.join(dupes)}",
                                     ErrorCode.INVALID_REQUEST)

                def op(image, resource=resource, ops=ops) -> Change:
                    records = cluster_control.alter_configs(image, resource.resource_type, resource.resource_name,
                                                            ops, settings.validate_configs, settings.list_config)
                    return Change([] if request.validate_only else records)

                await self._write("alter-configs", op)
            except KafkaError as e:
                entry["error_code"], entry["error_message"] = _error(e)
            responses.append(entry)
        return {"throttle_time_ms": 0, "responses": responses}

    # --- elections and reassignments --------------------------------------------------------------

    async def _elect_leaders(self, ctx: RequestContext, request: Any) -> dict:
        wanted = None if request.topic_partitions is None else [
            (t.topic, p) for t in request.topic_partitions for p in t.partitions]
        election_type = request.election_type if ctx.header.api_version >= 1 else 0
        if election_type not in (0, 1):
            return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REQUEST, "replica_election_results": []}
        try:
            results = await self._write("elect-leaders", lambda image: replication_control.elect_leaders(
                image, election_type, wanted, self.controller.settings.limits))
        except KafkaError as e:
            return {"throttle_time_ms": 0, "error_code": e.code, "replica_election_results": []}
        entries = {tp: {"partition_id": tp[1], "error_code": error, "error_message": message}
                   for tp, (error, message) in results.items()}
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE,
                "replica_election_results": by_topic(entries, "partition_result", "topic")}

    async def _alter_reassignments(self, ctx: RequestContext, request: Any) -> dict:
        changes = [(t.name, p.partition_index, None if p.replicas is None else list(p.replicas))
                   for t in request.topics for p in t.partitions]
        try:
            results = await self._write("alter-reassignments",
                                        lambda image: replication_control.alter_reassignments(
                                            image, changes, self.controller.settings.limits))
        except KafkaError as e:
            return {"throttle_time_ms": 0, "allow_replication_factor_change": True, "error_code": e.code,
                    "error_message": str(e), "responses": []}
        entries = {tp: {"partition_index": tp[1], "error_code": error, "error_message": message}
                   for tp, (error, message) in results.items()}
        return {"throttle_time_ms": 0, "allow_replication_factor_change": True, "error_code": ErrorCode.NONE,
                "error_message": None, "responses": by_topic(entries)}

    async def _list_reassignments(self, ctx: RequestContext, request: Any) -> dict:
        try:
            self.controller.check_active()
        except NotController as e:
            return {"throttle_time_ms": 0, "error_code": e.code, "error_message": None, "topics": []}
        wanted = None if request.topics is None else [(t.name, p) for t in request.topics for p in t.partition_indexes]
        ongoing = replication_control.list_reassignments(self.controller.image, wanted)
        entries = {tp: {"partition_index": tp[1], "replicas": s.replicas, "adding_replicas": s.adding,
                        "removing_replicas": s.removing} for tp, s in ongoing.items()}
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None,
                "topics": by_topic(entries)}

    async def _alter_partition(self, ctx: RequestContext, request: Any) -> dict:
        image = self.controller.image
        broker = image.brokers.get(request.broker_id)
        if broker is None or 0 <= request.broker_epoch != broker.epoch:
            return {"throttle_time_ms": 0, "error_code": ErrorCode.STALE_BROKER_EPOCH, "topics": []}
        by_id = {t.topic_id: name for name, t in image.topics.items()}
        version = ctx.header.api_version
        limits = self.controller.settings.limits  # min.insync.replicas for the ELRs

        def op(img) -> Change:
            out = Change(result=[])
            for t in request.topics:
                name = t.topic_name if version < 2 else by_id.get(t.topic_id, "")
                answers = []
                for p in t.partitions:
                    records, answer = replication_control.alter_partition(img, request.broker_id, name, p, limits)
                    out.records += records
                    answers.append(answer)
                out.result.append({"topic_name": name, "topic_id": getattr(t, "topic_id", None),
                                   "partitions": answers})
            return out

        try:
            topics = await self._write("alter-partition", op)
        except KafkaError as e:
            return {"throttle_time_ms": 0, "error_code": e.code, "topics": []}
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "topics": topics}

    # --- features and the cluster -----------------------------------------------------------------

    async def _update_features(self, ctx: RequestContext, request: Any) -> dict:
        version = ctx.header.api_version
        updates = [FeatureUpdate(u.feature, u.max_version_level,
                                 u.upgrade_type if version >= 1 else (SAFE_DOWNGRADE if u.allow_downgrade else UPGRADE))
                   for u in request.feature_updates]
        validate_only = version >= 1 and request.validate_only

        def response(error: int, message: str | None, results: dict | None = None) -> dict:
            # v2 answers with the top-level error only, as the broker's own handler does.
            return features._response(version, updates, error, message, results)

        if not updates:
            return response(ErrorCode.INVALID_REQUEST, "No feature updates were given.")

        def op(image) -> Change:
            change = cluster_control.update_features(image, updates)
            return Change([] if validate_only else change.records, change.result)

        try:
            results = await self._write("update-features", op)
        except KafkaError as e:
            return response(e.code, str(e))
        return response(ErrorCode.NONE, None, results)

    async def _describe_cluster(self, ctx: RequestContext, request: Any) -> dict:
        """Asked of a controller (KIP-919's endpoint type 2, as `kafka-metadata-quorum` and admin
        clients with bootstrap.controllers ask): the controllers where they listen on the
        listener asked, and the one that leads. A controller answers no other endpoint type,
        and (unlike a broker) only a principal with ALTER on the cluster."""
        version = ctx.header.api_version
        wrong = endpoint_type_error(request, version, CONTROLLER_ENDPOINT)
        if wrong is not None:
            return wrong
        if not allowed(self.server, ctx, ALTER, CLUSTER):
            return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    "error_message": None, "endpoint_type": CONTROLLER_ENDPOINT, "cluster_id": "",
                    "controller_id": -1, "brokers": [], "authorized_operations": None}
        nodes = [{"broker_id": v.voter_id, "host": e.host, "port": e.port, "rack": None, "is_fenced": False}
                 for v in self.driver.core.voters.voters for e in v.endpoints if e.name == ctx.listener]
        leader = self.driver.core.leader_id
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None,
                "endpoint_type": CONTROLLER_ENDPOINT, "cluster_id": self.server.cluster_id,
                "controller_id": leader if any(n["broker_id"] == leader for n in nodes) else -1, "brokers": nodes,
                "authorized_operations": None}

    async def _broker_registration(self, ctx: RequestContext, request: Any) -> dict:
        try:
            epoch = await self.controller.register_broker(request)
        except KafkaError as e:
            return {"throttle_time_ms": 0, "error_code": e.code, "broker_epoch": -1}
        log.info("broker %d registered with broker epoch %d", request.broker_id, epoch)
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "broker_epoch": epoch}

    async def _broker_heartbeat(self, ctx: RequestContext, request: Any) -> dict:
        try:
            state = await self.controller.heartbeat(request)
        except KafkaError as e:
            return {"throttle_time_ms": 0, "error_code": e.code, "is_caught_up": False, "is_fenced": True,
                    "should_shut_down": False}
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "is_caught_up": state.is_caught_up,
                "is_fenced": state.is_fenced, "should_shut_down": state.should_shut_down}

    async def _unregister_broker(self, ctx: RequestContext, request: Any) -> dict:
        limits = self.controller.settings.limits
        try:
            await self._write("unregister-broker", lambda image: Change(
                cluster_control.unregister_broker(image, request.broker_id, limits)))
        except KafkaError as e:
            return {"throttle_time_ms": 0, "error_code": e.code, "error_message": str(e)}
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None}

    async def _allocate_producer_ids(self, ctx: RequestContext, request: Any) -> dict:
        try:
            start, length = await self._write("allocate-producer-ids", lambda image: cluster_control.allocate_producer_ids(
                image, request.broker_id, request.broker_epoch))
        except KafkaError as e:
            return {"throttle_time_ms": 0, "error_code": e.code, "producer_id_start": -1, "producer_id_len": 0}
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "producer_id_start": start,
                "producer_id_len": length}

    # --- ACLs, client quotas, SCRAM users (brokers forward these; checked as a broker checks) ---

    async def _create_acls(self, ctx: RequestContext, request: Any) -> dict:
        results, wanted = [], []
        for c in request.creations:
            why = acls.check_binding(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal,
                                     c.operation, c.permission_type)
            results.append({"error_code": ErrorCode.INVALID_REQUEST if why else ErrorCode.NONE, "error_message": why})
            if why is None:
                wanted.append(c)
        try:
            await self._write("create-acls", lambda image: Change(cluster_control.create_acls(image, wanted)))
        except KafkaError as e:
            results = [{"error_code": e.code, "error_message": str(e)} for _ in results]
        return {"throttle_time_ms": 0, "results": results}

    async def _delete_acls(self, ctx: RequestContext, request: Any) -> dict:
        filters = [acls.acl_filter(f) for f in request.filters]
        try:
            removed = await self._write("delete-acls", lambda image: cluster_control.delete_acls(image, filters))
        except KafkaError as e:
            return {"throttle_time_ms": 0, "filter_results": [
                {"error_code": e.code, "error_message": str(e), "matching_acls": []} for _ in filters]}
        return {"throttle_time_ms": 0, "filter_results": [
            {"error_code": ErrorCode.NONE, "error_message": None, "matching_acls": [
                {"error_code": ErrorCode.NONE, "error_message": None, "resource_type": rec.resource_type,
                 "resource_name": rec.resource_name, "pattern_type": rec.pattern_type, "principal": rec.principal,
                 "host": rec.host, "operation": rec.operation, "permission_type": rec.permission_type}
                for rec in matched]} for matched in removed]}

    async def _alter_client_quotas(self, ctx: RequestContext, request: Any) -> dict:
        results, records = [], []
        for entry in request.entries:
            entity = [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]
            try:
                _path, updates = quotas.validate_entry(entry)
            except ValueError as e:
                results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(e), "entity": entity})
                continue
            records += cluster_control.quota_records(entity, updates)
            results.append({"error_code": ErrorCode.NONE, "error_message": None, "entity": entity})
        if records and not request.validate_only:
            try:
                await self._write("alter-client-quotas", lambda _image: Change(records))
            except KafkaError as e:
                results = [{**r, "error_code": e.code, "error_message": str(e)} for r in results]
        return {"throttle_time_ms": 0, "entries": results}

    async def _alter_user_scram_credentials(self, ctx: RequestContext, request: Any) -> dict:
        changes: dict[str, list] = {}
        for d in request.deletions:
            changes.setdefault(d.name, []).append(("delete", d.mechanism, d))
        for u in request.upsertions:
            changes.setdefault(u.name, []).append(("upsert", u.mechanism, u))

        def op(image) -> Change:
            out = Change(result=[])
            for user, ops in changes.items():
                current = {MECHANISM_BY_ID[m]: "" for (name, m) in image.scram if name == user}
                error, message = scram.check(user, ops, current)
                if error == ErrorCode.NONE:
                    out.records += cluster_control.scram_records(user, ops)
                out.result.append({"user": user, "error_code": error, "error_message": message})
            return out

        try:
            results = await self._write("alter-scram", op)
        except KafkaError as e:
            results = [{"user": u, "error_code": e.code, "error_message": str(e)} for u in changes]
        return {"throttle_time_ms": 0, "results": results}

    # --- forwarded requests and delegation tokens --------------------------------------------------

    async def _envelope(self, ctx: RequestContext, request: Any) -> dict:
        """A client's request a broker forwarded: answered as the client's (Kafka refuses an
        envelope from a principal without CLUSTER_ACTION on the cluster)."""
        def error(code: int) -> dict:
            return {"error_code": code, "response_data": None}

        if not allowed(self.server, ctx, CLUSTER_ACTION, CLUSTER):
            return error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        if not self.controller.active:
            return error(ErrorCode.NOT_CONTROLLER)
        try:
            inner_ctx, body = envelope.unwrap(ctx, request)
        except ValueError as e:
            log.info("envelope from %s refused: %s", ctx.client, e)
            return error(ErrorCode.INVALID_REQUEST)
        key, version = inner_ctx.header.api_key, inner_ctx.header.api_version
        if key not in FORWARDABLE or not self.supports(key, version):
            return error(ErrorCode.UNSUPPORTED_VERSION)
        response = await self.handle(inner_ctx, body)  # checked as the client's, as Kafka does
        if response.get("error_code") == ErrorCode.NOT_CONTROLLER:
            return error(ErrorCode.NOT_CONTROLLER)  # the broker asks the next controller
        return {"error_code": ErrorCode.NONE, "response_data": envelope.response_data(inner_ctx, response)}

    async def _create_token(self, ctx: RequestContext, request: Any) -> dict:
        owner, answer = delegation_tokens.create_answer(ctx, request)
        requester = ctx.principal
        if not _token_requests_allowed(ctx):
            return {**answer, "error_code": ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED}
        if owner != requester and not allowed(self.server, ctx, CREATE_TOKENS, USER, owner):
            return {**answer, "error_code": ErrorCode.DELEGATION_TOKEN_AUTHORIZATION_FAILED}
        tokens = self.controller.settings.tokens
        renewers = [f"{x.principal_type}:{x.principal_name}" for x in request.renewers]
        try:
            info, hmac = await self._write("create-token", lambda image: tokens.create(
                image, owner, requester, renewers, request.max_lifetime_ms, wall_clock_ms()))
        except KafkaError as e:  # TokenError among them
            return {**answer, "error_code": e.code}
        log.info("created delegation token %s for %s", info.token_id, owner)
        return {**answer, "issue_timestamp_ms": info.issue_ms, "expiry_timestamp_ms": info.expiry_ms,
                "max_timestamp_ms": info.max_ms, "token_id": info.token_id, "hmac": hmac}

    async def _change_token(self, ctx: RequestContext, name: str, change: Callable[..., Change], hmac: bytes,
                            period_ms: int) -> dict:
        if not _token_requests_allowed(ctx):
            return {"error_code": ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, "expiry_timestamp_ms": -1,
                    "throttle_time_ms": 0}
        try:
            expiry = await self._write(name, lambda image: change(image, ctx.principal, hmac, period_ms,
                                                                  wall_clock_ms()))
        except KafkaError as e:  # TokenError among them
            return {"error_code": e.code, "expiry_timestamp_ms": -1, "throttle_time_ms": 0}
        return {"error_code": ErrorCode.NONE, "expiry_timestamp_ms": expiry, "throttle_time_ms": 0}

    async def _renew_token(self, ctx: RequestContext, request: Any) -> dict:
        tokens = self.controller.settings.tokens
        return await self._change_token(ctx, "renew-token", tokens.renew, request.hmac, request.renew_period_ms)

    async def _expire_token(self, ctx: RequestContext, request: Any) -> dict:
        tokens = self.controller.settings.tokens
        return await self._change_token(ctx, "expire-token", tokens.expire, request.hmac,
                                        request.expiry_time_period_ms)
