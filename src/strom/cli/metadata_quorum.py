"""`strom metadata-quorum describe --status|--replication`, `add-controller`, `remove-controller`:
the KRaft metadata quorum, as `kafka-metadata-quorum.sh` shows and changes it.

DescribeQuorum goes to a controller (--bootstrap-controller) or a broker of a KRaft node
(--bootstrap-server) and is asked again of the leader it names. add-controller reads the new
controller's server.properties (--command-config: node.id, its controller listener, and the
directory.id of its metadata.log.dir) and sends AddRaftVoter to the leader; the controller must
be running and fetching from the quorum (KIP-853). remove-controller sends RemoveRaftVoter.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from strom.cli.common import (
    BrokerConnection,
    ClientSettings,
    CommandError,
    Group,
    error_text,
    parse_servers,
    read_properties,
)
from strom.config import broker as broker_config
from strom.metadata.storage import StorageError, kafka_uuid, parse_kafka_uuid, read_meta
from strom.protocol.errors import ErrorCode

DESCRIBE_QUORUM, DESCRIBE_CLUSTER, ADD_RAFT_VOTER, REMOVE_RAFT_VOTER = 55, 60, 80, 81
METADATA_TOPIC = "__cluster_metadata"


@click.group(cls=Group)
@click.option("--bootstrap-controller", "controllers", metavar="HOST:PORT[,...]",
              help="Controllers to ask (their controller listener).")
@click.option("--bootstrap-server", "brokers", metavar="HOST:PORT[,...]",
              help="Brokers of KRaft nodes to ask instead (they ask the quorum's leader).")
@click.option("--command-config", "command_config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Client properties; for add-controller, the new controller's server.properties.")
@click.pass_context
def metadata_quorum(ctx: click.Context, controllers: str | None, brokers: str | None,
                    command_config: Path | None) -> None:
    """Describe and change the KRaft metadata quorum (like kafka-metadata-quorum.sh)."""
    if bool(controllers) == bool(brokers):
        raise click.UsageError("give one of --bootstrap-controller and --bootstrap-server")
    ctx.obj = (parse_servers(controllers or brokers), command_config)


class _Quorum:
    """Connections that follow DescribeQuorum's answers to the leader of the quorum."""

    def __init__(self, servers: list[tuple[str, int]], properties: dict[str, str] | None = None) -> None:
        self.settings = ClientSettings(servers, properties or {})
        self.conns: dict[tuple[str, int], BrokerConnection] = {}

    def _conn(self, address: tuple[str, int]) -> BrokerConnection:
        if address not in self.conns:
            self.conns[address] = BrokerConnection(*address, self.settings)
        return self.conns[address]

    def describe(self) -> tuple[Any, tuple[str, int]]:
        """The leader's DescribeQuorum answer, and the address it came from."""
        fields = {"topics": [{"topic_name": METADATA_TOPIC, "partitions": [{"partition_index": 0}]}]}
        tried, last, failure = [], None, None
        todo = list(self.settings.servers)
        while todo:
            address = todo.pop(0)
            if address in tried:
                continue
            tried.append(address)
            try:
                body = self._conn(address).call(DESCRIBE_QUORUM, 2, fields)
            except CommandError as e:
                failure = e
                continue
            last = body
            part = body.topics[0].partitions[0] if body.topics and body.topics[0].partitions else None
            if body.error_code == 0 and part is not None and part.error_code == 0:
                return body, address
            leader = part.leader_id if part is not None else -1
            for node in body.nodes:
                if node.node_id == leader and node.listeners:
                    todo.insert(0, (node.listeners[0].host, node.listeners[0].port))
        if last is not None:
            part = last.topics[0].partitions[0] if last.topics and last.topics[0].partitions else None
            code = last.error_code or (part.error_code if part else ErrorCode.NOT_LEADER_OR_FOLLOWER)
            raise CommandError(f"the controller quorum has no leader (a majority of the controllers down?): "
                               f"no controller answered DescribeQuorum as leader ({error_text(code)})")
        raise failure or CommandError("no controller answered")

    def call_leader(self, api_key: int, fields: dict) -> Any:
        _, address = self.describe()
        return self._conn(address).call(api_key, 0, fields, timeout_s=60)

    def cluster_id(self, address: tuple[str, int]) -> str:
        """A controller answers DescribeCluster for endpoint type 2, a broker for type 1."""
        for endpoint_type in (2, 1):
            body = self._conn(address).call(DESCRIBE_CLUSTER, 1, {"include_cluster_authorized_operations": False,
                                                                  "endpoint_type": endpoint_type})
            if body.error_code == ErrorCode.NONE:
                return body.cluster_id
        raise CommandError(f"DescribeCluster: {error_text(body.error_code)}")

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


