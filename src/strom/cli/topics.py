"""`strom topics create|list|describe|alter|delete`: topics from the command line, in the
manner of Kafka's kafka-topics.sh.

Like `strom groups` and `strom configs`, the commands speak the Kafka protocol, so they work
against any Kafka-compatible cluster: Metadata (and DescribeConfigs for `describe`) from the
bootstrap server; CreateTopics, CreatePartitions and DeleteTopics at the controller, asked
again elsewhere on NOT_CONTROLLER, as Kafka's admin client does.
"""

from __future__ import annotations

import base64
import re
import sys
import uuid
from collections.abc import Callable
from typing import Any

import click

from strom.cli.common import (
    ClientSettings,
    Cluster,
    CommandError,
    KafkaToolGroup,
    client_options,
    error_name,
    parse_key_values,
)
from strom.protocol.errors import ErrorCode

CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS, CREATE_PARTITIONS = 19, 20, 32, 37
TOPIC_RESOURCE, BROKER_RESOURCE, DYNAMIC_TOPIC_CONFIG = 2, 4, 1
TIMEOUT_MS = 30_000  # how long the controller may wait for new partitions' leaders (Kafka's default)


def _failure(topic: str, entry: Any) -> str:
    if entry.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return f"Topic '{topic}' does not exist."
    return entry.error_message or error_name(entry.error_code)


def parse_replica_assignment(text: str) -> list[list[int]]:
    """Kafka's `--replica-assignment` syntax: partitions separated by commas, each partition's
    broker ids (the preferred leader first) by colons: "1:2:3,2:3:1"."""
    out = []
    for index, part in enumerate(text.split(",")):
        try:
            replicas = [int(b) for b in part.split(":")]
        except ValueError:
            raise click.BadParameter(f"partition {index}: expected broker ids separated by colons, "
                                     f"got {part!r}") from None
        if len(set(replicas)) != len(replicas):
            raise click.BadParameter(f"partition {index} lists a broker twice: {part!r}")
        out.append(replicas)
    if len({len(r) for r in out}) > 1:
        raise click.BadParameter("all partitions must have the same number of replicas")
    return out


def _assignment_option(ctx: click.Context, param: click.Parameter,
                       value: str | None) -> list[list[int]] | None:
    return None if value is None else parse_replica_assignment(value)


def _config_option(ctx: click.Context, param: click.Parameter,
                   values: tuple[str, ...]) -> dict[str, str]:
    """`--config k=v`, repeatable; as in kafka-topics.sh the value is everything after the first
    `=`, commas included (cleanup.policy=compact,delete)."""
    return {k: v.strip() for k, v in parse_key_values(values, "--config").items()}


class TopicsGroup(KafkaToolGroup):
    """`strom topics SUBCOMMAND ...`, or kafka-topics.sh's `strom topics --ACTION ...`: Strom's
    subcommands take kafka-topics' options, so the flag just picks the subcommand."""

    action_flags = {"--create": "create", "--list": "list", "--describe": "describe",
                    "--alter": "alter", "--delete": "delete"}


def one_topic(argument: str | None, option: tuple[str, ...]) -> str:
    """The topic a command acts on, given as an argument (`create orders`) or as kafka-topics.sh
    has it (`create --topic orders`)."""
    names = list(dict.fromkeys([*([argument] if argument else []), *option]))
    if len(names) != 1:
        raise click.UsageError("name one topic: TOPIC or --topic TOPIC" if not names
                               else f"one topic at a time, got {', '.join(names)}")
    return names[0]


def topic_option(text: str) -> Callable[[Callable], Callable]:
    return click.option("--topic", "topic_options", multiple=True, metavar="TOPIC", help=text)


@click.group(cls=TopicsGroup)
def topics() -> None:
    """Create, list, describe, alter and delete topics (like kafka-topics.sh).

    kafka-topics.sh's command lines work as they are: `--create`, `--list`, `--describe`,
    `--alter` or `--delete` anywhere on the line stands for the subcommand, and every
    subcommand takes the topic as `--topic TOPIC`.

    \b
    Examples:
      strom topics create orders --partitions 3
      strom topics --create --topic orders --partitions 3 --replication-factor 1
      strom topics --describe --topic orders --bootstrap-server 127.0.0.1:9092
    """


@topics.command()
@client_options()
@click.argument("topic", required=False)
@topic_option("The topic to create (instead of the TOPIC argument).")
@click.option("--partitions", type=int, default=-1,
              help="Number of partitions (default: the broker's num.partitions).")
