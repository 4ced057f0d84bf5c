"""`strom consume`: records of topics to stdout, in the manner of Kafka's
kafka-console-consumer.sh (its formatter properties for keys, headers, timestamps, offsets), or
one JSON object per line.

It is a kafka-python consumer (a dependency of Strom already), so it works against any
Kafka-compatible cluster. Without `--group` it assigns itself the partitions and commits
nothing; with `--group` it joins that group and commits what it printed.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import click
from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition

from strom.cli.common import (
    ClientSettings,
    Command,
    CommandError,
    bytes_to_json,
    client_options,
    parse_key_values,
    parse_timestamp,
)

POLL_MS = 200  # how often the loop looks at --timeout-ms and --exit-at-end
JOIN_TIMEOUT_MS = 60_000  # the longest a group join is waited for before polling starts
MAX_POLL_RECORDS = 2000  # records handed over per poll: fewer, larger writes to stdout
TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


@dataclass
class TextFormat:
    """kafka-console-consumer's default formatter: which fields a line shows and the
    separators between them (`--property print.key=true`, ...)."""

    print_timestamp: bool = False
    print_partition: bool = False
    print_offset: bool = False
    print_headers: bool = False
    print_key: bool = False
    print_value: bool = True
    key_separator: bytes = b"\t"
    line_separator: bytes = b"\n"
    headers_separator: bytes = b","
    null_literal: bytes = b"null"

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> TextFormat:
        fmt = cls()
        for key, value in props.items():
            attr = key.replace(".", "_")
            if attr not in cls.__dataclass_fields__:
                raise click.BadParameter(
                    f"unknown property {key!r} (known: "
                    f"{', '.join(f.replace('_', '.') for f in cls.__dataclass_fields__)})",
                    param_hint="'--property'")
            current = getattr(fmt, attr)
            setattr(fmt, attr, value.strip().lower() == "true" if isinstance(current, bool)
                    else value.encode())
        return fmt

    @functools.cached_property
    def values_only(self) -> bool:  # looked at once per record: computed once
        return self.print_value and not (self.print_timestamp or self.print_partition or
                                         self.print_offset or self.print_headers or self.print_key)

    def __call__(self, r: Any) -> bytes:
        """One record as kafka-console-consumer prints it: the chosen columns separated by
        key.separator, then line.separator."""
        null = self.null_literal
        if self.values_only:  # the default: skip the general path, this is per record
            return (null if r.value is None else r.value) + self.line_separator
        columns = []
        if self.print_timestamp:
            kind = TIMESTAMP_TYPES.get(r.timestamp_type)
            columns.append(f"{kind}:{r.timestamp}".encode() if kind else b"NO_TIMESTAMP")
        if self.print_partition:
            columns.append(b"Partition:%d" % r.partition)
        if self.print_offset:
            columns.append(b"Offset:%d" % r.offset)
        if self.print_headers:
            columns.append(self.headers_separator.join(
                k.encode() + b":" + (null if v is None else v) for k, v in r.headers) or b"NO_HEADERS")
        if self.print_key:
            columns.append(null if r.key is None else r.key)
        if self.print_value:
            columns.append(null if r.value is None else r.value)
        return self.key_separator.join(columns) + self.line_separator


def json_line(r: Any) -> bytes:
    """One record as a JSON object (what `strom produce --format json` reads back)."""
    return json.dumps({
        "topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
        "timestamp_type": TIMESTAMP_TYPES.get(r.timestamp_type, "NoTimestamp"),
        "key": bytes_to_json(r.key), "value": bytes_to_json(r.value),
        "headers": [[k, bytes_to_json(v)] for k, v in r.headers],
    }, ensure_ascii=False).encode() + b"\n"


@dataclass(frozen=True)
class StartAt:
    """Where reading starts in a partition the consumer has no committed offset for (or, with
    an explicit offset or timestamp, in every partition it is given)."""

    kind: str  # "earliest", "latest", "offset", "timestamp", "committed"
    value: int = 0

    def apply(self, consumer: KafkaConsumer, partitions: list[TopicPartition]) -> None:
        if not partitions or self.kind == "committed":
            return
        if self.kind == "earliest":
            consumer.seek_to_beginning(*partitions)
        elif self.kind == "latest":
            consumer.seek_to_end(*partitions)
        elif self.kind == "offset":
            for tp in partitions:
                consumer.seek(tp, self.value)
        else:
            found = consumer.offsets_for_times(dict.fromkeys(partitions, self.value))
            late = [tp for tp in partitions if found.get(tp) is None]
            for tp, hit in found.items():
                if hit is not None:
                    consumer.seek(tp, hit.offset)
            if late:  # nothing that recent: wait for new records
                consumer.seek_to_end(*late)


class _Seeker(ConsumerRebalanceListener):
    """With a group: an explicit start (a timestamp) applies to each partition the first time
    it is assigned, not again after a rebalance.

    kafka-python 3 calls the listener on its network thread, where a call that waits on the
    network (offsets_for_times) fails. So a timestamp start pauses the new partitions there,
    and `settle`, called between polls, looks their offsets up, seeks and resumes them."""

    def __init__(self, consumer: KafkaConsumer, start: StartAt) -> None:
        self.consumer, self.start, self.seen = consumer, start, set()
        self.pending: list[TopicPartition] = []

    def on_partitions_revoked(self, revoked: Any) -> None:
        pass

    def on_partitions_assigned(self, assigned: Any) -> None:
        new = [tp for tp in assigned if tp not in self.seen]
        self.seen.update(new)
        if self.start.kind == "timestamp":
            self.consumer.pause(*new)
            self.pending += new
        else:
            self.start.apply(self.consumer, new)

    def settle(self) -> None:
        if not self.pending:
            return
        assigned = self.consumer.assignment()
        ready = [tp for tp in self.pending if tp in assigned]
        self.pending = []
        self.start.apply(self.consumer, ready)
        self.consumer.resume(*ready)


class EndTracker:
    """--exit-at-end: the end offset (high watermark, or last stable offset for read_committed)
    of each assigned partition when it was first assigned, and whether reading reached it."""

    def __init__(self, consumer: KafkaConsumer) -> None:
        self.consumer = consumer
        self.ends: dict[TopicPartition, int] = {}

    def reached(self) -> bool:
        assigned = self.consumer.assignment()
        if not assigned:
            return False
        new = [tp for tp in assigned if tp not in self.ends]
        if new:
            self.ends.update(self.consumer.end_offsets(new))
        return all(self.consumer.position(tp) >= self.ends[tp] for tp in assigned)


@click.command("consume", cls=Command)
@client_options("--consumer.config")
@click.argument("topic_arg", metavar="[TOPIC]", required=False)
@click.option("--topic", help="The topic to read (or give it as the argument).")
@click.option("--include", metavar="REGEX", help="Every topic whose whole name matches REGEX.")
@click.option("--group", help="Join this consumer group: its partitions, from its committed "
              "offsets, committing what was printed. Without it: every partition, no commits.")
@click.option("--partition", "partitions", type=int, multiple=True,
              help="Only this partition (repeatable; not with --group).")
@click.option("--from-beginning", is_flag=True, help="Start at the earliest offset (with --group: "
              "where the group has no committed offset).")
@click.option("--offset", metavar="earliest|latest|N", help="Start at this offset of each --partition.")
@click.option("--from-timestamp", callback=lambda c, p, v: None if v is None else parse_timestamp(v),
              metavar="MS|DATETIME", help="Start at the first record at or after this time: ms "
              "since the epoch or ISO-8601 such as 2024-05-01T12:00:00 (local time without a zone).")
@click.option("--max-messages", type=click.IntRange(min=1), help="Stop after this many records.")
@click.option("--timeout-ms", type=click.IntRange(min=0), help="Stop when no record arrived for this long.")
@click.option("--exit-at-end", is_flag=True, help="Stop once every partition is read up to its "
              "end as it was when reading started.")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
              help="read_committed: only committed transactional records (default: read_uncommitted).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: as kafka-console-consumer, shaped by --property; json: one object per "
                   "record with topic, partition, offset, timestamp, key, value and headers.")
@click.option("--property", "--formatter-property", "properties", multiple=True, metavar="KEY=VALUE",
              help="For text: print.key, print.value, print.headers, print.timestamp, "
                   "print.partition, print.offset (true/false), key.separator, line.separator, "
                   "headers.separator, null.literal (repeatable).")
@click.option("--consumer-property", "--command-property", "consumer_properties", multiple=True,
              metavar="KEY=VALUE", help="A consumer config (Kafka's name, e.g. "
              "fetch.max.bytes=1048576), over --command-config; repeatable.")
def consume(client: ClientSettings, topic_arg: str | None, topic: str | None, include: str | None,
            group: str | None, partitions: tuple[int, ...], from_beginning: bool, offset: str | None,
            from_timestamp: int | None, max_messages: int | None, timeout_ms: int | None,
            exit_at_end: bool, isolation_level: str | None, fmt: str, properties: tuple[str, ...],
            consumer_properties: tuple[str, ...]) -> None:
    """Print records of a topic, one per line (like kafka-console-consumer). By default it
    starts at the end and waits for new records; stop it with Ctrl-C, --max-messages,
    --timeout-ms or --exit-at-end. It says how many records it printed on stderr.

    \b
    Example:
      strom consume orders --from-beginning --exit-at-end
      strom consume orders --property print.key=true --property print.headers=true --max-messages 10
      strom consume orders --partition 0 --offset 1200 --format json
      strom consume orders --from-timestamp 2024-05-01T08:00:00 --timeout-ms 5000
      strom consume orders --group audit --from-beginning --isolation-level read_committed
      strom consume --include 'orders-.*' --from-beginning --exit-at-end > all-orders.txt
    """
    if topic_arg and topic and topic_arg != topic:
        raise click.UsageError(f"two topics given: {topic_arg!r} and --topic {topic!r}")
    topic = topic_arg or topic
    if bool(topic) == bool(include):
        raise click.UsageError("give a topic (as the argument or --topic) or --include, not both")
    extra = parse_key_values(consumer_properties, "--consumer-property")
    group = _one_group(group, client.properties.get("group.id"), extra.get("group.id"))
    if partitions and not topic:
        raise click.UsageError("--partition needs a topic, not --include")
    if partitions and group:
        raise click.UsageError("--partition and --group exclude each other")
    if offset is not None and not partitions:
        raise click.UsageError("--offset needs --partition")
    if sum(x is not None and x is not False for x in (from_beginning, offset, from_timestamp)) > 1:
        raise click.UsageError("give at most one of --from-beginning, --offset, --from-timestamp")
    start = _start(from_beginning, offset, from_timestamp, group)
    if fmt == "json" and properties:
        raise click.UsageError("--property shapes text output; JSON shows every field")
    formatter: Callable[[Any], bytes] = (
        TextFormat.from_properties(parse_key_values(properties, "--property")) if fmt == "text" else json_line)

    if isolation_level is not None:
        extra["isolation.level"] = isolation_level
    if group is not None:
        extra["group.id"] = group
    # kafka-python sends one fetch at a time to a broker, for the partitions with nothing
    # buffered: when those are at their end, the broker holds the fetch fetch.max.wait.ms
    # while the others' next data waits behind it. 100 ms instead of 500 keeps a topic whose
    # partitions end at different times from stalling (measured: 4 partitions holding 500,000
    # records read in about 5 s instead of 12; see benchmarks/cli.md).
    fallback = {"client.id": "strom-consume", "allow.auto.create.topics": "false",
                "max.poll.records": str(MAX_POLL_RECORDS), "fetch.max.wait.ms": "100",
                "auto.offset.reset": "earliest" if from_beginning else "latest"}
    if group is None:
        fallback["enable.auto.commit"] = "false"
    config = client.kafka_python_config(KafkaConsumer.DEFAULT_CONFIG, fallback=fallback, extra=extra)
    consumer = KafkaConsumer(**config)
    try:
        seeker = _subscribe(consumer, topic, include, partitions, group, start)
        if seeker is not None:  # --timeout-ms bounds the wait for the group too
            _join(consumer, JOIN_TIMEOUT_MS if timeout_ms is None else min(timeout_ms, JOIN_TIMEOUT_MS))
        printed = _print_records(consumer, sys.stdout.buffer, formatter, max_messages, timeout_ms,
                                 EndTracker(consumer) if exit_at_end else None, seeker)
    finally:
        consumer.close(autocommit=group is not None and config.get("enable_auto_commit", True))
    click.echo(f"Processed a total of {printed} messages", err=True)


def _one_group(*candidates: str | None) -> str | None:
    given = {g for g in candidates if g}
    if len(given) > 1:
        raise click.UsageError(f"different group ids given: {', '.join(sorted(given))}")
    return given.pop() if given else None


def _start(from_beginning: bool, offset: str | None, from_timestamp: int | None,
           group: str | None) -> StartAt:
    if offset is not None:
        if offset.lower() in ("earliest", "latest"):
            return StartAt(offset.lower())
        if not re.fullmatch(r"\d+", offset):
            raise click.BadParameter(f"expected earliest, latest or an offset, got {offset!r}",
                                     param_hint="'--offset'")
        return StartAt("offset", int(offset))
    if from_timestamp is not None:
        return StartAt("timestamp", from_timestamp)
    if group is not None:
        return StartAt("committed")  # the group's offsets; auto.offset.reset where it has none
    return StartAt("earliest" if from_beginning else "latest")


def _subscribe(consumer: KafkaConsumer, topic: str | None, include: str | None,
               partitions: tuple[int, ...], group: str | None, start: StartAt) -> _Seeker | None:
    """Subscribe (with a group) or assign the partitions; the group's rebalance listener."""
    if group is not None:
        listener = _Seeker(consumer, start)
        if include:
            consumer.subscribe(pattern=f"^(?:{include})$", listener=listener)
        else:
            consumer.subscribe([topic], listener=listener)
        # Metadata fetched after subscribing: kafka-python takes its view of the subscribed
        # topics' partitions from a metadata update, and without one it makes the first
        # assignment from an empty view and joins again at once. A missing topic is an error.
        consumer.topics()
        if not include and not consumer.partitions_for_topic(topic):
            raise CommandError(f"Topic '{topic}' does not exist.")
        return listener
    if include:
        pattern = re.compile(include)
        names = sorted(t for t in consumer.topics() if pattern.fullmatch(t))
        if not names:
            raise CommandError(f"no topic matches --include {include!r}")
    else:
        names = [topic]
    assigned = []
    for name in names:
        known = consumer.partitions_for_topic(name)
        if not known:
            raise CommandError(f"Topic '{name}' does not exist.")
        wanted = sorted(partitions) if partitions else sorted(known)
        missing = sorted(set(wanted) - set(known))
        if missing:
            raise CommandError(f"Partition(s) {','.join(map(str, missing))} of topic '{name}' do not exist.")
        assigned += [TopicPartition(name, p) for p in wanted]
    consumer.assign(assigned)
    start.apply(consumer, assigned)
    return None


