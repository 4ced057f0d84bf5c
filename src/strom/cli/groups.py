"""`strom groups list|describe|delete|reset-offsets|delete-offsets`: consumer groups from the
command line, in the manner of Kafka's kafka-consumer-groups.sh. Share groups (KIP-932) are
listed, described (per partition the share-partition start offset and its lag, KIP-1226's,
as kafka-share-groups.sh shows them) and deleted too.

The commands speak the Kafka protocol to any Kafka-compatible cluster (Strom or Kafka): they
find each group's coordinator with FindCoordinator and ask it; `describe` adds each partition's
log end offset (ListOffsets at the partition leader) to show the lag, and `reset-offsets`
commits new offsets for an inactive group as Kafka's admin client does (OffsetCommit with no
member and generation -1).
"""

from __future__ import annotations

import csv
import io
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import click

from strom.cli.api_versions import api_versions
from strom.cli.common import (
    EARLIEST,
    LATEST,
    ClientSettings,
    Cluster,
    CommandError,
    KafkaToolGroup,
    TopicPartition,
    client_options,
    error_name,
    error_text,
    parse_duration_ms,
    parse_timestamp,
    resolve_partitions,
    table,
    take_option,
)
from strom.coordinator.group.consumer_protocol import decode_assignment
from strom.protocol.errors import ErrorCode

OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, LIST_GROUPS = 8, 9, 15, 16
DELETE_GROUPS, OFFSET_DELETE, CONSUMER_GROUP_DESCRIBE = 42, 47, 69
SHARE_GROUP_DESCRIBE, DESCRIBE_SHARE_GROUP_OFFSETS = 77, 90
INACTIVE_STATES = ("Empty", "Dead")  # Dead: the group does not exist (yet)


class GroupsGroup(KafkaToolGroup):
    """`strom groups SUBCOMMAND`, or kafka-consumer-groups.sh's `--list`, `--describe`,
    `--delete`, `--reset-offsets`, `--delete-offsets` with `--group G` (the groups are the
    subcommands' arguments; `--offsets`, describe's default view, is taken as said)."""

    action_flags = {"--list": "list", "--describe": "describe", "--delete": "delete",
                    "--reset-offsets": "reset-offsets", "--delete-offsets": "delete-offsets"}

    def kafka_line(self, command: str, args: list[str]) -> list[str]:
        args, groups_named = take_option(args, "--group")
        return [*groups_named, *(a for a in args if a != "--offsets")]


@click.group(cls=GroupsGroup)
def groups() -> None:
    """List, describe and delete consumer groups; reset or delete their committed offsets
    (like kafka-consumer-groups.sh)."""


@groups.command("list")
@client_options()
@click.option("--state", "states", multiple=True,
              help="Only groups in this state (Stable, Empty, PreparingRebalance, ...); "
                   "repeatable. Shows the state and type of each group.")
def list_groups(client: ClientSettings, states: tuple[str, ...]) -> None:
    """The groups of the cluster, one per line.

    \b
    Example:
      strom groups list
      strom groups list --state Stable --state Empty
    """
    with Cluster(client) as cluster:
        found = {group_id: (state, kind) for group_id, state, kind in _list_groups(cluster, states)}
    if not states:
        for group_id in sorted(found):
            click.echo(group_id)
    elif found:
        click.echo(table([["GROUP", "STATE", "TYPE"]] + [[g, *found[g]] for g in sorted(found)]))


