"""`strom transactions`: find and recover hanging transactions, in the manner of Kafka's
kafka-transactions.sh (the same subcommands, options and tables).

list: ListTransactions at every broker (each coordinates some transactional ids); describe:
DescribeTransactions at the id's coordinator; describe-producers: DescribeProducers at a
partition's leader (or a given replica); find-hanging: producers with a transaction open on a
partition for longer than the longest transaction timeout whose coordinator does not count
that partition in the transaction; abort: WriteTxnMarkers (an abort marker) at the leader.
"""

from __future__ import annotations

import time
from typing import Any

import click

from strom.cli.admin_common import group_client, topic_option, tp_name
from strom.cli.common import (
    ClientSettings,
    Cluster,
    Command,
    CommandError,
    Group,
    TopicPartition,
    client_options,
    error_text,
)
from strom.protocol.errors import ErrorCode

FIND_COORDINATOR, WRITE_TXN_MARKERS = 10, 27
DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 61, 65, 66
TRANSACTION_KEY = 1  # FindCoordinator's key type of a transactional id


def pretty_table(headers: list[str], rows: list[list[Any]]) -> str:
    """Kafka's transactions table: each cell padded to its column's width, then a tab."""
    widths = [max([len(h), *(len(str(r[i])) for r in rows)]) for i, h in enumerate(headers)]
    return "\n".join("".join(str(cell).ljust(w) + "\t" for cell, w in zip(row, widths, strict=True))
                     for row in [headers, *rows])


@click.group(cls=Group)
@client_options()
@click.pass_context
def transactions(ctx: click.Context, client: ClientSettings) -> None:
    """Transactions and their producers (like kafka-transactions): list, describe,
    describe-producers, find-hanging, abort. --bootstrap-server and --command-config may come
    before the subcommand, as Kafka's tool takes them, or after it.

    \b
    Examples:
      strom transactions --bootstrap-server 127.0.0.1:9092 list
      strom transactions describe --transactional-id payments-1
      strom transactions find-hanging --broker-id 1
      strom transactions abort --topic orders --partition 0 --start-offset 1234
    """
    ctx.obj = client


def _listings(cluster: Cluster, producer_ids: list[int] | None = None, duration_ms: int = -1,
              pattern: str | None = None) -> list[tuple[int, Any]]:
    """(coordinator id, listing) of every transactional id, asking each broker; `duration_ms`:
    only transactions running for longer (v1, KIP-994); `pattern`: only ids the regular
    expression matches whole (v2, KIP-1152)."""
    out = []
    cluster.metadata([])
    # The oldest version that carries the filters asked for: brokers before Kafka 3.8 know only
    # v0, before 4.1 not v2.
    version = 2 if pattern else 0 if duration_ms < 0 else 1
    for broker_id in sorted(cluster.brokers):
        body = cluster.broker(broker_id).call(LIST_TRANSACTIONS, version, {
            "state_filters": [], "producer_id_filters": producer_ids or [], "duration_filter": duration_ms,
            "transactional_id_pattern": pattern})
        if body.error_code != ErrorCode.NONE:
            raise CommandError(f"Failed to list transactions: {error_text(body.error_code)}")
        out.extend((broker_id, s) for s in sorted(body.transaction_states, key=lambda s: s.transactional_id))
    return out


@transactions.command("list", cls=Command)
@client_options()
@click.option("--duration-filter", type=click.IntRange(0, 2**63 - 1), metavar="MS",
              help="Only transactions running for longer than this many milliseconds.")
@click.option("--transactional-id-pattern", metavar="REGEX",
              help="Only transactional ids this regular expression matches whole (Kafka 4.1+ brokers).")
def list_(client: ClientSettings, duration_filter: int | None, transactional_id_pattern: str | None) -> None:
    """Every transactional id, its coordinator, producer id and state.

    \b
    Example:
      strom transactions list --transactional-id-pattern 'payments-.*'
    """
    with Cluster(group_client(client)) as cluster:
        rows = [[s.transactional_id, broker_id, s.producer_id, s.transaction_state]
                for broker_id, s in _listings(cluster, duration_ms=-1 if duration_filter is None else duration_filter,
                                              pattern=transactional_id_pattern)]
    click.echo(pretty_table(["TransactionalId", "Coordinator", "ProducerId", "TransactionState"], rows))


def _describe(cluster: Cluster, transactional_id: str) -> tuple[int, Any]:
    """(coordinator id, DescribeTransactions state) of one transactional id."""
    body = cluster.call(FIND_COORDINATOR, 3, {"key": transactional_id, "key_type": TRANSACTION_KEY})
    if body.error_code != ErrorCode.NONE:
        raise CommandError(f"Failed to describe transaction state of transactional-id `{transactional_id}`: "
                           f"{error_text(body.error_code, body.error_message)}")
    conn = cluster.connection(body.host, body.port)
    state = conn.call(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [transactional_id]}).transaction_states[0]
    return body.node_id, state