def _join(consumer: KafkaConsumer, timeout_ms: int) -> None:
    """Join the group in one call rather than across the print loop's short polls. In
    kafka-python 3.0 a join that outlasts a poll is started over by the next poll, and that
    second join sometimes never completes: the consumer then neither fetches nor heartbeats
    until the coordinator drops it. The coordinator is not public API; without it the
    polls join as before."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is not None and hasattr(coordinator, "ensure_active_group"):
        coordinator.ensure_active_group(timeout_ms=timeout_ms)


def _print_records(consumer: KafkaConsumer, out: BinaryIO, formatter: Callable[[Any], bytes],
                   max_messages: int | None, timeout_ms: int | None, ends: EndTracker | None,
                   seeker: _Seeker | None = None) -> int:
    """Poll and write until a stop condition holds or Ctrl-C; the number of records written."""
    printed = 0
    last_record = time.monotonic()
    try:
        while max_messages is None or printed < max_messages:
            if seeker is not None:
                seeker.settle()
            batch = consumer.poll(POLL_MS, max_records=None if max_messages is None else max_messages - printed)
            lines = [formatter(r) for records in batch.values() for r in records]
            if lines:
                out.write(b"".join(lines))
                out.flush()
                printed += len(lines)
                last_record = time.monotonic()
            elif timeout_ms is not None and (time.monotonic() - last_record) * 1000 >= timeout_ms:
                break
            if ends is not None and ends.reached():
                break
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as a pipe's writer should; what is
        # still buffered goes nowhere instead of failing again when Python exits.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    return printed
