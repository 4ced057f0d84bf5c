"""`strom producer-perf-test` and `strom consumer-perf-test`: Kafka's kafka-producer-perf-test.sh
and kafka-consumer-perf-test.sh, with their options and the lines they print (the progress
lines, the producer's summary with latency percentiles, the consumer's CSV-like header and
values), so that a benchmark script and whatever parses its output work unchanged.

The producer sends `--num-records` records as fast as `--throughput` allows (Kafka's
ThroughputThrottler), measuring each record's latency from send to acknowledgement. The
consumer joins a group, reads `--messages` records and reports the time it took, the share of
it spent joining the group and the rate of the rest. The clients are in perf_clients.py.
"""

from __future__ import annotations

import argparse
import base64
import random
import re
import sys
import uuid
from pathlib import Path
from typing import Any, NoReturn

import click

from strom.cli.common import (
    DEFAULT_BOOTSTRAP,
    ClientSettings,
    Command,
    CommandError,
    client_options,
    parse_servers,
    read_properties,
)
from strom.cli.perf_clients import (
    Consumer,
    Failures,
    KafkaPythonConsumer,
    KafkaPythonProducer,
    LibrdkafkaConsumer,
    LibrdkafkaProducer,
    Producer,
    confluent_kafka_available,
    now_ms,
)
from strom.cli.perf_format import (
    DatePatternError,
    java_date_format,
    java_fixed,
    metrics_table,
    ratio,
)

REPORTING_INTERVAL_MS = 5_000  # the producer's progress lines, as Kafka's tool fixes it
MAX_LATENCY_SAMPLES = 500_000  # latencies kept for the percentiles (every n-th record beyond)
DEFAULT_TRANSACTION_DURATION_MS = 3_000
TRANSACTIONAL_ID_PREFIX = "performance-producer-"
CLIENTS = ("confluent-kafka", "kafka-python")
MB = 1024 * 1024
# Uppercase letters for random payloads: one byte of randomness becomes one of A-Z, as in
# Kafka's tool, with C-speed translation rather than a Python loop per byte.
_LETTERS = bytes(65 + b % 26 for b in range(256))


def _client_choice(requested: str | None) -> str:
    if requested:
        if requested == "confluent-kafka" and not confluent_kafka_available():
            raise CommandError("--client confluent-kafka: confluent-kafka is not installed")
        return requested
    return "confluent-kafka" if confluent_kafka_available() else "kafka-python"


# --- producer statistics ------------------------------------------------------------------------
class ProducerStats:
    """Kafka's ProducerPerformance.Stats: totals, a window printed every REPORTING_INTERVAL_MS,
    and a sample of the latencies (every record up to MAX_LATENCY_SAMPLES records, every n-th
    beyond) for the percentiles."""

    def __init__(self, num_records: int, reporting_interval_ms: int = REPORTING_INTERVAL_MS) -> None:
        self.start = self.window_start = now_ms()
        self.sampling = num_records // min(num_records, MAX_LATENCY_SAMPLES)
        self.latencies: list[int] = []
        self.interval = reporting_interval_ms
        self.iteration = self.count = self.bytes = self.max_latency = self.total_latency = 0
        self._new_window()

    def _new_window(self) -> None:
        self.window_start = now_ms()
        self.window_count = self.window_bytes = self.window_max = self.window_total = 0

    def record(self, latency: int, size: int, now: int) -> None:
        self.count += 1
        self.bytes += size
        self.total_latency += latency
        self.max_latency = max(self.max_latency, latency)
        self.window_count += 1
        self.window_bytes += size
        self.window_total += latency
        self.window_max = max(self.window_max, latency)
        if self.iteration % self.sampling == 0:
            self.latencies.append(latency)
        self.iteration += 1
        if now - self.window_start >= self.interval:
            self.print_window()
            self._new_window()

    def print_window(self) -> None:
        elapsed = now_ms() - self.window_start
        click.echo(f"{self.window_count} records sent, {java_fixed(ratio(1000.0 * self.window_count, elapsed), 1)} "
                   f"records/sec ({java_fixed(ratio(1000.0 * self.window_bytes, elapsed) / MB, 2)} MB/sec), "
                   f"{java_fixed(ratio(self.window_total, self.window_count), 1)} ms avg latency, "
                   f"{java_fixed(float(self.window_max), 1)} ms max latency.")

    def percentiles(self, *fractions: float) -> list[int]:
        ordered = sorted(self.latencies) or [0]
        return [ordered[min(int(f * len(self.latencies)), len(ordered) - 1)] for f in fractions]

    def print_total(self) -> None:
        elapsed = now_ms() - self.start
        p50, p95, p99, p999 = self.percentiles(0.5, 0.95, 0.99, 0.999)
        click.echo(f"{self.count} records sent, {java_fixed(ratio(1000.0 * self.count, elapsed), 1)} records/sec "
                   f"({java_fixed(ratio(1000.0 * self.bytes, elapsed) / MB, 2)} MB/sec), "
                   f"{java_fixed(ratio(self.total_latency, self.count), 2)} ms avg latency, "
                   f"{java_fixed(float(self.max_latency), 2)} ms max latency, {p50} ms 50th, {p95} ms 95th, "
                   f"{p99} ms 99th, {p999} ms 99.9th.")


