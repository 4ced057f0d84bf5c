"""`strom produce`: records from stdin to a topic, one per line, in the manner of Kafka's
kafka-console-producer.sh (its `--property` names for keys and headers), or one JSON object
per line.

It is a kafka-python producer (a dependency of Strom already), so it works against any
Kafka-compatible cluster and takes Kafka's client properties from `--command-config` and
`--producer-property`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import click
from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from strom.cli.common import (
    ClientSettings,
    Command,
    CommandError,
    client_options,
    json_to_bytes,
    kafka_error_text,
    parse_key_values,
)

# The producer's own defaults, under --command-config and --producer-property:
# - linger.ms: lines read in a burst share a batch, a typed line is not noticeably delayed;
# - enable.idempotence off, one request in flight: kafka-python's idempotent producer fails
#   every later record once the broker refused one batch (a record too large, say), while a
#   console producer should report that record and go on; one request in flight keeps the
#   order that idempotence would have kept across retries.
FALLBACK = {"linger.ms": "10", "enable.idempotence": "false",
            "max.in.flight.requests.per.connection": "1"}
Header = tuple[str, bytes | None]


class LineError(ValueError):
    """An input line that is not a record."""


@dataclass(frozen=True)
class OutRecord:
    value: bytes | None
    key: bytes | None = None
    headers: tuple[Header, ...] = ()
    partition: int | None = None
    timestamp: int | None = None
    line: int = 0  # where in the input it was read


@dataclass
class LineFormat:
    """kafka-console-producer's line reader properties: which parts a line holds and what
    separates them (`headers<headers.delimiter>key<key.separator>value`)."""

    parse_key: bool = False
    key_separator: str = "\t"
    parse_headers: bool = False
    headers_delimiter: str = "\t"
    headers_separator: str = ","
    headers_key_separator: str = ":"
    null_marker: str | None = None
    ignore_error: bool = False
    names: dict[str, str] = field(default_factory=lambda: {
        "parse.key": "parse_key", "key.separator": "key_separator",
        "parse.headers": "parse_headers", "headers.delimiter": "headers_delimiter",
        "headers.separator": "headers_separator", "headers.key.separator": "headers_key_separator",
        "null.marker": "null_marker", "ignore.error": "ignore_error"})

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> LineFormat:
        fmt = cls()
        for key, value in props.items():
            if key not in fmt.names:
                raise click.BadParameter(f"unknown property {key!r} (known: {', '.join(fmt.names)})",
                                         param_hint="'--property'")
            attr = fmt.names[key]
            setattr(fmt, attr, value.strip().lower() == "true" if isinstance(getattr(fmt, attr), bool)
                    else value)
        separators = {"headers.delimiter": fmt.headers_delimiter, "headers.separator": fmt.headers_separator,
                      "headers.key.separator": fmt.headers_key_separator}
        for name, value in {**separators, "key.separator": fmt.key_separator}.items():
            if not value:
                raise click.BadParameter(f"{name} may not be empty", param_hint="'--property'")
        if len(set(separators.values())) < len(separators):
            raise click.BadParameter("headers.delimiter, headers.separator and headers.key.separator "
                                     "must differ", param_hint="'--property'")
        if fmt.null_marker is not None and fmt.null_marker in (fmt.key_separator, *separators.values()):
            raise click.BadParameter("null.marker may not equal a separator", param_hint="'--property'")
        return fmt

    def _null(self, text: bytes) -> bytes | None:
        return None if self.null_marker is not None and text == self.null_marker.encode() else text

    def _cut(self, line: bytes, start: int, separator: str, what: str, number: int) -> bytes | None:
        """The part of `line` from `start` up to `separator`; None (ignore.error) or a
        ValueError when the separator is missing."""
        end = line.find(separator.encode(), start)
        if end < 0:
            if self.ignore_error:
                return None
            raise LineError(f"line {number}: no {what} found: {_shown(line)}")
        return line[start:end]

    def parse(self, line: bytes, number: int) -> OutRecord:
        pos = 0
        headers: list[Header] = []
        if self.parse_headers:
            part = self._cut(line, 0, self.headers_delimiter, "headers delimiter", number)
            if part is not None:
                pos = len(part) + len(self.headers_delimiter)
                if part and self._null(part) is not None:  # an empty part: no headers
                    headers = self._headers(part, number)
        key = None
        if self.parse_key:
            part = self._cut(line, pos, self.key_separator, "key separator", number)
            if part is not None:
                pos += len(part) + len(self.key_separator)
                key = self._null(part)
        return OutRecord(self._null(line[pos:]), key, tuple(headers))

    def _headers(self, text: bytes, number: int) -> list[Header]:
        out = []
        for pair in text.split(self.headers_separator.encode()):
            name, sep, value = pair.partition(self.headers_key_separator.encode())
            if not sep and not self.ignore_error:
                raise LineError(f"line {number}: no header key separator in {_shown(pair)}")
            if self.null_marker is not None and name == self.null_marker.encode():
                raise LineError(f"line {number}: a header key may not be the null marker")
            out.append((name.decode("utf-8", "replace"), self._null(value) if sep else None))
        return out


def _shown(line: bytes) -> str:
    text = line.decode("utf-8", "replace")
    return repr(text if len(text) <= 80 else text[:80] + "...")


def parse_json_line(line: bytes, number: int) -> OutRecord:
    """`{"key": ..., "value": ..., "headers": {...} or [[k, v], ...], "partition": n,
    "timestamp": ms}`; keys, values and header values are strings, null or {"base64": ...}."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LineError(f"line {number}: not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise LineError(f"line {number}: expected a JSON object")
    # topic, offset and timestamp_type are what `strom consume --format json` adds: ignored, so
    # its output can be produced again as it is.
    unknown = set(obj) - {"key", "value", "headers", "partition", "timestamp", "topic", "offset",
                          "timestamp_type"}
    if unknown:
        raise LineError(f"line {number}: unknown field(s) {', '.join(sorted(unknown))}")
    raw_headers = obj.get("headers") or []
    pairs = list(raw_headers.items()) if isinstance(raw_headers, dict) else raw_headers
    if not isinstance(pairs, list) or not all(isinstance(p, list | tuple) and len(p) == 2
                                              and isinstance(p[0], str) for p in pairs):
        raise LineError(f"line {number}: headers must be an object or a list of [name, value] pairs")
    for name in ("partition", "timestamp"):
        if obj.get(name) is not None and (not isinstance(obj[name], int) or isinstance(obj[name], bool)):
            raise LineError(f"line {number}: {name} must be an integer")
    try:
        return OutRecord(json_to_bytes(obj.get("value"), "value"), json_to_bytes(obj.get("key"), "key"),
                         tuple((k, json_to_bytes(v, f"header {k!r}")) for k, v in pairs),
                         obj.get("partition"), obj.get("timestamp"))
    except ValueError as e:
        raise LineError(f"line {number}: {e}") from None


