"""Consumer group benchmarks: how fast a group forms, how fast it rebalances, commit throughput.

    .venv/bin/python benchmarks/groups.py [--consumers 10] [--partitions 30] [--runs 3]
                                          [--heartbeats 3000,100] [--commit-seconds 3]

Prints one JSON document to stdout (progress on stderr). One broker process (127.0.0.1,
ephemeral port, temp dir) with group.initial.rebalance.delay.ms=0 serves every scenario;
each run uses a group of its own. Clients are confluent-kafka (librdkafka) consumers, each
polled by its own thread.

- cold_stable_s: from creating N consumers until their assignments are complete and
  disjoint. With no initial delay the first member forms a generation alone and each
  later one starts another rebalance, as with Kafka.
- leave_rebalance_s: one member of the stable group closes (LeaveGroup); until the other
  N-1 hold every partition again.
- broker_rebalance_ms: per rebalance, from "preparing to rebalance" to "stabilized" in the
  broker log: the time the coordinator waited for members to rejoin.
- Both depend on how soon members learn of a rebalance, i.e. on heartbeat.interval.ms,
  so each is measured with librdkafka's default (3000 ms) and with fast heartbeats.
- commits_per_s: one consumer committing one partition's offset in a loop, synchronously
  (a round trip each) and asynchronously (librdkafka pipelines them).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import threading
import time
import uuid
from datetime import datetime

try:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from strom.testing import BrokerProcess
except ImportError as e:  # pragma: no cover - a usage error, not a benchmark result
    sys.exit(f"groups.py needs the project venv (confluent-kafka and strom): {e}")

BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": "0", "offsets.topic.num.partitions": "10"}
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def progress(message: str) -> None:
    print(f"[groups] {message}", file=sys.stderr, flush=True)


class PolledConsumer:
    """A subscribed consumer polled by a thread of its own until closed."""

    def __init__(self, bootstrap: str, group: str, topic: str, heartbeat_ms: int) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "heartbeat.interval.ms": heartbeat_ms, "session.timeout.ms": max(6000, 3 * heartbeat_ms),
            "partition.assignment.strategy": "range"})
        self.consumer.subscribe([topic])
        self.assignment: set[int] = set()
        self._stop = threading.Event()
        self._closed = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll(0.02)
            self.assignment = {tp.partition for tp in self.consumer.assignment()}
        self.consumer.close()
        self._closed.set()

    def close(self) -> None:
        self._stop.set()
        self._closed.wait(30)


def wait_balanced(consumers: list[PolledConsumer], partitions: int, timeout: float = 120.0) -> float:
    """Until every consumer holds its even share and together they hold every partition once
    (a group mid-rebalance can be complete and disjoint with some members still empty)."""
    n = len(consumers)
    even = sorted(partitions // n + (1 if i < partitions % n else 0) for i in range(n))
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        sets = [c.assignment for c in consumers]
        if sorted(map(len, sets)) == even and set().union(*sets) == set(range(partitions)):
            return time.monotonic() - start
        time.sleep(0.002)
    raise RuntimeError(f"the group never balanced within {timeout} s")


def broker_rebalances(lines: list[str], group: str) -> list[float]:
    """Milliseconds from each "preparing to rebalance" to the next "stabilized" of `group`."""
    out, started = [], None
    for line in lines:
        if f"group {group} " not in line and f"group {group}:" not in line:
            continue
        match = _LOG_TIME.match(line)
        if not match:
            continue
        at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if "preparing to rebalance" in line and started is None:
            started = at
        elif "stabilized group" in line and started is not None:
            out.append(round((at - started) * 1000, 1))
            started = None
    return out


def group_scenarios(broker: BrokerProcess, topic: str, args, heartbeat_ms: int) -> dict:
    cold, leave, broker_ms = [], [], []
    for run in range(args.runs):
        group = f"bench-{heartbeat_ms}-{run}-{uuid.uuid4().hex[:6]}"
        started = time.monotonic()
        consumers = [PolledConsumer(broker.bootstrap, group, topic, heartbeat_ms)
                     for _ in range(args.consumers)]
        wait_balanced(consumers, args.partitions)
        cold.append(round(time.monotonic() - started, 3))  # from the first consumer's creation
        time.sleep(0.5)
        leaving = consumers.pop()
        left_at = time.monotonic()
        leaving.close()
        wait_balanced(consumers, args.partitions)
        leave.append(round(time.monotonic() - left_at, 3))
        for c in consumers:
            c.close()
        broker_ms.extend(broker_rebalances(broker.stderr_lines, group))
        progress(f"heartbeat {heartbeat_ms} ms, run {run + 1}: stable after {cold[-1]} s, "
                 f"rebalance after leave {leave[-1]} s")
    return {
        "heartbeat_interval_ms": heartbeat_ms,
        "cold_stable_s": {"runs": cold, "median": statistics.median(cold)},
        "leave_rebalance_s": {"runs": leave, "median": statistics.median(leave)},
        "broker_rebalance_ms": {"count": len(broker_ms), "median": statistics.median(broker_ms)
                                if broker_ms else None, "max": max(broker_ms, default=None)},
    }


def commit_throughput(broker: BrokerProcess, topic: str, seconds: float, window: int = 64) -> dict:
    completed = 0

    def on_commit(err, partitions) -> None:
        nonlocal completed
        assert err is None, err
        completed += 1

    group = f"bench-commit-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False, "on_commit": on_commit})
    try:
        offset = 0

        def commit(asynchronous: bool) -> None:
            nonlocal offset
            offset += 1
            consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=asynchronous)

        commit(False)  # the coordinator lookup happens once, outside the measurement
        consumer.poll(0)
        out = {}
        # sync: one round trip per commit. async: up to `window` commits in flight (librdkafka
        # would otherwise queue without bound and the number would say nothing).
        for mode in ("sync", "async"):
            consumer.poll(0)
            completed, sent, start = 0, 0, time.monotonic()
            while time.monotonic() - start < seconds:
                if mode == "sync":
                    commit(False)
                    sent += 1
                elif sent - completed < window:
                    commit(True)
                    sent += 1
                else:
                    consumer.poll(0.0005)
            while mode == "async" and completed < sent:
                consumer.poll(0.01)
            elapsed = time.monotonic() - start
            out[mode] = round(sent / elapsed)
        (committed,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        assert committed.offset == offset, (committed.offset, offset)
        out["async_window"] = window
        progress(f"commits/s: {out}")
        return out
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consumers", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--heartbeats", default="3000,100",
                        help="heartbeat.interval.ms values to measure with (comma-separated)")
    parser.add_argument("--commit-seconds", type=float, default=3.0)
    args = parser.parse_args()
    with BrokerProcess(overrides=BROKER_OVERRIDES) as broker:
        topic = "bench-groups"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(15)
        # The first group request creates __consumer_offsets: not part of any measurement.
        warm_up = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-warm-up"})
        warm_up.committed([TopicPartition(topic, 0)], timeout=15)
        warm_up.close()
        result = {
            "consumers": args.consumers,
            "partitions": args.partitions,
            "groups": [group_scenarios(broker, topic, args, int(h))
                       for h in args.heartbeats.split(",")],
            "commits_per_s": commit_throughput(broker, topic, args.commit_seconds),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
