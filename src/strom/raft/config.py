"""QuorumConfig: the settings of the Raft quorum under Kafka's names and defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from strom.protocol.raft_records import Endpoint, VoterEntry

METADATA_TOPIC = "__cluster_metadata"
METADATA_PARTITION = 0
CONTROLLER_LISTENER = "CONTROLLER"
# Kafka's fixed topic id of __cluster_metadata (Uuid.METADATA_TOPIC_ID: most 0, least 1).
METADATA_TOPIC_ID_INT = 1


@dataclass(frozen=True)
class QuorumConfig:
    node_id: int
    # controller.quorum.voters: static voters "id@host:port"; empty with dynamic quorums.
    voters: tuple[VoterEntry, ...] = ()
    # controller.quorum.bootstrap.servers: where an observer or new voter looks for the leader.
    bootstrap_servers: tuple[tuple[str, int], ...] = ()
    cluster_id: str | None = None
    election_timeout_ms: int = 1000  # controller.quorum.election.timeout.ms
    fetch_timeout_ms: int = 2000  # controller.quorum.fetch.timeout.ms
    election_backoff_max_ms: int = 1000  # controller.quorum.election.backoff.max.ms
    append_linger_ms: int = 25  # controller.quorum.append.linger.ms
    request_timeout_ms: int = 2000  # controller.quorum.request.timeout.ms
    retry_backoff_ms: int = 20  # controller.quorum.retry.backoff.ms
    # metadata.log.max.record.bytes.between.snapshots / metadata.log.max.snapshot.interval.ms
    max_bytes_between_snapshots: int = 20 * 1024 * 1024
    max_snapshot_interval_ms: int = 60 * 60 * 1000
    # Kafka's KafkaRaftClient constants: fetch long-poll and size bounds.
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 8 * 1024 * 1024
    snapshot_chunk_bytes: int = 8 * 1024 * 1024
    # A leader that has not heard a majority fetch for this long resigns (Kafka: 1.5 x fetch).
    check_quorum_factor: float = 1.5
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def check_quorum_timeout_ms(self) -> int:
        return int(self.fetch_timeout_ms * self.check_quorum_factor)

    @classmethod
    def from_props(cls, node_id: int, props: Mapping[str, str], cluster_id: str | None = None) -> QuorumConfig:
        """Read Kafka's property names (unknown ones are kept in `extra`)."""
        names = {
            "controller.quorum.election.timeout.ms": "election_timeout_ms",
            "controller.quorum.fetch.timeout.ms": "fetch_timeout_ms",
            "controller.quorum.election.backoff.max.ms": "election_backoff_max_ms",
            "controller.quorum.append.linger.ms": "append_linger_ms",
            "controller.quorum.request.timeout.ms": "request_timeout_ms",
            "controller.quorum.retry.backoff.ms": "retry_backoff_ms",
            "metadata.log.max.record.bytes.between.snapshots": "max_bytes_between_snapshots",
            "metadata.log.max.snapshot.interval.ms": "max_snapshot_interval_ms",
        }
        kwargs: dict = {}
        extra = {}
        for key, value in props.items():
            if key in names:
                kwargs[names[key]] = int(value)
            elif key == "controller.quorum.voters":
                kwargs["voters"] = parse_voters(value)
            elif key == "controller.quorum.bootstrap.servers":
                kwargs["bootstrap_servers"] = parse_bootstrap_servers(value)
            else:
                extra[key] = value
        return cls(node_id=node_id, cluster_id=cluster_id, extra=extra, **kwargs)


def parse_voters(text: str, listener: str = CONTROLLER_LISTENER) -> tuple[VoterEntry, ...]:
    """controller.quorum.voters: comma-separated `id@host:port` (Kafka's format); `listener`
    names the endpoints (the first of controller.listener.names)."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        ident, _, address = item.partition("@")
        host, _, port = address.rpartition(":")
        if not ident.isdigit() or not host or not port.isdigit():
            raise ValueError(f"controller.quorum.voters entry {item!r} is not id@host:port")
        out.append(VoterEntry(int(ident), None, (Endpoint(listener, host.strip("[]"), int(port)),)))
    if len({v.voter_id for v in out}) != len(out):
        raise ValueError("controller.quorum.voters names a voter twice")
    return tuple(out)


def parse_bootstrap_servers(text: str) -> tuple[tuple[str, int], ...]:
    out = []
    for item in (s.strip() for s in text.split(",")):
        if item:
            host, _, port = item.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"controller.quorum.bootstrap.servers entry {item!r} is not host:port")
            out.append((host.strip("[]"), int(port)))
    return tuple(out)