def read_records(stream: BinaryIO, fmt: LineFormat | None) -> Iterator[OutRecord]:
    """One record per input line (`fmt` None: JSON lines, where blank lines are skipped)."""
    for number, raw in enumerate(stream, 1):
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if line.endswith(b"\r"):
            line = line[:-1]
        if fmt is not None:
            record = fmt.parse(line, number)
        elif line.strip():
            record = parse_json_line(line, number)
        else:
            continue
        if record.key is None and record.value is None:
            raise LineError(f"line {number}: a record without key and value cannot be sent by "
                            "this producer")
        yield dataclasses.replace(record, line=number)


class Delivery:
    """Counts records sent, delivered and refused (the producer's I/O thread reports them), and
    remembers the first refusal to report it."""

    def __init__(self) -> None:
        self.sent = self.failed = self.done = 0
        self.first_error: str | None = None
        self._changed = threading.Condition()

    def track(self, future: Any) -> None:
        self.sent += 1
        future.add_callback(self._success)
        future.add_errback(self._failure)

    def _success(self, _metadata: Any) -> None:
        with self._changed:
            self.done += 1
            self._changed.notify_all()

    def _failure(self, error: Exception) -> None:
        with self._changed:
            self.done += 1
            self.failed += 1
            if self.first_error is None:
                self.first_error = kafka_error_text(error) if isinstance(error, KafkaError) else str(error)
            self._changed.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """Whether every record sent was reported within `timeout_s`."""
        with self._changed:
            return self._changed.wait_for(lambda: self.done >= self.sent, timeout_s)


@click.command("produce", cls=Command)
@client_options("--producer.config")
@click.argument("topic_arg", metavar="[TOPIC]", required=False)
@click.option("--topic", help="The topic to write to (or give it as the argument).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: one record per line, parsed as the --property options say; json: one "
                   "JSON object per line with value, key, headers, partition and timestamp.")
@click.option("--property", "--reader-property", "properties", multiple=True, metavar="KEY=VALUE",
              help="For text lines, as kafka-console-producer: parse.key, key.separator, "
                   "parse.headers, headers.delimiter, headers.separator, headers.key.separator, "
                   "null.marker, ignore.error (repeatable).")
