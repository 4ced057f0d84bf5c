"""The broker side of a KRaft node, for now (its brokers are not on the metadata quorum yet):
the broker Strom has always run, with three differences a KRaft node needs.

- Its log manager leaves `__cluster_metadata-0` to the Raft driver (as Kafka's LogManager skips
  the metadata partition) and keeps meta.properties as `strom storage format` wrote it
  (version 1 with node.id and directory.id) instead of writing its own version 0.
- Its listeners are those not named by controller.listener.names.
- It answers DescribeQuorum (as Kafka 4 brokers do, for kafka-metadata-quorum and admin
  clients) by asking the quorum's leader over the controller listener.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from strom.client import AsyncConnection
from strom.config.broker import BrokerConfig
from strom.controller.admin import TopicAdmin
from strom.log.manager import LogManager
from strom.metadata.storage import ensure_formatted
from strom.network.request import API_VERSIONS, RequestContext
from strom.protocol.errors import ErrorCode, KafkaError
from strom.raft.config import (
    METADATA_PARTITION,
    METADATA_TOPIC,
    parse_bootstrap_servers,
    parse_voters,
)
from strom.raft.core import DESCRIBE_QUORUM
from strom.raft.driver import to_fields
from strom.server.apis import KafkaApis
from strom.server.broker import Broker

log = logging.getLogger(__name__)

METADATA_KEY = (METADATA_TOPIC, METADATA_PARTITION)
DESCRIBE_QUORUM_VERSIONS = (0, 2)


class KRaftLogManager(LogManager):
    """A LogManager that does not open the metadata partition nor rewrite meta.properties."""

    metadata_log_dir: Path | None = None
    node_id = -1

    def _check_meta(self, broker_id: int, cluster_id: str | None) -> str:
        meta = ensure_formatted([d for d in self.log_dirs if d in self.live_dirs], self.metadata_log_dir or
                                self.live_dirs[0], broker_id)
        if cluster_id is not None and cluster_id != meta.cluster_id:
            raise ValueError(f"cluster id {cluster_id} does not match {meta.cluster_id} in meta.properties")
        return meta.cluster_id

    def _recover_logs(self, d, todo, clean) -> None:
        super()._recover_logs(d, [item for item in todo if item[0] != METADATA_KEY], clean)


class KRaftBrokerApis(KafkaApis):
    """The broker's APIs plus DescribeQuorum, answered by the quorum's leader."""

    def supports(self, api_key: int, version: int) -> bool:
        if api_key == DESCRIBE_QUORUM:
            return DESCRIBE_QUORUM_VERSIONS[0] <= version <= DESCRIBE_QUORUM_VERSIONS[1]
        return super().supports(api_key, version)

    async def handle(self, ctx: RequestContext, body: Any) -> Any:
        if ctx.header.api_key == DESCRIBE_QUORUM:
            return await self.broker.describe_quorum(ctx.header.api_version, to_fields(body))
        response = await super().handle(ctx, body)
        if ctx.header.api_key == API_VERSIONS and isinstance(response, dict):
            response["api_keys"] = _with_describe_quorum(response["api_keys"])
        return response

    def unsupported_version_response(self) -> dict:
        response = super().unsupported_version_response()
        response["api_keys"] = _with_describe_quorum(response["api_keys"])
        return response


def _with_describe_quorum(keys: list[dict]) -> list[dict]:
    lo, hi = DESCRIBE_QUORUM_VERSIONS
    return sorted([*keys, {"api_key": DESCRIBE_QUORUM, "min_version": lo, "max_version": hi}],
                  key=lambda k: k["api_key"])


class KRaftTopicAdmin(TopicAdmin):
    """No topic may take the metadata partition's name (and so its directory), as Kafka 4's
    controller refuses it."""

    def create_topic(self, name: str, *args: Any, **kwargs: Any):
        if name == METADATA_TOPIC:
            raise KafkaError(f"Creation of internal topic {METADATA_TOPIC} is prohibited.", ErrorCode.INVALID_REQUEST)
        return super().create_topic(name, *args, **kwargs)


class KRaftBroker(Broker):
    log_manager_class = KRaftLogManager
    apis_class = KRaftBrokerApis

    def __init__(self, config: BrokerConfig, controller_server: Any = None) -> None:
        super().__init__(config)
        self.log_manager.metadata_log_dir = config.metadata_log_dir
        self.controller_server = controller_server  # this node's own controller, if combined

    async def startup(self) -> None:
        await super().startup()
        # Before any request is taken (nothing yields between the broker's ready and here).
        admin = self.admin
        self.admin = KRaftTopicAdmin(admin.store, admin.live_brokers, admin.validate_configs, admin.replica_counts,
                                     admin.max_broker_partitions)

    async def describe_quorum(self, version: int, fields: dict) -> dict:
        """DescribeQuorum from the leader of the quorum: this node's controller when it leads,
        else the leader it names, else each known controller in turn."""
        response = None
        if self.controller_server is not None:
            server = self.controller_server
            response = await server.call(server.driver.handle_request(DESCRIBE_QUORUM, version, fields))
            if _ok(response):
                return response
        for host, port in self._controller_addresses(response):
            try:
                conn = await AsyncConnection.open(host, port, f"broker-{self.broker_id}-describe-quorum", 2.0)
                try:
                    answer = to_fields(await conn.call(DESCRIBE_QUORUM, version, fields, timeout_s=5))
                finally:
                    conn.close()
            except (OSError, ConnectionError, TimeoutError) as e:
                log.debug("DescribeQuorum to %s:%d failed: %s", host, port, e)
                continue
            if _ok(answer):
                return answer
            response = answer
        if response is not None:
            return response
        return {"error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER, "error_message": "no controller answered",
                "topics": [], "nodes": []}

    def _controller_addresses(self, hint: dict | None) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        if hint:  # the leader a controller named, where the answer says it listens
            leader = next((p["leader_id"] for t in hint.get("topics", []) for p in t.get("partitions", [])), -1)
            for node in hint.get("nodes", []):
                if node["node_id"] == leader and node["listeners"]:
                    out.append((node["listeners"][0]["host"], node["listeners"][0]["port"]))
        voters = parse_voters(self.config["controller.quorum.voters"])
        out += [(v.endpoints[0].host, v.endpoints[0].port) for v in voters]
        out += list(parse_bootstrap_servers(self.config["controller.quorum.bootstrap.servers"]))
        return list(dict.fromkeys(out))


def _ok(response: dict) -> bool:
    if response.get("error_code"):
        return False
    parts = [p for t in response.get("topics", []) for p in t.get("partitions", [])]
    return bool(parts) and all(p.get("error_code", 0) == 0 for p in parts)
