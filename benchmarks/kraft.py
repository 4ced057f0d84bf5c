"""KRaft beside ZooKeeper: the same 3-broker cluster in both modes, the same scenarios, in one
invocation (so both columns see the same machine).

    .venv/bin/python benchmarks/kraft.py [--partitions 10000] [--session-timeout-ms 4000] [--modes zookeeper,kraft]

ZooKeeper mode: Debian's ZooKeeper (no fsync) and brokers 1-3. KRaft mode: nodes 1-3 each a
broker and a controller (process.roles=broker,controller), no JVM. The session timeout is the
same number in both (zookeeper.session.timeout.ms, broker.session.timeout.ms). Per mode:

- `create`: CreateTopics of `--partitions` partitions with RF=3 (topics of at most 10,000),
  until EVERY broker's Metadata shows every partition with a leader;
- `controller_failover`: kill -9 of the active controller (a broker too, in both modes):
  `new_controller_s` until a new, live active controller is known (ZooKeeper: a survivor's
  Metadata names it; KRaft: the quorum has a new leader), `acting_s` until a CreateTopics
  through a survivor has been carried out by the new controller (its topic on both survivors),
  `all_led_s` until every partition is led by a survivor (the dead broker's leaderships need
  its session to end: that is the session timeout's share); the old controller is then started
  again, until it is back in every ISR (`restarted_in_every_isr_s`);
- `broker_failure`: kill -9 of a broker that is not the controller: until every partition it
  led has a new leader on both survivors (`new_leaders_s`; minus the session timeout:
  `past_session_timeout_s`);
- `new_broker_ready`: a fourth broker started until its ready line (`ready_s`) and until every
  other broker's Metadata lists it (`known_s`).

Prints one JSON document (and a Markdown table with --table); `--logs DIR` keeps every node's log.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from partitions import (  # benchmarks/partitions.py
    CREATE_TOPICS,
    metadata,
    poll_interval,
    topic_names,
    wait_until,
)
from strom.client import Connection
from strom.testing import KRAFT, Cluster, wait_for


def _create(conn: Connection, topics: list[tuple[str, int]], factor: int = 3) -> None:
    for name, n in topics:
        body = conn.call(CREATE_TOPICS, 4, {"topics": [{"name": name, "num_partitions": n, "replication_factor": factor,
                                                        "assignments": [], "configs": []}],
                                            "timeout_ms": 600_000, "validate_only": False})
        assert body.topics[0].error_code == 0, body


def _leaders(conn: Connection, names: list[str]) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.leader_id for t in metadata(conn, names).topics if t.error_code == 0
            for p in t.partitions}


def scenario(mode: str, partitions: int, session_ms: int, logs: Path | None = None) -> dict:
    from strom.zookeeper_server import ZooKeeperServer

    topics = topic_names(partitions)
    names = [t for t, _ in topics]
    overrides = {"max.broker.partitions": str(partitions + 1000), "num.partitions": "1",
                 "offsets.topic.num.partitions": "6", "transaction.state.log.num.partitions": "6"}
    out: dict = {"mode": mode, "partitions": partitions, "replication_factor": 3, "session_timeout_ms": session_ms}
    zk = ZooKeeperServer(fsync=False).start() if mode == "zookeeper" else None
    cluster = Cluster(3, zookeeper=zk if zk is not None else KRAFT, overrides=overrides, session_timeout_ms=session_ms)
    clients: dict[int, Connection] = {}
    try:
        started = time.monotonic()
        cluster.start()
        out["cluster_start_s"] = round(time.monotonic() - started, 2)
        clients = {i: Connection("127.0.0.1", b.port, timeout_s=600) for i, b in cluster.brokers.items()}

        def all_led(conn: Connection, alive: set[int]) -> bool:
            led = _leaders(conn, names)
            return len(led) == partitions and all(x in alive for x in led.values())

        started = time.monotonic()
        _create(clients[wait_for(lambda: (c := cluster.controller_id()) > 0 and c, 60)], topics)
        for conn in clients.values():
            wait_until(lambda c=conn: all_led(c, {1, 2, 3}), 1800, poll_interval(partitions))
        elapsed = time.monotonic() - started
        out["create"] = {"all_brokers_s": round(elapsed, 2), "partitions_per_s": round(partitions / elapsed)}

        # Controller failover.
        old = wait_for(lambda: (c := cluster.controller_id()) > 0 and c, 60)
        survivors = {i: c for i, c in clients.items() if i != old}
        started = time.monotonic()
        cluster.brokers[old].kill()
        clients.pop(old).close()
        new = wait_for(lambda: (c := cluster.controller_id()) in survivors and c, 600, 0.02)
        new_s = time.monotonic() - started
        probe = f"after-failover-{mode}"
        wait_until(lambda: _try_create(survivors, probe), 600, 0.1)
        wait_until(lambda: all(_leaders(c, [probe]) for c in survivors.values()), 600)
        acting_s = time.monotonic() - started
        wait_until(lambda: all(all_led(c, set(survivors)) for c in survivors.values()), 1800, poll_interval(partitions))
        out["controller_failover"] = {"new_controller": new, "new_controller_s": round(new_s, 2),
                                      "acting_s": round(acting_s, 2),
                                      "all_led_s": round(time.monotonic() - started, 2)}
        cluster.brokers[old].start(timeout=900)
        clients[old] = Connection("127.0.0.1", cluster.brokers[old].port, timeout_s=600)
        wait_until(lambda: old in {b.node_id for b in metadata(clients[new], []).brokers}, 600)
        started = time.monotonic()  # back in every ISR before the next scenario
        wait_until(lambda: all(len(p.isr_nodes) == 3 for t in metadata(clients[new], names).topics
                               for p in t.partitions), 1800, poll_interval(partitions))
        out["controller_failover"]["restarted_in_every_isr_s"] = round(time.monotonic() - started, 2)

        # A broker that is not the controller fails.
        controller = wait_for(lambda: (c := cluster.controller_id()) > 0 and c, 60)
        some = clients[controller]
        led = _leaders(some, names)
        victim = max((i for i in clients if i != controller), key=lambda b: list(led.values()).count(b))
        its = [tp for tp, leader in led.items() if leader == victim]
        rest = {i: c for i, c in clients.items() if i != victim}
        started = time.monotonic()
        cluster.brokers[victim].kill()
        clients.pop(victim).close()
        def moved(conn: Connection) -> bool:
            now = _leaders(conn, names)
            return all(now.get(tp) not in (victim, -1, None) for tp in its)

        wait_until(lambda: all(moved(c) for c in rest.values()), 1800, poll_interval(partitions))
        took = time.monotonic() - started
        out["broker_failure"] = {"partitions_it_led": len(its), "new_leaders_s": round(took, 2),
                                 "past_session_timeout_s": round(took - session_ms / 1000, 2)}

        # A new broker.
        started = time.monotonic()
        cluster.add_broker(4)
        ready = time.monotonic() - started
        wait_until(lambda: all(4 in {b.node_id for b in metadata(c, []).brokers} for c in rest.values()), 600)
        out["new_broker_ready"] = {"ready_s": round(ready, 2), "known_s": round(time.monotonic() - started, 2)}
    finally:
        for conn in clients.values():
            conn.close()
        if logs is not None:  # every node's log, for what a number does not say
            logs.mkdir(parents=True, exist_ok=True)
            for node_id, node in cluster.brokers.items():
                (logs / f"{mode}-node-{node_id}.log").write_text(node.log_text())
        cluster.close()
        if zk is not None:
            zk.close()
    return out


def _try_create(clients: dict[int, Connection], name: str) -> bool:
    for conn in clients.values():
        try:
            body = conn.call(CREATE_TOPICS, 4, {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 2,
                                                            "assignments": [], "configs": []}],
                                                "timeout_ms": 10_000, "validate_only": False})
        except (OSError, ConnectionError):
            continue
        if body.topics[0].error_code in (0, 36):  # created, or created by an earlier attempt
            return True
    return False


def table(results: list[dict]) -> str:
    rows = [("cluster start", lambda r: f"{r['cluster_start_s']} s"),
            ("CreateTopics until every broker serves them", lambda r: f"{r['create']['all_brokers_s']} s "
                                                                     f"({r['create']['partitions_per_s']}/s)"),
            ("controller kill -9: new active controller", lambda r: f"{r['controller_failover']['new_controller_s']} s"),
            ("controller kill -9: new controller acting", lambda r: f"{r['controller_failover']['acting_s']} s"),
            ("controller kill -9: all partitions led again", lambda r: f"{r['controller_failover']['all_led_s']} s"),
            ("broker kill -9: new leaders everywhere", lambda r: f"{r['broker_failure']['new_leaders_s']} s"),
            ("new broker: ready / known to all", lambda r: f"{r['new_broker_ready']['ready_s']} s / "
                                                           f"{r['new_broker_ready']['known_s']} s")]
    head = "| | " + " | ".join(f"{r['mode']} ({r['partitions']:,} partitions RF=3)" for r in results) + " |"
    lines = [head, "|---|" + "---|" * len(results)]
    for label, cell in rows:
        cells = []
        for r in results:
            try:
                cells.append(cell(r))
            except KeyError:
                cells.append(r.get("error", "-"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--session-timeout-ms", type=int, default=4000)
    parser.add_argument("--modes", default="zookeeper,kraft")
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--logs", type=Path, help="write each node's log here")
    args = parser.parse_args()
    results = []
    for mode in args.modes.split(","):
        print(f"{mode}: {args.partitions} partitions ...", file=sys.stderr, flush=True)
        try:
            results.append(scenario(mode, args.partitions, args.session_timeout_ms, args.logs))
        except Exception as e:  # the other mode still runs
            results.append({"mode": mode, "partitions": args.partitions, "error": f"{type(e).__name__}: {e}"})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps(results, indent=2))
    if args.table:
        print(table(results))


if __name__ == "__main__":
    main()
