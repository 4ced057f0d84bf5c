"""Driver-side offset work: which topic-partitions a subscription covers, and where each read
starts and ends (the Kafka requests; ranges.py holds what needs none)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from strom.spark import clients
from strom.spark.options import EARLIEST, LATEST, ClientOptions, SourceOptions, StromOptionError
from strom.spark.ranges import Offsets, Partition

TIMEOUT_S = 15.0  # bound on every metadata/offset request from the driver
# Kafka's internal topics: left out of subscribePattern matches unless
# kafka.exclude.internal.topics=false, as the Java consumer does.
INTERNAL_TOPICS = {"__consumer_offsets", "__transaction_state", "__share_group_state"}
RETRY_BACKOFF_S = 0.2
# Answers that mean "not here yet" while a leader moves or a broker restarts.
RETRIABLE_CODES = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.LEADER_NOT_AVAILABLE,
                   KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError._TRANSPORT, KafkaError._TIMED_OUT}


class StromConnectionError(RuntimeError):
    """The brokers could not be reached or did not answer in time."""

    retriable = False


class Admin:
    """Metadata and ListOffsets through librdkafka's admin client, with bounded waits."""

    def __init__(self, client: ClientOptions, isolation: str = "read_uncommitted",
                 retries: int = 0, retry_interval_ms: int = 1000) -> None:
        self.bootstrap = client.bootstrap
        self.isolation = (IsolationLevel.READ_COMMITTED if isolation == "read_committed"
                          else IsolationLevel.READ_UNCOMMITTED)
        self.timeout_s = client.request_timeout_ms / 1000 if client.request_timeout_ms else TIMEOUT_S
        self.retries, self.retry_interval_s = retries, retry_interval_ms / 1000
        self.errors = clients.BrokerErrors(client.bootstrap)
        self.admin = clients.make(AdminClient, client, "admin", self.errors,
                                  **{"socket.connection.setup.timeout.ms": 10_000})

    @classmethod
    def of(cls, opts: SourceOptions) -> Admin:
        return cls(opts.client, opts.isolation_level, opts.offset_retries, opts.offset_retry_interval_ms)

    def _fail(self, what: str, error: object) -> StromConnectionError:
        return StromConnectionError(
            f"Could not {what} from Kafka brokers {self.bootstrap} (kafka.bootstrap.servers) "
            f"within {self.timeout_s:.0f} s: {error}")

    def topics(self) -> dict[str, list[int]]:
        """Every topic and its partitions; fails in bounded time when no broker answers, at
        once (with their reason) when the brokers refuse the connection."""
        try:
            metadata = clients.wait(lambda s: self.admin.list_topics(timeout=s), self.errors, self.timeout_s,
                                    self.admin.poll, lambda e: e.args[0].code() in RETRIABLE_CODES)
        except KafkaException as e:
            raise self._fail("fetch metadata", e.args[0]) from None
        return {name: sorted(t.partitions) for name, t in metadata.topics.items() if t.error is None}

    def partitions(self, options: SourceOptions, batch: bool = False) -> list[Partition]:
        """The topic-partitions the subscription covers now (topics are never auto-created). A
        batch read of a topic that does not exist fails, as Spark's does; a stream waits for it."""
        found = self.topics()
        if options.assign is not None:
            for topic, parts in options.assign.items():
                if topic not in found:
                    raise StromOptionError(f"assign: topic {topic!r} does not exist")
                missing = sorted(set(parts) - set(found[topic]))
                if missing:
                    raise StromOptionError(f"assign: topic {topic!r} has no partition(s) {missing} "
                                           f"(it has {found[topic]})")
            return sorted((t, p) for t, parts in options.assign.items() for p in set(parts))
        absent = [t for t in options.subscribe if t not in found]
        if batch and absent:
            raise StromOptionError(f"subscribe: topic(s) {', '.join(map(repr, absent))} do not exist")
        if options.pattern is not None and options.client.exclude_internal_topics:
            found = {t: parts for t, parts in found.items() if t not in INTERNAL_TOPICS}
        return sorted((t, p) for t, parts in found.items() if options.matches(t) for p in parts)

    def list_offsets(self, specs: dict[Partition, OffsetSpec]) -> Offsets:
        """ListOffsets, tried again up to `retries` times (fetchOffset.numRetries), and on
        retriable errors (a leader moving, a broker restarting) until the request timeout, as
        the Java admin client Spark's connector uses retries them."""
        deadline = time.monotonic() + self.timeout_s
        attempt = 0
        while True:
            try:
                return self._list_offsets(specs)
            except StromConnectionError as e:
                attempt += 1
                if attempt > self.retries and not (e.retriable and time.monotonic() < deadline):
                    raise
                time.sleep(self.retry_interval_s if attempt <= self.retries else RETRY_BACKOFF_S)

    def _list_offsets(self, specs: dict[Partition, OffsetSpec]) -> Offsets:
        if not specs:
            return {}
        # One request per spec kind: TopicPartition keys hash on topic and partition only.
        futures = self.admin.list_offsets(
            {TopicPartition(t, p): spec for (t, p), spec in specs.items()},
            isolation_level=self.isolation, request_timeout=self.timeout_s)
        out = {}
        for tp, future in futures.items():
            try:
                out[(tp.topic, tp.partition)] = self._result(future).offset
            except KafkaException as e:
                error = self._fail(f"list offsets of {tp.topic}-{tp.partition}", e.args[0])
                error.retriable = bool(e.args[0].retriable()) or e.args[0].code() in RETRIABLE_CODES
                raise error from None
            except TimeoutError:
                raise self._fail(f"list offsets of {tp.topic}-{tp.partition}", "timed out") from None
        return out

    def _result(self, future: Future) -> Any:
        """A request's answer, within the request timeout; a refusal by the brokers ends the
        wait at once."""
        deadline = time.monotonic() + self.timeout_s + 5
        while True:
            try:
                return future.result(timeout=clients.FIRST_SLICE_S)
            except TimeoutError:
                self.admin.poll(0)
                self.errors.check()
                if time.monotonic() >= deadline:
                    raise

    def earliest(self, parts: Iterable[Partition]) -> Offsets:
        return self.list_offsets({tp: OffsetSpec.earliest() for tp in parts})

    def latest(self, parts: Iterable[Partition]) -> Offsets:
        """High watermark (read_uncommitted) or last stable offset (read_committed)."""
        return self.list_offsets({tp: OffsetSpec.latest() for tp in parts})

    def resolve(self, spec: object, parts: list[Partition], strategy: str = "error",
                missing: int = EARLIEST, name: str = "startingOffsets") -> Offsets:
        """Concrete offsets for an offset spec (see options.OffsetSpec) over `parts`. JSON must
        name exactly `parts`, as Spark's source insists; a partition appearing since the query
        began (`missing`-filled) is the streaming case."""
        if spec == "earliest" or spec == "latest":
            return self.earliest(parts) if spec == "earliest" else self.latest(parts)
        if isinstance(spec, tuple):
            kind, value = spec
            if kind == "timestamps":
                check_covers(value, parts, name.replace("Offsets", "OffsetsByTimestamp"))
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
            check_covers(spec, parts, name)
            wanted = {tp: spec.get(tp[0], {}).get(tp[1], missing) for tp in parts}
        return self._sentinels(wanted)

    def _sentinels(self, wanted: Offsets) -> Offsets:
        early = self.earliest([tp for tp, o in wanted.items() if o == EARLIEST])
        late = self.latest([tp for tp, o in wanted.items() if o == LATEST])
        return {tp: early.get(tp, late.get(tp, o)) for tp, o in wanted.items()}


def check_covers(spec: dict[str, dict[int, int]], parts: list[Partition], name: str) -> None:
    """Per-partition JSON must name every partition read and nothing else (Spark's rule: a
    misspelled topic would otherwise silently read from the default)."""
    named = {(t, p) for t, ps in spec.items() for p in ps}
    wanted = set(parts)
    if named == wanted:
        return
    problems = []
    topics = {t for t, _ in parts}
    unknown = sorted({t for t, _ in named if t not in topics})
    if unknown:
        problems.append(f"topic(s) {', '.join(map(repr, unknown))} that the query does not read")
    extra = sorted(tp for tp in named - wanted if tp[0] in topics)
    if extra:
        problems.append("partition(s) that do not exist: " + ", ".join(f"{t}-{p}" for t, p in extra))
    left_out = sorted(wanted - named)
    if left_out:
        problems.append("no offset for " + ", ".join(f"{t}-{p}" for t, p in left_out))
    raise StromOptionError(f"{name} must give an offset for every partition the query reads and no "
                           f"other (-2 for earliest, -1 for latest): it names {'; '.join(problems)}")