@click.option("--replication-factor", type=int, default=-1,
              help="Replicas of each partition (default: the broker's default.replication.factor).")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", callback=_config_option,
              help="A topic config, e.g. --config retention.ms=86400000 (repeatable).")
@click.option("--replica-assignment", "assignment", metavar="B:B:B,B:B:B", callback=_assignment_option,
              help="Brokers of each partition: partitions separated by commas, replicas by colons "
                   "(instead of --partitions and --replication-factor).")
@click.option("--if-not-exists", is_flag=True, help="Succeed quietly if the topic exists.")
def create(client: ClientSettings, topic: str | None, topic_options: tuple[str, ...], partitions: int,
           replication_factor: int, configs: dict[str, str], assignment: list[list[int]] | None,
           if_not_exists: bool) -> None:
    """Create a topic.

    \b
    Example:
      strom topics create orders --partitions 6 --replication-factor 3 --config retention.ms=86400000
      strom topics create pinned --replica-assignment 1:2:3,2:3:1
      strom topics --create --topic orders --partitions 6    # as kafka-topics.sh
    """
    topic = one_topic(topic, topic_options)
    if assignment is not None and (partitions != -1 or replication_factor != -1):
        raise click.UsageError("--replica-assignment cannot be used with --partitions or "
                               "--replication-factor")
    cluster = Cluster(client)
    try:
        entry = cluster.at_controller(CREATE_TOPICS, 5, {"topics": [{
            "name": topic, "num_partitions": partitions, "replication_factor": replication_factor,
            "assignments": [{"partition_index": i, "broker_ids": r}
                            for i, r in enumerate(assignment or [])],
            "configs": [{"name": k, "value": v} for k, v in configs.items()],
        }], "timeout_ms": TIMEOUT_MS, "validate_only": False}, lambda body: body.topics[0])
    finally:
        cluster.close()
    if entry.error_code == ErrorCode.TOPIC_ALREADY_EXISTS and if_not_exists:
        return
    if entry.error_code != ErrorCode.NONE:
        raise CommandError(_failure(topic, entry))
    click.echo(f"Created topic {topic}.")


@topics.command("list")
@client_options()
@topic_option("Only this topic, if it exists (repeatable).")
@click.option("--exclude-internal", is_flag=True, help="Leave out internal topics (__consumer_offsets, ...).")
def list_topics(client: ClientSettings, topic_options: tuple[str, ...], exclude_internal: bool) -> None:
    """The topics of the cluster, one per line.

    \b
    Example:
      strom topics list --exclude-internal --bootstrap-server 127.0.0.1:9092
    """
    cluster = Cluster(client)
    try:
        body = cluster.metadata(sorted(set(topic_options)) if topic_options else None)
    finally:
        cluster.close()
    for t in sorted(body.topics, key=lambda t: t.name):
        if t.error_code == ErrorCode.NONE and not (exclude_internal and t.is_internal):
            click.echo(t.name)


def format_topic_id(topic_id: uuid.UUID | None) -> str:
    """Kafka's Uuid.toString: url-safe base64 of the 16 bytes, without padding."""
    if topic_id is None:
        return ""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?+[]()|^$\\{},")


def _topic_pattern(text: str) -> re.Pattern:
    """kafka-topics' topic list: a regular expression, commas as alternatives."""
    try:
        return re.compile("|".join(part.strip() for part in text.split(",")))
    except re.error as e:
        raise click.BadParameter(f"{text!r} is not a regular expression: {e}", param_hint="'--topic'") from None


def _topic_configs(cluster: Cluster, names: list[str], every: bool = False) -> dict[str, list[str]]:
    """The configs set on each topic (DYNAMIC_TOPIC_CONFIG; with `every`, all of its effective
    configs), as `k=v` strings."""
    if not names:
        return {}
    body = cluster.call(DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": TOPIC_RESOURCE, "resource_name": n, "configuration_keys": None}
                      for n in names],
        "include_synonyms": False, "include_documentation": False})
    return {r.resource_name: [f"{c.name}={c.value}" for c in r.configs
                              if every or c.config_source == DYNAMIC_TOPIC_CONFIG]
            for r in body.results if r.error_code == ErrorCode.NONE}