def _open(ctx: click.Context) -> _Quorum:
    """Connections to the servers given, with --command-config's client properties (TLS, SASL,
    request.timeout.ms) as the other client commands take them."""
    servers, config = ctx.obj
    return _Quorum(servers, read_properties(config) if config is not None else {})


@metadata_quorum.command()
@click.option("--status", is_flag=True, help="The leader, epoch, high watermark and voters.")
@click.option("--replication", is_flag=True, help="Each replica's log end offset, lag and fetch times.")
@click.option("--human-readable", is_flag=True, help="With --replication: times as ago, not timestamps.")
@click.pass_context
def describe(ctx: click.Context, status: bool, replication: bool, human_readable: bool) -> None:
    """Show the quorum as its leader sees it.

    \b
    Examples:
      strom metadata-quorum --bootstrap-controller 127.0.0.1:9093 describe --status
      strom metadata-quorum --bootstrap-controller 127.0.0.1:9093 describe --replication
    """
    if status == replication:
        raise click.UsageError("give one of --status and --replication")
    quorum = _open(ctx)
    try:
        body, address = quorum.describe()
        part = body.topics[0].partitions[0]
        nodes = {n.node_id: n for n in body.nodes}
        if status:
            click.echo(_status(quorum.cluster_id(address), part, nodes))
        else:
            click.echo(_replication(part, human_readable))
    finally:
        quorum.close()


def _lag(part: Any) -> tuple[int, int]:
    leader = next((v for v in part.current_voters if v.replica_id == part.leader_id), None)
    end = leader.log_end_offset if leader is not None else part.high_watermark
    followers = [v for v in part.current_voters if v.replica_id != part.leader_id]
    max_lag = max((end - v.log_end_offset for v in followers), default=0)
    now = int(time.time() * 1000)
    times = [now - v.last_caught_up_timestamp for v in followers if v.last_caught_up_timestamp >= 0]
    return max_lag, max(times, default=0) if len(times) == len(followers) else -1


def _voter(v: Any, nodes: dict[int, Any]) -> dict:
    out: dict[str, Any] = {"id": v.replica_id, "directoryId": kafka_uuid(v.replica_directory_id)
                           if v.replica_directory_id else "AAAAAAAAAAAAAAAAAAAAAA"}
    node = nodes.get(v.replica_id)
    if node is not None:
        out["endpoints"] = [f"{x.name}://{x.host}:{x.port}" for x in node.listeners]
    return out


def _status(cluster_id: str, part: Any, nodes: dict[int, Any]) -> str:
    max_lag, lag_ms = _lag(part)
    rows = [("ClusterId:", cluster_id), ("LeaderId:", part.leader_id), ("LeaderEpoch:", part.leader_epoch),
            ("HighWatermark:", part.high_watermark), ("MaxFollowerLag:", max_lag),
            ("MaxFollowerLagTimeMs:", lag_ms),
            ("CurrentVoters:", json.dumps([_voter(v, nodes) for v in part.current_voters])),
            ("CurrentObservers:", json.dumps([_voter(v, {}) for v in part.observers]))]
    return "\n".join(f"{k:<24}{v}" for k, v in rows)


