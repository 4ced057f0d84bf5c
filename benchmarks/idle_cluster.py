"""What an idle cluster of many partitions costs: three brokers, 10,000 partitions RF=3, nothing
written, every broker replicating what the others lead.

    .venv/bin/python benchmarks/idle_cluster.py [--partitions 10000] [--seconds 30] \
        [--modes zookeeper kraft] [--baseline-src ../strom-before/src]

Per mode (ZooKeeper, or KRaft with three combined nodes) and per code base (`--baseline-src`:
another checkout's `src/`, say the commit before a change, run first in the same invocation so
both columns see the same machine):

- start the cluster, create one topic of --partitions partitions RF=3 and wait until every
  partition has a leader and all three replicas in its ISR, then 5 s more;
- over --seconds of idleness: CPU seconds of each broker process (utime + stime from
  /proc/PID/stat), bytes each broker read and wrote (rchar / wchar of /proc/PID/io: sockets,
  mostly replica fetches, as nothing else happens) and the Fetch requests each answered
  (its `strom_requests` metric, scraped just outside the window), so CPU per Fetch stays
  comparable when a CPU-starved broker manages fewer rounds than it would alone;
- after the window: that every ISR is still whole and, in KRaft mode, how many times the
  quorum's leader epoch moved (re-elections while idle);
- the size of a follower's Fetch v12 request naming every partition one leader gives it
  (what every round sent without sessions) beside an incremental one naming none, computed
  with the protocol's own encoder.

Progress on stderr, one JSON document on stdout (a Markdown table with --table).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run  # noqa: E402  (cpu_seconds, log)
from strom.client import Connection  # noqa: E402
from strom.protocol import messages  # noqa: E402
from strom.testing import KRAFT, Cluster  # noqa: E402
from strom.zookeeper_server import ZooKeeperServer  # noqa: E402

METADATA, FETCH, CREATE_TOPICS = 3, 1, 19
NOT_CONTROLLER, REQUEST_TIMED_OUT = 41, 7
OVERRIDES = {"offsets.topic.num.partitions": "3", "transaction.state.log.num.partitions": "3",
             "metrics.port": "0"}


def io_bytes(pid: int) -> tuple[int, int]:
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def fetches(url: str) -> int:
    """Fetch requests the broker answered so far (its `strom_requests` counter; only followers
    fetch here). A scrape of a busy broker with many partitions is slow: a long timeout, and
    taken outside the CPU window."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=300) as response:
        text = response.read().decode()
    return int(sum(s.value for family in text_string_to_metric_families(text) if family.name == "strom_requests"
                   for s in family.samples if s.labels.get("request") == "Fetch"))


def isr_whole(port: int, topic: str, partitions: int) -> int:
    """How many of the topic's partitions have a leader and all three replicas in the ISR."""
    with Connection("127.0.0.1", port, timeout_s=60) as conn:
        body = conn.call(METADATA, 9, {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                       "include_cluster_authorized_operations": False,
                                       "include_topic_authorized_operations": False})
    return sum(1 for t in body.topics for p in t.partitions
               if p.leader_id >= 0 and len(p.isr_nodes) == 3) if body.topics else 0


def quorum_epoch(cluster: Cluster) -> int | None:
    if not cluster.kraft:
        return None
    found = cluster.quorum.describe()
    return None if found is None else found["leader_epoch"]


