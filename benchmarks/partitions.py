"""What partition count costs a broker: metadata work, restarts, idle cost, and stalls.

For each partition count (default 1,000 and 10,000) on a fresh `strom serve`:

- creation: CreateTopics of topics of at most 10,000 partitions each (one request per topic)
  until every partition has a leader in Metadata; partitions/s;
- stalls while it runs: a probe process (its own interpreter) sends an ApiVersions every 10 ms
  on a raw connection and produces one record every 10 ms with acks=1 (confluent-kafka, to a
  topic made before): the longest ApiVersions wait and the produce latency p50 / p99 / max
  during creation, the same again during deletion;
- idle: CPU of the broker over 10 s with nothing to do (% of one core), RSS, and RSS per
  1,000 partitions above the empty broker's;
- restarts: SIGTERM then start (clean) and kill -9 then start, each until the port serves and
  until Metadata shows every partition with a leader; one record is written to each of up to
  20,000 partitions first, so restarts find data, not only empty logs (timed, with the probe
  running: a new partition's first write makes its files);
- deletion: DeleteTopics of everything, until Metadata no longer lists it.

`--baseline-src DIR` runs the same scenarios against another checkout's `src/` (say, the
commit before a change), in the same invocation, so both columns see the same machine; the
three-broker scenario (`--cluster N ...`, see cluster_scenario) too, its baseline's brokers
started with that `src/` first on their PYTHONPATH.

    python benchmarks/partitions.py --partitions 1000 10000
    python benchmarks/partitions.py --partitions 100000 --skip-baseline-above 10000 \
        --baseline-src ../strom-before/src

Prints one JSON document (and a Markdown table with --table).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from strom.client import Connection
from strom.testing import BrokerProcess

CREATE_TOPICS, DELETE_TOPICS, METADATA, API_VERSIONS, ELECT_LEADERS = 19, 20, 3, 18, 43
TOPIC_SIZE = 10_000  # partitions per CreateTopics request
PROBE_TOPIC = "probe"
FILL_LIMIT = 20_000


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


# --- the probe: its own process, so the benchmark's own work never delays its requests ---------

def probe_main(bootstrap: str, out: str) -> None:
    from confluent_kafka import Producer

    host, port = bootstrap.rsplit(":", 1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    api_waits: list[float] = []
    produce_waits: list[float] = []
    failures = 0

    errors: list[str] = []

    def api_versions() -> None:
        try:
            conn = Connection(host, int(port), timeout_s=300)
            while not stop.is_set():
                started = time.monotonic()
                conn.call(API_VERSIONS, 3, {"client_software_name": "probe", "client_software_version": "1"})
                api_waits.append(time.monotonic() - started)
                time.sleep(0.01)
            conn.close()
        except Exception as e:  # reported, not hidden: the run's numbers are then suspect
            errors.append(f"ApiVersions: {e!r}")

    thread = threading.Thread(target=api_versions, daemon=True)
    thread.start()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0,
                         "message.timeout.ms": 300_000, "enable.idempotence": False})

    def delivered(err, _msg, started: float) -> None:
        nonlocal failures
        if err is not None:
            failures += 1
        else:
            produce_waits.append(time.monotonic() - started)

    try:
        while not stop.is_set():
            started = time.monotonic()
            producer.produce(PROBE_TOPIC, b"x" * 100,
                             on_delivery=lambda err, msg, s=started: delivered(err, msg, s))
            producer.poll(0.01)
        producer.flush(30)
    except Exception as e:
        errors.append(f"produce: {e!r}")
    finally:
        thread.join(30)
        Path(out).write_text(json.dumps({"api": api_waits, "produce": produce_waits, "failures": failures,
                                         "errors": errors}))


class Probe:
    def __init__(self, bootstrap: str, env: dict[str, str]) -> None:
        self.out = tempfile.mktemp(prefix="strom-probe-", suffix=".json")
        self.proc = subprocess.Popen([sys.executable, __file__, "--probe", bootstrap, self.out], env=env)
        time.sleep(1.0)  # connected and past the first metadata round trips

    def finish(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)
        data = json.loads(Path(self.out).read_text())
        os.unlink(self.out)
        produce = sorted(data["produce"])

        def pct(p: float) -> float | None:
            return _ms(produce[min(len(produce) - 1, int(p * len(produce)))]) if produce else None

        return {"api_versions_max_ms": _ms(max(data["api"], default=0)),
                "api_versions_count": len(data["api"]),
                "produce_p50_ms": pct(0.50), "produce_p99_ms": pct(0.99),
                "produce_max_ms": _ms(produce[-1]) if produce else None,
                "produce_count": len(produce), "produce_failures": data["failures"],
                "probe_errors": data["errors"]}


# --- the broker side ------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def topic_names(partitions: int) -> list[tuple[str, int]]:
    out, left, i = [], partitions, 0
    while left > 0:
        n = min(TOPIC_SIZE, left)
        out.append((f"scale-{i}", n))
        left -= n
        i += 1
    return out


def metadata(conn: Connection, names: list[str] | None):
    topics = None if names is None else [{"name": n} for n in names]
    return conn.call(METADATA, 12, {"topics": topics, "allow_auto_topic_creation": False,
                                    "include_topic_authorized_operations": False})


def all_led(conn: Connection, topics: list[tuple[str, int]]) -> bool:
    response = metadata(conn, [t for t, _ in topics])
    wanted = dict(topics)
    for t in response.topics:
        if t.error_code != 0 or len(t.partitions) != wanted.get(t.name, -1):
            return False
        if any(p.leader_id < 0 for p in t.partitions):
            return False
    return len(response.topics) == len(topics)


def wait_until(predicate, timeout: float, interval: float = 0.05) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise TimeoutError("gave up waiting")
        time.sleep(interval)
    return time.monotonic() - started


def logged_between(lines: list[str], first: str, then: str) -> float | None:
    """Seconds between the broker's log lines holding `first` and then `then` (their
    timestamps, "2026-12-06 00:18:26,320 ..."), None if either is missing."""
    def stamp(text: str) -> float | None:
        line = next((line for line in lines if text in line), None)
        if line is None:
            return None
        day, clock = line.split(" ", 2)[:2]
        return time.mktime(time.strptime(f"{day} {clock[:8]}", "%Y-%m-%d %H:%M:%S")) + int(clock[9:12]) / 1000

    begin, end = stamp(first), stamp(then)
    return None if begin is None or end is None else round(end - begin, 2)


def poll_interval(partitions: int) -> float:
    """How often to ask for the Metadata of every partition: its answer costs the broker
    about as much as a partition's creation, so asking too often would measure the asking."""
    return max(0.05, partitions / 100_000)