def _list_groups(cluster: Cluster, states: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(group, state, type) of every group of the cluster (in `states`, if any), from every broker."""
    found: dict[str, tuple[str, str, str]] = {}
    for conn in cluster.all_brokers():
        body = conn.call(LIST_GROUPS, 5, {"states_filter": list(states), "types_filter": []})
        if body.error_code != ErrorCode.NONE:
            raise CommandError(f"ListGroups failed: {error_name(body.error_code)}")
        for g in body.groups:
            found[g.group_id] = (g.group_id, g.group_state, g.group_type)
    return list(found.values())


def describe_group(cluster: Cluster, group: str) -> dict:
    """State, members (with their partitions) and committed offsets of one group; state
    "Dead" when the group does not exist."""
    node_id, conn = cluster.coordinator(group)
    info: dict[str, Any] = {"group": group, "coordinator": node_id, "members": []}
    new = conn.call(CONSUMER_GROUP_DESCRIBE, 0, {"group_ids": [group],
                                                 "include_authorized_operations": False}).groups[0]
    if new.error_code == ErrorCode.NONE:
        info.update(state=new.group_state, protocol=new.assignor_name, type="consumer")
        for m in new.members:
            info["members"].append(_described_member(m))
    elif new.error_code == ErrorCode.GROUP_ID_NOT_FOUND and _is_share_group(conn, group):
        return _describe_share_group(conn, group, info)
    elif new.error_code in (ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.UNSUPPORTED_VERSION):
        old = conn.call(DESCRIBE_GROUPS, 4, {"groups": [group],
                                             "include_authorized_operations": False}).groups[0]
        if old.error_code != ErrorCode.NONE:
            raise CommandError(f"describing group {group!r} failed: {error_name(old.error_code)}")
        info.update(state=old.group_state, protocol=old.protocol_data, type="classic")
        for m in old.members:
            assignment = decode_assignment(m.member_assignment) if old.protocol_type == "consumer" else None
            info["members"].append({
                "member_id": m.member_id, "host": m.client_host, "client_id": m.client_id,
                "partitions": [] if assignment is None else
                [(t, p) for t, ps in assignment.partitions.items() for p in ps]})
    else:
        raise CommandError(f"describing group {group!r} failed: {error_name(new.error_code)}")
    info["offsets"] = committed_offsets(conn, group)
    return info


def _described_member(m: Any) -> dict:
    """A member as ConsumerGroupDescribe and ShareGroupDescribe both describe one."""
    return {"member_id": m.member_id, "host": m.client_host, "client_id": m.client_id,
            "partitions": [(tp.topic_name, p) for tp in m.assignment.topic_partitions for p in tp.partitions]}


def _is_share_group(conn: Any, group: str) -> bool:
    """KIP-932: the coordinator lists `group` as a share group (brokers without share groups
    list none)."""
    body = conn.call(LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["share"]})
    return body.error_code == ErrorCode.NONE and any(g.group_id == group for g in body.groups)


def _describe_share_group(conn: Any, group: str, info: dict) -> dict:
    """A share group: its members (who may share partitions) and, as its offsets, the
    share-partition start offset of each partition it reads."""
    described = conn.call(SHARE_GROUP_DESCRIBE, 1, {"group_ids": [group],
                                                    "include_authorized_operations": False}).groups[0]
    if described.error_code != ErrorCode.NONE:
        raise CommandError(f"describing share group {group!r} failed: {error_name(described.error_code)}")
    info.update(state=described.group_state, protocol=described.assignor_name, type="share")
    for m in described.members:
        info["members"].append(_described_member(m))
    # v1 (Kafka 4.2+) has the lag; a broker with v0 only is asked at v0 and shows none.
    version = min(1, max((k.max_version for k in api_versions(conn).api_keys
                          if k.api_key == DESCRIBE_SHARE_GROUP_OFFSETS), default=0))
    body = conn.call(DESCRIBE_SHARE_GROUP_OFFSETS, version, {"groups": [{"group_id": group, "topics": None}]})
    (g,) = body.groups
    if g.error_code not in (ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND):
        raise CommandError(f"fetching the start offsets of {group!r} failed: {error_name(g.error_code)}")
    info["offsets"] = {(t.topic_name, p.partition_index): p.start_offset
                       for t in g.topics for p in t.partitions if p.start_offset >= 0}
    # KIP-1226's lag, the broker's: records past the start offset already done with do not count.
    info["lags"] = {(t.topic_name, p.partition_index): p.lag for t in g.topics for p in t.partitions
                    if getattr(p, "lag", -1) >= 0 and p.error_code == ErrorCode.NONE}
    return info


def committed_offsets(conn: Any, group: str) -> dict[TopicPartition, int]:
    """Every committed offset of `group`, asked of its coordinator `conn`."""
    body = conn.call(OFFSET_FETCH, 7, {"group_id": group, "topics": None, "require_stable": False})
    if body.error_code != ErrorCode.NONE:
        raise CommandError(f"fetching the offsets of {group!r} failed: {error_name(body.error_code)}")
    return {(t.name, p.partition_index): p.committed_offset
            for t in body.topics for p in t.partitions if p.committed_offset >= 0}


def _chosen_groups(cluster: Cluster, group_ids: tuple[str, ...], all_groups: bool) -> list[str]:
    if all_groups == bool(group_ids):
        raise click.UsageError("name the groups (GROUP... or --group), or --all-groups")
    if not all_groups:
        return list(group_ids)
    return sorted(g for g, _, _ in _list_groups(cluster, ()))


@groups.command("describe")
@client_options()
@click.argument("group_ids", metavar="GROUP...", nargs=-1)
@click.option("--all-groups", is_flag=True, help="Every group of the cluster.")
@click.option("--members", "show", flag_value="members", help="Show members instead of offsets.")
@click.option("--state", "show", flag_value="state", help="Show the group's state instead of offsets.")
def describe_groups(client: ClientSettings, group_ids: tuple[str, ...], all_groups: bool, show: str | None) -> None:
    """Per partition: committed offset, log end offset, lag and the member consuming it.

    A group that does not exist is reported (exit code 1) and the others are still shown.

    \b
    Example:
      strom groups describe orders-app
      strom groups describe orders-app --members
      strom groups describe orders-app --state
    """
    missing = False
    with Cluster(client) as cluster:
        for i, group in enumerate(_chosen_groups(cluster, group_ids, all_groups)):
            info = describe_group(cluster, group)
            if i:
                click.echo()
            if info["state"] == "Dead":
                # On stdout, in sequence with the other groups, as kafka-consumer-groups.sh.
                click.echo(f"Error: Consumer group '{group}' does not exist.")
                missing = True
                continue
            if show == "state":
                host, port = cluster.brokers.get(info["coordinator"], ("?", "?"))
                click.echo(table([["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
                                  [group, f"{host}:{port} ({info['coordinator']})",
                                   info["protocol"] or "", info["state"], len(info["members"])]]))
                continue
            if not info["members"]:
                click.echo(f"Consumer group '{group}' has no active members.")
            if show == "members":
                rows = [["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]]
                rows += [[group, m["member_id"], m["host"], m["client_id"], len(m["partitions"])]
                         for m in info["members"]]
                click.echo(table(rows))
                continue
            click.echo(_offsets_table(cluster, info))
    if missing:
        sys.exit(1)


def _offsets_table(cluster: Cluster, info: dict) -> str:
    owner = {tp: m for m in info["members"] for tp in m["partitions"]}
    partitions = sorted(set(owner) | set(info["offsets"]))
    ends = {tp: r.offset for tp, r in cluster.list_offsets(dict.fromkeys(partitions, LATEST)).items()
            if r.error_code == ErrorCode.NONE}
    if info.get("type") == "share":
        # Members share partitions: each row counts them. The lag is what the group has not
        # finished with, as the broker computes it (KIP-1226): the records from the
        # share-partition start offset to the log end, less those already done with.
        rows = [["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LOG-END-OFFSET", "LAG", "#MEMBERS"]]
        for tp in partitions:
            start, end, lag = info["offsets"].get(tp), ends.get(tp), info["lags"].get(tp)
            members = sum(1 for m in info["members"] if tp in m["partitions"])
            rows.append([info["group"], tp[0], tp[1], "-" if start is None else start,
                         "-" if end is None else end, "-" if lag is None else lag, members])
        return table(rows)
    rows = [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
             "CONSUMER-ID", "HOST", "CLIENT-ID"]]
    for tp in partitions:
        committed, end, member = info["offsets"].get(tp), ends.get(tp), owner.get(tp)
        lag = end - committed if committed is not None and end is not None else None
        rows.append([info["group"], tp[0], tp[1], "-" if committed is None else committed,
                     "-" if end is None else end, "-" if lag is None else lag,
                     member["member_id"] if member else "-", member["host"] if member else "-",
                     member["client_id"] if member else "-"])
    return table(rows)


@groups.command("delete")
@client_options()
@click.argument("group_ids", metavar="GROUP...", nargs=-1)
@click.option("--all-groups", is_flag=True, help="Every group of the cluster.")
def delete_groups(client: ClientSettings, group_ids: tuple[str, ...], all_groups: bool) -> None:
    """Delete groups that have no members, with their committed offsets.

    \b
    Example:
      strom groups delete old-app other-old-app
    """
    failed = False
    with Cluster(client) as cluster:
        for group in _chosen_groups(cluster, group_ids, all_groups):
            _, conn = cluster.coordinator(group)
            (result,) = conn.call(DELETE_GROUPS, 2, {"groups_names": [group]}).results
            if result.error_code == ErrorCode.NONE:
                click.echo(f"Deletion of requested consumer groups ('{group}') was successful.")
            else:
                failed = True
                reason = {ErrorCode.NON_EMPTY_GROUP: "The group is not empty.",
                          ErrorCode.GROUP_ID_NOT_FOUND: "The group id does not exist."}.get(
                    result.error_code, error_name(result.error_code))
                click.echo(f"Error: Deletion of consumer group '{group}' failed due to: {reason}",
                           err=True)
    if failed:
        sys.exit(1)


# --- reset-offsets ------------------------------------------------------------------------------
SPECS = ("to_earliest", "to_latest", "to_current", "to_offset", "shift_by", "to_datetime",
         "by_duration", "from_file")


def read_reset_plan(path: Path, group: str) -> dict[TopicPartition, int]:
    """The CSV that `--export` writes: `topic,partition,offset` lines, or
    `group,topic,partition,offset` lines (only `group`'s are used)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise CommandError(f"cannot read {path}: {e.strerror}") from None
    plan: dict[TopicPartition, int] = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) == 4:
            if row[0] != group:
                continue
            row = row[1:]
        try:
            topic, partition, offset = row[0], int(row[1]), int(row[2])
        except (ValueError, IndexError):
            raise CommandError(f"{path}:{number}: expected topic,partition,offset, got {','.join(row)!r}") from None
        plan[(topic, partition)] = offset
    if not plan:
        raise CommandError(f"{path} holds no offsets for group '{group}'")
    return plan


def _clamped(cluster: Cluster, requested: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Requested offsets moved into [log start, log end], with a warning for each one moved, as
    kafka-consumer-groups.sh does."""
    starts = _offsets_at(cluster, requested, EARLIEST)
    ends = _offsets_at(cluster, requested, LATEST)
    out = {}
    for tp, offset in requested.items():
        new = min(max(offset, starts[tp]), ends[tp])
        if new != offset:
            click.echo(f"Warning: new offset {offset} of {tp[0]}-{tp[1]} is outside "
                       f"[{starts[tp]}, {ends[tp]}]: {new} is used.", err=True)
        out[tp] = new
    return out


def _offsets_at(cluster: Cluster, partitions: Iterable[TopicPartition], timestamp: int) -> dict[TopicPartition, int]:
    """ListOffsets for every partition; a partition without an answer is a CommandError."""
    listed = cluster.list_offsets(dict.fromkeys(partitions, timestamp))
    failed = {tp: r for tp, r in listed.items() if r.error_code != ErrorCode.NONE}
    if failed:
        raise CommandError("cannot list offsets of " + ", ".join(
            f"{t}-{p} ({error_name(r.error_code)})" for (t, p), r in sorted(failed.items())))
    return {tp: r.offset for tp, r in listed.items()}


def _by_time(cluster: Cluster, partitions: list[TopicPartition], timestamp: int) -> dict[TopicPartition, int]:
    """The first offset at or after `timestamp`; the log end where no record is that recent."""
    found = _offsets_at(cluster, partitions, timestamp)
    late = [tp for tp, offset in found.items() if offset < 0]
    return {**found, **(_offsets_at(cluster, late, LATEST) if late else {})}


def plan_reset(cluster: Cluster, partitions: list[TopicPartition], committed: Mapping[TopicPartition, int],
               spec: str, value: Any) -> dict[TopicPartition, int]:
    """The new offset of each partition for one reset specification (Kafka's semantics)."""
    if spec == "to_earliest":
        return _offsets_at(cluster, partitions, EARLIEST)
    if spec == "to_latest":
        return _offsets_at(cluster, partitions, LATEST)
    if spec == "to_offset":
        return _clamped(cluster, dict.fromkeys(partitions, value))
    if spec == "shift_by":
        without = [tp for tp in partitions if tp not in committed]
        if without:
            raise CommandError(f"cannot shift the offset of {without[0][0]}-{without[0][1]}: the "
                               "group has no committed offset there")
        return _clamped(cluster, {tp: committed[tp] + value for tp in partitions})
    if spec == "to_datetime":
        return _by_time(cluster, partitions, value)
    if spec == "by_duration":
        return _by_time(cluster, partitions, int(time.time() * 1000) - value)
    if spec == "to_current":
        rest = [tp for tp in partitions if tp not in committed]
        ends = _offsets_at(cluster, rest, LATEST) if rest else {}
        return {tp: committed[tp] if tp in committed else ends[tp] for tp in partitions}
    assert spec == "from_file"
    return _clamped(cluster, value)


@groups.command("reset-offsets")
@client_options()
@click.argument("group")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC[:P,P-P]",
              help="Partitions to reset: a whole topic or some of its partitions (repeatable).")
@click.option("--all-topics", is_flag=True, help="Every partition the group has an offset for.")
@click.option("--to-earliest", is_flag=True, help="To the log start offset.")
@click.option("--to-latest", is_flag=True, help="To the log end offset.")
@click.option("--to-current", is_flag=True,
              help="To the committed offset (the log end where the group has none).")
@click.option("--to-offset", type=int, metavar="OFFSET",
              help="To this offset (kept between the log start and end offsets).")
@click.option("--shift-by", type=int, metavar="N", help="Committed offset + N (N may be negative).")
@click.option("--to-datetime", callback=lambda c, p, v: None if v is None else parse_timestamp(v),
              metavar="DATETIME", help="To the first offset at or after a time: ms since the "
              "epoch or ISO-8601 such as 2024-05-01T12:00:00.000 (local time without a zone).")
@click.option("--by-duration", callback=lambda c, p, v: None if v is None else parse_duration_ms(v),
              metavar="DURATION", help="To the first offset at or after now minus an ISO-8601 "
              "duration such as PT30M or P1DT12H.")
@click.option("--from-file", type=click.Path(dir_okay=False, path_type=Path), metavar="CSV",
              help="To the offsets of a CSV file that --export wrote (topic,partition,offset).")
@click.option("--dry-run", is_flag=True, help="Show the new offsets only (the default).")
@click.option("--execute", is_flag=True, help="Commit the new offsets.")
@click.option("--export", is_flag=True, help="Print the new offsets as CSV, for --from-file.")
def reset_offsets(client: ClientSettings, group: str, topics: tuple[str, ...], all_topics: bool,
                  dry_run: bool, execute: bool, export: bool, **specs: Any) -> None:
    """Move the committed offsets of an inactive group (no members), like
    kafka-consumer-groups.sh --reset-offsets. Without --execute nothing changes.

    \b
    Example:
      strom groups reset-offsets orders-app --topic orders --to-earliest --dry-run
      strom groups reset-offsets orders-app --topic orders:0,1 --shift-by -100 --execute
      strom groups reset-offsets orders-app --all-topics --to-datetime 2024-05-01T00:00:00 --execute
      strom groups reset-offsets orders-app --all-topics --by-duration PT1H --export > plan.csv
      strom groups reset-offsets orders-app --from-file plan.csv --execute
    """
    chosen = [s for s in SPECS if specs[s] is not None and specs[s] is not False]  # 0 is a value
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-current, "
                               "--to-offset, --shift-by, --to-datetime, --by-duration, --from-file")
    spec = chosen[0]
    if dry_run and execute:
        raise click.UsageError("--dry-run and --execute exclude each other")
    if spec == "from_file" and (topics or all_topics):
        raise click.UsageError("--from-file names its own partitions: no --topic or --all-topics")
    if spec != "from_file" and bool(topics) == all_topics:
        raise click.UsageError("give --topic (repeatable) or --all-topics")
    value = read_reset_plan(specs["from_file"], group) if spec == "from_file" else specs[spec]
    with Cluster(client) as cluster:
        info = describe_group(cluster, group)
        if info["state"] not in INACTIVE_STATES:
            raise CommandError(f"Assignments can only be reset if the group '{group}' is inactive, "
                               f"but the current state is {info['state']}.")
        committed = info["offsets"]
        if spec == "from_file":
            partitions = resolve_partitions(cluster, {f"{t}:{p}" for t, p in value})
        elif all_topics:
            partitions = sorted(committed)
        else:
            partitions = resolve_partitions(cluster, topics)
        new = plan_reset(cluster, partitions, committed, spec, value) if partitions else {}
        if execute and new:
            _commit(cluster, group, new)
    if export:
        click.echo("\n".join(f"{t},{p},{o}" for (t, p), o in sorted(new.items())))
    elif new:
        click.echo(table([["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]] +
                         [[group, t, p, o] for (t, p), o in sorted(new.items())]))
    else:
        click.echo(f"Consumer group '{group}' has no offsets to reset.")
    if not execute and not dry_run:
        click.echo("Warning: a dry run, nothing was changed: --execute commits these offsets "
                   "(--dry-run asks for a dry run without this warning).", err=True)


def _commit(cluster: Cluster, group: str, offsets: Mapping[TopicPartition, int]) -> None:
    """OffsetCommit as an admin: no member, generation -1 (accepted only while the group has
    no members); any partition refused is a CommandError naming it."""
    _, conn = cluster.coordinator(group)
    by_topic: dict[str, list[dict]] = {}
    for (t, p), offset in sorted(offsets.items()):
        by_topic.setdefault(t, []).append({"partition_index": p, "committed_offset": offset,
                                           "committed_leader_epoch": -1, "committed_metadata": ""})
    body = conn.call(OFFSET_COMMIT, 8, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "group_instance_id": None, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]})
    failed = [(t.name, p.partition_index, p.error_code) for t in body.topics for p in t.partitions
              if p.error_code != ErrorCode.NONE]
    if failed:
        raise CommandError(f"committing the new offsets of group '{group}' failed: " + ", ".join(
            f"{t}-{p} ({error_name(code)})" for t, p, code in failed))


# --- delete-offsets -----------------------------------------------------------------------------
@groups.command("delete-offsets")
@client_options()
@click.argument("group")
@click.option("--topic", "topics", multiple=True, required=True, metavar="TOPIC[:P,P-P]",
              help="A topic, or some of its partitions, whose offsets to delete (repeatable).")
def delete_offsets(client: ClientSettings, group: str, topics: tuple[str, ...]) -> None:
    """Delete a group's committed offsets of some partitions (OffsetDelete). The group must
    not be consuming those topics.

    \b
    Example:
      strom groups delete-offsets orders-app --topic retired-topic
      strom groups delete-offsets orders-app --topic orders:3
    """
    with Cluster(client) as cluster:
        partitions = resolve_partitions(cluster, topics)
        by_topic: dict[str, list[dict]] = {}
        for t, p in partitions:
            by_topic.setdefault(t, []).append({"partition_index": p})
        _, conn = cluster.coordinator(group)
        body = conn.call(OFFSET_DELETE, 0, {"group_id": group, "topics": [
            {"name": t, "partitions": ps} for t, ps in by_topic.items()]})
    if body.error_code == ErrorCode.GROUP_ID_NOT_FOUND:
        raise CommandError(f"Consumer group '{group}' does not exist.")
    if body.error_code != ErrorCode.NONE:
        raise CommandError(f"deleting offsets of group '{group}' failed: {error_text(body.error_code)}")
    results = {(t.name, p.partition_index): p.error_code for t in body.topics for p in t.partitions}
    click.echo(table([["TOPIC", "PARTITION", "STATUS"]] + [
        [t, p, "Successful" if code == ErrorCode.NONE else f"Error: {error_name(code)}"]
        for (t, p), code in sorted(results.items())]))
    failed = sorted(tp for tp, code in results.items() if code != ErrorCode.NONE)
    if failed:
        reasons = {error_name(results[tp]) for tp in failed}
        raise CommandError(f"the offsets of {len(failed)} partition(s) were not deleted "
                           f"({', '.join(sorted(reasons))})")