def measure(mode: str, partitions: int, seconds: float, src: Path | None) -> dict:
    saved = os.environ.get("PYTHONPATH")
    if src is not None:  # the brokers (subprocesses) run the other checkout's code
        os.environ["PYTHONPATH"] = str(src.resolve())
    zk = ZooKeeperServer(fsync=False) if mode == "zookeeper" else None
    try:
        if zk is not None:
            zk.start()
        overrides = {**OVERRIDES, "max.broker.partitions": str(partitions + 1000)}
        with Cluster(3, zookeeper=KRAFT if zk is None else zk, overrides=overrides) as cluster:
            topic = "idle"
            port = next(iter(cluster.brokers.values())).port
            began = time.monotonic()
            for broker in cluster.brokers.values():  # the one that is the controller takes it
                with Connection("127.0.0.1", broker.port, timeout_s=900) as conn:
                    body = conn.call(CREATE_TOPICS, 5, {"topics": [{
                        "name": topic, "num_partitions": partitions, "replication_factor": 3, "assignments": [],
                        "configs": []}], "timeout_ms": 600_000, "validate_only": False})
                if body.topics[0].error_code != NOT_CONTROLLER:
                    break
            # REQUEST_TIMED_OUT: created, some leaders still to come (waited for below).
            assert body.topics[0].error_code in (0, REQUEST_TIMED_OUT), body
            cluster.wait_for(lambda: isr_whole(port, topic, partitions) == partitions, 900,
                             "every ISR whole")
            ready_s = time.monotonic() - began
            run.log(f"{mode}: {partitions} partitions RF=3 in sync after {ready_s:.1f} s")
            time.sleep(5)
            procs = {i: b for i, b in cluster.brokers.items()}
            epoch_before = quorum_epoch(cluster)
            counted = {i: (fetches(b.metrics_url), time.monotonic()) for i, b in procs.items()}
            before = {i: (run.cpu_seconds(b.proc.pid), io_bytes(b.proc.pid)) for i, b in procs.items()}
            time.sleep(seconds)
            after = {i: (run.cpu_seconds(b.proc.pid), io_bytes(b.proc.pid)) for i, b in procs.items()}
            # Fetch answered per second between the two scrapes of each broker.
            rate = {i: (fetches(b.metrics_url) - counted[i][0]) / (time.monotonic() - counted[i][1])
                    for i, b in procs.items()}
            epoch_after = quorum_epoch(cluster)
            whole = isr_whole(port, topic, partitions)
            brokers = {}
            for i in procs:
                (c0, (r0, w0)), (c1, (r1, w1)) = before[i], after[i]
                brokers[str(i)] = {"cpu_s": round(c1 - c0, 2), "cpu_pct": round(100 * (c1 - c0) / seconds, 1),
                                   "read_kb_per_s": round((r1 - r0) / seconds / 1000, 1),
                                   "written_kb_per_s": round((w1 - w0) / seconds / 1000, 1),
                                   "fetches_per_s": round(rate[i], 2),
                                   "cpu_ms_per_fetch": round(1000 * (c1 - c0) / (rate[i] * seconds), 1)
                                   if rate[i] else None}
    finally:
        if zk is not None:
            zk.stop()
        if src is not None:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
    cpu = [b["cpu_s"] for b in brokers.values()]
    result = {"ready_s": round(ready_s, 1), "seconds": seconds, "brokers": brokers,
              "cpu_s_median": statistics.median(cpu), "isr_whole_after": whole,
              "quorum_epoch_moves": None if epoch_before is None or epoch_after is None
              else epoch_after - epoch_before}
    run.log(f"{mode}: CPU s over {seconds:.0f} s per broker {cpu}, {result}")
    return result


def request_sizes(partitions: int) -> dict:
    """A follower's Fetch v12 naming every partition one leader gives it (a third of the
    topic), beside an incremental one naming none."""
    def size(named: int, session_id: int, epoch: int) -> int:
        ps = [{"partition": i, "current_leader_epoch": 0, "fetch_offset": 0, "last_fetched_epoch": -1,
               "log_start_offset": 0, "partition_max_bytes": 1 << 20} for i in range(named)]
        body = {"replica_id": 1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 10 << 20,
                "isolation_level": 0, "session_id": session_id, "session_epoch": epoch,
                "topics": [{"topic": "idle", "partitions": ps}] if ps else [],
                "forgotten_topics_data": [], "rack_id": ""}
        return len(messages.encode_request(FETCH, 12, body, 1, "broker-1-fetcher"))
    per_leader = partitions // 3
    return {"partitions_per_leader": per_leader, "full_bytes": size(per_leader, 0, -1),
            "incremental_idle_bytes": size(0, 123456, 7)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--modes", nargs="+", default=["zookeeper", "kraft"], choices=["zookeeper", "kraft"])
    parser.add_argument("--baseline-src", type=Path, help="another checkout's src/ to compare with")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    runs: dict[str, dict] = {}
    for mode in args.modes:
        if args.baseline_src is not None:
            runs.setdefault("baseline", {})[mode] = measure(mode, args.partitions, args.seconds, args.baseline_src)
        runs.setdefault("strom", {})[mode] = measure(mode, args.partitions, args.seconds, None)
    result = {"cpus": os.cpu_count(), "load_at_start": round(os.getloadavg()[0], 2),
              "partitions": args.partitions, "fetch_request": request_sizes(args.partitions), "runs": runs}
    print(json.dumps(result, indent=1))
    if args.table:
        print("| code | mode | CPU s per broker over the window | Fetch/s answered | CPU ms per Fetch "
              "| read kB/s per broker | ISR whole after |")
        print("|---|---|---|---|---|---|---|")
        for label, modes in runs.items():
            for mode, r in modes.items():
                b = r["brokers"].values()
                print(f"| {label} | {mode} | {', '.join(str(x['cpu_s']) for x in b)} | "
                      f"{', '.join(str(x['fetches_per_s']) for x in b)} | "
                      f"{', '.join(str(x['cpu_ms_per_fetch']) for x in b)} | "
                      f"{', '.join(str(x['read_kb_per_s']) for x in b)} | "
                      f"{r['isr_whole_after']} |")


if __name__ == "__main__":
    main()
