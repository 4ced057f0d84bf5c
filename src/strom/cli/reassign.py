"""`strom reassign-partitions`: move partitions to other brokers, in the manner of Kafka's
kafka-reassign-partitions.sh, with its actions and JSON files.

It speaks the Kafka protocol (KIP-455): Metadata for the current replicas from the bootstrap
server, AlterPartitionReassignments and ListPartitionReassignments at the controller (asked
again on NOT_CONTROLLER), so it works against any Kafka-compatible cluster.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

import click

from strom.cli.admin_common import read_json, tp_name
from strom.cli.common import (
    ClientSettings,
    Cluster,
    Command,
    CommandError,
    client_options,
    error_name,
)
from strom.cli.topics import TIMEOUT_MS
from strom.protocol.errors import ErrorCode, KafkaError

ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS = 45, 46
ANY_LOG_DIR = "any"
METADATA_LAG_S = 3.0  # how long verify waits for metadata to catch up with a finished move

TopicPartition = tuple[str, int]
Assignment = dict[TopicPartition, list[int]]


def _version_1(data: Any, path: str, key: str) -> list:
    """The `key` list of a version-1 document (a missing version means 1, as in Kafka)."""
    if not isinstance(data, dict):
        raise CommandError(f"{path}: expected a JSON object with a {key!r} list")
    if data.get("version", 1) != 1:
        raise CommandError(f"{path}: not supported version field value {data['version']!r}")
    items = data.get(key)
    if not isinstance(items, list):
        raise CommandError(f"{path}: expected a {key!r} list")
    return items


def parse_topics_to_move(data: Any, path: str) -> list[str]:
    """`{"version":1,"topics":[{"topic":"t"}]}`: the topic names, in order, once each."""
    names = []
    for item in _version_1(data, path, "topics"):
        if not isinstance(item, dict) or not isinstance(item.get("topic"), str) or not item["topic"]:
            raise CommandError(f'{path}: each topic must be {{"topic": "<name>"}}, got {json.dumps(item)}')
        names.append(item["topic"])
    if not names:
        raise CommandError(f"{path}: the list of topics to move is empty")
    return list(dict.fromkeys(names))


def parse_reassignment(data: Any, path: str) -> Assignment:
    """`{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2],"log_dirs":[...]}]}`:
    the target replicas of each partition, checked as Kafka's tool checks them."""
    out: Assignment = {}
    for item in _version_1(data, path, "partitions"):
        if not (isinstance(item, dict) and isinstance(item.get("topic"), str)
                and _is_int(item.get("partition")) and isinstance(item.get("replicas"), list)
                and all(_is_int(r) for r in item["replicas"])):
            raise CommandError(f'{path}: each partition needs "topic", "partition" and '
                                       f'"replicas" (broker ids), got {json.dumps(item)}')
        tp, replicas = (item["topic"], item["partition"]), item["replicas"]
        if tp in out:
            raise CommandError(f"{path}: partition {tp_name(tp)} is listed twice")
        if not replicas:
            raise CommandError(f"{path}: the replica list of {tp_name(tp)} is empty")
        if len(set(replicas)) != len(replicas):
            raise CommandError(f"{path}: the replica list of {tp_name(tp)} lists a broker twice: {replicas}")
        log_dirs = item.get("log_dirs", [ANY_LOG_DIR] * len(replicas))
        if not isinstance(log_dirs, list) or len(log_dirs) != len(replicas):
            raise CommandError(f"{path}: the log_dirs of {tp_name(tp)} must be a list as long as "
                                       f"its replicas {replicas}")
        if any(d != ANY_LOG_DIR for d in log_dirs):
            raise CommandError(f'{path}: log_dirs other than "any" ({tp_name(tp)}) are not supported '
                                       "by this tool yet")
        out[tp] = list(replicas)
    if not out:
        raise CommandError(f"{path}: the partition reassignment list is empty")
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def format_reassignment(assignment: Assignment) -> str:
    """Kafka's compact reassignment JSON, partitions sorted by topic and number."""
    return json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": r, "log_dirs": [ANY_LOG_DIR] * len(r)}
        for (t, p), r in sorted(assignment.items())]}, separators=(",", ":"))