@transactions.command(cls=Command)
@client_options()
@click.option("--transactional-id", required=True, help="The transactional id.")
def describe(client: ClientSettings, transactional_id: str) -> None:
    """The state of one transactional id at its coordinator."""
    with Cluster(group_client(client)) as cluster:
        coordinator, s = _describe(cluster, transactional_id)
    if s.error_code != ErrorCode.NONE:
        raise CommandError(f"Failed to describe transaction state of transactional-id `{transactional_id}`: "
                           f"{error_text(s.error_code)}")
    started = s.transaction_start_time_ms
    partitions = ",".join(f"{t.topic}-{p}" for t in s.topics for p in t.partitions)
    row = [coordinator, transactional_id, s.producer_id, s.producer_epoch, s.transaction_state,
           s.transaction_timeout_ms, started if started >= 0 else "None",
           int(time.time() * 1000) - started if started >= 0 else "None", partitions]
    click.echo(pretty_table(["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                             "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                             "TopicPartitions"], [row]))


def producers(cluster: Cluster, partitions: list[TopicPartition], broker_id: int | None) -> dict[TopicPartition, list]:
    """The active producers of each partition, asked of its leader (or of `broker_id`)."""
    meta = cluster.metadata(sorted({t for t, _ in partitions}))
    leaders = {(t.name, p.partition_index): p.leader_id for t in meta.topics for p in t.partitions}
    by_broker: dict[int, dict[str, list[int]]] = {}
    for tp in partitions:
        target = broker_id if broker_id is not None else leaders.get(tp)
        if target is None or target not in cluster.brokers:
            where = f"broker {broker_id}" if broker_id is not None else "leader"
            code = ErrorCode.LEADER_NOT_AVAILABLE if tp in leaders else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            raise CommandError(f"Failed to describe producers for partition {tp_name(tp)} on {where}: "
                               f"{error_text(code)}")
        by_broker.setdefault(target, {}).setdefault(tp[0], []).append(tp[1])
    out = {}
    for target, topics in by_broker.items():
        body = cluster.broker(target).call(DESCRIBE_PRODUCERS, 0, {
            "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]})
        for t in body.topics:
            for p in t.partitions:
                if p.error_code != ErrorCode.NONE:
                    raise CommandError(f"Failed to describe producers for partition {t.name}-{p.partition_index} "
                                       f"on broker {target}: {error_text(p.error_code, p.error_message)}")
                out[(t.name, p.partition_index)] = list(p.active_producers)
    return out


@transactions.command("describe-producers", cls=Command)
@client_options()
@click.option("--topic", required=True, callback=topic_option, help="Topic name.")
@click.option("--partition", required=True, type=click.IntRange(0, 2**31 - 1), help="Partition number.")
@click.option("--broker-id", type=int, help="Ask this replica rather than the leader.")
def describe_producers(client: ClientSettings, topic: str, partition: int, broker_id: int | None) -> None:
    """The producers a partition remembers: epochs, last sequence, open transaction."""
    with Cluster(group_client(client)) as cluster:
        found = producers(cluster, [(topic, partition)], broker_id)[(topic, partition)]
    rows = [[p.producer_id, p.producer_epoch, p.coordinator_epoch, p.last_sequence, p.last_timestamp,
             p.current_txn_start_offset if p.current_txn_start_offset >= 0 else "None"] for p in found]
    click.echo(pretty_table(["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                             "CurrentTransactionStartOffset"], rows))


@transactions.command("find-hanging", cls=Command)
@client_options()
@click.option("--broker-id", type=int, help="Search the partitions this broker has a replica of.")
@click.option("--topic", callback=topic_option, help="Search this topic's partitions.")
@click.option("--partition", type=click.IntRange(0, 2**31 - 1), help="Only this partition (with --topic).")
@click.option("--max-transaction-timeout", type=click.IntRange(0, 2**31 - 1), default=15, show_default=True,
              help="The longest transaction timeout, in minutes: transactions open for longer are suspects.")
def find_hanging(client: ClientSettings, broker_id: int | None, topic: str | None, partition: int | None,
                 max_transaction_timeout: int) -> None:
    """Transactions left open on a partition that their coordinator no longer completes."""
    if topic is None and broker_id is None:
        raise click.UsageError("The `find-hanging` command requires either --topic or --broker-id to limit the "
                               "scope of the search")
    if partition is not None and topic is None:
        raise click.UsageError("The --partition argument requires --topic to be provided")
    with Cluster(group_client(client)) as cluster:
        if topic is not None and partition is not None:
            searched = [(topic, partition)]
        else:
            meta = cluster.metadata([topic] if topic is not None else None)
            missing = [t.name for t in meta.topics if t.error_code != ErrorCode.NONE]
            if missing:
                raise CommandError(f"Failed to describe topics {', '.join(missing)}: "
                                   f"{error_text(meta.topics[0].error_code)}")
            searched = sorted((t.name, p.partition_index) for t in meta.topics for p in t.partitions
                              if broker_id is None or broker_id in p.replica_nodes)
        now = int(time.time() * 1000)
        limit_ms = max_transaction_timeout * 60_000
        open_txns = [(tp, p) for tp, states in producers(cluster, searched, broker_id).items() for p in states
                     if p.current_txn_start_offset >= 0 and now - p.last_timestamp > limit_ms]
        hanging = []
        if open_txns:
            ids = {s.producer_id: s.transactional_id
                   for _, s in _listings(cluster, sorted({p.producer_id for _, p in open_txns}))}
            described = {i: _describe(cluster, i)[1] for i in set(ids.values())}
            for tp, p in open_txns:
                state = described.get(ids.get(p.producer_id, ""))
                if state is None or state.error_code != ErrorCode.NONE:
                    hanging.append((tp, p))
                elif not any(t.topic == tp[0] and tp[1] in t.partitions for t in state.topics):
                    hanging.append((tp, p))
    rows = [[t, i, p.producer_id, p.producer_epoch, p.coordinator_epoch, p.current_txn_start_offset,
             p.last_timestamp, (now - p.last_timestamp) // 60_000] for (t, i), p in sorted(hanging, key=lambda h: h[0])]
    click.echo(pretty_table(["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                             "LastTimestamp", "Duration(min)"], rows))


@transactions.command(cls=Command)
@client_options()
@click.option("--topic", required=True, callback=topic_option, help="Topic name.")
@click.option("--partition", required=True, type=click.IntRange(0, 2**31 - 1), help="Partition number.")
@click.option("--start-offset", type=click.IntRange(0, 2**63 - 1), help="The first offset of the transaction to abort.")
@click.option("--producer-id", type=click.IntRange(0, 2**63 - 1), help="Instead of --start-offset: the producer id ...")
@click.option("--producer-epoch", type=click.IntRange(0, 2**15 - 1), help="... its epoch ...")
@click.option("--coordinator-epoch", type=click.IntRange(-1, 2**31 - 1), help="... and the coordinator epoch.")
def abort(client: ClientSettings, topic: str, partition: int, start_offset: int | None, producer_id: int | None,
          producer_epoch: int | None, coordinator_epoch: int | None) -> None:
    """Abort a hanging transaction on one partition: an abort marker is written there, so
    read_committed consumers move past it. Only for transactions find-hanging reports."""
    tp = (topic, partition)
    if start_offset is None and producer_id is None:
        raise click.UsageError("The transaction to abort must be identified either with --start-offset or with "
                               "--producer-id, --producer-epoch, and --coordinator-epoch")
    with Cluster(group_client(client)) as cluster:
        if start_offset is not None:
            found = [p for p in producers(cluster, [tp], None)[tp] if p.current_txn_start_offset == start_offset]
            if not found:
                raise CommandError(f"Could not find any open transactions starting at offset {start_offset} on "
                                   f"partition {tp_name(tp)}")
            producer_id, producer_epoch, coordinator_epoch = (found[0].producer_id, found[0].producer_epoch,
                                                              found[0].coordinator_epoch)
        elif producer_epoch is None or coordinator_epoch is None:
            raise click.UsageError("--producer-id needs --producer-epoch and --coordinator-epoch")
        meta = cluster.metadata([topic])
        leader = next((p.leader_id for t in meta.topics for p in t.partitions if p.partition_index == partition), None)
        if leader is None or leader not in cluster.brokers:
            raise CommandError(f"Failed to abort transaction on {tp_name(tp)}: no leader")
        body = cluster.broker(leader).call(WRITE_TXN_MARKERS, 1, {"markers": [{
            "producer_id": producer_id, "producer_epoch": producer_epoch, "transaction_result": False,
            "topics": [{"name": topic, "partition_indexes": [partition]}],
            # A transaction hung before its first marker has coordinator epoch -1: 0 is at
            # or below every real one.
            "coordinator_epoch": max(coordinator_epoch or 0, 0)}]})
    errors = [p.error_code for m in body.markers for t in m.topics for p in t.partitions if p.error_code]
    if errors:
        raise CommandError(f"Failed to abort transaction of producer {producer_id} on {tp_name(tp)}: "
                           f"{error_text(errors[0])}")