def _replication(part: Any, human: bool) -> str:
    leader = next((v for v in part.current_voters if v.replica_id == part.leader_id), None)
    end = leader.log_end_offset if leader is not None else part.high_watermark
    now = int(time.time() * 1000)

    def when(ts: int) -> str:
        if not human or ts < 0:
            return str(ts)
        return f"{max(now - ts, 0)} ms ago"

    rows = [("NodeId", "DirectoryId", "LogEndOffset", "Lag", "LastFetchTimestamp", "LastCaughtUpTimestamp", "Status")]
    for kind, replicas in (("Follower", part.current_voters), ("Observer", part.observers)):
        for v in replicas:
            status = "Leader" if v.replica_id == part.leader_id else kind
            directory = kafka_uuid(v.replica_directory_id) if v.replica_directory_id else "AAAAAAAAAAAAAAAAAAAAAA"
            rows.append((str(v.replica_id), directory, str(v.log_end_offset), str(max(end - v.log_end_offset, 0)),
                         when(v.last_fetch_timestamp), when(v.last_caught_up_timestamp), status))
    rows[1:] = sorted(rows[1:], key=lambda r: (r[6] != "Leader", r[6], int(r[0])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _voter_change(quorum: _Quorum, api_key: int, fields: dict, what: str) -> None:
    body = quorum.call_leader(api_key, fields)
    if body.error_code:
        raise CommandError(f"{what} failed: {error_text(body.error_code, body.error_message)}")


@metadata_quorum.command("add-controller")
@click.pass_context
def add_controller(ctx: click.Context) -> None:
    """Add the controller whose server.properties is --command-config as a voter (it must be
    running, formatted with --no-initial-controllers, and caught up as an observer)."""
    servers, config = ctx.obj
    if config is None:
        raise click.UsageError("add-controller needs --command-config: the new controller's server.properties")
    try:
        cfg = broker_config.load(config, [])
        if "controller" not in cfg.process_roles:
            raise CommandError(f"{config} is not a controller's config (process.roles has no controller)")
        meta = read_meta(cfg.metadata_log_dir)
        if meta is None:
            raise CommandError(f"{cfg.metadata_log_dir} is not formatted: run strom storage format first")
        directory = parse_kafka_uuid(meta.directory_id)
    except (broker_config.ConfigError, StorageError) as e:
        raise CommandError(str(e)) from None
    advertised = {x.name: x for x in cfg["advertised.listeners"] or []}
    listeners = [advertised.get(x.name, x) for x in cfg.listeners if x.name in cfg.controller_listener_names]
    quorum = _Quorum(servers)
    try:
        _voter_change(quorum, ADD_RAFT_VOTER, {
            "cluster_id": meta.cluster_id, "timeout_ms": 30000, "voter_id": cfg.broker_id,
            "voter_directory_id": directory,
            "listeners": [{"name": x.name, "host": x.host, "port": x.port} for x in listeners]}, "AddRaftVoter")
    finally:
        quorum.close()
    click.echo(f"Added controller {cfg.broker_id} with directory id {meta.directory_id} and endpoints: "
               + ", ".join(str(x) for x in listeners))


@metadata_quorum.command("remove-controller")
@click.option("--controller-id", "-i", type=int, required=True)
@click.option("--controller-directory-id", "-d", required=True)
@click.pass_context
def remove_controller(ctx: click.Context, controller_id: int, controller_directory_id: str) -> None:
    """Remove a voter from the quorum."""
    try:
        directory = parse_kafka_uuid(controller_directory_id)
    except StorageError as e:
        raise CommandError(str(e)) from None
    quorum = _open(ctx)
    try:
        _, address = quorum.describe()
        _voter_change(quorum, REMOVE_RAFT_VOTER, {"cluster_id": quorum.cluster_id(address), "voter_id": controller_id,
                                                  "voter_directory_id": directory}, "RemoveRaftVoter")
    finally:
        quorum.close()
    click.echo(f"Removed KRaft controller {controller_id} with directory id {controller_directory_id}")
