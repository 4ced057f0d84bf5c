"""Cluster benchmark: what a 3-broker Strom cluster on ZooKeeper costs and how fast it recovers.

    .venv/bin/python benchmarks/cluster.py [--scenarios a,b,...] [--json FILE] [--records N]
                                           [--session-timeouts 4000,10000] [--client-debug FILE]

One ZooKeeper (Debian's, no fsync: `ZooKeeperServer(fsync=False)`) serves every scenario; each
scenario starts its own `strom.testing.Cluster` of three real `strom serve` processes (under a
fresh chroot, 127.0.0.1, temp dirs) and closes it. Clients are confluent-kafka (librdkafka);
Metadata polls use `RawClient` (Metadata v12) so that each broker is asked about its own view.
Progress and one line of numbers per scenario go to stderr; one JSON document goes to stdout
(and to `--json FILE`). A scenario that fails prints its error and the others still run.

Scenarios (every time is wall clock, `time.monotonic()`):

- `create-topics`: CreateTopics (AdminClient, after its connection is up) of one topic of 1,000
  partitions with replication factor 3. `response_s`: until the CreateTopics future resolves.
  `all_brokers_s`: until EVERY broker's Metadata shows all 1,000 partitions with a leader >= 0
  (`per_broker_s` for each); `replicas_created_s`: until every broker has a log directory for
  each of the 1,000 partitions (the LeaderAndIsr work, not required by a client).
- `controller-failover`: kill -9 the controller; `metadata_s`: until the first surviving broker
  answers Metadata with `controller_id` naming a new, live broker (that broker got the new
  controller's first UpdateMetadata); `all_metadata_s` until both survivors do; `zk_s` until
  /controller names the new one. Once per `--session-timeouts` value (zookeeper.session.timeout.ms,
  default 4000 and 10000): the old controller's session must expire before anyone can take over,
  so the session timeout is the baseline here.
- `replication-throughput`: `--records` (300,000) records of 100 bytes with one Producer
  (linger.ms=5, batch.size=1,000,000, compression none) into (a) an RF=1 topic with acks=1 and
  (b) an RF=3 topic with acks=all and min.insync.replicas=2, 3 partitions each, on the same
  cluster; passes alternate a, b, a, b, a, b (`--passes`, 3) and the median is reported.
  records/s = records ÷ time from the first produce() to flush() returning with every record
  acknowledged; `delivered` checks the acknowledgements and the end offsets. `ratio` = b ÷ a
  (target >= 0.6): (a) is the baseline. `brokers_cpu_s_per_gb`: utime+stime of all three
  brokers per 10^9 payload bytes (what replication costs even when the client sets the pace);
  `client_cpu_util`: this process (the producer, librdkafka's threads included), in cores.
- `replication-lag`: one producer (acks=1, linger.ms=1) at ~50,000 records/s of 100 bytes for 10 s
  into partition 0 of an RF=3 topic; a consumer process (read_uncommitted, assign, fetch.wait.max.ms=5)
  reads it. Each record carries the CLOCK_MONOTONIC time (shared by all processes on Linux) of its
  produce() call, and the consumer subtracts it on arrival: that is leader append -> high watermark
  (both followers fetched it, and fetched again to confirm) -> consumer fetch, plus the client's
  own batching. The first 0.5 s is left out. The same load on an RF=1 topic (the high watermark
  moves on append) is the baseline.
- `catch-up`: cluster with replica.lag.time.max.ms=3000; an RF=3 topic of 3 partitions whose
  leaders are the two brokers that stay up. kill -9 one follower, produce ~200 MB of 1,000-byte
  records with acks=1 (at most ~30 s), start the follower again and time until its log files hold
  as many bytes as the leaders' (`bytes_match_s`, from spawning it; `from_ready_s` from its
  "ready" line) and until Metadata lists it in the ISR again (`isr_s`). `mb_per_s` = bytes it
  was missing ÷ `bytes_match_s` (start-up included); `mb_per_s_from_ready` without it. Both
  are polled every ~50 ms; the ISR can come first: a follower rejoins once it has fetched up
  to the high watermark, and the size of its files is only seen once it has written them.
- `leader-kill`: a 1-partition RF=3 topic (min.insync.replicas=2) with assignment [[a, b, c]] where
  a, the leader, is not the controller; an idempotent acks=all producer (linger.ms=5) at ~5,000
  records/s (`--failover-rate`) of 100 bytes, each carrying a sequence number and its produce()
  time; after 2 s kill -9 the leader, then produce until 4 s after a live broker's Metadata
  (the controller's) names a new leader. `max_gap_s`: the longest gap between consecutive
  acknowledgements (delivery callbacks, polled every 1 ms) ending after 1 s before the kill;
  `first_ack_after_s`: kill -> the first acknowledgement after it; `first_new_record_ack_s`: kill ->
  the first acknowledgement of a record produce()d after the kill; `baseline_max_gap_s`: the
  longest gap before it; `exactly_once`: acknowledgements (distinct sequence numbers) == end
  offset. Once per `--session-timeouts` value: nothing moves before the dead leader's session
  expires.
- `controlled-shutdown`: the same with SIGTERM (BrokerProcess.stop(): controlled shutdown, then
  exit) instead of kill -9, session timeout 4000 ms, 3 s of producing after it. Target: under 1 s.
- `rolling-restart`: an RF=3 topic of 3 partitions (min.insync.replicas=2) and the same producer
  at ~20,000 records/s (`--rolling-rate`); after 2 s, brokers 1, 2, 3 in turn get SIGTERM, are
  started again, and the next waits until another broker's Metadata lists the restarted one in
  every partition's ISR. `total_s`: the first SIGTERM -> the last broker back in every ISR; the
  longest gap between acknowledgements from the first SIGTERM to 2 s after the end; then a
  consumer reads every partition up to its end offset and checks each acknowledged sequence
  number is read exactly once (`duplicates`, `acked_not_read`, `read_not_acked`).
- `--client-debug FILE` appends librdkafka's debug lines (msg,protocol,topic,metadata) around
  each leader-kill and controlled-shutdown, and around rolling-restart's longest gap, with
  ms since the disruption and wall time (to compare with the brokers' logs).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import statistics
import struct
import sys
import threading
import time
import traceback
import uuid
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent

try:
    import confluent_kafka
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from strom.testing import Cluster, RawClient
    from strom.zookeeper_server import ZooKeeperServer, zookeeper_available
except ImportError as e:  # pragma: no cover - a usage error, not a benchmark result
    sys.exit(f"cluster.py needs the project venv (confluent-kafka, kazoo and strom): {e}\n"
             f"use: .venv/bin/python benchmarks/cluster.py")

sys.path.insert(0, str(HERE))
import run  # noqa: E402  (the harness next to this file: machine description, progress log)

METADATA = 3
MB = 1_000_000
RECORD_SIZE = 100
SCENARIOS = ("create-topics", "controller-failover", "replication-throughput", "replication-lag", "catch-up",
             "leader-kill", "controlled-shutdown", "rolling-restart")
# Small internal topics: a 2-core machine runs three brokers and the clients.
CLUSTER_OVERRIDES = {
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "3",
    "default.replication.factor": "3",
}
TARGET_RATIO = 0.6
_STAMP = struct.Struct(">q")

log = run.log


# --- helpers ----------------------------------------------------------------------------------
LAST_CLUSTER: list[Cluster] = []  # the scenario's cluster, for its brokers' errors if it fails


def new_cluster(zk: ZooKeeperServer, overrides: dict[str, str] | None = None, **kw) -> Cluster:
    cluster = Cluster(3, zookeeper=zk, overrides={**CLUSTER_OVERRIDES, **(overrides or {})}, **kw)
    LAST_CLUSTER[:] = [cluster]
    return cluster


def live(cluster: Cluster) -> dict:
    return {i: b for i, b in cluster.brokers.items() if b.proc is not None and b.proc.poll() is None}


def metadata(client: RawClient, topics: list[str] | None):
    return client.call(METADATA, 12, {
        "topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
        "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})


def partitions_view(client: RawClient, topic: str) -> dict[int, tuple[int, list[int]]]:
    """partition -> (leader, isr) as this broker answers Metadata."""
    for t in metadata(client, [topic]).topics:
        if t.name == topic and t.error_code == 0:
            return {p.partition_index: (p.leader_id, list(p.isr_nodes)) for p in t.partitions}
    return {}


def create_topic(cluster: Cluster, topic: str, partitions: int = 3, factor: int = 3,
                 assignment: list[list[int]] | None = None, configs: dict | None = None) -> None:
    client = AdminClient({"bootstrap.servers": cluster.bootstrap})
    # confluent-kafka wants num_partitions == len(assignment) with an assignment (it calls -1 a default)
    new = (NewTopic(topic, len(assignment), replica_assignment=assignment, config=configs or {}) if assignment
           else NewTopic(topic, partitions, factor, config=configs or {}))
    client.create_topics([new], request_timeout=60)[topic].result(60)
    # Wait until every live broker knows every partition's leader, so that clients start at once.
    count = len(assignment) if assignment else partitions
    for broker in live(cluster).values():
        with RawClient(broker) as raw:
            cluster.wait_for(lambda raw=raw: all_led(partitions_view(raw, topic), count), 30, f"leaders of {topic}")


def all_led(view: dict[int, tuple[int, list[int]]], partitions: int) -> bool:
    return len(view) == partitions and all(leader >= 0 for leader, _ in view.values())


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-offsets"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)]
    finally:
        consumer.close()


def log_bytes(broker, topic: str, partition: int) -> int:
    directory = broker.data_dir / "logs" / f"{topic}-{partition}"
    total = 0
    for path in directory.glob("*.log"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # a segment deleted or renamed meanwhile
            pass
    return total


def broker_errors(cluster: Cluster, per_broker: int = 3) -> list[str]:
    """The last ERROR lines and the exceptions that ended tracebacks, per broker."""
    out = []
    for broker_id, broker in cluster.brokers.items():
        lines, found, in_traceback = broker.stderr_lines, [], False
        for line in lines:
            if line.startswith("Traceback"):
                in_traceback = True
            elif in_traceback and line and not line.startswith(" "):
                found.append(line)
                in_traceback = False
            elif " ERROR " in line:
                found.append(line)
        out += [f"broker {broker_id}: {line}" for line in found[-per_broker:]]
    return out


# --- create-topics --------------------------------------------------------------------------
def scenario_create_topics(zk: ZooKeeperServer, args) -> dict:
    partitions = args.create_partitions
    with new_cluster(zk) as cluster:
        topic = f"bench-create-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.list_topics(timeout=10)  # the connection is up before the clock starts
        clients = {i: RawClient(b) for i, b in cluster.brokers.items()}
        try:
            started = time.monotonic()
            future = admin.create_topics([NewTopic(topic, partitions, 3)], request_timeout=120)[topic]
            future.result(120)
            response_s = time.monotonic() - started
            per_broker: dict[int, float] = {}
            replicas_at: float | None = None
            deadline = started + 90
            while (len(per_broker) < len(clients) or replicas_at is None) and time.monotonic() < deadline:
                for broker_id, client in clients.items():
                    if broker_id in per_broker:
                        continue
                    if all_led(partitions_view(client, topic), partitions):
                        per_broker[broker_id] = time.monotonic() - started
                if replicas_at is None and all(
                        sum(1 for _ in (b.data_dir / "logs").glob(f"{topic}-*")) >= partitions
                        for b in cluster.brokers.values()):
                    replicas_at = time.monotonic() - started
                time.sleep(0.1)
            if len(per_broker) < len(clients):
                raise AssertionError(f"after 90 s only brokers {sorted(per_broker)} show all {partitions} leaders")
        finally:
            for client in clients.values():
                client.close()
        result = {"partitions": partitions, "replication_factor": 3, "response_s": round(response_s, 3),
                  "all_brokers_s": round(max(per_broker.values()), 3),
                  "per_broker_s": {str(i): round(s, 3) for i, s in sorted(per_broker.items())},
                  "replicas_created_s": None if replicas_at is None else round(replicas_at, 3)}
        if errors := broker_errors(cluster):
            result["broker_errors"] = errors
    log(f"create-topics: {partitions} partitions x RF 3: CreateTopics answered in {result['response_s']} s, "
        f"all brokers' Metadata show every leader after {result['all_brokers_s']} s "
        f"(per broker {result['per_broker_s']}), replica dirs on all brokers after {result['replicas_created_s']} s")
    return result


# --- controller-failover --------------------------------------------------------------------
def failover_once(zk: ZooKeeperServer, session_timeout_ms: int) -> dict:
    with new_cluster(zk, session_timeout_ms=session_timeout_ms) as cluster:
        cluster.wait_for(lambda: cluster.controller_id() >= 0, 30, "a controller")
        old = cluster.controller_id()
        survivors = {i: b for i, b in cluster.brokers.items() if i != old}
        clients = {i: RawClient(b) for i, b in survivors.items()}
        try:
            for client in clients.values():  # everyone knows the first controller
                cluster.wait_for(lambda c=client: metadata(c, []).controller_id == old, 10, "the first controller")
            epoch = cluster.controller_epoch()
            started = time.monotonic()
            cluster.brokers[old].kill()
            seen: dict[int, float] = {}
            zk_at: float | None = None
            deadline = started + session_timeout_ms / 1000 + 60
            while (len(seen) < len(clients) or zk_at is None) and time.monotonic() < deadline:
                for broker_id, client in clients.items():
                    if broker_id not in seen and metadata(client, []).controller_id in survivors:
                        seen[broker_id] = time.monotonic() - started
                if zk_at is None and cluster.controller_id() in survivors:
                    zk_at = time.monotonic() - started
                time.sleep(0.01)
            if not seen:
                raise AssertionError(f"no surviving broker named a new controller within {deadline - started:.0f} s")
            new = cluster.controller_id()
            new_epoch = cluster.controller_epoch()
        finally:
            for client in clients.values():
                client.close()
    return {"session_timeout_ms": session_timeout_ms, "old_controller": old, "new_controller": new,
            "controller_epoch": [epoch, new_epoch],
            "metadata_s": round(min(seen.values()), 3),
            "all_metadata_s": round(max(seen.values()), 3) if len(seen) == len(clients) else None,
            "zk_s": None if zk_at is None else round(zk_at, 3),
            "after_session_timeout_s": round(min(seen.values()) - session_timeout_ms / 1000, 3)}


def scenario_controller_failover(zk: ZooKeeperServer, args) -> dict:
    results = {}
    for timeout_ms in args.session_timeouts:
        r = failover_once(zk, timeout_ms)
        results[f"session_{timeout_ms}ms"] = r
        log(f"controller-failover: session timeout {timeout_ms} ms: kill -9 of controller {r['old_controller']} -> "
            f"a survivor's Metadata names controller {r['new_controller']} after {r['metadata_s']} s "
            f"(both survivors {r['all_metadata_s']} s, /controller {r['zk_s']} s; "
            f"{r['after_session_timeout_s']:+} s after the session timeout)")
    return results


# --- replication-throughput ------------------------------------------------------------------
def brokers_cpu(cluster: Cluster) -> float:
    return sum(run.cpu_seconds(b.proc.pid) for b in live(cluster).values())


def produce_pass(cluster: Cluster, topic: str, records: int, acks: str) -> dict:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": acks, "linger.ms": 5,
                         "batch.size": 1_000_000, "batch.num.messages": 1_000_000,
                         "compression.type": "none", "queue.buffering.max.kbytes": 512 * 1024,
                         "queue.buffering.max.messages": 2_000_000, "message.timeout.ms": 30_000})
    producer.list_topics(topic, timeout=10)  # connected and the leaders known before the clock starts
    value = os.urandom(RECORD_SIZE)
    delivered = [0]
    failed: list = []

    def report(err, _msg):
        if err is None:
            delivered[0] += 1
        elif str(err) not in failed and len(failed) < 3:
            failed.append(str(err))

    started, cpu0, own0 = time.monotonic(), brokers_cpu(cluster), run.own_cpu()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
    remaining = producer.flush(120)
    elapsed = time.monotonic() - started
    broker_cpu, client_cpu = brokers_cpu(cluster) - cpu0, run.own_cpu() - own0
    if failed or remaining:
        raise RuntimeError(f"acks={acks} to {topic}: {records - delivered[0]:,} of {records:,} records not "
                           f"delivered ({remaining} still queued); first errors: {failed}")
    return {"seconds": round(elapsed, 3), "records_per_s": round(delivered[0] / elapsed),
            "delivered": delivered[0], "not_flushed": remaining, "errors": failed,
            "brokers_cpu_s_per_gb": round(broker_cpu / (records * RECORD_SIZE / 1e9), 2),
            "client_cpu_util": round(client_cpu / elapsed, 2)}


def scenario_replication_throughput(zk: ZooKeeperServer, args) -> dict:
    with new_cluster(zk) as cluster:
        topics = {"rf1-acks1": (f"bench-rf1-{uuid.uuid4().hex[:6]}", 1, "1", {}),
                  "rf3-acksall": (f"bench-rf3-{uuid.uuid4().hex[:6]}", 3, "all", {"min.insync.replicas": "2"})}
        for topic, factor, _, configs in topics.values():
            create_topic(cluster, topic, 3, factor, configs=configs)
        passes: dict[str, list[dict]] = {name: [] for name in topics}
        for i in range(args.passes):
            for name, (topic, _, acks, _) in topics.items():
                p = produce_pass(cluster, topic, args.records, acks)
                passes[name].append(p)
                log(f"replication-throughput: pass {i + 1} {name}: {p['records_per_s']:,} rec/s "
                    f"({p['delivered']:,} delivered{', errors ' + str(p['errors']) if p['errors'] else ''})")
        result: dict = {"records_per_pass": args.records, "record_bytes": RECORD_SIZE, "partitions": 3}
        for name, (topic, factor, acks, _) in topics.items():
            ends = end_offsets(cluster.bootstrap, topic, 3)
            rate = statistics.median(p["records_per_s"] for p in passes[name])
            result[name] = {
                "replication_factor": factor, "acks": acks, "records_per_s": round(rate),
                "mb_per_s": round(rate * RECORD_SIZE / MB, 1),
                "records_per_s_passes": [p["records_per_s"] for p in passes[name]],
                "brokers_cpu_s_per_gb": statistics.median(p["brokers_cpu_s_per_gb"] for p in passes[name]),
                "client_cpu_util": statistics.median(p["client_cpu_util"] for p in passes[name]),
                "delivered": all(p["delivered"] == args.records for p in passes[name])
                and sum(ends) == args.records * args.passes,
                "end_offsets": ends, "errors": [e for p in passes[name] for e in p["errors"]][:5]}
        a, b = result["rf1-acks1"]["records_per_s"], result["rf3-acksall"]["records_per_s"]
        result["ratio"] = round(b / a, 3) if a else None
        result["target_ratio"] = TARGET_RATIO
        result["target_met"] = None if result["ratio"] is None else result["ratio"] >= TARGET_RATIO
        if errors := broker_errors(cluster):
            result["broker_errors"] = errors
    ra, rb = result["rf1-acks1"], result["rf3-acksall"]
    log(f"replication-throughput: RF=1 acks=1 {ra['records_per_s']:,} rec/s {ra['mb_per_s']} MB/s "
        f"(brokers {ra['brokers_cpu_s_per_gb']} CPU s/GB, client {ra['client_cpu_util']} cores) | "
        f"RF=3 acks=all {rb['records_per_s']:,} rec/s {rb['mb_per_s']} MB/s "
        f"(brokers {rb['brokers_cpu_s_per_gb']} CPU s/GB, client {rb['client_cpu_util']} cores) | ratio {result['ratio']} "
        f"(target >= {TARGET_RATIO}) | delivered a={ra['delivered']} b={rb['delivered']}")
    return result


# --- replication-lag ---------------------------------------------------------------------------
def _lag_consumer(bootstrap: str, topic: str, warmup_until: float, stop_at: float, ready, out) -> None:
    """Consumer process: latencies (ms) of the records produced after warmup_until."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-lag-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "isolation.level": "read_uncommitted",
                         "fetch.wait.max.ms": 5, "fetch.min.bytes": 1})
    consumer.assign([TopicPartition(topic, 0, 0)])
    consumer.consume(1, 0.5)
    ready.put(True)
    latencies: list[float] = []
    received = 0
    while time.monotonic() < stop_at:
        # poll() returns as soon as a record is there (consume(n, timeout) waits for n or the timeout)
        msg = consumer.poll(0.05)
        if msg is None or msg.error() is not None:
            continue
        now = time.monotonic()
        received += 1
        sent = _STAMP.unpack_from(msg.value())[0] / 1e9
        if sent >= warmup_until:
            latencies.append((now - sent) * 1000)
    consumer.close()
    out.put((received, latencies))


