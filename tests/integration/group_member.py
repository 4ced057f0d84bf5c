"""One consumer group member in a process of its own, so that tests can kill it with SIGKILL
(no LeaveGroup) as well as close it cleanly.

Run as `python group_member.py '<json>'` with {"client": "confluent" | "kafka-python" |
"aiokafka", "bootstrap", "group", "topics", "conf": {...client settings...}}. The member
subscribes and polls until told otherwise. It reports on stdout, one JSON object per line:

    {"event": "assignment", "partitions": [[topic, p], ...]}   whenever its assignment changes
    {"event": "consumed", "n": total}                            whenever records arrive
    {"event": "revoked" | "assigned" | "lost", "partitions": [...]}   from the rebalance callbacks
    {"event": "closed"}                                          after a clean close

and reads commands on stdin: "commit" (synchronous commit of what it consumed) and "close".
`Member` is the test-side handle.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable


def _emit(event: str, partitions=None, **fields) -> None:
    out = {"event": event, "t": time.monotonic(), **fields}
    if partitions is not None:
        out["partitions"] = sorted([t, p] for t, p in partitions)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def _commands() -> queue.Queue:
    commands: queue.Queue = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("close")  # the test went away

    threading.Thread(target=read, daemon=True).start()
    return commands


def run_confluent(spec: dict, commands: queue.Queue) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"],
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         **spec["conf"]})

    def tps(partitions):
        return [(tp.topic, tp.partition) for tp in partitions]

    consumer.subscribe(spec["topics"],
                       on_assign=lambda c, ps: _emit("assigned", tps(ps)),
                       on_revoke=lambda c, ps: _emit("revoked", tps(ps)),
                       on_lost=lambda c, ps: _emit("lost", tps(ps)))
    last, consumed = None, 0
    while True:
        msg = consumer.poll(0.05)
        if msg is not None and msg.error() is None:
            consumed += 1
            _emit("consumed", n=consumed)
        current = sorted(tps(consumer.assignment()))
        if current != last:
            last = current
            _emit("assignment", current)
        try:
            command = commands.get_nowait()
        except queue.Empty:
            continue
        if command == "commit":
            try:
                consumer.commit(asynchronous=False)
            except Exception as e:  # nothing consumed yet: not an error for the tests
                _emit(f"commit-failed: {e}")
            _emit("committed")
        elif command == "close":
            consumer.close()
            _emit("closed")
            return


def run_kafka_python(spec: dict, commands: queue.Queue) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            _emit("revoked", [(tp.topic, tp.partition) for tp in revoked])

        def on_partitions_assigned(self, assigned):
            _emit("assigned", [(tp.topic, tp.partition) for tp in assigned])

    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    by_name = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor,
               "cooperative-sticky": CooperativeStickyAssignor}
    conf = dict(spec["conf"])
    if "assignors" in conf:  # assignor classes cannot travel as JSON: they go by name
        conf["partition_assignment_strategy"] = [by_name[n] for n in conf.pop("assignors")]
    consumer = KafkaConsumer(bootstrap_servers=spec["bootstrap"], group_id=spec["group"],
                             auto_offset_reset="earliest", enable_auto_commit=False, **conf)
    # Know the topics before joining. Otherwise a leader may assign before it has their
    # metadata, rejoin when it arrives, and (kafka-python 3.0.12) lose that rejoin's result if
    # a poll times out while it is in flight: the member then stops heartbeating.
    for topic in spec["topics"]:
        consumer.partitions_for_topic(topic)
    consumer.subscribe(spec["topics"], listener=Listener())
    last, consumed = None, 0
    while True:
        # Long enough for a JoinGroup to complete inside one poll: kafka-python 3.0.12 can drop
        # a join that completes after poll() returned early, if it no longer wants to rejoin.
        batch = consumer.poll(timeout_ms=500)
        if batch:
            consumed += sum(len(records) for records in batch.values())
            _emit("consumed", n=consumed)
        current = sorted((tp.topic, tp.partition) for tp in consumer.assignment())
        if current != last:
            last = current
            _emit("assignment", current)
        try:
            command = commands.get_nowait()
        except queue.Empty:
            continue
        if command == "commit":
            consumer.commit()
            _emit("committed")
        elif command == "close":
            consumer.close()
            _emit("closed")
            return


def run_aiokafka(spec: dict, commands: queue.Queue) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):
            _emit("revoked", [(tp.topic, tp.partition) for tp in revoked])

        async def on_partitions_assigned(self, assigned):
            _emit("assigned", [(tp.topic, tp.partition) for tp in assigned])

    async def main() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=spec["bootstrap"], group_id=spec["group"],
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    **spec["conf"])
        consumer.subscribe(spec["topics"], listener=Listener())
        await consumer.start()
        last, consumed = None, 0
        while True:
            batch = await consumer.getmany(timeout_ms=50)
            if batch:
                consumed += sum(len(records) for records in batch.values())
                _emit("consumed", n=consumed)
            current = sorted((tp.topic, tp.partition) for tp in consumer.assignment())
            if current != last:
                last = current
                _emit("assignment", current)
            try:
                command = commands.get_nowait()
            except queue.Empty:
                continue
            if command == "commit":
                await consumer.commit()
                _emit("committed")
            elif command == "close":
                await consumer.stop()
                _emit("closed")
                return

    asyncio.run(main())


RUNNERS = {"confluent": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}

# Per-client names of the settings tests use: a short session so that a killed member is
# noticed quickly, frequent heartbeats so that rebalances are seen quickly.
SETTINGS = {
    "confluent": lambda session_ms, instance_id: {
        "session.timeout.ms": session_ms, "heartbeat.interval.ms": 200,
        "max.poll.interval.ms": max(session_ms, 10000),
        **({"group.instance.id": instance_id} if instance_id else {})},
    "kafka-python": lambda session_ms, instance_id: {
        "session_timeout_ms": session_ms, "heartbeat_interval_ms": 200,
        "max_poll_interval_ms": max(session_ms, 10000),
        **({"group_instance_id": instance_id} if instance_id else {})},
    "aiokafka": lambda session_ms, instance_id: {
        "session_timeout_ms": session_ms, "heartbeat_interval_ms": 200,
        "max_poll_interval_ms": max(session_ms, 10000), "rebalance_timeout_ms": 10000,
        **({"group_instance_id": instance_id} if instance_id else {})},
}


class Member:
    """A member process and what it reported."""

    def __init__(self, client: str, bootstrap: str, group: str, topics: list[str],
                 session_ms: int = 3000, instance_id: str | None = None,
                 group_protocol: str = "classic", **conf) -> None:
        if group_protocol == "consumer":
            # KIP-848 (librdkafka): the session and heartbeats are the broker's business.
            settings = {"group.protocol": "consumer"}
        else:
            settings = SETTINGS[client](session_ms, instance_id)
        spec = {"client": client, "bootstrap": bootstrap, "group": group, "topics": topics,
                "conf": {**settings, **conf}}
        self.client = client
        self.events: list[dict] = []
        self._changed = threading.Condition()
        # STROM_MEMBER_LOG_DIR=<dir> keeps each member's client debug log, for a failing run.
        log_dir = os.environ.get("STROM_MEMBER_LOG_DIR")
        stderr = open(os.path.join(log_dir, f"{client}-{time.time_ns()}.log"), "w") if log_dir \
            else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, __file__, json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        if log_dir:
            stderr.close()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()

    @property
    def assignment(self) -> set[tuple[str, int]]:
        with self._changed:
            for event in reversed(self.events):
                if event["event"] == "assignment":
                    return {tuple(tp) for tp in event["partitions"]}
        return set()

    def partitions(self) -> set[int]:
        return {p for _, p in self.assignment}

    def consumed(self) -> int:
        with self._changed:
            return max((e["n"] for e in self.events if e["event"] == "consumed"), default=0)

    def reported(self, event: str, since: float = 0.0) -> list[set[int]]:
        """The partition sets of every `event` reported after monotonic time `since`."""
        with self._changed:
            return [{p for _, p in e["partitions"]} for e in self.events
                    if e["event"] == event and e["t"] >= since]

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.client} member: timed out waiting for {what}; "
                                         f"events: {self.events[-10:]}")
                self._changed.wait(min(left, 0.1))

    def command(self, command: str, done_event: str, timeout: float = 20.0) -> None:
        count = sum(1 for e in self.events if e["event"] == done_event)
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self.wait(lambda: sum(1 for e in self.events if e["event"] == done_event) > count,
                  timeout, done_event)

    def close(self) -> None:
        """A clean close: the member leaves the group (LeaveGroup or its KIP-848 heartbeat)."""
        self.command("close", "closed")
        self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL: the coordinator only learns of it when the session times out."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def __enter__(self) -> Member:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def coordinator_lines(broker, group: str, text: str, since: int = 0) -> int:
    """How many lines of `broker`'s log from line `since` on name `group` and contain `text`:
    the coordinator says why members come and go ("has failed" for an expired session, "through
    explicit LeaveGroup", "preparing to rebalance"), which no wall clock can show reliably."""
    lines = broker.stderr_lines[since:]
    return sum(1 for line in lines if group in line and text in line)


def assert_rejoined_without_rebalance(broker, group: str, instance_id: str, since: int) -> None:
    """The coordinator took the restarted static member back in place: it logged the rejoin,
    started no rebalance (a rebalance starts within the JoinGroup that would cause it, before
    the member has its partitions), and the group is stable."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    from strom.testing import wait_for

    wait_for(lambda: coordinator_lines(broker, group, f"instance id {instance_id} rejoins group", since) == 1,
             30, what="the coordinator to log the static member's rejoin")
    assert coordinator_lines(broker, group, "preparing to rebalance", since) == 0
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(15)
    assert described.state == ConsumerGroupState.STABLE and len(described.members) == 2


def wait_balanced(members: list[Member], partitions: int, sizes: list[int] | None = None,
                  timeout: float = 30.0, topic: str | None = None) -> list[set[int]]:
    """Wait until the members' assignments are disjoint, cover partitions 0..n-1 and have the
    expected sizes (default: as even as possible). Returns each member's partitions."""
    expected = sorted(sizes or [partitions // len(members) + (1 if i < partitions % len(members) else 0)
                                for i in range(len(members))])
    deadline = time.monotonic() + timeout
    while True:
        current = [m.partitions() for m in members]
        union = set().union(*current)
        if union == set(range(partitions)) and sum(map(len, current)) == partitions \
                and sorted(map(len, current)) == expected:
            return current
        if time.monotonic() > deadline:
            recent = "\n".join(f"  {m.client} pid {m.proc.pid}: {m.events[-6:]}" for m in members)
            raise AssertionError(f"assignments never balanced: {current} (expected sizes "
                                 f"{expected}); latest events:\n{recent}")
        time.sleep(0.05)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get("STROM_MEMBER_LOG_DIR"):
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")
    config = json.loads(sys.argv[1])
    RUNNERS[config["client"]](config, _commands())
