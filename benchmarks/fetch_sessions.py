"""What incremental fetch sessions (KIP-227) save the broker: a consumer of many partitions that
has caught up, fetching with and without a session, against one broker process.

    .venv/bin/python benchmarks/fetch_sessions.py [--partitions 1000] [--fetches 2000] [--passes 3]

The topic gets one record per partition. Each pass sends --fetches Fetch v12 requests over one
connection (max_wait_ms 0, so the broker answers at once and CPU is the only cost), caught up
on every partition:
- full: session 0, epoch -1, every partition named in every request and answered in every
  response (what a client without sessions does, librdkafka's way);
- incremental: one full fetch opening a session, then requests naming no partition, answered
  with none (nothing changed).
Per mode, the median over passes (alternating which goes first) of the broker's CPU
microseconds per fetch (/proc/<pid>/stat) and the client's fetches per second. Progress on
stderr, one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from confluent_kafka import Producer  # noqa: E402

import run  # noqa: E402  (cpu_seconds, log, machine_info, background_load)
from strom.client import Connection  # noqa: E402
from strom.testing import BrokerProcess, create_topic  # noqa: E402

FETCH = 1


def request(topic: str, offsets: dict[int, int], session_id: int, epoch: int) -> dict:
    partitions = [{"partition": i, "current_leader_epoch": -1, "fetch_offset": o, "last_fetched_epoch": -1,
                   "log_start_offset": -1, "partition_max_bytes": 1 << 20} for i, o in offsets.items()]
    return {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 50 << 20, "isolation_level": 0,
            "session_id": session_id, "session_epoch": epoch,
            "topics": [{"topic": topic, "partitions": partitions}] if partitions else [],
            "forgotten_topics_data": [], "rack_id": ""}


def one_pass(broker: BrokerProcess, topic: str, partitions: int, fetches: int, incremental: bool) -> dict:
    caught_up = dict.fromkeys(range(partitions), 1)
    with Connection("127.0.0.1", broker.port, 30.0, "fetch-sessions-bench") as conn:
        session, epoch = 0, -1
        if incremental:
            opened = conn.call(FETCH, 12, request(topic, caught_up, 0, 0))
            assert opened.session_id != 0, "the broker opened no session"
            session, epoch = opened.session_id, 1
        cpu_before, began = run.cpu_seconds(broker.proc.pid), time.monotonic()
        answered = 0
        for _ in range(fetches):
            body = conn.call(FETCH, 12, request(topic, {} if incremental else caught_up, session, epoch))
            assert body.error_code == 0, body.error_code
            answered += sum(len(t.partitions) for t in body.responses)
            if incremental:
                epoch += 1
        seconds = time.monotonic() - began
        cpu = run.cpu_seconds(broker.proc.pid) - cpu_before
    return {"broker_cpu_us_per_fetch": cpu / fetches * 1e6, "fetches_per_s": fetches / seconds,
            "partitions_answered_per_fetch": answered / fetches}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--fetches", type=int, default=2000)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    load = run.background_load(2.0)
    with BrokerProcess() as broker:
        topic = "sessions-bench"
        create_topic(broker.bootstrap, topic, partitions=args.partitions)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        for i in range(args.partitions):
            producer.produce(topic, b"x", partition=i)
        assert producer.flush(30) == 0
        found: dict[str, list[dict]] = {"full": [], "incremental": []}
        for k in range(args.passes):
            for mode in (("full", "incremental") if k % 2 == 0 else ("incremental", "full")):
                result = one_pass(broker, topic, args.partitions, args.fetches, mode == "incremental")
                run.log(f"pass {k + 1} {mode}: {result['broker_cpu_us_per_fetch']:.0f} us broker CPU per fetch, "
                        f"{result['fetches_per_s']:.0f} fetches/s")
                found[mode].append(result)
    medians = {mode: {key: round(statistics.median(r[key] for r in results), 1) for key in results[0]}
               for mode, results in found.items()}
    doc = {"meta": {"machine": run.machine_info(), "background_load": round(load, 2),
                    "partitions": args.partitions, "fetches": args.fetches, "passes": args.passes},
           **medians,
           "broker_cpu_ratio_incremental_to_full": round(medians["incremental"]["broker_cpu_us_per_fetch"]
                                                         / medians["full"]["broker_cpu_us_per_fetch"], 3)}
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