def fill(bootstrap: str, topics: list[tuple[str, int]]) -> int:
    """One record into each of the first FILL_LIMIT partitions, acks=all."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 50,
                         "message.timeout.ms": 300_000})
    count = 0
    for name, n in topics:
        for p in range(n):
            if count >= FILL_LIMIT:
                break
            producer.produce(name, b"record-%d" % p, partition=p)
            count += 1
            if count % 10_000 == 0:
                producer.flush(300)
    assert producer.flush(300) == 0
    return count


def connect(broker: BrokerProcess) -> Connection:
    return Connection("127.0.0.1", broker.port, timeout_s=600)


def timed_start(broker: BrokerProcess, topics: list[tuple[str, int]]) -> dict:
    started = time.monotonic()
    broker.start(timeout=900)
    ready = time.monotonic() - started
    with connect(broker) as conn:
        wait_until(lambda: all_led(conn, topics), 900, poll_interval(sum(n for _, n in topics)))
    return {"port_ready_s": round(ready, 2), "all_led_s": round(time.monotonic() - started, 2)}


def scenario(partitions: int, env: dict[str, str]) -> dict:
    topics = topic_names(partitions)
    overrides = {"max.broker.partitions": str(partitions + 1000), "num.partitions": "1",
                 "auto.create.topics.enable": "true"}
    out: dict = {"partitions": partitions}
    broker = BrokerProcess(overrides=overrides, env=env)
    try:
        broker.start(timeout=120)
        with connect(broker) as conn:
            conn.call(CREATE_TOPICS, 4, {"topics": [{"name": PROBE_TOPIC, "num_partitions": 1,
                                                      "replication_factor": 1, "assignments": [],
                                                      "configs": []}], "timeout_ms": 30_000,
                                          "validate_only": False})
            time.sleep(1)
            empty_rss = rss_mb(broker.proc.pid)
            probe = Probe(broker.bootstrap, env)
            started = time.monotonic()
            for name, n in topics:
                response = conn.call(CREATE_TOPICS, 4, {
                    "topics": [{"name": name, "num_partitions": n, "replication_factor": 1,
                                "assignments": [], "configs": []}],
                    "timeout_ms": 600_000, "validate_only": False})
                error = response.topics[0].error_code
                if error not in (0, 7):  # 7: REQUEST_TIMED_OUT, the leaders are still coming
                    raise RuntimeError(f"CreateTopics {name}: error {error}")
            answered = time.monotonic() - started
            wait_until(lambda: all_led(conn, topics), 900, poll_interval(partitions))
            elapsed = time.monotonic() - started
            out["create"] = {"answered_s": round(answered, 2), "all_led_s": round(elapsed, 2),
                             "partitions_per_s": round(partitions / elapsed), **probe.finish()}
            # The first write to each partition makes its files (a new log has none): timed
            # with the probe, as the creation's disk work now happens here.
            probe = Probe(broker.bootstrap, env)
            started = time.monotonic()
            filled = fill(broker.bootstrap, topics)
            out["fill"] = {"partitions": filled, "s": round(time.monotonic() - started, 2), **probe.finish()}
        time.sleep(2)
        pid = broker.proc.pid
        before = cpu_seconds(pid)
        time.sleep(10)
        out["idle_cpu_pct"] = round((cpu_seconds(pid) - before) / 10 * 100, 2)
        out["rss_mb"] = round(rss_mb(pid), 1)
        out["rss_mb_per_1000_partitions"] = round((out["rss_mb"] - empty_rss) / partitions * 1000, 2)

        started = time.monotonic()
        assert broker.stop(timeout=900) == 0
        out["clean_stop_s"] = round(time.monotonic() - started, 2)
        out["clean_restart"] = timed_start(broker, topics)
        broker.kill()
        out["kill9_restart"] = timed_start(broker, topics)

        with connect(broker) as conn:
            probe = Probe(broker.bootstrap, env)
            started = time.monotonic()
            conn.call(DELETE_TOPICS, 4, {"topic_names": [t for t, _ in topics], "timeout_ms": 600_000})
            answered = time.monotonic() - started
            wait_until(lambda: all(t.error_code == 3 for t in metadata(conn, [t for t, _ in topics]).topics),
                       900, 0.2)  # 3: UNKNOWN_TOPIC_OR_PARTITION
            out["delete"] = {"answered_s": round(answered, 2),
                             "gone_s": round(time.monotonic() - started, 2), **probe.finish()}
    finally:
        broker.close()
    return out


def cluster_scenario(partitions: int, mode: str = "zookeeper") -> dict:
    """Three brokers, `partitions` partitions with RF=3 (topics of at most 10,000), on a
    ZooKeeper or (mode "kraft") on a KRaft quorum of the three as combined nodes: creation until
    every broker's Metadata shows every leader; controller failover (kill -9 of the active
    controller until a new one is known: a survivor's Metadata names it under ZooKeeper, the
    quorum's DescribeQuorum names a new leader under KRaft, where Metadata's controller id is
    any live broker; then until every partition is led by a live broker, and how much of that
    is past the session timeout); the killed broker started again until it is back in the ISR
    of all its partitions; a preferred leader election (ElectLeaders) until every partition's
    first replica leads again; controlled shutdown (SIGTERM) of the broker that then leads the
    most (about a third), until it is answered (the broker's log: from "shutting down" to
    "controlled shutdown succeeded") and until the process has exited."""
    from contextlib import nullcontext

    from cluster import metadata  # benchmarks/cluster.py: the cluster benchmark's helpers
    from strom.testing import KRAFT, Cluster
    from strom.zookeeper_server import ZooKeeperServer

    topics = topic_names(partitions)
    session_ms = 4000
    overrides = {"max.broker.partitions": str(partitions + 1000), "num.partitions": "1",
                 "offsets.topic.num.partitions": "6", "transaction.state.log.num.partitions": "6"}
    out: dict = {"mode": mode, "partitions": partitions, "replication_factor": 3, "session_timeout_ms": session_ms}
    kraft = mode == "kraft"

    def views(client) -> dict[str, dict[int, tuple[int, list[int], list[int]]]]:
        return {t.name: {p.partition_index: (p.leader_id, list(p.replica_nodes), list(p.isr_nodes))
                         for p in t.partitions}
                for t in metadata(client, [t for t, _ in topics]).topics if t.error_code == 0}

    def led_by(client, alive: set[int]) -> bool:
        v = views(client)
        return sum(len(x) for x in v.values()) == partitions and all(
            leader in alive for parts in v.values() for leader, _, _ in parts.values())

    with (nullcontext(KRAFT) if kraft else ZooKeeperServer(fsync=False)) as zk, \
            Cluster(3, zookeeper=zk, overrides=overrides, session_timeout_ms=session_ms) as cluster:
        clients = {i: Connection("127.0.0.1", b.port, timeout_s=600) for i, b in cluster.brokers.items()}
        try:
            started = time.monotonic()
            controller = clients[cluster.controller_id()]
            for name, n in topics:
                controller.call(CREATE_TOPICS, 4, {"topics": [{"name": name, "num_partitions": n,
                                                                "replication_factor": 3, "assignments": [],
                                                                "configs": []}],
                                                    "timeout_ms": 600_000, "validate_only": False})
            for client in clients.values():
                wait_until(lambda c=client: led_by(c, {1, 2, 3}), 1800, poll_interval(partitions))
            elapsed = time.monotonic() - started
            out["create"] = {"all_brokers_s": round(elapsed, 2), "partitions_per_s": round(partitions / elapsed),
                             "replicas_per_s": round(3 * partitions / elapsed)}
            out["rss_mb"] = {i: round(rss_mb(b.proc.pid), 1) for i, b in cluster.brokers.items()}

            old = cluster.controller_id()
            survivors = {i: c for i, c in clients.items() if i != old}
            started = time.monotonic()
            cluster.brokers[old].kill()
            clients.pop(old).close()
            if kraft:
                first = wait_until(lambda: cluster.controller_id() in survivors, 600)
            else:
                first = wait_until(lambda: any(metadata(c, []).controller_id in survivors
                                               for c in survivors.values()), 600)
            led = wait_until(lambda: all(led_by(c, set(survivors)) for c in survivors.values()), 1800,
                             poll_interval(partitions))
            out["controller_failover"] = {"new_controller_s": round(first, 2),
                                          "past_session_timeout_s": round(first - session_ms / 1000, 2),
                                          "all_led_again_s": round(first + led, 2)}

            started = time.monotonic()
            cluster.brokers[old].start(timeout=900)
            clients[old] = Connection("127.0.0.1", cluster.brokers[old].port, timeout_s=600)
            ready = time.monotonic() - started
            some = next(iter(survivors.values()))
            wait_until(lambda: all(sorted(isr) == sorted(replicas) for parts in views(some).values()
                                   for _, replicas, isr in parts.values()), 1800, poll_interval(partitions))
            out["restart_rejoin"] = {"port_ready_s": round(ready, 2),
                                     "in_every_isr_s": round(time.monotonic() - started, 2)}

            # The restarted broker leads nothing: a preferred election (as auto.leader.rebalance
            # would make after its interval) gives each broker back about a third.
            started = time.monotonic()
            answer = clients[cluster.controller_id()].call(ELECT_LEADERS, 2, {
                "election_type": 0, "topic_partitions": None, "timeout_ms": 600_000})
            assert answer.error_code == 0, answer
            moved = wait_until(lambda: all(
                leader == replicas[0] for parts in views(some).values() for leader, replicas, _ in parts.values()),
                1800, poll_interval(partitions))
            out["preferred_election"] = {"all_preferred_s": round(moved, 2)}

            leaders = [leader for parts in views(some).values() for leader, _, _ in parts.values()]
            target = max((i for i in clients if i != cluster.controller_id()), key=leaders.count)
            out["controlled_shutdown"] = {"broker_led": leaders.count(target)}
            clients.pop(target).close()
            broker = cluster.brokers[target]
            logged = len(broker.stderr_lines)
            started = time.monotonic()
            assert broker.stop(timeout=900) == 0
            out["controlled_shutdown"]["stopped_s"] = round(time.monotonic() - started, 2)
            out["controlled_shutdown"]["controlled_s"] = logged_between(
                broker.stderr_lines[logged:], "strom: shutting down", "controlled shutdown succeeded")
            out["controlled_shutdown"]["attempts"] = sum(
                "controlled shutdown" in line for line in broker.stderr_lines[logged:])
            for line in broker.stderr_lines[logged:]:
                if "controlled shutdown" in line:
                    print(f"  broker {target}: {line}", file=sys.stderr)
        finally:
            for client in clients.values():
                client.close()
    return out


def table(results: dict) -> str:
    rows = [
        ("creation, partitions/s", lambda r: r["create"]["partitions_per_s"]),
        ("creation: longest ApiVersions wait, ms", lambda r: r["create"]["api_versions_max_ms"]),
        ("creation: produce p99 / max, ms",
         lambda r: f'{r["create"]["produce_p99_ms"]} / {r["create"]["produce_max_ms"]}'),
        ("first record to each of up to 20,000 partitions, s",
         lambda r: f'{r["fill"]["s"]} ({r["fill"]["partitions"]:,})'),
        ("first records: longest ApiVersions wait, ms", lambda r: r["fill"]["api_versions_max_ms"]),
        ("first records: produce p99 / max, ms",
         lambda r: f'{r["fill"]["produce_p99_ms"]} / {r["fill"]["produce_max_ms"]}'),
        ("deletion, s", lambda r: r["delete"]["gone_s"]),
        ("deletion: longest ApiVersions wait, ms", lambda r: r["delete"]["api_versions_max_ms"]),
        ("clean restart: port / all led, s",
         lambda r: f'{r["clean_restart"]["port_ready_s"]} / {r["clean_restart"]["all_led_s"]}'),
        ("kill -9 restart: port / all led, s",
         lambda r: f'{r["kill9_restart"]["port_ready_s"]} / {r["kill9_restart"]["all_led_s"]}'),
        ("clean stop, s", lambda r: r["clean_stop_s"]),
        ("idle CPU, % of a core", lambda r: r["idle_cpu_pct"]),
        ("RSS, MB (per 1,000 partitions)", lambda r: f'{r["rss_mb"]} ({r["rss_mb_per_1000_partitions"]})'),
    ]
    return markdown(rows, [(f"{label} {int(n):,}", r) for label, runs in results.items()
                           for n, r in runs.items()])


def markdown(rows: list[tuple[str, Callable[[dict], object]]], columns: list[tuple[str, dict]]) -> str:
    """A table of one row per (name, value of a result) and one column per (title, result);
    a value a result lacks shows as n/a."""
    lines = ["| | " + " | ".join(title for title, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, get in rows:
        cells = []
        for _, r in columns:
            try:
                cells.append(str(get(r)))
            except (KeyError, TypeError):
                cells.append("n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cluster_table(clusters: dict) -> str:
    rows = [
        ("creation until every broker shows every leader, s (partitions/s)",
         lambda r: f'{r["create"]["all_brokers_s"]} ({r["create"]["partitions_per_s"]})'),
        ("controller failover: new controller known, s (past the session timeout)",
         lambda r: f'{r["controller_failover"]["new_controller_s"]} ({r["controller_failover"]["past_session_timeout_s"]})'),
        ("controller failover: every partition led again, s", lambda r: r["controller_failover"]["all_led_again_s"]),
        ("killed broker restarted: port / in every ISR, s",
         lambda r: f'{r["restart_rejoin"]["port_ready_s"]} / {r["restart_rejoin"]["in_every_isr_s"]}'),
        ("preferred election until every preferred replica leads, s",
         lambda r: r["preferred_election"]["all_preferred_s"]),
        ("controlled shutdown: partitions led", lambda r: r["controlled_shutdown"]["broker_led"]),
        ("controlled shutdown: answered / exited, s",
         lambda r: f'{r["controlled_shutdown"]["controlled_s"]} / {r["controlled_shutdown"]["stopped_s"]}'),
        ("RSS per broker, MB", lambda r: ", ".join(str(v) for v in r["rss_mb"].values())),
    ]
    return markdown(rows, [(f"{label} {mode} {int(n):,}", r) for label, modes in clusters.items()
                           for mode, runs in modes.items() for n, r in runs.items()])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--probe":
        probe_main(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, nargs="*", default=[1000, 10_000])
    parser.add_argument("--baseline-src", type=Path, help="another checkout's src/ to compare with")
    parser.add_argument("--skip-baseline-above", type=int, default=None,
                        help="run the baseline only up to this many partitions")
    parser.add_argument("--table", action="store_true", help="also print a Markdown table")
    parser.add_argument("--cluster", type=int, nargs="*", default=[],
                        help="also run the three-broker scenario (RF=3) at these partition counts")
    parser.add_argument("--cluster-modes", nargs="*", choices=["zookeeper", "kraft"], default=["zookeeper"],
                        help="the metadata modes of the three-broker scenario, each in turn")
    args = parser.parse_args()
    runs = {"strom": {}}
    if args.baseline_src:
        runs = {"baseline": {}, "strom": {}}
    load = os.getloadavg()[0]
    for n in args.partitions:
        for label in runs:
            env = dict(os.environ)
            if label == "baseline":
                if args.skip_baseline_above is not None and n > args.skip_baseline_above:
                    continue
                env["PYTHONPATH"] = str(args.baseline_src.resolve())
            print(f"{label}: {n} partitions", file=sys.stderr)
            runs[label][n] = scenario(n, env)
    clusters: dict = {}
    for n in args.cluster:
        for mode in args.cluster_modes:
            for label in runs:  # the baseline's brokers: its src/ first on their PYTHONPATH
                print(f"{label}: {mode} cluster of {n} partitions", file=sys.stderr)
                saved = os.environ.get("PYTHONPATH")
                if label == "baseline":
                    os.environ["PYTHONPATH"] = str(args.baseline_src.resolve())
                try:
                    clusters.setdefault(label, {}).setdefault(mode, {})[n] = cluster_scenario(n, mode)
                finally:
                    if saved is None:
                        os.environ.pop("PYTHONPATH", None)
                    else:
                        os.environ["PYTHONPATH"] = saved
    result = {"cpus": os.cpu_count(), "load_at_start": round(load, 2), "python": sys.version.split()[0],
              "results": runs, "clusters": clusters}
    print(json.dumps(result, indent=1))
    if args.table:
        if any(runs.values()):
            print(table(runs))
        if clusters:
            print(cluster_table(clusters))


if __name__ == "__main__":
    main()