def _iceberg_tables(cluster: Cluster, names: list[str], configs: dict[str, list[str]]) -> dict[str, str]:
    """The summary line's end for each topic with an iceberg.mode: its table
    `<iceberg.namespace>.<topic>` and, in a schema mode, its dead-letter table; the namespace
    asked of a broker (one DescribeConfigs, only when such a topic is described)."""
    modes = {n: c.split("=", 1)[1] for n in names for c in configs.get(n, ()) if c.startswith("iceberg.mode=")}
    wanted = {n: mode for n, mode in modes.items() if mode != "disabled"}
    if not wanted or not cluster.brokers:
        return {}
    body = cluster.call(DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": BROKER_RESOURCE, "resource_name": str(min(cluster.brokers)),
                       "configuration_keys": ["iceberg.namespace"]}],
        "include_synonyms": False, "include_documentation": False})
    namespace = next((c.value for r in body.results if r.error_code == ErrorCode.NONE for c in r.configs
                      if c.name == "iceberg.namespace" and c.value), "strom")
    return {n: f"\tIcebergTable: {namespace}.{n}" + (f"\tDeadLetterTable: {namespace}.{n}~dlq"
                                                      if mode != "key_value" else "")
            for n, mode in wanted.items()}


@topics.command()
@client_options()
@click.argument("arguments", metavar="[TOPIC]...", nargs=-1)
@click.option("--topic", "names", multiple=True, help="Only this topic (repeatable; default: all).")
@click.option("--exclude-internal", is_flag=True, help="Leave out internal topics.")
@click.option("--under-replicated-partitions", "under_replicated", is_flag=True,
              help="Only partitions whose ISR is smaller than their replica list.")
@click.option("--unavailable-partitions", "unavailable", is_flag=True,
              help="Only partitions without a leader, or whose leader is not a live broker.")
@click.option("--under-min-isr-partitions", "under_min_isr", is_flag=True,
              help="Only partitions whose ISR is smaller than the topic's min.insync.replicas.")
@click.option("--at-min-isr-partitions", "at_min_isr", is_flag=True,
              help="Only partitions whose ISR is exactly the topic's min.insync.replicas.")
@click.option("--topics-with-overrides", "with_overrides", is_flag=True,
              help="Only the summary lines of topics with configs of their own.")
def describe(client: ClientSettings, arguments: tuple[str, ...], names: tuple[str, ...],
             exclude_internal: bool, under_replicated: bool, unavailable: bool, under_min_isr: bool,
             at_min_isr: bool, with_overrides: bool) -> None:
    """Partitions, leaders, replicas and ISR of topics, in kafka-topics.sh's format.

    A --topic is a regular expression, matched against whole names, as kafka-topics reads it
    ("orders.*"; a comma separates alternatives). With --under-replicated-partitions,
    --unavailable-partitions, --under-min-isr-partitions or --at-min-isr-partitions only the
    matching partitions are shown, without the topics' summary lines; with
    --topics-with-overrides only the summary lines of topics that set configs.

    A tiered topic's partitions (remote.storage.enable=true) show their size on the leader's
    disk (LocalSize), in remote storage (RemoteSize, RemoteSegments: the finished copies
    `__remote_log_metadata` lists), the log start offset and the first offset kept locally.
    An Iceberg topic's summary line names its table and dead-letter table (its translation lag
    is each partition leader's strom_iceberg_translation_lag_* metrics).

    \b
    Example:
      strom topics describe --topic orders
      strom topics describe --under-replicated-partitions
    """
    names = (*arguments, *names)
    patterns = [_topic_pattern(n) for n in names if _is_pattern(n)]
    exact = sorted({n for n in names if not _is_pattern(n)})
    cluster = Cluster(client)
    try:
        body = cluster.metadata(None if patterns or not exact else exact)
        found = []
        for t in sorted(body.topics, key=lambda t: t.name):
            if names and t.name not in exact and not any(p.fullmatch(t.name) for p in patterns):
                continue
            if t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise CommandError(f"Topic '{t.name}' does not exist.")
            if t.error_code != ErrorCode.NONE:
                raise CommandError(f"describing topic '{t.name}' failed: "
                                           f"{error_name(t.error_code)}")
            if not (exclude_internal and t.is_internal):
                found.append(t)
        if patterns and not found and not exact:
            raise CommandError(f"Topic '{','.join(names)}' does not exist as expected")
        filtered = under_replicated or unavailable or under_min_isr or at_min_isr
        every = _topic_configs(cluster, [t.name for t in found], every=True) if under_min_isr or at_min_isr else {}
        configs = {} if filtered else _topic_configs(cluster, [t.name for t in found])
        iceberg = _iceberg_tables(cluster, [t.name for t in found], configs)
        tiered_topics = [t for t in found if "remote.storage.enable=true" in configs.get(t.name, ())]
        tiered = {}
        if tiered_topics:  # only then loaded: strom.cli.tiered imports remote storage's modules
            from strom.cli.tiered import tiered_partitions

            tiered = tiered_partitions(cluster, tiered_topics)
    finally:
        cluster.close()
    live = set(cluster.brokers)
    for t in found:
        if with_overrides and not configs.get(t.name):
            continue
        partitions = sorted(t.partitions, key=lambda p: p.partition_index)
        min_isr = int(dict(c.split("=", 1) for c in every.get(t.name, ())).get("min.insync.replicas", 1))
        if not filtered:
            factor = len(partitions[0].replica_nodes) if partitions else 0
            click.echo(f"Topic: {t.name}\tTopicId: {format_topic_id(t.topic_id)}"
                       f"\tPartitionCount: {len(partitions)}\tReplicationFactor: {factor}"
                       f"\tConfigs: {','.join(configs.get(t.name, []))}"
                       + iceberg.get(t.name, ""))
        for p in partitions:
            is_under = len(p.isr_nodes) < len(p.replica_nodes)
            is_unavailable = p.leader_id < 0 or p.leader_id not in live
            if ((under_replicated and not is_under) or (unavailable and not is_unavailable)
                    or (under_min_isr and not len(p.isr_nodes) < min_isr)
                    or (at_min_isr and len(p.isr_nodes) != min_isr) or with_overrides):
                continue
            leader = p.leader_id if p.leader_id >= 0 else "none"
            click.echo(f"\tTopic: {t.name}\tPartition: {p.partition_index}\tLeader: {leader}"
                       f"\tReplicas: {','.join(map(str, p.replica_nodes))}"
                       f"\tIsr: {','.join(map(str, p.isr_nodes))}"
                       + (sizes.describe() if (sizes := tiered.get((t.name, p.partition_index))) else ""))