def current_assignment(cluster: Cluster, topics: Iterable[str]) -> Assignment:
    """Every partition's replicas of `topics`, as the bootstrap server's metadata has them."""
    body = cluster.metadata(sorted(set(topics)))
    out: Assignment = {}
    for t in body.topics:
        if t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise CommandError(f"Topic '{t.name}' does not exist.")
        if t.error_code != ErrorCode.NONE:
            raise CommandError(f"describing topic '{t.name}' failed: {error_name(t.error_code)}")
        out.update({(t.name, p.partition_index): list(p.replica_nodes) for p in t.partitions})
    return out


def _current_of(cluster: Cluster, partitions: Iterable[TopicPartition]) -> Assignment:
    partitions = sorted(partitions)
    current = current_assignment(cluster, (t for t, _ in partitions))
    for tp in partitions:
        if tp not in current:
            raise CommandError(f"Partition {tp_name(tp)} does not exist.")
    return {tp: current[tp] for tp in partitions}


def propose(current: Assignment, brokers: list[int]) -> Assignment:
    """Kafka's rack-unaware assignment of each topic's partitions over `brokers`, keeping every
    partition's replication factor (one random start and shift per topic, as Kafka)."""
    from strom.controller.admin import assign_replicas  # the controller package, only when needed

    n = len(brokers)
    out: Assignment = {}
    for topic in sorted({t for t, _ in current}):
        partitions = {p: r for (t, p), r in current.items() if t == topic}
        count = max(partitions) + 1
        start, shift = random.randrange(n), random.randrange(n)
        by_factor: dict[int, dict[int, list[int]]] = {}
        for p, replicas in sorted(partitions.items()):
            if len(replicas) not in by_factor:
                by_factor[len(replicas)] = assign_replicas(count, len(replicas), brokers,
                                                           start_index=start, replica_shift=shift)
            out[(topic, p)] = by_factor[len(replicas)][p]
    return out


def _controller_call(cluster: Cluster, api_key: int, fields: dict) -> Any:
    body = cluster.at_controller(api_key, 0, fields, lambda body: body)
    if body.error_code != ErrorCode.NONE:
        raise CommandError(body.error_message or error_name(body.error_code))
    return body


def alter(cluster: Cluster, changes: Mapping[TopicPartition, list[int] | None]) -> dict[TopicPartition, Any]:
    """Start (replicas) or cancel (None) reassignments: each partition's response entry."""
    by_topic: dict[str, list[dict]] = {}
    for (t, p), replicas in sorted(changes.items()):
        by_topic.setdefault(t, []).append({"partition_index": p, "replicas": replicas})
    body = _controller_call(cluster, ALTER_REASSIGNMENTS, {"timeout_ms": TIMEOUT_MS, "topics": [
        {"name": t, "partitions": ps} for t, ps in by_topic.items()]})
    return {(t.name, p.partition_index): p for t in body.responses for p in t.partitions}


def ongoing(cluster: Cluster, partitions: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, Any]:
    """The ongoing reassignments (of `partitions`, or all): entries with replicas,
    adding_replicas and removing_replicas."""
    topics = None
    if partitions is not None:
        wanted: dict[str, list[int]] = {}
        for t, p in sorted(partitions):
            wanted.setdefault(t, []).append(p)
        topics = [{"name": t, "partition_indexes": ps} for t, ps in wanted.items()]
    body = _controller_call(cluster, LIST_REASSIGNMENTS, {"timeout_ms": TIMEOUT_MS, "topics": topics})
    return {(t.name, p.partition_index): p for t in body.topics for p in t.partitions}


def _failure(tp: TopicPartition, entry: Any) -> str:
    if entry.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return f"partition {tp_name(tp)} does not exist"
    name = error_name(entry.error_code)
    return f"{name}: {entry.error_message}" if entry.error_message else name


def _broker_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        brokers = [int(b) for b in value.split(",") if b.strip()]
    except ValueError:
        raise click.BadParameter(f"expected broker ids separated by commas, got {value!r}") from None
    duplicates = sorted({b for b in brokers if brokers.count(b) > 1})
    if duplicates:
        raise click.BadParameter(f"lists broker(s) {','.join(map(str, duplicates))} twice")
    if not brokers:
        raise click.BadParameter("no broker ids")
    return brokers


