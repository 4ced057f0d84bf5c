"""`strom get-offsets`: the earliest, latest or by-time offset of partitions, in the manner of
Kafka's kafka-get-offsets.sh (`topic:partition:offset` lines), asked of each partition's leader
with ListOffsets.
"""

from __future__ import annotations

import re

import click

from strom.cli.common import (
    EARLIEST,
    LATEST,
    MAX_TIMESTAMP,
    ClientSettings,
    Cluster,
    Command,
    CommandError,
    TopicPartition,
    client_options,
    error_name,
    parse_timestamp,
    parse_topic_partitions,
)
from strom.protocol.errors import ErrorCode

NAMED_TIMES = {"latest": LATEST, "earliest": EARLIEST, "max-timestamp": MAX_TIMESTAMP}


def parse_time(text: str) -> int:
    """--time: latest (-1), earliest (-2), max-timestamp (-3), ms since the epoch or a date-time
    (the numbers -1, -2 and -3 are ListOffsets' own codes for the first three)."""
    return NAMED_TIMES.get(text.strip().lower()) or parse_timestamp(text)


def select(topics: dict[str, list[int]], internal: set[str], topic: str | None,
           partitions: list[int] | None, topic_partitions: str | None,
           exclude_internal: bool) -> list[TopicPartition]:
    """The partitions the filters pick: `topic` is a regular expression matching whole names
    (none: every topic), `partitions` a list of numbers, `topic_partitions` Kafka's
    comma-separated `regex[:partition[-partition]]` entries."""
    if topic_partitions is not None:
        filters = []
        for entry in topic_partitions.split(","):
            name, wanted = parse_topic_partitions(entry.strip()) if entry.strip() else ("", None)
            filters.append((_regex(name or ".*"), wanted))
    else:
        filters = [(_regex(topic or ".*"), partitions)]
    out = set()
    for pattern, wanted in filters:
        for name, numbers in topics.items():
            if (exclude_internal and name in internal) or not pattern.fullmatch(name):
                continue
            out.update((name, p) for p in numbers if wanted is None or p in wanted)
    return sorted(out)


def _regex(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as e:
        raise click.BadParameter(f"{text!r} is not a regular expression: {e}") from None


def _partition_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    return parse_topic_partitions(f"t:{value}")[1]


@click.command("get-offsets", cls=Command)
@client_options()
@click.option("--topic", metavar="REGEX", help="Topics whose whole name matches (default: all).")
@click.option("--partitions", callback=_partition_list, metavar="P,P-P",
              help="Only these partitions, e.g. 0,2,4-7 (with --topic).")
@click.option("--topic-partitions", metavar="REGEX[:P[-P]],...",
              help="Topic-partition filters, e.g. 'orders:0-2,payments' (instead of --topic and "
                   "--partitions).")
@click.option("--time", "when", default="latest", show_default=True, metavar="TIME",
              help="latest (-1), earliest (-2), max-timestamp (-3), ms since the epoch, or an "
                   "ISO-8601 date-time such as 2024-05-01T12:00:00 (local time without a zone): "
                   "the first offset at or after it.")
@click.option("--exclude-internal-topics", is_flag=True, help="Leave out __consumer_offsets and friends.")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
              default="read_uncommitted", show_default=True,
              help="read_committed: latest means the last stable offset.")
def get_offsets(client: ClientSettings, topic: str | None, partitions: list[int] | None,
                topic_partitions: str | None, when: str, exclude_internal_topics: bool,
                isolation_level: str) -> None:
    """Offsets of partitions at a time, one `topic:partition:offset` line each (like
    kafka-get-offsets). By time or max-timestamp, a partition with no such record shows an
    empty offset.

    \b
    Example:
      strom get-offsets --topic orders
      strom get-offsets --topic orders --partitions 0,1 --time earliest
      strom get-offsets --topic 'orders|payments' --time 2024-05-01T12:00:00
      strom get-offsets --topic-partitions 'orders:0-2,payments' --time -3
    """
    if topic_partitions is not None and (topic is not None or partitions is not None):
        raise click.UsageError("--topic-partitions replaces --topic and --partitions")
    timestamp = parse_time(when)
    with Cluster(client) as cluster:
        meta = cluster.metadata(None)
        topics = {t.name: sorted(p.partition_index for p in t.partitions)
                  for t in meta.topics if t.error_code == ErrorCode.NONE}
        internal = {t.name for t in meta.topics if t.is_internal}
        chosen = select(topics, internal, topic, partitions, topic_partitions, exclude_internal_topics)
        if not chosen:
            raise CommandError("no topic partition matches the filters")
        listed = cluster.list_offsets(dict.fromkeys(chosen, timestamp),
                                      read_committed=isolation_level == "read_committed")
    failed = {tp: r for tp, r in listed.items() if r.error_code != ErrorCode.NONE}
    for (t, p), r in sorted(listed.items()):
        if (t, p) not in failed:
            click.echo(f"{t}:{p}:{r.offset if r.offset >= 0 else ''}")
    if failed:
        raise CommandError("no offsets for " + ", ".join(
            f"{t}:{p} ({error_name(r.error_code)})" for (t, p), r in sorted(failed.items())))