@topics.command()
@client_options()
@click.argument("topic", required=False)
@topic_option("The topic to alter (instead of the TOPIC argument).")
@click.option("--partitions", type=int, required=True, help="The new, larger number of partitions.")
@click.option("--if-exists", is_flag=True, help="Succeed quietly if the topic does not exist.")
def alter(client: ClientSettings, topic: str | None, topic_options: tuple[str, ...], partitions: int,
          if_exists: bool) -> None:
    """Add partitions to a topic (their number can only grow).

    \b
    Example:
      strom topics alter orders --partitions 12
      strom topics --alter --topic orders --partitions 12    # as kafka-topics.sh
    """
    topic = one_topic(topic, topic_options)
    cluster = Cluster(client)
    try:
        entry = cluster.at_controller(CREATE_PARTITIONS, 2, {
            "topics": [{"name": topic, "count": partitions, "assignments": None}],
            "timeout_ms": TIMEOUT_MS, "validate_only": False}, lambda body: body.results[0])
    finally:
        cluster.close()
    if entry.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and if_exists:
        return
    if entry.error_code != ErrorCode.NONE:
        raise CommandError(_failure(topic, entry))
    click.echo(f"Topic {topic} now has {partitions} partitions.")


@topics.command()
@client_options()
@click.argument("arguments", metavar="[TOPIC]...", nargs=-1)
@topic_option("A topic to delete (repeatable; instead of or beside TOPIC arguments).")
@click.option("--if-exists", is_flag=True, help="Skip topics that do not exist.")
def delete(client: ClientSettings, arguments: tuple[str, ...], topic_options: tuple[str, ...],
           if_exists: bool) -> None:
    """Delete topics with all their data.

    \b
    Example:
      strom topics delete orders payments
      strom topics --delete --topic orders    # as kafka-topics.sh
    """
    names = (*arguments, *topic_options)
    if not names:
        raise click.UsageError("name the topics to delete: TOPIC... or --topic TOPIC")
    cluster = Cluster(client)
    failed = False
    try:
        for topic in dict.fromkeys(names):
            entry = cluster.at_controller(DELETE_TOPICS, 4, {
                "topic_names": [topic], "timeout_ms": TIMEOUT_MS}, lambda body: body.responses[0])
            if entry.error_code == ErrorCode.NONE:
                click.echo(f"Deleted topic {topic}.")
            elif not (entry.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and if_exists):
                failed = True
                click.echo(f"Error: {_failure(topic, entry)}", err=True)
    finally:
        cluster.close()
    if failed:
        sys.exit(1)
