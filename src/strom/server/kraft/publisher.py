"""BrokerMetadataPublisher: what a KRaft broker does with each change to its metadata image.

One code path downstream for both modes: a ZooKeeper cluster's controller tells each broker
what changed with LeaderAndIsr, UpdateMetadata and StopReplica, and the broker applies them in
server/apis/controller_apis.py. A KRaft broker learns the same from its metadata log, so the
publisher turns a MetadataDelta into those same requests (built by the controller's own
RequestBatch) and hands them to the same handlers, in process: partitions this broker holds a
replica of become leader or follower, every changed partition and the live brokers go to the
metadata cache, replicas that left this broker (a deleted topic, a reassignment) are stopped
and deleted. Topic configs come from the image before the logs that use them are made.

Live brokers are the unfenced ones; this broker counts as live for its own partitions even while
fenced (it must follow its leaders to catch up), but clients are not told of it until it is
unfenced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import replace
from itertools import islice
from typing import Any

from strom.config.dynamic import DEFAULT_ENTITY
from strom.config.repository import sanitize
from strom.controller.channel import MAX_PARTITIONS_PER_REQUEST, RequestBatch
from strom.controller.features import FinalizedFeatures
from strom.metadata.image import BROKER_RESOURCE, GROUP_RESOURCE, TOPIC_RESOURCE, MetadataImage
from strom.metadata.loader import MetadataDelta
from strom.metadata.model import LEADER_DURING_DELETE, BrokerInfo, EndPoint
from strom.network.quotas import check_entity, quota_keys

log = logging.getLogger(__name__)

LEADER_AND_ISR, STOP_REPLICA, UPDATE_METADATA = 4, 5, 6
_VERSIONS = {LEADER_AND_ISR: 7, STOP_REPLICA: 4, UPDATE_METADATA: 8}
CONTROLLER_EPOCH = 1  # one source of these requests, in log order: no older controller to fence
PUBLISH_SLICE = MAX_PARTITIONS_PER_REQUEST  # partitions changed per turn of the loop


class _Collect:
    """The channel RequestBatch sends through: keeps what is addressed to this broker."""

    def __init__(self, broker_id: int, listener: str) -> None:
        self.broker_id = broker_id
        self.listener = listener
        self.requests: list[tuple[int, dict]] = []

    def send(self, broker_id: int, api_key: int, fields: dict, callback: Any = None) -> None:
        if broker_id == self.broker_id:
            self.requests.append((api_key, fields))


def live_brokers(image: MetadataImage, also: int | None = None) -> dict[int, BrokerInfo]:
    """The unfenced brokers of the image, as BrokerInfo, and broker `also` however it stands.

    `also` is the publishing broker: what it is told goes through the same requests as a
    ZooKeeper broker's, addressed to live brokers only, and it must hear of every partition
    even before its own registration is in the image. A new broker follows the log from its
    start and replays the topics made before it joined ahead of that registration; without
    itself here it would drop them, and never know those topics until they changed."""
    live = {b.id: BrokerInfo(b.id, [EndPoint(e.listener, e.host, e.port, e.security_protocol) for e in b.endpoints],
                             b.rack, b.epoch)
            for b in image.brokers.values() if not b.fenced or b.id == also}
    if also is not None and also not in live:
        live[also] = BrokerInfo(also, [])  # not registered yet: fenced, so no client hears of it
    return live


class BrokerMetadataPublisher:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.broker_id = broker.broker_id

    async def publish(self, image: MetadataImage, delta: MetadataDelta) -> None:
        broker = self.broker
        if broker.stopping:
            return  # as Kafka's broker closes its publishers once its shutdown begins (see below)
        self._publish_configs(image, delta)
        self._publish_security(image, delta)
        hosted = broker.replica_manager.partitions
        live = live_brokers(image, also=self.broker_id)
        fenced = getattr(image.brokers.get(self.broker_id), "fenced", True)
        # Removed topics first: a topic deleted and made again under its name in one delta
        # loses its old replicas before the new ones are made.
        batch = RequestBatch(self.broker_id, CONTROLLER_EPOCH)
        for name, (topic_id, partitions) in delta.removed_topics.items():
            current = image.topics.get(name)
            if current is not None and current.topic_id == topic_id:
                continue
            gone = _Removed(name, topic_id)
            batch.add_update_metadata([], [(gone, i, replace(s, leader=LEADER_DURING_DELETE))
                                           for i, s in partitions.items()
                                           if current is None or i not in current.partitions])
            for index in partitions:
                if (name, index) in hosted and (current is None or self.broker_id not in
                                                getattr(current.partitions.get(index), "replicas", ())):
                    batch.add_stop_replica(self.broker_id, name, index, -1, True)
        if delta.brokers:
            batch.update_metadata_brokers.add(self.broker_id)
        await self._deliver(batch, live, fenced)
        # Then the changed partitions, a slice at a time with the loop given back between
        # slices: a full delta of 100,000 partitions is never one long stretch on the loop.
        changed = self._every_partition(image) if delta.full else self._changed(image, delta)
        while piece := list(islice(changed, PUBLISH_SLICE)):
            if broker.stopping:
                # Past its controlled shutdown the broker acts on no change: the rest of a
                # big one (every partition it leaves, at 100,000) would only slow its stop.
                return
            batch = RequestBatch(self.broker_id, CONTROLLER_EPOCH)
            for topic, index, state in piece:
                if self.broker_id in state.replicas:
                    batch.add_leader_and_isr([self.broker_id], topic, index, state)
                else:
                    batch.add_update_metadata([], [(topic, index, state)])
                    if (topic.name, index) in hosted:  # moved away by a reassignment
                        batch.add_stop_replica(self.broker_id, topic.name, index, state.leader_epoch, True)
            await self._deliver(batch, live, fenced)
            await asyncio.sleep(0)

    @staticmethod
    def _every_partition(image: MetadataImage) -> Iterator[tuple[Any, int, Any]]:
        # Over copies of the dicts: the loop is given back between slices.
        for topic in list(image.topics.values()):
            for index, state in list(topic.partitions.items()):
                yield topic, index, state

    @staticmethod
    def _changed(image: MetadataImage, delta: MetadataDelta) -> Iterator[tuple[Any, int, Any]]:
        for topic_id, index in delta.partitions:
            topic = image.topics_by_id.get(topic_id)
            state = topic.partitions.get(index) if topic is not None else None
            if state is not None:
                yield topic, index, state

    async def _deliver(self, batch: RequestBatch, live: dict[int, BrokerInfo], fenced: bool) -> None:
        channel = _Collect(self.broker_id, self.broker.inter_broker_listener)
        batch.send(channel, live)
        for api_key, fields in channel.requests:
            # From this broker's own image, in log order: nothing to fence (the image may still
            # hold an earlier registration's epoch just after this broker registered again).
            fields["broker_epoch"] = -1
            if api_key == UPDATE_METADATA and fenced:  # clients hear of this broker once unfenced
                fields["live_brokers"] = [b for b in fields["live_brokers"] if b["id"] != self.broker_id]
            response = await self.broker.deliver_local(api_key, _VERSIONS[api_key], fields)
            if getattr(response, "error_code", 0):
                log.warning("metadata change %d not applied: error %d", api_key, response.error_code)

    def _publish_security(self, image: MetadataImage, delta: MetadataDelta) -> None:
        """Finalized features; ACLs into the authorizer; SCRAM credentials and client quotas
        into the config repository, under the paths a ZooKeeper broker keeps them at;
        delegation tokens into the broker's token store."""
        authorizer = self.broker.authorizer
        if authorizer is not None and (delta.full or "acls" in delta.other):
            authorizer.replace_acls(image.acls.values())
        if delta.full or "features" in delta.other:
            self.broker.finalized_features = FinalizedFeatures(dict(image.features), image.end_offset)
        if delta.full or delta.other & {"scram", "quotas"}:
            clients: dict[str, dict[str, str]] = {}
            for user, mechanism, credential in image.scram_credentials():
                clients.setdefault(f"users/{sanitize(user)}", {})[mechanism] = credential.encode()
            for entity, values in image.client_quotas.items():
                try:
                    path = check_entity(dict(entity))
                except ValueError:
                    continue
                kinds = quota_keys(path)
                for key, value in values.items():
                    clients.setdefault(path, {})[key] = str(int(value)) if kinds.get(key) is int else repr(value)
            self.broker.config_repository.clients = clients
        if delta.full or "tokens" in delta.other:
            self.broker.delegation_tokens.publish(image.delegation_tokens.values())

    def _publish_configs(self, image: MetadataImage, delta: MetadataDelta) -> None:
        """Topic configs into the broker's config repository before partitions need them; live
        logs of a topic whose configs changed take the new ones."""
        repository = self.broker.config_repository
        names = set(image.topics) if delta.full else {n for kind, n in delta.configs if kind == TOPIC_RESOURCE}
        for name in names:
            configs = image.topic_configs(name)
            if repository.topics.get(name) != configs:
                repository.topics[name] = configs
                if self.broker.replica_manager.hosts_topic(name):
                    self.broker.log_services.topic_config_changed(name)
        for name in delta.removed_topics:
            if name not in image.topics:
                repository.topics.pop(name, None)
        # Dynamic broker configs: "" is the cluster default (the store's "<default>").
        entities = {n for kind, n in delta.configs if kind == BROKER_RESOURCE}
        if delta.full:
            entities |= {n for kind, n in image.configs if kind == BROKER_RESOURCE}
        for name in entities:
            repository.brokers[name or DEFAULT_ENTITY] = dict(image.configs.get((BROKER_RESOURCE, name), {}))
        if entities & {"", str(self.broker_id)}:
            self.broker.log_services.load_dynamic_config()
        groups = {n for kind, n in delta.configs if kind == GROUP_RESOURCE}
        if delta.full:
            groups |= {n for kind, n in image.configs if kind == GROUP_RESOURCE}
        for name in groups:  # changed in place: the group coordinator holds this dict
            configs = image.configs.get((GROUP_RESOURCE, name))
            if configs:
                repository.groups[name] = dict(configs)
            else:
                repository.groups.pop(name, None)


class _Removed:
    """A removed topic as RequestBatch names it."""

    def __init__(self, name: str, topic_id: Any) -> None:
        self.name = name
        self.topic_id = topic_id
