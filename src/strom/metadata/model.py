"""What brokers, topics and partitions look like to the controller and the brokers, whichever
store holds them: ZooKeeper's znodes (`controller/znodes.py` reads and writes their JSON) or
the KRaft metadata log (`metadata/image.py`)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

NO_LEADER = -1
LEADER_DURING_DELETE = -2  # what UpdateMetadata says of a partition whose topic is being deleted

# Security protocol ids on the wire (UpdateMetadata endpoints).
SECURITY_PROTOCOLS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}


def now_ms() -> str:
    return str(int(time.time() * 1000))


# --- brokers ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class EndPoint:
    listener: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


@dataclass(slots=True)
class BrokerInfo:
    """A registered broker: /brokers/ids/<id>, its epoch being the znode's creation zxid."""

    id: int
    endpoints: list[EndPoint]
    rack: str | None = None
    epoch: int = -1

    def endpoint(self, listener: str) -> EndPoint | None:
        return next((e for e in self.endpoints if e.listener == listener), None)

    def encode(self) -> dict[str, Any]:
        first = self.endpoints[0]
        data: dict[str, Any] = {
            "features": {},
            "listener_security_protocol_map": {e.listener: e.security_protocol for e in self.endpoints},
            "endpoints": [f"{e.listener}://{e.host}:{e.port}" for e in self.endpoints],
            "jmx_port": -1,
            "host": first.host,
            "port": first.port,
            "timestamp": now_ms(),
            "version": 5,
        }
        if self.rack is not None:
            data["rack"] = self.rack
        return data

    @classmethod
    def decode(cls, broker_id: int, data: dict[str, Any], epoch: int) -> BrokerInfo:
        protocols = data.get("listener_security_protocol_map") or {}
        endpoints = []
        for text in data.get("endpoints", []):
            name, _, address = text.partition("://")
            host, _, port = address.rpartition(":")
            endpoints.append(EndPoint(name, host.strip("[]"), int(port), protocols.get(name, name)))
        return cls(broker_id, endpoints, data.get("rack"), epoch)


# --- topics and partitions ---------------------------------------------------------------------

@dataclass(slots=True)
class PartitionState:
    """A partition's leader, ISR and replicas: /brokers/topics/<t>/partitions/<p>/state plus
    the assignment under ZooKeeper, a PartitionRecord and its changes under KRaft.
    `zk_version` is the partition epoch: the state node's version under ZooKeeper, the
    record's PartitionEpoch under KRaft (`partition_epoch` names it so)."""

    leader: int
    leader_epoch: int
    isr: list[int]
    replicas: list[int]
    controller_epoch: int = 0
    zk_version: int = 0
    # An ongoing reassignment (KIP-455): replicas being added and removed; `replicas` is then
    # the union, target replicas first.
    adding: list[int] = field(default_factory=list)
    removing: list[int] = field(default_factory=list)
    # KRaft only: 1 while a leader chosen by an unclean election recovers (KIP-704), and the log
    # dir of each replica (KIP-858; None: not assigned yet).
    leader_recovery_state: int = 0
    directories: list[uuid.UUID | None] | None = None
    # KIP-966: replicas that left the ISR while it was below min.insync.replicas and shut down
    # cleanly since (they have every acknowledged record: any may lead once the ISR is empty),
    # and the last leader of a partition whose ISR emptied (elected when nobody else can be).
    elr: list[int] = field(default_factory=list)
    last_known_elr: list[int] = field(default_factory=list)

    @property
    def partition_epoch(self) -> int:
        return self.zk_version

    @property
    def target_replicas(self) -> list[int]:
        return [r for r in self.replicas if r not in self.removing]

    @property
    def original_replicas(self) -> list[int]:
        return [r for r in self.replicas if r not in self.adding]

    def encode(self) -> dict[str, Any]:
        data = {"controller_epoch": self.controller_epoch, "leader": self.leader, "version": 1,
                "leader_epoch": self.leader_epoch, "isr": list(self.isr)}
        # Strom's own keys (Kafka's ZooKeeper state had no ELR), written only when set, so the
        # node stays what Kafka's tools read.
        if self.elr:
            data["eligible_leader_replicas"] = list(self.elr)
        if self.last_known_elr:
            data["last_known_elr"] = list(self.last_known_elr)
        return data

    @property
    def offline_replicas(self) -> list[int]:
        return [r for r in self.replicas if r not in self.isr]


@dataclass(slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionState] = field(default_factory=dict)
    internal: bool = False


def is_internal(topic: str) -> bool:
    return topic in ("__consumer_offsets", "__transaction_state", "__share_group_state")
