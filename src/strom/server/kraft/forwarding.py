"""What a KRaft broker asks of the active controller instead of writing a metadata store:
topic admin (Kafka 4 brokers forward CreateTopics, DeleteTopics, CreatePartitions and config
changes of topics, brokers and groups to the controller), blocks of producer ids
(AllocateProducerIds, KIP-730), and the table of requests passed whole in an Envelope (ENVELOPED).

ForwardingTopicAdmin has TopicAdmin's methods and is called where TopicAdmin is, on the
broker's metadata-io thread (the handlers' `store_io`), so the handlers and the auto topic
creation are one code path in every mode. Each call crosses to the broker's loop, where the
controller channel lives, and waits there for the controller's answer; the event loop never
waits on it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote

from strom.metadata.image import BROKER_RESOURCE, GROUP_RESOURCE, TOPIC_RESOURCE, MetadataImage
from strom.protocol.errors import ErrorCode, KafkaError
from strom.server.kraft.controller_channel import ControllerChannel, ControllerUnavailable

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS = 19, 20, 37, 44
ALLOCATE_PRODUCER_IDS = 67
ELECT_LEADERS, ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS, UPDATE_FEATURES = 43, 45, 46, 57
CREATE_ACLS, DELETE_ACLS, ALTER_CLIENT_QUOTAS, ALTER_USER_SCRAM_CREDENTIALS = 30, 31, 49, 51
# What a KRaft broker passes whole to the active controller in an Envelope, authorized by the
# controller as the client's. Every version the broker advertises for one of these is
# forwarded (a handler's new version goes with it: no second list of versions to fall behind),
# so the controller takes every such version too.
ENVELOPED = frozenset({ELECT_LEADERS, ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS, UPDATE_FEATURES, CREATE_ACLS,
                       DELETE_ACLS, ALTER_CLIENT_QUOTAS, ALTER_USER_SCRAM_CREDENTIALS})
PRODUCER_ID_BLOCK = 1000
SET, DELETE = 0, 1
TIMEOUT_S = 30.0


def _raise_for(error_code: int, message: str | None) -> None:
    if error_code:
        raise KafkaError(message or ErrorCode(error_code).name, ErrorCode(error_code))


class ForwardingTopicAdmin:
    def __init__(self, channel: ControllerChannel, loop: asyncio.AbstractEventLoop,
                 image: Callable[[], MetadataImage]) -> None:
        self.channel = channel
        self.loop = loop
        self.image = image  # the broker's metadata image, for the configs a change replaces

    def _call(self, api_key: int, version: int, fields: dict) -> Any:
        future = asyncio.run_coroutine_threadsafe(self.channel.call(api_key, version, fields, TIMEOUT_S), self.loop)
        try:
            return future.result(TIMEOUT_S + 5)
        except ControllerUnavailable as e:  # Kafka's ForwardingManager times the request out
            raise KafkaError(str(e), ErrorCode.REQUEST_TIMED_OUT) from None

    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     assignment: Mapping[int, list[int]] | None, configs: Mapping[str, str], *,
                     validate_only: bool = False, default_partitions: int = 1,
                     default_replication_factor: int = 1) -> tuple[uuid.UUID, dict[int, list[int]]]:
        """The new topic's id and its shape (partition -> as many replicas as it has; the
        controller's answer names no brokers: the metadata log does, moments later)."""
        body = self._call(CREATE_TOPICS, 7, {"timeout_ms": int(TIMEOUT_S * 1000), "validate_only": validate_only,
                                             "topics": [{
            "name": name, "num_partitions": num_partitions, "replication_factor": replication_factor,
            "assignments": [{"partition_index": i, "broker_ids": list(b)} for i, b in (assignment or {}).items()],
            "configs": [{"name": k, "value": v} for k, v in configs.items()]}]})
        result = body.topics[0]
        _raise_for(result.error_code, result.error_message)
        return result.topic_id, {i: [-1] * result.replication_factor for i in range(result.num_partitions)}

    def is_recorded(self, name: str) -> bool:
        """Whether this broker's image still holds the topic (the metadata log removes it in one
        record, so the image and the controller agree once the record is replayed)."""
        return name in self.image().topics

    def delete_topic(self, name: str) -> None:
        body = self._call(DELETE_TOPICS, 6, {"timeout_ms": int(TIMEOUT_S * 1000),
                                             "topics": [{"name": name, "topic_id": uuid.UUID(int=0)}]})
        result = body.responses[0]
        _raise_for(result.error_code, result.error_message)

    def create_partitions(self, name: str, count: int, assignment: list[list[int]] | None, *,
                          validate_only: bool = False) -> None:
        body = self._call(CREATE_PARTITIONS, 3, {"timeout_ms": int(TIMEOUT_S * 1000), "validate_only": validate_only,
                                                 "topics": [{"name": name, "count": count, "assignments": None
                                                             if assignment is None else
                                                             [{"broker_ids": list(b)} for b in assignment]}]})
        result = body.results[0]
        _raise_for(result.error_code, result.error_message)

    def change_topic_config(self, name: str, configs: Mapping[str, str], *, validate_only: bool = False) -> None:
        """AlterConfigs' meaning (the topic's configs become `configs`) as the controller's
        incremental operations: set each given key, delete each other one the topic has."""
        if name not in self.image().topics:
            raise KafkaError(f"Topic {name} does not exist.", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        self._alter(TOPIC_RESOURCE, name, configs, self.image().topic_configs(name), validate_only)

    def change_broker_config(self, entity: str, configs: Mapping[str, str]) -> None:
        name = "" if entity == "<default>" else entity
        current = dict(self.image().configs.get((BROKER_RESOURCE, name), {}))
        self._alter(BROKER_RESOURCE, name, configs, current, False)

    def change_client_config(self, path: str, configs: Mapping[str, str]) -> None:
        """Group configs (groups/<id>) become the controller's GROUP config resource. Client
        quotas and SCRAM users do not come here: a KRaft broker passes their requests to the
        controller as they came (broker.py)."""
        kind, _, name = path.partition("/")
        if kind != "groups":
            raise KafkaError(f"{path}: not a config a KRaft broker keeps this way", ErrorCode.INVALID_REQUEST)
        group = unquote(name)
        self._alter(GROUP_RESOURCE, group, configs, dict(self.image().configs.get((GROUP_RESOURCE, group), {})), False)

    def _alter(self, kind: int, name: str, configs: Mapping[str, str], current: Mapping[str, str],
               validate_only: bool) -> None:
        ops = [{"name": k, "config_operation": SET, "value": v} for k, v in configs.items()]
        ops += [{"name": k, "config_operation": DELETE, "value": None} for k in current if k not in configs]
        body = self._call(INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": validate_only, "resources": [
            {"resource_type": kind, "resource_name": name, "configs": ops}]})
        result = body.responses[0]
        _raise_for(result.error_code, result.error_message)