def lag_run(cluster: Cluster, factor: int, rate: int, seconds: float) -> dict:
    topic = f"bench-lag-rf{factor}-{uuid.uuid4().hex[:6]}"
    create_topic(cluster, topic, 1, factor)
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    start = time.monotonic() + 3.0  # the consumer process starts (spawn) meanwhile
    warmup_until, stop_at = start + 0.5, start + seconds
    proc = ctx.Process(target=_lag_consumer, args=(cluster.bootstrap, topic, warmup_until, stop_at + 3.0, ready, out))
    proc.start()
    try:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "1", "linger.ms": 1,
                             "batch.size": 1_000_000, "compression.type": "none"})
        producer.list_topics(topic, timeout=10)
        ready.get(timeout=30)
        while time.monotonic() < start:
            time.sleep(0.005)
        padding = b"x" * (RECORD_SIZE - _STAMP.size)
        sent = 0
        tick = 0.001  # produce in 1 ms slots of rate/1000 records
        per_tick = max(1, rate // 1000)
        slot = start
        while slot < stop_at:
            for _ in range(per_tick):
                producer.produce(topic, _STAMP.pack(time.monotonic_ns()) + padding, partition=0)
            sent += per_tick
            producer.poll(0)
            slot += tick
            pause = slot - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        achieved = sent / (time.monotonic() - start)
        producer.flush(30)
        received, latencies = out.get(timeout=60)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    if not latencies:
        raise RuntimeError(f"RF={factor}: the consumer got {received:,} of {sent:,} records, none after the warm-up")
    latencies.sort()
    return {"replication_factor": factor, "records_sent": sent, "records_received": received,
            "rate_per_s": round(achieved), "measured": len(latencies),
            "p50_ms": _r(percentile(latencies, 0.5)), "p99_ms": _r(percentile(latencies, 0.99)),
            "p99_9_ms": _r(percentile(latencies, 0.999)), "max_ms": _r(latencies[-1] if latencies else None),
            "mean_ms": _r(statistics.fmean(latencies) if latencies else None)}


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def scenario_replication_lag(zk: ZooKeeperServer, args) -> dict:
    with new_cluster(zk) as cluster:
        result = {}
        for factor in (1, 3):  # RF=1 first: the baseline
            r = lag_run(cluster, factor, args.lag_rate, args.lag_seconds)
            result[f"rf{factor}"] = r
            log(f"replication-lag: RF={factor} acks=1 at {r['rate_per_s']:,} rec/s: produce() -> consumer "
                f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, p99.9 {r['p99_9_ms']} ms, max {r['max_ms']} ms "
                f"({r['measured']:,} measured, {r['records_received']:,}/{r['records_sent']:,} received)")
        result["p50_added_ms"] = _r(result["rf3"]["p50_ms"] - result["rf1"]["p50_ms"])
        result["p99_added_ms"] = _r(result["rf3"]["p99_ms"] - result["rf1"]["p99_ms"])
        if errors := broker_errors(cluster):
            result["broker_errors"] = errors
    return result


# --- catch-up -------------------------------------------------------------------------------
def scenario_catch_up(zk: ZooKeeperServer, args) -> dict:
    with new_cluster(zk, {"replica.lag.time.max.ms": "3000"}) as cluster:
        cluster.wait_for(lambda: cluster.controller_id() >= 0, 30, "a controller")
        controller = cluster.controller_id()
        a, b = [i for i in cluster.brokers if i != controller]
        victim_id = b  # a follower that is not the controller; the leaders are the other two
        leaders = [controller, a, controller]
        assignment = [[controller, a, victim_id], [a, controller, victim_id], [controller, a, victim_id]]
        topic = f"bench-catchup-{uuid.uuid4().hex[:6]}"
        create_topic(cluster, topic, assignment=assignment)
        victim = cluster.brokers[victim_id]
        victim.kill()
        killed = time.monotonic()
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "1", "linger.ms": 5,
                             "batch.size": 1_000_000, "compression.type": "none",
                             "queue.buffering.max.kbytes": 256 * 1024})
        value = os.urandom(1000)
        target = args.catch_up_mb * MB
        delivered, failed = [0], []

        def report(err, _msg):
            if err is None:
                delivered[0] += 1
            elif str(err) not in failed and len(failed) < 3:
                failed.append(str(err))

        started = time.monotonic()
        produced = 0
        while produced < target and time.monotonic() - started < args.catch_up_seconds:
            try:
                producer.produce(topic, value, partition=(produced // 1000) % 3, on_delivery=report)
                produced += len(value)
                if produced % 100_000 == 0:
                    producer.poll(0)
            except BufferError:
                producer.poll(0.01)
        producer.flush(60)
        produce_s = time.monotonic() - started
        # acks=1 accepted it; the ISR no longer holds the dead follower (session or lag).
        with RawClient(cluster.brokers[controller]) as raw:
            cluster.wait_for(lambda: all(victim_id not in isr for _, isr in partitions_view(raw, topic).values()),
                             30, "the dead follower out of the ISR")
        isr_shrunk_s = time.monotonic() - killed
        leader_bytes = sum(log_bytes(cluster.brokers[leaders[p]], topic, p) for p in range(3))
        follower_bytes = sum(log_bytes(victim, topic, p) for p in range(3))
        missing = leader_bytes - follower_bytes
        log(f"catch-up: produced {produced / MB:.0f} MB ({delivered[0]:,} records acked) in {produce_s:.1f} s "
            f"with broker {victim_id} down; it is missing {missing / MB:.0f} MB; restarting it")
        restart = time.monotonic()
        victim.start()
        ready_s = time.monotonic() - restart
        match_s = isr_s = None
        clients = {i: RawClient(cluster.brokers[i]) for i in (controller, a)}
        try:
            deadline = restart + 60
            while (match_s is None or isr_s is None) and time.monotonic() < deadline:
                now = time.monotonic() - restart
                if match_s is None and all(log_bytes(victim, topic, p) >= log_bytes(cluster.brokers[leaders[p]], topic, p)
                                           for p in range(3)):
                    match_s = now
                if isr_s is None and all(victim_id in partitions_view(clients[leaders[p]], topic).get(p, (-1, []))[1]
                                         for p in range(3)):
                    isr_s = now
                time.sleep(0.05)
        finally:
            for client in clients.values():
                client.close()
        if match_s is None:
            raise AssertionError(f"broker {victim_id} did not catch up within 60 s "
                                 f"({sum(log_bytes(victim, topic, p) for p in range(3)) / MB:.0f} of "
                                 f"{leader_bytes / MB:.0f} MB)")
        result = {"produced_mb": round(produced / MB, 1), "acked_records": delivered[0], "errors": failed,
                  "produce_s": round(produce_s, 2), "isr_shrunk_after_kill_s": round(isr_shrunk_s, 2),
                  "missing_mb": round(missing / MB, 1), "ready_s": round(ready_s, 3),
                  "bytes_match_s": round(match_s, 3), "from_ready_s": round(match_s - ready_s, 3),
                  "isr_s": None if isr_s is None else round(isr_s, 3),
                  "mb_per_s": round(missing / MB / match_s, 1),
                  "mb_per_s_from_ready": round(missing / MB / max(1e-3, match_s - ready_s), 1)}
        if errors := broker_errors(cluster):
            result["broker_errors"] = errors
    log(f"catch-up: broker {victim_id} copied {result['missing_mb']} MB: logs match {result['bytes_match_s']} s "
        f"after spawn ({result['from_ready_s']} s after ready), {result['mb_per_s']} MB/s "
        f"({result['mb_per_s_from_ready']} MB/s from ready); back in the ISR after {result['isr_s']} s")
    return result


# --- leader-kill, controlled-shutdown, rolling-restart ------------------------------------------
_SEQ = struct.Struct(">qq")  # sequence number, CLOCK_MONOTONIC ns of the produce() call
DEBUG_CONTEXTS = "msg,protocol,topic,metadata"


class _Lines(logging.Handler):
    """librdkafka's log lines (forwarded on poll()), each with the monotonic and wall time it came."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[float, float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), time.time(), record.getMessage()))


def paced_produce(cluster: Cluster, topic: str, partitions: int, rate: int, disrupt, tail_s: float,
                  warmup_s: float = 2.0, debug: bool = False, limit_s: float = 180.0) -> dict:
    """An idempotent acks=all producer at `rate` records/s (1 ms slots, partition = seq % partitions)
    from this thread; after `warmup_s`, `disrupt(events)` runs in a thread of its own (it stores
    monotonic times in `events`, "disrupted" first); producing goes on until `tail_s` after it
    returned. Every acknowledgement is timestamped when its callback runs (poll() every slot)."""
    conf = {"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "compression.type": "none", "message.timeout.ms": 120_000}
    lines = _Lines()
    if debug:
        logger = logging.getLogger(f"rdkafka-{uuid.uuid4().hex[:6]}")
        logger.propagate, logger.level = False, logging.DEBUG
        logger.addHandler(lines)
        conf |= {"debug": DEBUG_CONTEXTS, "logger": logger}
    producer = Producer(conf)
    producer.list_topics(topic, timeout=10)
    acks: list[tuple[float, int, float]] = []  # (callback time, sequence, produce() time)
    failed: list[str] = []
    errors = [0]

    def report(err, msg):
        now = time.monotonic()
        if err is None:
            seq, sent_ns = _SEQ.unpack_from(msg.value())
            acks.append((now, seq, sent_ns / 1e9))
        else:
            errors[0] += 1
            if str(err) not in failed and len(failed) < 3:
                failed.append(str(err))

    events: dict[str, float] = {}
    outcome: list[BaseException] = []

    def run_disrupt():
        try:
            disrupt(events)
        except BaseException as e:  # noqa: BLE001 - raised again from the producing thread
            outcome.append(e)
        events["done"] = time.monotonic()

    thread = threading.Thread(target=run_disrupt, daemon=True)
    padding = b"x" * (RECORD_SIZE - _SEQ.size)
    per_tick, seq = max(1, rate // 1000), 0
    start = slot = time.monotonic()
    while True:
        now = time.monotonic()
        if not thread.is_alive() and "done" not in events and now - start >= warmup_s:
            thread.start()
        if "done" in events and now - events["done"] >= tail_s:
            break
        if now - start > limit_s:
            raise RuntimeError(f"the disruption did not finish within {limit_s:.0f} s: {events}")
        for _ in range(per_tick):
            try:
                producer.produce(topic, _SEQ.pack(seq, time.monotonic_ns()) + padding,
                                 partition=seq % partitions, on_delivery=report)
            except BufferError:
                break  # the queue is full: this slot's records are not produced
            seq += 1
        producer.poll(0)
        slot += 0.001
        pause = slot - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    produced_s = time.monotonic() - start
    remaining = producer.flush(60)
    if outcome:
        raise outcome[0]
    return {"acks": acks, "events": events, "produced": seq, "rate_per_s": round(seq / produced_s),
            "not_flushed": remaining, "errors": errors[0], "first_errors": failed, "start": start,
            "debug_lines": lines.lines}


def ack_gaps(acks: list[tuple[float, int, float]], t0: float, t1: float) -> tuple[float, float]:
    """The longest gap between consecutive acknowledgements whose gap ends in (t0, t1], and when it began."""
    times = [a[0] for a in acks]
    best, began = 0.0, t0
    for before, after in zip(times, times[1:], strict=False):
        if t0 < after <= t1 and after - before > best:
            best, began = after - before, before
    return best, began


def long_gaps(acks: list[tuple[float, int, float]], hit: float, over: float = 0.25) -> list[list[float]]:
    """[start after `hit` (s), length (s)] of every gap between consecutive acknowledgements over `over` s."""
    times = [a[0] for a in acks]
    return [[round(before - hit, 3), round(after - before, 3)]
            for before, after in zip(times, times[1:], strict=False) if after - before > over]


def unavailability(run_: dict, partitions: int, bootstrap: str, topic: str) -> dict:
    """The numbers of leader-kill and controlled-shutdown, relative to events["disrupted"]."""
    acks, events = run_["acks"], run_["events"]
    hit = events["disrupted"]
    gap, began = ack_gaps(acks, hit - 1.0, float("inf"))
    baseline, _ = ack_gaps(acks, run_["start"] + 0.5, hit - 0.1)
    after = [a for a in acks if a[0] > hit]
    new = [a for a in after if a[2] > hit]  # produce()d after the disruption
    ends = end_offsets(bootstrap, topic, partitions)
    sequences = {a[1] for a in acks}
    return {"max_gap_s": round(gap, 3), "gap_began_after_s": round(began - hit, 3),
            "first_ack_after_s": round(after[0][0] - hit, 3) if after else None,
            "first_new_record_ack_s": round(new[0][0] - hit, 3) if new else None,
            "baseline_max_gap_s": round(baseline, 3), "gaps_over_0_25_s": long_gaps(acks, hit),
            "rate_per_s": run_["rate_per_s"],
            "produced": run_["produced"], "acked": len(acks), "errors": run_["errors"],
            "first_errors": run_["first_errors"], "not_flushed": run_["not_flushed"],
            "end_offsets": ends, "exactly_once": len(sequences) == len(acks) == sum(ends)}


def debug_excerpt(run_: dict, path: Path | None, label: str, begin: float, end: float) -> int:
    """librdkafka's lines from `begin` to `end` (monotonic), each with ms since the disruption (and
    wall time to compare with the brokers' logs). Appended to `path`; returns the number of lines."""
    if path is None or not run_["debug_lines"]:
        return 0
    hit = run_["events"]["disrupted"]
    picked = [(m, w, text) for m, w, text in run_["debug_lines"] if begin <= m <= end]
    with path.open("a") as f:
        wall = datetime.fromtimestamp(time.time() - (time.monotonic() - hit), UTC)
        f.write(f"=== {label}: disrupted at {wall.isoformat(timespec='milliseconds')}; events (ms since): "
                + ", ".join(f"{k} {1000 * (v - hit):+.0f}" for k, v in run_["events"].items()) + "\n")
        for m, w, text in picked:
            stamp = datetime.fromtimestamp(w, UTC).strftime("%H:%M:%S.%f")[:-3]
            f.write(f"{1000 * (m - hit):+8.1f} ms {stamp} {text}\n")
    return len(picked)


def leader_cluster(zk: ZooKeeperServer, session_timeout_ms: int, topic: str) -> tuple[Cluster, int]:
    """A started cluster with a 1-partition RF=3 topic (min.insync.replicas=2) led by a broker that
    is not the controller: assignment [[leader, other, controller]]. The caller closes it."""
    cluster = new_cluster(zk, session_timeout_ms=session_timeout_ms).start()
    try:
        cluster.wait_for(lambda: cluster.controller_id() >= 0, 30, "a controller")
        controller = cluster.controller_id()
        leader, other = [i for i in cluster.brokers if i != controller]
        create_topic(cluster, topic, assignment=[[leader, other, controller]], configs={"min.insync.replicas": "2"})
        return cluster, leader
    except BaseException:
        cluster.close()
        raise


def leader_down(zk: ZooKeeperServer, args, session_timeout_ms: int, graceful: bool) -> dict:
    name = "controlled-shutdown" if graceful else "leader-kill"
    topic = f"bench-{name}-{uuid.uuid4().hex[:6]}"
    cluster, leader = leader_cluster(zk, session_timeout_ms, topic)
    try:
        victim = cluster.brokers[leader]

        def disrupt(events):
            events["disrupted"] = time.monotonic()
            if graceful:
                victim.stop()  # SIGTERM: controlled shutdown, then the broker exits
            else:
                victim.kill()
            events["exited"] = time.monotonic()
            # the partition's new leader, as the controller's broker answers Metadata
            controller = cluster.controller_id()
            with RawClient(cluster.brokers[controller]) as raw:
                cluster.wait_for(lambda: partitions_view(raw, topic).get(0, (leader,))[0] not in (leader, -1),
                                 session_timeout_ms / 1000 + 30, "a new leader")
            events["new_leader_in_metadata"] = time.monotonic()

        tail = 3.0 if graceful else 4.0
        run_ = paced_produce(cluster, topic, 1, args.failover_rate, disrupt, tail, debug=args.client_debug is not None)
        result = {"session_timeout_ms": session_timeout_ms, "signal": "SIGTERM" if graceful else "SIGKILL",
                  "leader": leader, "controller": cluster.controller_id(),
                  **unavailability(run_, 1, cluster.bootstrap, topic),
                  **{f"{k}_s": round(v - run_["events"]["disrupted"], 3) for k, v in run_["events"].items()
                     if k not in ("disrupted", "done")}}
        # from 0.2 s before the disruption to 0.3 s after the first record produce()d after it got through
        hit = run_["events"]["disrupted"]
        new = [a[0] for a in run_["acks"] if a[2] > hit]
        result["debug_lines"] = debug_excerpt(run_, args.client_debug, f"{name} session {session_timeout_ms} ms",
                                              hit - 0.2, (new[0] if new else hit + 10) + 0.3)
        if errors := broker_errors(cluster):
            result["broker_errors"] = errors
    finally:
        cluster.close()
    log(f"{name}: session {session_timeout_ms} ms, {result['signal']} of leader {leader} at "
        f"{result['rate_per_s']:,} rec/s: longest gap between acks {result['max_gap_s']} s "
        f"(from {result['gap_began_after_s']:+} s; before it {result['baseline_max_gap_s']} s), first ack after "
        f"{result['first_ack_after_s']} s, first ack of a record produced after it {result['first_new_record_ack_s']} s; "
        f"new leader in Metadata after {result['new_leader_in_metadata_s']} s; {result['acked']:,}/{result['produced']:,} "
        f"acked, end offset {sum(result['end_offsets']):,}, exactly once {result['exactly_once']}")
    return result


def scenario_leader_kill(zk: ZooKeeperServer, args) -> dict:
    return {f"session_{ms}ms": leader_down(zk, args, ms, graceful=False) for ms in args.session_timeouts}


def scenario_controlled_shutdown(zk: ZooKeeperServer, args) -> dict:
    return {"session_4000ms": leader_down(zk, args, 4000, graceful=True)}


def read_back(bootstrap: str, topic: str, ends: list[int]) -> tuple[int, set[int], int]:
    """(records read, their distinct sequence numbers, duplicates) of every partition up to `ends`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-read-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(len(ends))])
    seen: set[int] = set()
    read = duplicates = 0
    positions = [0] * len(ends)
    deadline = time.monotonic() + 120
    try:
        while any(pos < end for pos, end in zip(positions, ends, strict=True)) and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is not None:
                    continue
                read += 1
                seq = _SEQ.unpack_from(msg.value())[0]
                duplicates += seq in seen
                seen.add(seq)
                positions[msg.partition()] = msg.offset() + 1
    finally:
        consumer.close()
    return read, seen, duplicates


def scenario_rolling_restart(zk: ZooKeeperServer, args) -> dict:
    partitions = 3
    with new_cluster(zk) as cluster:
        topic = f"bench-rolling-{uuid.uuid4().hex[:6]}"
        create_topic(cluster, topic, partitions, 3, configs={"min.insync.replicas": "2"})
        steps: list[dict] = []

        def disrupt(events):
            events["disrupted"] = time.monotonic()
            for broker_id, broker in cluster.brokers.items():
                was_controller = cluster.controller_id() == broker_id
                t0 = time.monotonic()
                events[f"stop_{broker_id}"] = t0
                broker.stop()
                t1 = time.monotonic()
                broker.start()
                t2 = time.monotonic()
                other = cluster.brokers[next(i for i in cluster.brokers if i != broker_id)]
                with RawClient(other) as raw:
                    cluster.wait_for(lambda raw=raw, b=broker_id: (view := partitions_view(raw, topic))
                                     and all(b in isr for _, isr in view.values()), 60,
                                     f"broker {broker_id} back in every ISR")
                t3 = time.monotonic()
                steps.append({"broker": broker_id, "was_controller": was_controller, "stop_s": round(t1 - t0, 3), "start_s": round(t2 - t1, 3),
                              "back_in_isr_s": round(t3 - t2, 3), "step_s": round(t3 - t0, 3)})
                log(f"rolling-restart: broker {broker_id}: SIGTERM -> exit {t1 - t0:.2f} s, start -> ready "
                    f"{t2 - t1:.2f} s, ready -> in every ISR {t3 - t2:.2f} s")

        run_ = paced_produce(cluster, topic, partitions, args.rolling_rate, disrupt, tail_s=2.0,
                             debug=args.client_debug is not None)
        hit, done = run_["events"]["disrupted"], run_["events"]["done"]
        acks = run_["acks"]
        gap, began = ack_gaps(acks, hit, done + 2.0)
        baseline, _ = ack_gaps(acks, run_["start"] + 0.5, hit)
        debug_lines = debug_excerpt(run_, args.client_debug, "rolling-restart (the longest gap)", began - 0.3,
                                    began + gap + 0.1)
        ends = end_offsets(cluster.bootstrap, topic, partitions)
        read, seen, duplicates = read_back(cluster.bootstrap, topic, ends)
        acked = {a[1] for a in acks}
        view = {}
        with RawClient(cluster.brokers[1]) as raw:
            view = partitions_view(raw, topic)
        result = {"partitions": partitions, "rate_per_s": run_["rate_per_s"], "total_s": round(done - hit, 3),
                  "steps": steps, "max_gap_s": round(gap, 3), "gap_began_after_s": round(began - hit, 3),
                  "baseline_max_gap_s": round(baseline, 3), "gaps_over_0_25_s": long_gaps(acks, hit),
                  "produced": run_["produced"], "acked": len(acks),
                  "errors": run_["errors"], "first_errors": run_["first_errors"],
                  "not_flushed": run_["not_flushed"], "end_offsets": ends, "read": read,
                  "duplicates": duplicates, "acked_not_read": len(acked - seen),
                  "read_not_acked": len(seen - acked),
                  "exactly_once": duplicates == 0 and not (acked - seen) and read == len(acks),
                  "leaders_after": {str(p): v[0] for p, v in sorted(view.items())}, "debug_lines": debug_lines}
        if errors := broker_errors(cluster):
            result["broker_errors"] = errors
    log(f"rolling-restart: 3 brokers restarted in {result['total_s']} s at {result['rate_per_s']:,} rec/s; longest gap "
        f"between acks {result['max_gap_s']} s (before: {result['baseline_max_gap_s']} s); {result['acked']:,}/"
        f"{result['produced']:,} acked, {result['read']:,} read, {result['duplicates']} duplicates, "
        f"{result['acked_not_read']} acked but not read: exactly once {result['exactly_once']}")
    return result


RUNNERS = {"create-topics": scenario_create_topics, "controller-failover": scenario_controller_failover,
           "replication-throughput": scenario_replication_throughput, "replication-lag": scenario_replication_lag,
           "catch-up": scenario_catch_up, "leader-kill": scenario_leader_kill,
           "controlled-shutdown": scenario_controlled_shutdown, "rolling-restart": scenario_rolling_restart}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--json", type=Path, help="also write the JSON document to this file")
    parser.add_argument("--records", type=int, default=300_000, help="records per replication-throughput pass")
    parser.add_argument("--passes", type=int, default=3, help="replication-throughput passes per topic")
    parser.add_argument("--session-timeouts", default="4000,10000",
                        help="zookeeper.session.timeout.ms values for controller-failover and leader-kill")
    parser.add_argument("--create-partitions", type=int, default=1000)
    parser.add_argument("--lag-rate", type=int, default=50_000, help="records/s of the replication-lag producer")
    parser.add_argument("--lag-seconds", type=float, default=10.0)
    parser.add_argument("--catch-up-mb", type=int, default=200)
    parser.add_argument("--catch-up-seconds", type=float, default=30.0)
    parser.add_argument("--failover-rate", type=int, default=5_000,
                        help="records/s of the leader-kill and controlled-shutdown producer")
    parser.add_argument("--rolling-rate", type=int, default=20_000, help="records/s of the rolling-restart producer")
    parser.add_argument("--client-debug", type=Path,
                        help=f"append librdkafka's debug lines ({DEBUG_CONTEXTS}) around each leader-kill "
                             f"and controlled-shutdown, and around rolling-restart's longest gap, to this file")
    args = parser.parse_args()
    args.session_timeouts = [int(x) for x in args.session_timeouts.split(",") if x.strip()]
    names = [x.strip() for x in args.scenarios.split(",") if x.strip()]
    if unknown := [n for n in names if n not in RUNNERS]:
        sys.exit(f"unknown scenario(s) {unknown}; names: {', '.join(SCENARIOS)}")
    if problem := zookeeper_available():
        sys.exit(problem)
    doc = {"benchmark": "cluster", "started": datetime.now(UTC).isoformat(timespec="seconds"),
           "command": " ".join(sys.argv),
           "meta": {**run.machine_info(), "confluent_kafka": confluent_kafka.__version__,
                    "librdkafka": confluent_kafka.libversion()[0], "brokers": 3,
                    "broker_overrides": CLUSTER_OVERRIDES,
                    "background_cpu_util_at_start": run.background_load()},
           "results": {}, "failed": {}}
    began = time.monotonic()
    with ZooKeeperServer(fsync=False) as zk:
        log(f"ZooKeeper on {zk.connect}")
        for name in names:
            t0 = time.monotonic()
            try:
                doc["results"][name] = RUNNERS[name](zk, args)
            except Exception as e:  # noqa: BLE001 - reported, and the next scenario runs
                errors = broker_errors(LAST_CLUSTER[0]) if LAST_CLUSTER else []
                doc["failed"][name] = {"error": f"{type(e).__name__}: {e}", "broker_errors": errors}
                log(f"{name}: FAILED: {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
                    + "".join(f"\n  {line}" for line in errors))
            LAST_CLUSTER.clear()
            log(f"{name}: {time.monotonic() - t0:.1f} s")
    doc["seconds"] = round(time.monotonic() - began, 1)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if doc["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