@click.option("--partition", type=int, help="Write every record to this partition.")
@click.option("--compression-codec", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]),
              help="Compress batches (default: none, or compression.type from the properties).")
@click.option("--acks", "--request-required-acks", "acks", type=click.Choice(["all", "-1", "0", "1"]),
              help="Acknowledgements to wait for (default: all).")
@click.option("--sync", is_flag=True, help="Wait for each record to be acknowledged before the next.")
@click.option("--producer-property", "--command-property", "producer_properties", multiple=True, metavar="KEY=VALUE",
              help="A producer config (Kafka's name, e.g. linger.ms=50), over --command-config; "
                   "repeatable.")
def produce(client: ClientSettings, topic_arg: str | None, topic: str | None, fmt: str,
            properties: tuple[str, ...], partition: int | None, compression_codec: str | None,
            acks: str | None, sync: bool, producer_properties: tuple[str, ...]) -> None:
    """Write records read from stdin to a topic, one per line (like kafka-console-producer).

    Exits 1, saying how many records were not delivered, if any was refused.

    \b
    Example:
      echo hello | strom produce orders
      printf 'k1\\tv1\\nk2\\tv2\\n' | strom produce orders --property parse.key=true
      printf 'h1:a,h2:b\\tk1\\tv1\\n' | strom produce orders --property parse.headers=true --property parse.key=true
      echo '{"key": "k1", "value": "v1", "headers": {"trace": "42"}}' | strom produce orders --format json
      strom produce orders --compression-codec zstd --acks 1 < records.txt
    """
    name = _topic(topic_arg, topic)
    line_format = LineFormat.from_properties(parse_key_values(properties, "--property")) if fmt == "text" else None
    if fmt == "json" and properties:
        raise click.UsageError("--property describes text lines; JSON lines carry their own fields")
    extra = parse_key_values(producer_properties, "--producer-property")
    if compression_codec is not None:
        extra["compression.type"] = compression_codec
    if acks is not None:
        extra["acks"] = acks
    config = client.kafka_python_config(KafkaProducer.DEFAULT_CONFIG, extra=extra, fallback=FALLBACK)
    if config.get("compression_type") == "none":
        config["compression_type"] = None
    try:
        producer = KafkaProducer(**config)
    except ValueError as e:  # a config kafka-python refuses
        raise CommandError(f"invalid producer config: {e}") from None
    except RuntimeError as e:  # a compression codec whose Python package is not installed
        raise CommandError(f"{e} (kafka-python needs python-snappy, lz4 or zstandard for them)") from None
    delivery = Delivery()
    try:
        for record in read_records(sys.stdin.buffer, line_format):
            try:
                future = producer.send(name, value=record.value, key=record.key,
                                       headers=list(record.headers) or None,
                                       partition=partition if partition is not None else record.partition,
                                       timestamp_ms=record.timestamp)
            except (ValueError, TypeError, AssertionError) as e:  # what the client refuses to send
                raise LineError(f"line {record.line}: {e}") from None
            delivery.track(future)
            if sync:
                delivery.wait(producer.config["delivery_timeout_ms"] / 1000)
    except LineError as e:
        raise CommandError(f"{e} ({delivery.sent} records before it were sent)") from None
    except KafkaTimeoutError:  # no metadata for the topic within max.block.ms
        raise CommandError(f"no metadata for topic '{name}' within max.block.ms "
                           f"({producer.config['max_block_ms']} ms): does it exist?") from None
    except KeyboardInterrupt:
        pass  # end of input: deliver what was read
    finally:
        _finish(producer, delivery)
    if delivery.failed:
        raise CommandError(f"{delivery.failed} of {delivery.sent} records were not delivered: "
                           f"{delivery.first_error}")


def _finish(producer: KafkaProducer, delivery: Delivery) -> None:
    """Deliver what is queued and wait for every report. kafka-python's flush can give up
    early once a batch failed, so the reports themselves are awaited."""
    try:
        producer.flush()
    except KafkaError:
        pass
    if not delivery.wait(producer.config["delivery_timeout_ms"] / 1000 + 5):
        click.echo(f"Warning: {delivery.sent - delivery.done} records were not confirmed in time",
                   err=True)
    producer.close()


def _topic(argument: str | None, option: str | None) -> str:
    if argument and option and argument != option:
        raise click.UsageError(f"two topics given: {argument!r} and --topic {option!r}")
    name = argument or option
    if not name:
        raise click.UsageError("give the topic (as the argument or --topic)")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", name) or name in (".", ".."):
        raise click.BadParameter(f"{name!r} is not a valid topic name (up to 249 of A-Z a-z 0-9 . _ -)",
                                 param_hint="'TOPIC'")
    return name