class ThroughputThrottler:
    """Kafka's ThroughputThrottler: once the rate so far exceeds the target, sleep on average
    1/target seconds per record, in sleeps of at least 2 ms."""

    MIN_SLEEP_NS = 2_000_000

    def __init__(self, target: float, start_ms: int) -> None:
        self.target, self.start_ms = target, start_ms
        self.sleep_ns = int(1e9 / target) if target > 0 else 0
        self.deficit_ns = 0

    def should_throttle(self, sent: int, now: int) -> bool:
        if self.target < 0:
            return False
        elapsed_s = (now - self.start_ms) / 1000
        return elapsed_s > 0 and sent / elapsed_s > self.target

    def throttle(self, pause: Any) -> None:
        self.deficit_ns += self.sleep_ns
        if self.deficit_ns >= self.MIN_SLEEP_NS:
            pause(self.deficit_ns / 1e9)
            self.deficit_ns = 0


def read_payload_file(path: str, delimiter: str) -> list[bytes]:
    """The payloads of --payload-file: the file (UTF-8) split by --payload-delimiter, a regular
    expression as in Java's String.split, trailing empty payloads dropped as Java drops them."""
    file = Path(path)
    click.echo(f"Reading payloads from: {file.absolute()}")
    if not file.is_file() or file.stat().st_size == 0:
        raise CommandError("File does not exist or empty file provided.")
    try:
        text = file.read_text(encoding="utf-8")
        payloads = re.split(delimiter, text)
    except UnicodeDecodeError as e:
        raise CommandError(f"{path} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    except re.error as e:
        raise CommandError(f"--payload-delimiter {delimiter!r} is not a regular expression: {e}") from None
    while len(payloads) > 1 and payloads[-1] == "":
        payloads.pop()
    click.echo(f"Number of messages read: {len(payloads)}")
    return [p.encode("utf-8") for p in payloads]


# --- producer-perf-test's command line ----------------------------------------------------------
class KafkaArgumentError(Exception):
    """A command line Kafka's argparse4j parser refuses; its message is argparse4j's."""


class _ArgParser(argparse.ArgumentParser):
    """argparse with argparse4j's failures: raised (so the command prints them its way)."""

    def error(self, message: str) -> NoReturn:
        raise KafkaArgumentError(message)


def producer_parser() -> argparse.ArgumentParser:
    """kafka-producer-perf-test's options (argparse4j's nargs="+" for --producer-props, which
    click cannot take), plus `--bootstrap-server`/`--command-property`/`--command-config`
    (KIP-1147's names) and Strom's `--client`."""
    p = _ArgParser(prog="producer-performance", add_help=True, allow_abbrev=True,
                   description="This tool is used to verify the producer performance. To enable transactions, "
                               "give --transactional-id, transactional.id in the producer properties, or "
                               "--transaction-duration-ms.")
    payload = p.add_mutually_exclusive_group()
    p.add_argument("--bootstrap-server", metavar="BOOTSTRAP-SERVER",
                   help="The server(s) to connect to; takes precedence over bootstrap.servers in "
                        "--producer-props or --producer.config (default: bootstrap.servers there, else "
                        f"{DEFAULT_BOOTSTRAP}).")
    p.add_argument("--topic", metavar="TOPIC", help="produce messages to this topic")
    p.add_argument("--num-records", dest="num_records", metavar="NUM-RECORDS", type=int,
                   help="number of messages to produce")
    payload.add_argument("--record-size", dest="record_size", metavar="RECORD-SIZE", type=int,
                         help="message size in bytes. Note that you must provide exactly one of --record-size, "
                              "--payload-file or --payload-monotonic.")
    payload.add_argument("--payload-file", dest="payload_file", metavar="PAYLOAD-FILE",
                         help="file to read the message payloads from (UTF-8 text); each record is one of them, "
                              "chosen at random.")
    payload.add_argument("--payload-monotonic", dest="payload_monotonic", action="store_true",
                         help="payload is a monotonically increasing integer.")
    p.add_argument("--payload-delimiter", dest="payload_delimiter", metavar="PAYLOAD-DELIMITER", default="\\n",
                   help="delimiter of the payloads in --payload-file (a regular expression; default: new line).")
    p.add_argument("--throughput", metavar="THROUGHPUT", type=float,
                   help="throttle maximum message throughput to *approximately* THROUGHPUT messages/sec. "
                        "Set this to -1 to disable throttling.")
    p.add_argument("--producer-props", "--command-property", dest="producer_props", nargs="+", action="extend",
                   metavar="PROP-NAME=PROP-VALUE",
                   help="producer configuration properties like bootstrap.servers, client.id, acks; they take "
                        "precedence over those of --producer.config.")
    p.add_argument("--producer.config", "--command-config", dest="producer_config", metavar="CONFIG-FILE",
                   help="producer config properties file.")
    p.add_argument("--print-metrics", dest="print_metrics", action="store_true",
                   help="print out metrics at the end of the test.")
    p.add_argument("--transactional-id", dest="transactional_id", metavar="TRANSACTIONAL-ID",
                   help="The transactional id to use (it takes precedence over transactional.id in the producer "
                        f"properties); with --transaction-duration-ms alone, {TRANSACTIONAL_ID_PREFIX}<random>.")
    p.add_argument("--transaction-duration-ms", dest="transaction_duration_ms", metavar="TRANSACTION-DURATION",
                   type=int, help="The max age of each transaction: it is committed when this time has elapsed "
                                  f"(default {DEFAULT_TRANSACTION_DURATION_MS} when transactions are enabled).")
    p.add_argument("--client", choices=CLIENTS,
                   help="The client library (Strom's option): confluent-kafka when installed, else kafka-python.")
    return p


def _parse_producer_args(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    """Parsed as argparse4j parses: a missing required option is named (the last one missing,
    as argparse4j reports it), then a missing payload option, then Kafka's own checks."""
    ns = parser.parse_args(args)
    missing = [flag for flag, value in (("--topic", ns.topic), ("--num-records", ns.num_records),
                                        ("--throughput", ns.throughput)) if value is None]
    if missing:
        raise KafkaArgumentError(f"argument {missing[-1]} is required")
    if ns.record_size is None and ns.payload_file is None and not ns.payload_monotonic:
        raise KafkaArgumentError("one of the arguments --record-size --payload-file --payload-monotonic is required")
    if ns.num_records <= 0:
        raise KafkaArgumentError("--num-records should be greater than zero")
    if ns.record_size is not None and ns.record_size <= 0:
        raise KafkaArgumentError("--record-size should be greater than zero")
    if ns.transaction_duration_ms is not None and ns.transaction_duration_ms <= 0:
        raise KafkaArgumentError("--transaction-duration-ms should be greater than zero")
    if ns.throughput == 0:  # Kafka's throttler would wait forever after the first record
        raise KafkaArgumentError("--throughput should be greater than zero, or negative (-1) for no throttling")
    return ns


def _producer_properties(ns: argparse.Namespace) -> dict[str, str]:
    """--producer.config, then --producer-props over it, then the tool's own: a client.id
    unless given, the transactional id when transactions are on."""
    props = read_properties(Path(ns.producer_config)) if ns.producer_config else {}
    for prop in ns.producer_props or ():
        pieces = prop.split("=")
        if len(pieces) != 2:  # as Kafka splits them: a value may not contain "="
            raise CommandError(f"Invalid property: {prop}")
        props[pieces[0]] = pieces[1]
    props.setdefault("client.id", "perf-producer-client")
    return props


def _transactional_id(ns: argparse.Namespace, props: dict[str, str]) -> str | None:
    if ns.transaction_duration_ms is None and ns.transactional_id is None and "transactional.id" not in props:
        return None
    random_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    return ns.transactional_id or props.get("transactional.id") or TRANSACTIONAL_ID_PREFIX + random_id


@click.command("producer-perf-test", cls=Command, add_help_option=False,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def producer_perf_test(args: tuple[str, ...]) -> None:
    """Kafka's kafka-producer-perf-test.sh: send records and print the throughput and latency.

    \b
    Examples:
      strom producer-perf-test --topic t --num-records 1000000 --record-size 100 --throughput -1
      strom producer-perf-test --topic t --num-records 50000 --payload-file lines.txt --throughput 5000 \\
          --producer-props bootstrap.servers=127.0.0.1:9092 acks=1 linger.ms=5
    Run with --help for every option.
    """
    parser = producer_parser()
    if not args:  # as Kafka's tool: the help, exit 0
        parser.print_help()
        return
    try:
        ns = _parse_producer_args(parser, list(args))
    except KafkaArgumentError as e:
        click.echo(parser.format_usage().rstrip(), err=True)
        click.echo(f"{parser.prog}: error: {e}", err=True)
        sys.exit(1)
    delimiter = "\n" if ns.payload_delimiter == "\\n" else ns.payload_delimiter
    payloads = read_payload_file(ns.payload_file, delimiter) if ns.payload_file else []
    props = _producer_properties(ns)
    transactional_id = _transactional_id(ns, props)
    if transactional_id is not None:
        props["transactional.id"] = transactional_id
    bootstrap = ns.bootstrap_server or props.get("bootstrap.servers") or DEFAULT_BOOTSTRAP
    try:
        servers = parse_servers(bootstrap)
    except click.BadParameter as e:
        raise CommandError(e.format_message()) from None
    props["bootstrap.servers"] = ",".join(f"{h}:{p}" for h, p in servers)
    run_producer(ns, ClientSettings(servers, props), payloads, transactional_id is not None)


def _payloads(ns: argparse.Namespace, payloads: list[bytes]) -> Any:
    """Each record's value: a random line of the payload file, random uppercase letters of
    --record-size (seeded, as Kafka's tool seeds its generator), or the record's number."""
    rng = random.Random(0)
    if payloads:
        choose = rng.randrange
        count = len(payloads)
        return lambda i: payloads[choose(count)]
    if ns.record_size is not None:
        size, randbytes = ns.record_size, rng.randbytes
        return lambda i: randbytes(size).translate(_LETTERS)
    return lambda i: str(i).encode()


def run_producer(ns: argparse.Namespace, client: ClientSettings, payloads: list[bytes], transactions: bool) -> None:
    stats = ProducerStats(ns.num_records)
    failures = Failures()
    producer: Producer
    if _client_choice(ns.client) == "confluent-kafka":
        producer = LibrdkafkaProducer(dict(client.properties), ns.topic, stats.record, failures, ns.print_metrics)
    else:
        producer = KafkaPythonProducer(client, dict(client.properties), ns.topic, stats.record, failures)
    duration_ms = ns.transaction_duration_ms or DEFAULT_TRANSACTION_DURATION_MS
    if transactions:
        producer.init_transactions()
    producer.wait_for_topic()
    payload = _payloads(ns, payloads)
    stats.start = stats.window_start = start_ms = now_ms()
    throttler = ThroughputThrottler(ns.throughput, start_ms)
    in_transaction, transaction_start = 0, 0
    for i in range(ns.num_records):
        value = payload(i)
        if transactions and in_transaction == 0:
            producer.begin_transaction()
            transaction_start = now_ms()
        send_start = now_ms()
        producer.send(value)
        in_transaction += 1
        if transactions and duration_ms <= send_start - transaction_start:
            producer.commit_transaction()
            in_transaction = 0
        if throttler.should_throttle(i, send_start):
            throttler.throttle(producer.pause)
    if transactions and in_transaction:
        producer.commit_transaction()
    producer.flush()
    stats.print_total()
    if ns.print_metrics:
        table = metrics_table(producer.metrics())
        if table:
            click.echo(table)
    producer.close()
    if failures.count:
        raise CommandError(f"{failures.count} of {ns.num_records} records were not sent")


# --- consumer-perf-test -------------------------------------------------------------------------
HEADER = "data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, " \
         "fetch.MB.sec, fetch.nMsg.sec"


class KafkaToolCommand(Command):
    """A command whose wrong command line exits 1, as Kafka's perf-test scripts do."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            e.exit_code = 1
            raise


class JoinTimer:
    """Kafka's ConsumerPerfRebListener: the time from the start (or a revocation) to each
    assignment, in total and since the last progress line."""

    def __init__(self, start_ms: int) -> None:
        self.join_start = start_ms
        self.total = self.since_report = 0

    def revoked(self) -> None:
        self.join_start = now_ms()

    def assigned(self) -> None:
        elapsed = now_ms() - self.join_start
        self.total += elapsed
        self.since_report += elapsed


def _progress_line(when: str, read_bytes: int, last_bytes: int, read: int, last_read: int, start_ms: int,
                   end_ms: int, join_ms: int) -> str:
    """A --show-detailed-stats line: this interval's rates, overall and without the join time."""
    elapsed = float(end_ms - start_ms)
    fetch_ms = end_ms - start_ms - join_ms
    interval_mb = (read_bytes - last_bytes) / MB
    fetch_mb_s = 0.0 if fetch_ms <= 0 else 1000.0 * interval_mb / fetch_ms
    fetch_n_s = 0.0 if fetch_ms <= 0 else 1000.0 * (read - last_read) / fetch_ms
    return (f"{when}, 0, {java_fixed(read_bytes / MB, 4)}, {java_fixed(ratio(1000.0 * interval_mb, elapsed), 4)}, "
            f"{read}, {java_fixed(ratio(read - last_read, elapsed) * 1000.0, 4)}, {join_ms}, {fetch_ms}, "
            f"{java_fixed(fetch_mb_s, 4)}, {java_fixed(fetch_n_s, 4)}")


@click.command("consumer-perf-test", cls=KafkaToolCommand)
@client_options("--consumer.config")
@click.option("--topic", metavar="TOPIC", help="REQUIRED: The topic to consume from.")
@click.option("--messages", type=int, metavar="COUNT", help="REQUIRED: The number of messages to consume.")
@click.option("--group", metavar="GID", help="The group id to consume on (default: perf-consumer-<random>).")
@click.option("--fetch-size", type=click.IntRange(min=0), default=1024 * 1024, show_default=True, metavar="SIZE",
              help="The amount of data to fetch in a single request (max.partition.fetch.bytes).")
@click.option("--socket-buffer-size", type=click.IntRange(min=0), default=2 * 1024 * 1024, show_default=True,
              metavar="SIZE", help="The size of the tcp RECV size (receive.buffer.bytes).")
@click.option("--from-latest", is_flag=True,
              help="Without an offset committed for the group, start at the latest record rather than the earliest.")
@click.option("--timeout", "timeout_ms", type=click.IntRange(min=0), default=10_000, show_default=True,
              metavar="MILLISECONDS", help="The maximum allowed time in milliseconds between returned records.")
@click.option("--reporting-interval", type=int, default=5_000, show_default=True, metavar="INTERVAL_MS",
              help="Interval in milliseconds at which to print progress info.")
@click.option("--show-detailed-stats", is_flag=True,
              help="Print stats for each reporting interval (as configured by --reporting-interval).")
@click.option("--date-format", default="yyyy-MM-dd HH:mm:ss:SSS", show_default=True, metavar="DATE FORMAT",
              help="The format of the time fields (java.text.SimpleDateFormat's patterns).")
@click.option("--hide-header", is_flag=True, help="Skip printing the header for the stats.")
@click.option("--print-metrics", is_flag=True, help="Print out the metrics.")
@click.option("--command-property", "command_properties", multiple=True, metavar="PROP=VALUE",
              help="A consumer property (repeatable); it takes precedence over --consumer.config.")
@click.option("--client", "client_library", type=click.Choice(CLIENTS),
              help="The client library (Strom's option): confluent-kafka when installed, else kafka-python.")
def consumer_perf_test(client: ClientSettings, topic: str | None, messages: int | None, group: str | None,
                       fetch_size: int, socket_buffer_size: int, from_latest: bool, timeout_ms: int,
                       reporting_interval: int, show_detailed_stats: bool, date_format: str, hide_header: bool,
                       print_metrics: bool, command_properties: tuple[str, ...], client_library: str | None) -> None:
    """Kafka's kafka-consumer-perf-test.sh: consume records and print the throughput.

    \b
    Examples:
      strom consumer-perf-test --bootstrap-server 127.0.0.1:9092 --topic t --messages 1000000
      strom consumer-perf-test --topic t --messages 50000 --show-detailed-stats --reporting-interval 1000
    """
    for name, value in (("topic", topic), ("messages", messages)):
        if value is None:
            missing = click.UsageError(f'Missing required argument "[{name}]"')
            missing.exit_code = 1  # as Kafka's tool exits
            raise missing
    assert topic is not None and messages is not None
    if reporting_interval <= 0:
        raise CommandError("Reporting interval must be greater than 0.")
    try:
        formatter = java_date_format(date_format)
    except DatePatternError as e:
        raise CommandError(str(e)) from None
    if not hide_header:
        click.echo(f"time, threadId, {HEADER}" if show_detailed_stats else f"start.time, end.time, {HEADER}")
    props = dict(client.properties)
    for prop in command_properties:
        key, sep, value = prop.partition("=")
        if not sep or not key:
            raise CommandError(f"Invalid property: {prop}")
        props[key] = value
    props.update({"bootstrap.servers": ",".join(f"{h}:{p}" for h, p in client.servers),
                  "group.id": group or f"perf-consumer-{random.randrange(100_000)}",
                  "receive.buffer.bytes": str(socket_buffer_size), "max.partition.fetch.bytes": str(fetch_size),
                  "auto.offset.reset": "latest" if from_latest else "earliest", "check.crcs": "false"})
    props.setdefault("client.id", "perf-consumer-client")
    settings = ClientSettings(client.servers, props)

    start_ms = now_ms()
    joins = JoinTimer(start_ms)
    consumer: Consumer
    if _client_choice(client_library) == "confluent-kafka":
        consumer = LibrdkafkaConsumer(props, topic, joins.assigned, joins.revoked, print_metrics)
    else:
        consumer = KafkaPythonConsumer(settings, props, topic, joins.assigned, joins.revoked)
    try:
        read, read_bytes = _consume(consumer, messages, timeout_ms, reporting_interval, show_detailed_stats,
                                    formatter, joins)
        end_ms = now_ms()
        metrics = consumer.metrics() if print_metrics else []
    finally:
        consumer.close()
    if not show_detailed_stats:
        elapsed_s = (end_ms - start_ms) / 1000
        fetch_ms = end_ms - start_ms - joins.total
        mb = read_bytes / MB
        click.echo(f"{formatter(start_ms)}, {formatter(end_ms)}, {java_fixed(mb, 4)}, "
                   f"{java_fixed(ratio(mb, elapsed_s), 4)}, {read}, {java_fixed(ratio(read, elapsed_s), 4)}, "
                   f"{joins.total}, {fetch_ms}, {java_fixed(ratio(mb, fetch_ms / 1000), 4)}, "
                   f"{java_fixed(ratio(read, fetch_ms / 1000), 4)}")
    table = metrics_table(metrics)
    if table:
        click.echo(table)


def _consume(consumer: Consumer, messages: int, timeout_ms: int, interval_ms: int, detailed: bool,
             formatter: Any, joins: JoinTimer) -> tuple[int, int]:
    """Kafka's loop: poll until `messages` records arrived or none came for `timeout_ms`; a
    progress line per `interval_ms` with --show-detailed-stats."""
    read = read_bytes = last_read = last_bytes = 0
    now = last_report = last_consumed = now_ms()
    while read < messages and now - last_consumed <= timeout_ms:
        count, size = consumer.poll(messages - read, 0.1)
        now = now_ms()
        if count:
            last_consumed = now
            read += count
            read_bytes += size
            if now - last_report >= interval_ms:
                if detailed:
                    click.echo(_progress_line(formatter(now), read_bytes, last_bytes, read, last_read, last_report,
                                              now, joins.since_report))
                joins.since_report = 0
                last_report, last_read, last_bytes = now, read, read_bytes
    if read < messages:
        click.echo(f"WARNING: Exiting before consuming the expected number of messages: timeout ({timeout_ms} ms) "
                   "exceeded. You can use the --timeout option to increase the timeout.")
    return read, read_bytes