ACTIONS = ("generate", "execute", "verify", "cancel", "list")


@click.command("reassign-partitions", cls=Command)
@client_options()
@click.option("--generate", is_flag=True, help="Propose an assignment of the topics in "
              "--topics-to-move-json-file over the brokers of --broker-list (nothing is changed).")
@click.option("--execute", is_flag=True, help="Start the reassignment in --reassignment-json-file.")
@click.option("--verify", is_flag=True, help="Whether the reassignment in --reassignment-json-file is complete.")
@click.option("--cancel", is_flag=True, help="Cancel the ongoing reassignments of the partitions in "
              "--reassignment-json-file (they go back to their original replicas).")
@click.option("--list", "list_", is_flag=True, help="Show every ongoing reassignment.")
@click.option("--topics-to-move-json-file", "topics_file", metavar="FILE",
              help='For --generate: {"version":1,"topics":[{"topic":"orders"}]}.')
@click.option("--broker-list", "brokers", metavar="ID,ID,...", callback=_broker_list,
              help="For --generate: the brokers to place the replicas on.")
@click.option("--reassignment-json-file", "reassignment_file", metavar="FILE",
              help="For --execute, --verify and --cancel: the partitions' target replicas, in the "
                   "JSON that --generate proposes.")
@click.option("--additional", is_flag=True,
              help="For --execute: start it even while other reassignments are in progress.")
@click.option("--throttle", type=int, metavar="BYTES/S",
              help="Accepted for compatibility; not applied by this tool yet (a warning says so).")
def reassign(client: ClientSettings, generate: bool, execute: bool, verify: bool, cancel: bool, list_: bool,
             topics_file: str | None, brokers: list[int] | None, reassignment_file: str | None,
             additional: bool, throttle: int | None) -> None:
    """Move partitions to other brokers (like kafka-reassign-partitions.sh). Exactly one
    action: --generate, --execute, --verify, --cancel or --list.

    \b
    Example: move topic orders onto brokers 2, 3 and 4
      echo '{"version":1,"topics":[{"topic":"orders"}]}' > move.json
      strom reassign-partitions --generate --topics-to-move-json-file move.json --broker-list 2,3,4
      (save the proposed configuration it prints as plan.json, the current one for a rollback)
      strom reassign-partitions --execute --reassignment-json-file plan.json
      strom reassign-partitions --verify --reassignment-json-file plan.json
      strom reassign-partitions --list
      strom reassign-partitions --cancel --reassignment-json-file plan.json
    """
    chosen = [a for a, on in zip(ACTIONS, (generate, execute, verify, cancel, list_), strict=True) if on]
    if len(chosen) != 1:
        raise click.UsageError("Command must include exactly one action: "
                               "--generate, --execute, --verify, --cancel or --list")
    action = chosen[0]
    if action == "generate" and (topics_file is None or brokers is None):
        raise click.UsageError("--generate needs --topics-to-move-json-file and --broker-list")
    if action in ("execute", "verify", "cancel") and reassignment_file is None:
        raise click.UsageError(f"--{action} needs --reassignment-json-file")
    if (throttle is not None or additional) and action != "execute":
        raise click.UsageError("--throttle and --additional go with --execute only")
    # Parse the files before connecting, so a bad file fails the same with or without a cluster.
    names: list[str] = []
    targets: Assignment = {}
    if topics_file is not None and action == "generate":
        names = parse_topics_to_move(read_json(topics_file), topics_file)
    elif reassignment_file is not None and action != "list":
        targets = parse_reassignment(read_json(reassignment_file), reassignment_file)
    cluster = Cluster(client)
    try:
        if action == "generate":
            _generate(cluster, names, brokers or [])
        elif action == "execute":
            _execute(cluster, targets, additional, throttle)
        elif action == "verify":
            _verify(cluster, targets)
        elif action == "cancel":
            _cancel(cluster, targets)
        else:
            _list(cluster)
    finally:
        cluster.close()


