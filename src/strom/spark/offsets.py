"""Driver-side offset work: which topic-partitions a subscription covers, and where each read
starts and ends. Offsets travel as Spark's Kafka source writes them in checkpoints:
{"topic": {"0": 123}}."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from strom.spark.options import EARLIEST, LATEST, ClientOptions, SourceOptions, StromOptionError

TIMEOUT_S = 15.0  # bound on every metadata/offset request from the driver

Partition = tuple[str, int]
Offsets = dict[Partition, int]


class StromConnectionError(RuntimeError):
    """The brokers could not be reached or did not answer in time."""


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json(value: dict | str) -> Offsets:
    if isinstance(value, str):
        value = json.loads(value)
    return {(t, int(p)): int(o) for t, parts in value.items() for p, o in parts.items()}


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one partition: one Spark task's work."""
    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


class Admin:
    """Metadata and ListOffsets through librdkafka's admin client, with bounded waits."""

    def __init__(self, client: ClientOptions, isolation: str = "read_uncommitted") -> None:
        self.bootstrap = client.bootstrap
        self.isolation = (IsolationLevel.READ_COMMITTED if isolation == "read_committed"
                          else IsolationLevel.READ_UNCOMMITTED)
        conf = {k: v for k, v in client.conf.items() if k not in ("isolation.level", "group.id")}
        self.admin = AdminClient({"bootstrap.servers": client.bootstrap,
                                  "socket.connection.setup.timeout.ms": 10_000, **conf})

    def _fail(self, what: str, error: object) -> StromConnectionError:
        return StromConnectionError(
            f"Could not {what} from Kafka brokers {self.bootstrap} (kafka.bootstrap.servers) "
            f"within {TIMEOUT_S:.0f} s: {error}")

    def topics(self) -> dict[str, list[int]]:
        """Every topic and its partitions; fails in bounded time when no broker answers."""
        try:
            metadata = self.admin.list_topics(timeout=TIMEOUT_S)
        except KafkaException as e:
            raise self._fail("fetch metadata", e.args[0]) from None
        return {name: sorted(t.partitions) for name, t in metadata.topics.items() if t.error is None}

    def partitions(self, options: SourceOptions) -> list[Partition]:
        """The topic-partitions the subscription covers now (topics are never auto-created)."""
        found = self.topics()
        if options.assign is not None:
            for topic, parts in options.assign.items():
                missing = sorted(set(parts) - set(found.get(topic, ())))
                if missing:
                    raise StromOptionError(f"assign: topic {topic!r} has no partition(s) {missing}")
            return sorted((t, p) for t, parts in options.assign.items() for p in set(parts))
        return sorted((t, p) for t, parts in found.items() if options.matches(t) for p in parts)

    def list_offsets(self, specs: dict[Partition, OffsetSpec]) -> Offsets:
        if not specs:
            return {}
        # One request per spec kind: TopicPartition keys hash on topic and partition only.
        futures = self.admin.list_offsets(
            {TopicPartition(t, p): spec for (t, p), spec in specs.items()},
            isolation_level=self.isolation, request_timeout=TIMEOUT_S)
        out = {}
        for tp, future in futures.items():
            try:
                out[(tp.topic, tp.partition)] = future.result(timeout=TIMEOUT_S + 5).offset
            except KafkaException as e:
                raise self._fail(f"list offsets of {tp.topic}-{tp.partition}", e.args[0]) from None
            except TimeoutError:
                raise self._fail(f"list offsets of {tp.topic}-{tp.partition}", "timed out") from None
        return out

    def earliest(self, parts: Iterable[Partition]) -> Offsets:
        return self.list_offsets({tp: OffsetSpec.earliest() for tp in parts})

    def latest(self, parts: Iterable[Partition]) -> Offsets:
        """High watermark (read_uncommitted) or last stable offset (read_committed)."""
        return self.list_offsets({tp: OffsetSpec.latest() for tp in parts})

    def resolve(self, spec: object, parts: list[Partition], strategy: str = "error",
                missing: int = EARLIEST) -> Offsets:
        """Concrete offsets for an offset spec (see options.OffsetSpec) over `parts`; a partition
        the spec leaves out gets `missing` (-2 earliest / -1 latest)."""
        if spec == "earliest" or spec == "latest":
            return self.earliest(parts) if spec == "earliest" else self.latest(parts)
        if isinstance(spec, tuple):
            kind, value = spec
            stamps = {tp: value for tp in parts} if kind == "timestamp" else {
                tp: value[tp[0]][tp[1]] for tp in parts if tp[1] in value.get(tp[0], {})}
            found = self.list_offsets({tp: OffsetSpec.for_timestamp(ts) for tp, ts in stamps.items()})
            nothing = [tp for tp, o in found.items() if o < 0]
            if nothing and strategy == "error":
                raise StromOptionError(
                    f"No record at or after the given timestamp in {', '.join(f'{t}-{p}' for t, p in nothing)}; "
                    "set startingOffsetsByTimestampStrategy=latest to start at the end instead")
            wanted = {tp: found.get(tp, missing) for tp in parts}
            wanted.update({tp: LATEST for tp in nothing})
        else:
            wanted = {tp: spec.get(tp[0], {}).get(tp[1], missing) for tp in parts}
        return self._sentinels(wanted)

    def _sentinels(self, wanted: Offsets) -> Offsets:
        early = self.earliest([tp for tp, o in wanted.items() if o == EARLIEST])
        late = self.latest([tp for tp, o in wanted.items() if o == LATEST])
        return {tp: early.get(tp, late.get(tp, o)) for tp, o in wanted.items()}


def split(ranges: list[Range], min_partitions: int | None, max_records: int | None) -> list[Range]:
    """Split large ranges so there are at least `min_partitions` tasks and none holds more than
    `max_records` offsets; pieces of one partition stay in offset order."""
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        pieces = 1
        if min_partitions and total and len(ranges) < min_partitions:
            pieces = max(1, round(r.size * min_partitions / total))
        if max_records:
            pieces = max(pieces, -(-r.size // max_records))
        pieces = max(1, min(pieces, r.size))
        step, extra = divmod(r.size, pieces)
        start = r.start
        for i in range(pieces):
            end = start + step + (1 if i < extra else 0)
            out.append(Range(r.topic, r.partition, start, end))
            start = end
    return out
