"""What one wide request costs a broker: memory and time of requests that name many topics
or partitions, the hostile kind (names that do not exist) and the large legal kind.

Each scenario runs on a fresh `strom serve` (strom.testing.BrokerProcess): RSS before, its
peak while the requests are answered (sampled every 10 ms from /proc), RSS 2 s after the
answers (what the broker keeps), the wall time until every answer is read, and the size of
the answers. Scenarios:

- metadata-200k-unknown: one Metadata v12 naming 200,000 topics that do not exist;
- metadata-4x1M-unknown: four such requests of 1,000,000 names each, at once;
- metadata-100k-partitions: Metadata v12 of 10 topics of 10,000 partitions each;
- dtp-1M-unknown: DescribeTopicPartitions naming 1,000,000 unknown topics;
- listoffsets-1M: ListOffsets v7 for 1,000,000 partitions of topics that do not exist;
- listoffsets-100k-partitions: ListOffsets v7 (latest) for the 100,000 existing partitions.

`--baseline-src DIR` runs the same scenarios against another checkout's `src/` (say, the
commit before a change) in the same invocation, so both columns see the same machine:

    git archive <commit> src | tar -x -C /tmp/before
    python benchmarks/wide_requests.py --baseline-src /tmp/before/src

Prints one JSON document; numbers are MB and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from strom.protocol.messages import encode_request
from strom.testing import BrokerProcess, memory_mb

METADATA, LIST_OFFSETS, CREATE_TOPICS, DESCRIBE_TOPIC_PARTITIONS = 3, 2, 19, 75
WIDE_TOPICS, WIDE_PARTITIONS = 10, 10_000


def metadata(names: list[str]) -> bytes:
    return encode_request(METADATA, 12, {"topics": [{"name": n} for n in names],
                                         "allow_auto_topic_creation": False,
                                         "include_topic_authorized_operations": False})


def describe_topic_partitions(names: list[str]) -> bytes:
    return encode_request(DESCRIBE_TOPIC_PARTITIONS, 0, {"topics": [{"name": n} for n in names],
                                                         "response_partition_limit": 2000, "cursor": None})


def list_offsets(topics: list[str], partitions: int) -> bytes:
    return encode_request(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": t, "partitions": [{"partition_index": i, "current_leader_epoch": -1, "timestamp": -1}
                                   for i in range(partitions)]} for t in topics]})


def _read_answer(sock: socket.socket) -> int:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        head += chunk
    size, got = int.from_bytes(head, "big"), 0
    while got < size:
        chunk = sock.recv(min(1 << 20, size - got))
        if not chunk:
            raise ConnectionError("the broker closed the connection mid-answer")
        got += len(chunk)
    return size


def measure(broker: BrokerProcess, requests: list[bytes]) -> dict[str, float]:
    """Send `requests` on connections of their own at once; RSS and time until all answered."""
    pid, stop, peak = broker.proc.pid, threading.Event(), [0.0]

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], memory_mb(pid))
            time.sleep(0.01)

    before = memory_mb(pid)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    begin = time.monotonic()
    socks = []
    try:
        for request in requests:
            sock = socket.create_connection(("127.0.0.1", broker.port), timeout=600)
            sock.sendall(request)
            socks.append(sock)
        answered = sum(_read_answer(sock) for sock in socks)
    finally:
        for sock in socks:
            sock.close()
    seconds = time.monotonic() - begin
    time.sleep(2.0)  # what the broker keeps once the answers are gone
    stop.set()
    sampler.join()
    return {"rss_before_mb": round(before), "rss_peak_mb": round(peak[0]),
            "rss_peak_growth_mb": round(peak[0] - before), "rss_after_mb": round(memory_mb(pid)),
            "seconds": round(seconds, 2), "request_mb": round(sum(map(len, requests)) / 1e6, 1),
            "answer_mb": round(answered / 1e6, 1)}


def _create_wide_topics(broker: BrokerProcess) -> list[str]:
    from strom.client import Connection

    names = [f"wide-{k}" for k in range(WIDE_TOPICS)]
    with Connection("127.0.0.1", broker.port, timeout_s=600) as conn:
        for name in names:
            body = conn.call(CREATE_TOPICS, 5, {"topics": [{"name": name, "num_partitions": WIDE_PARTITIONS,
                                                            "replication_factor": 1, "assignments": [],
                                                            "configs": []}],
                                                "timeout_ms": 600_000, "validate_only": False})
            assert body.topics[0].error_code == 0, body.topics[0]
    return names


def scenarios(broker: BrokerProcess, only: list[str]) -> dict[str, dict[str, float]]:
    unknown = [f"no-such-topic-{i:07d}" for i in range(1_000_000)]
    cases: dict[str, Callable[[], list[bytes]]] = {
        "metadata-200k-unknown": lambda: [metadata(unknown[:200_000])],
        "metadata-4x1M-unknown": lambda: [metadata([f"{k}-{n}" for n in unknown]) for k in range(4)],
        "dtp-1M-unknown": lambda: [describe_topic_partitions(unknown)],
        "listoffsets-1M": lambda: [list_offsets([f"no-such-{k}" for k in range(10)], 100_000)],
    }
    wide_cases: dict[str, Callable[[list[str]], list[bytes]]] = {
        "metadata-100k-partitions": lambda names: [metadata(names)],
        "listoffsets-100k-partitions": lambda names: [list_offsets(names, WIDE_PARTITIONS)],
    }
    results = {}
    for name, make in cases.items():
        if not only or any(o in name for o in only):
            print(f"  {name}", file=sys.stderr, flush=True)
            results[name] = measure(broker, make())
    wanted = [n for n in wide_cases if not only or any(o in n for o in only)]
    if wanted:
        print("  creating 100,000 partitions", file=sys.stderr, flush=True)
        names = _create_wide_topics(broker)
        for name in wanted:
            print(f"  {name}", file=sys.stderr, flush=True)
            results[name] = measure(broker, wide_cases[name](names))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-src", type=Path, help="another checkout's src/ to compare with")
    parser.add_argument("--only", action="append", default=[], help="scenarios whose name contains this")
    args = parser.parse_args()
    overrides = {"max.broker.partitions": str(WIDE_TOPICS * WIDE_PARTITIONS + 1000),
                 "auto.create.topics.enable": "false"}
    runs = {"strom": None}
    if args.baseline_src:
        runs = {"baseline": str(args.baseline_src.resolve()), "strom": None}
    out = {}
    for label, src in runs.items():
        print(f"{label}:", file=sys.stderr, flush=True)
        env = dict(os.environ, PYTHONPATH=src) if src else None
        with BrokerProcess(overrides=overrides, env=env) as broker:
            out[label] = scenarios(broker, args.only)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