class ControllerProducerIds:
    """ProducerIdManager's `generate` over blocks the controller hands out. Called on the
    broker's loop and never waits: the next block is fetched in the background while half of
    the current one is left (a round trip to the controller per 1,000 ids, as a ZooKeeper
    broker's block is one to ZooKeeper)."""

    def __init__(self, channel: ControllerChannel, broker_id: int, broker_epoch: Callable[[], int]) -> None:
        self.channel = channel
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self._blocks: list[tuple[int, int]] = []  # [first, last] id ranges not handed out yet
        self._refill: asyncio.Task | None = None

    @property
    def left(self) -> int:
        return sum(last - first + 1 for first, last in self._blocks)

    async def reserve(self) -> None:
        """One more block from the controller."""
        body = await self.channel.call(ALLOCATE_PRODUCER_IDS, 0, {"broker_id": self.broker_id,
                                                                  "broker_epoch": self.broker_epoch()}, TIMEOUT_S)
        _raise_for(body.error_code, None)
        self._blocks.append((body.producer_id_start, body.producer_id_start + body.producer_id_len - 1))

    def generate(self) -> int:
        if self.left < PRODUCER_ID_BLOCK // 2 and (self._refill is None or self._refill.done()):
            self._refill = asyncio.get_running_loop().create_task(self._reserve_quietly())
        if not self._blocks:
            raise KafkaError("no producer id block from the controller yet", ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        first, last = self._blocks[0]
        if first == last:
            self._blocks.pop(0)
        else:
            self._blocks[0] = (first + 1, last)
        return first

    async def _reserve_quietly(self) -> None:
        try:
            await self.reserve()
        except (KafkaError, ConnectionError):
            pass  # asked again at the next generate()
