"""`strom groups list|describe|delete`: consumer groups from the command line, in the manner
of Kafka's kafka-consumer-groups.sh.

The commands speak the Kafka protocol to any Kafka-compatible cluster (Strom or Kafka): they
find each group's coordinator with FindCoordinator and ask it, and `describe` adds each
partition's log end offset (ListOffsets at the partition leader) to show the lag.
"""

from __future__ import annotations

import socket
import struct
import sys
from collections.abc import Iterable

import click

from strom.coordinator.group.consumer_protocol import decode_assignment
from strom.protocol import messages
from strom.protocol.errors import ErrorCode

METADATA, LIST_OFFSETS, FIND_COORDINATOR, DESCRIBE_GROUPS, LIST_GROUPS = 3, 2, 10, 15, 16
OFFSET_FETCH, DELETE_GROUPS, CONSUMER_GROUP_DESCRIBE = 9, 42, 69
LATEST = -1


class GroupCommandError(click.ClickException):
    pass


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


class Connection:
    """One connection to one broker; requests are answered in order."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise GroupCommandError(f"cannot connect to {host}:{port}: {e}") from None
        self.reader = self.sock.makefile("rb")
        self.correlation_id = 0

    def call(self, api_key: int, version: int, fields: dict):
        self.correlation_id += 1
        try:
            self.sock.sendall(messages.encode_request(api_key, version, fields, self.correlation_id,
                                                      client_id="strom-groups"))
            head = self.reader.read(4)
            if len(head) < 4:
                raise GroupCommandError("the broker closed the connection")
            (size,) = struct.unpack(">i", head)
            _, body = messages.decode_response(api_key, version, self.reader.read(size))
        except OSError as e:
            raise GroupCommandError(f"request failed: {e}") from None
        return body

    def close(self) -> None:
        self.sock.close()


class Cluster:
    """Connections by broker, opened on demand from the bootstrap server's metadata."""

    def __init__(self, bootstrap: str) -> None:
        host, _, port = bootstrap.rpartition(":")
        if not host or not port.isdigit():
            raise GroupCommandError(f"--bootstrap-server must be host:port, got {bootstrap!r}")
        self.bootstrap = Connection(host.strip("[]"), int(port))
        self.connections: dict[tuple[str, int], Connection] = {(host.strip("[]"), int(port)): self.bootstrap}
        self.brokers: dict[int, tuple[str, int]] = {}

    def connection(self, host: str, port: int) -> Connection:
        if (host, port) not in self.connections:
            self.connections[(host, port)] = Connection(host, port)
        return self.connections[(host, port)]

    def metadata(self, topics: list[str] | None):
        body = self.bootstrap.call(METADATA, 1, {"topics": None if topics is None else
                                                 [{"name": t} for t in topics]})
        self.brokers = {b.node_id: (b.host, b.port) for b in body.brokers}
        return body

    def all_brokers(self) -> list[Connection]:
        self.metadata([])
        return [self.connection(*address) for _, address in sorted(self.brokers.items())]

    def coordinator(self, group: str) -> tuple[int, Connection]:
        body = self.bootstrap.call(FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
        if body.error_code != ErrorCode.NONE:
            raise GroupCommandError(f"cannot find the coordinator of group {group!r}: "
                                    f"{_error_name(body.error_code)}")
        self.brokers[body.node_id] = (body.host, body.port)
        return body.node_id, self.connection(body.host, body.port)

    def log_end_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The latest offset of each partition, asked of its leader."""
        partitions = sorted(set(partitions))
        if not partitions:
            return {}
        meta = self.metadata(sorted({t for t, _ in partitions}))
        leaders = {(t.name, p.partition_index): p.leader_id for t in meta.topics for p in t.partitions}
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for tp in partitions:
            if tp in leaders:
                by_leader.setdefault(leaders[tp], []).append(tp)
        out = {}
        for leader, tps in by_leader.items():
            if leader not in self.brokers:
                continue
            topics: dict[str, list[dict]] = {}
            for t, p in tps:
                topics.setdefault(t, []).append({"partition_index": p, "timestamp": LATEST})
            body = self.connection(*self.brokers[leader]).call(LIST_OFFSETS, 1, {
                "replica_id": -1, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
            for t in body.topics:
                for p in t.partitions:
                    if p.error_code == ErrorCode.NONE:
                        out[(t.name, p.partition_index)] = p.offset
        return out

    def close(self) -> None:
        for conn in self.connections.values():
            conn.close()


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


@click.group()
def groups() -> None:
    """List, describe and delete consumer groups."""


def _bootstrap_option(f):
    return click.option("--bootstrap-server", "bootstrap", default="127.0.0.1:9092",
                        show_default=True, help="A broker to start from (host:port).")(f)


@groups.command("list")
@_bootstrap_option
@click.option("--state", "states", multiple=True,
              help="Only groups in this state (Stable, Empty, PreparingRebalance, ...); "
                   "repeatable. Shows the state and type of each group.")
def list_groups(bootstrap: str, states: tuple[str, ...]) -> None:
    """The groups of the cluster, one per line."""
    cluster = Cluster(bootstrap)
    try:
        found: dict[str, tuple[str, str]] = {}
        for conn in cluster.all_brokers():
            body = conn.call(LIST_GROUPS, 5, {"states_filter": list(states), "types_filter": []})
            if body.error_code != ErrorCode.NONE:
                raise GroupCommandError(f"ListGroups failed: {_error_name(body.error_code)}")
            for g in body.groups:
                found[g.group_id] = (g.group_state, g.group_type)
    finally:
        cluster.close()
    if not states:
        for group_id in sorted(found):
            click.echo(group_id)
    elif found:
        click.echo(_table([["GROUP", "STATE", "TYPE"]] +
                          [[g, *found[g]] for g in sorted(found)]))


def _describe_one(cluster: Cluster, group: str) -> dict:
    """State, members (with their partitions) and committed offsets of one group."""
    node_id, conn = cluster.coordinator(group)
    info = {"group": group, "coordinator": node_id, "members": [], "offsets": {}}
    new = conn.call(CONSUMER_GROUP_DESCRIBE, 0, {"group_ids": [group],
                                                 "include_authorized_operations": False}).groups[0]
    if new.error_code == ErrorCode.NONE:
        info.update(state=new.group_state, protocol=new.assignor_name, type="consumer")
        for m in new.members:
            info["members"].append({
                "member_id": m.member_id, "host": m.client_host, "client_id": m.client_id,
                "partitions": [(tp.topic_name, p) for tp in m.assignment.topic_partitions
                               for p in tp.partitions]})
    elif new.error_code in (ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.UNSUPPORTED_VERSION):
        old = conn.call(DESCRIBE_GROUPS, 4, {"groups": [group],
                                             "include_authorized_operations": False}).groups[0]
        if old.error_code != ErrorCode.NONE:
            raise GroupCommandError(f"describing group {group!r} failed: {_error_name(old.error_code)}")
        info.update(state=old.group_state, protocol=old.protocol_data, type="classic")
        for m in old.members:
            assignment = decode_assignment(m.member_assignment) if old.protocol_type == "consumer" else None
            info["members"].append({
                "member_id": m.member_id, "host": m.client_host, "client_id": m.client_id,
                "partitions": [] if assignment is None else
                [(t, p) for t, ps in assignment.partitions.items() for p in ps]})
    else:
        raise GroupCommandError(f"describing group {group!r} failed: {_error_name(new.error_code)}")
    body = conn.call(OFFSET_FETCH, 7, {"group_id": group, "topics": None, "require_stable": False})
    if body.error_code != ErrorCode.NONE:
        raise GroupCommandError(f"fetching the offsets of {group!r} failed: {_error_name(body.error_code)}")
    info["offsets"] = {(t.name, p.partition_index): p.committed_offset
                       for t in body.topics for p in t.partitions if p.committed_offset >= 0}
    return info


@groups.command("describe")
@_bootstrap_option
@click.argument("group_ids", nargs=-1, required=True)
@click.option("--members", "show", flag_value="members", help="Show members instead of offsets.")
@click.option("--state", "show", flag_value="state", help="Show the group's state instead of offsets.")
def describe_groups(bootstrap: str, group_ids: tuple[str, ...], show: str | None) -> None:
    """Per partition: committed offset, log end offset, lag and the member consuming it."""
    cluster = Cluster(bootstrap)
    try:
        for i, group in enumerate(group_ids):
            info = _describe_one(cluster, group)
            if i:
                click.echo()
            if info["state"] == "Dead":
                click.echo(f"Error: Consumer group '{group}' does not exist.")
                continue
            if show == "state":
                host, port = cluster.brokers.get(info["coordinator"], ("?", "?"))
                click.echo(_table([["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
                                   [group, f"{host}:{port} ({info['coordinator']})",
                                    info["protocol"] or "", info["state"], len(info["members"])]]))
                continue
            if not info["members"]:
                click.echo(f"Consumer group '{group}' has no active members.")
            if show == "members":
                rows = [["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]]
                rows += [[group, m["member_id"], m["host"], m["client_id"], len(m["partitions"])]
                         for m in info["members"]]
                click.echo(_table(rows))
                continue
            click.echo(_offsets_table(cluster, info))
    finally:
        cluster.close()


def _offsets_table(cluster: Cluster, info: dict) -> str:
    owner = {tp: m for m in info["members"] for tp in m["partitions"]}
    partitions = sorted(set(owner) | set(info["offsets"]))
    ends = cluster.log_end_offsets(partitions)
    rows = [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
             "CONSUMER-ID", "HOST", "CLIENT-ID"]]
    for tp in partitions:
        committed, end, member = info["offsets"].get(tp), ends.get(tp), owner.get(tp)
        lag = end - committed if committed is not None and end is not None else None
        rows.append([info["group"], tp[0], tp[1], "-" if committed is None else committed,
                     "-" if end is None else end, "-" if lag is None else lag,
                     member["member_id"] if member else "-", member["host"] if member else "-",
                     member["client_id"] if member else "-"])
    return _table(rows)


@groups.command("delete")
@_bootstrap_option
@click.argument("group_ids", nargs=-1, required=True)
def delete_groups(bootstrap: str, group_ids: tuple[str, ...]) -> None:
    """Delete groups that have no members, with their committed offsets."""
    cluster = Cluster(bootstrap)
    failed = False
    try:
        for group in group_ids:
            _, conn = cluster.coordinator(group)
            (result,) = conn.call(DELETE_GROUPS, 2, {"groups_names": [group]}).results
            if result.error_code == ErrorCode.NONE:
                click.echo(f"Deletion of requested consumer groups ('{group}') was successful.")
            else:
                failed = True
                reason = {ErrorCode.NON_EMPTY_GROUP: "The group is not empty.",
                          ErrorCode.GROUP_ID_NOT_FOUND: "The group id does not exist."}.get(
                    result.error_code, _error_name(result.error_code))
                click.echo(f"Error: Deletion of consumer group '{group}' failed due to: {reason}",
                           err=True)
    finally:
        cluster.close()
    if failed:
        sys.exit(1)