def _generate(cluster: Cluster, names: list[str], brokers: list[int]) -> None:
    current = current_assignment(cluster, names)  # also learns the live brokers
    unknown = [b for b in brokers if b not in cluster.brokers]
    if unknown:
        raise CommandError(f"broker(s) {','.join(map(str, unknown))} of --broker-list "
                                   "are not in the cluster")
    try:
        proposed = propose(current, brokers)
    except KafkaError as e:
        raise CommandError(str(e)) from None
    click.echo(f"Current partition replica assignment\n{format_reassignment(current)}\n")
    click.echo(f"Proposed partition reassignment configuration\n{format_reassignment(proposed)}")


def _execute(cluster: Cluster, targets: Assignment, additional: bool, throttle: int | None) -> None:
    current = _current_of(cluster, targets)
    if not additional and ongoing(cluster):
        raise CommandError("Cannot execute because there is an existing partition assignment. "
                                   "Use --additional to override this and create a new partition "
                                   "assignment in addition to the existing one.")
    click.echo(f"Current partition replica assignment\n\n{format_reassignment(current)}\n\n"
               "Save this to use as the --reassignment-json-file option during rollback")
    if throttle is not None:
        click.echo("Warning: --throttle is not implemented by strom reassign-partitions yet and is "
                   "ignored: the move is not throttled.", err=True)
    results = alter(cluster, targets)
    started = [tp for tp in sorted(targets) if results[tp].error_code == ErrorCode.NONE]
    if started:
        click.echo(f"Successfully started partition reassignment{'s' if len(started) > 1 else ''} "
                   f"for {','.join(map(tp_name, started))}")
    failed = [tp for tp in sorted(targets) if tp not in started]
    for tp in failed:
        click.echo(f"Error reassigning partition {tp_name(tp)}: {_failure(tp, results[tp])}", err=True)
    if failed:
        sys.exit(1)


def _verify(cluster: Cluster, targets: Assignment) -> None:
    moving = ongoing(cluster, targets)
    current = _current_of(cluster, targets)
    # The bootstrap server's metadata may trail the controller by a moment after a move ends.
    deadline = time.monotonic() + METADATA_LAG_S
    while any(current[tp] != r for tp, r in targets.items() if tp not in moving) and time.monotonic() < deadline:
        time.sleep(0.2)
        current = _current_of(cluster, targets)
    click.echo("Status of partition reassignment:")
    for tp, replicas in sorted(targets.items()):
        if tp in moving:
            click.echo(f"Reassignment of partition {tp_name(tp)} is still in progress.")
        elif current[tp] == replicas:
            click.echo(f"Reassignment of partition {tp_name(tp)} is completed.")
        else:
            click.echo(f"There is no active reassignment of partition {tp_name(tp)}, but replica set is "
                       f"{','.join(map(str, current[tp]))} rather than {','.join(map(str, replicas))}.")


def _cancel(cluster: Cluster, targets: Assignment) -> None:
    results = alter(cluster, dict.fromkeys(targets))
    cancelled = [tp for tp in sorted(targets) if results[tp].error_code == ErrorCode.NONE]
    failed = [tp for tp in sorted(targets) if results[tp].error_code not in (
        ErrorCode.NONE, ErrorCode.NO_REASSIGNMENT_IN_PROGRESS)]
    if cancelled:
        click.echo(f"Successfully cancelled partition reassignment{'s' if len(cancelled) > 1 else ''} "
                   f"for: {','.join(map(tp_name, cancelled))}")
    elif not failed:
        click.echo("None of the specified partition reassignments are active.")
    for tp in failed:
        click.echo(f"Error cancelling the reassignment of partition {tp_name(tp)}: "
                   f"{_failure(tp, results[tp])}", err=True)
    if failed:
        sys.exit(1)


def _list(cluster: Cluster) -> None:
    moving = ongoing(cluster)
    if not moving:
        click.echo("No partition reassignments found.")
        return
    click.echo("Current partition reassignments:")
    for tp, entry in sorted(moving.items()):
        adding = f" adding: {','.join(map(str, entry.adding_replicas))}." if entry.adding_replicas else ""
        removing = f" removing: {','.join(map(str, entry.removing_replicas))}." if entry.removing_replicas else ""
        click.echo(f"{tp_name(tp)}: replicas: {','.join(map(str, entry.replicas))}.{adding}{removing}")
