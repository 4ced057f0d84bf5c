"""`strom log-dirs --describe` and `strom delete-records`, in the manner of Kafka's
kafka-log-dirs.sh (its JSON, with the same keys in the same order) and kafka-delete-records.sh
(its offset JSON file and its lines): DescribeLogDirs to each broker, DeleteRecords to each
partition's leader.
"""

from __future__ import annotations

import json
from typing import Any

import click

from strom.cli.admin_common import INT64_MAX, is_int, json_partition, read_json, tp_name
from strom.cli.common import (
    ClientSettings,
    Cluster,
    Command,
    CommandError,
    TopicPartition,
    client_options,
    error_name,
    error_text,
)
from strom.protocol.errors import ErrorCode

DELETE_RECORDS, DESCRIBE_LOG_DIRS = 21, 35
TIMEOUT_MS = 30_000
# The exception Kafka's tool names for a log dir that failed; other errors by their code's name.
_DIR_ERRORS = {ErrorCode.KAFKA_STORAGE_ERROR: "org.apache.kafka.common.errors.KafkaStorageException",
               ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
                   "org.apache.kafka.common.errors.ClusterAuthorizationException"}


def _id_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        return sorted({int(x) for x in value.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter(f"expected broker ids such as 0,1,2, got {value!r}") from None


def _dir_json(result: Any, topics: set[str], cordoned: bool | None = None) -> dict:
    """One log dir as Kafka prints it: its keys in the order Kafka's tool writes them."""
    partitions = [{"partition": f"{t.name}-{p.partition_index}", "size": p.partition_size,
                   "offsetLag": p.offset_lag, "isFuture": p.is_future_key}
                  for t in sorted(result.topics, key=lambda t: t.name) if not topics or t.name in topics
                  for p in sorted(t.partitions, key=lambda p: p.partition_index)]
    error = None
    if result.error_code != ErrorCode.NONE:
        error = _DIR_ERRORS.get(result.error_code, error_name(result.error_code))
    out = {"partitions": partitions, "error": error, "logDir": result.log_dir}
    if cordoned is not None:  # DescribeLogDirs v5 (KIP-1066)
        out["isCordoned"] = cordoned
    return out


def _describe(cluster: Cluster, broker_id: int) -> tuple[Any, int]:
    """DescribeLogDirs of one broker: v5 (which says which dirs are cordoned) where the broker
    speaks it, else v4."""
    connection = cluster.broker(broker_id)
    try:
        body = connection.call(DESCRIBE_LOG_DIRS, 5, {"topics": None})
        if body.error_code != ErrorCode.UNSUPPORTED_VERSION:
            return body, 5
    except CommandError:  # a broker that closes the connection on a version it does not know
        cluster.connections.pop(cluster.brokers[broker_id], None)
        connection = cluster.broker(broker_id)
    return connection.call(DESCRIBE_LOG_DIRS, 4, {"topics": None}), 4


@click.command("log-dirs", cls=Command)
@client_options()
@click.option("--describe", is_flag=True, required=True, help="Describe the brokers' log directories (required).")
@click.option("--broker-list", default="", callback=_id_list, metavar="ID,ID",
              help="Brokers to ask (default: every broker).")
@click.option("--topic-list", default="", metavar="TOPIC,TOPIC", help="Only these topics' partitions (default: all).")
def log_dirs(client: ClientSettings, describe: bool, broker_list: list[int], topic_list: str) -> None:
    """Each broker's log directories and the partitions in them, as kafka-log-dirs --describe
    prints them (one line of JSON after two progress lines), and whether each is cordoned
    (cordoned.log.dirs) where the broker says so.

    \b
    Examples:
      strom log-dirs --describe
      strom log-dirs --describe --broker-list 1,2 --topic-list orders,payments
    """
    topics = {t.strip() for t in topic_list.split(",") if t.strip()}
    with Cluster(client) as cluster:
        cluster.metadata([])
        known = sorted(cluster.brokers)
        missing = sorted(set(broker_list) - set(known))
        if missing:
            raise CommandError(f"The given brokers do not exist from --broker-list: "
                               f"{','.join(map(str, missing))}. Current existent brokers: "
                               f"{','.join(map(str, known))}")
        chosen = broker_list or known
        click.echo("Querying brokers for log directories information")
        brokers = []
        for broker_id in chosen:
            body, version = _describe(cluster, broker_id)
            if body.error_code != ErrorCode.NONE:
                raise CommandError(f"broker {broker_id}: {error_text(body.error_code)}")
            brokers.append({"broker": broker_id, "logDirs": [
                _dir_json(r, topics, r.is_cordoned if version >= 5 else None) for r in body.results]})
    click.echo(f"Received log directory information from brokers {','.join(map(str, chosen))}")
    click.echo(json.dumps({"brokers": brokers, "version": 1}, separators=(",", ":")))


def parse_offsets(data: Any, path: str) -> dict[TopicPartition, int]:
    """`{"partitions": [{"topic": "t", "partition": 0, "offset": 10}], "version": 1}` (offset -1:
    up to the high watermark); a partition listed twice is an error, as in Kafka."""
    if not isinstance(data, dict):
        raise CommandError(f"{path}: The input string is not a valid JSON object")
    if data.get("version", 1) != 1:
        raise CommandError(f"{path}: Not supported version field value {data['version']!r}")
    items = data.get("partitions")
    if not isinstance(items, list):
        raise CommandError(f"{path}: Missing partitions field")
    out: dict[TopicPartition, int] = {}
    duplicates = set()
    for item in items:
        if not isinstance(item, dict):
            raise CommandError(f'{path}: each partition needs "topic", "partition" and "offset", '
                               f"got {json.dumps(item)[:300]}")
        tp = json_partition(item, path)
        offset = item.get("offset")
        if not is_int(offset) or not -1 <= offset <= INT64_MAX:
            raise CommandError(f'{path}: "offset" of {tp_name(tp)} must be an offset (or -1), got {json.dumps(offset)}')
        if tp in out:
            duplicates.add(tp)
        out[tp] = offset
    if duplicates:
        raise CommandError("Offset json file contains duplicate topic partitions: "
                           + ",".join(map(tp_name, sorted(duplicates))))
    return out


def delete_at_leaders(cluster: Cluster, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
    """DeleteRecords at each partition's leader: (error code, new low watermark) per partition."""
    return cluster.at_leaders(
        offsets, lambda tp, offset: {"partition_index": tp[1], "offset": offset},
        lambda conn, topics: conn.call(DELETE_RECORDS, 2, {"topics": topics, "timeout_ms": TIMEOUT_MS},
                                       TIMEOUT_MS / 1000 + cluster.settings.timeout_s),
        lambda p: (p.error_code, p.low_watermark), lambda code: (code, -1), lambda r: r[0])


@click.command("delete-records", cls=Command)
@client_options()
@click.option("--offset-json-file", required=True, metavar="FILE",
              help='{"partitions": [{"topic": "foo", "partition": 1, "offset": 1}], "version": 1}: '
                   "delete each partition's records below its offset (-1: below the high watermark).")
def delete_records(client: ClientSettings, offset_json_file: str) -> None:
    """Delete records below an offset (like kafka-delete-records): each partition's log start
    moves up to it. A partition that failed is named on its own line and makes the command fail.

    \b
    Example:
      strom delete-records --offset-json-file offsets.json
    """
    offsets = parse_offsets(read_json(offset_json_file), offset_json_file)
    if not offsets:
        raise CommandError(f"{offset_json_file}: the partition list is empty")
    with Cluster(client) as cluster:
        click.echo("Executing records delete operation")
        results = delete_at_leaders(cluster, offsets)
    click.echo("Records delete operation completed:")
    for tp, (code, low) in sorted(results.items()):
        if code == ErrorCode.NONE:
            click.echo(f"partition: {tp_name(tp)}\tlow_watermark: {low}")
        else:
            click.echo(f"partition: {tp_name(tp)}\terror: {error_text(code)}")
    failed = sorted(tp for tp, (code, _) in results.items() if code != ErrorCode.NONE)
    if failed:
        raise CommandError(f"deleting records failed for {', '.join(map(tp_name, failed))}")
