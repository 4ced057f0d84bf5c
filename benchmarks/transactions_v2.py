"""Transactions version 1 against version 2 (KIP-890 part 2), request by request.

    .venv/bin/python benchmarks/transactions_v2.py [--seconds 10] [--partitions 4]
                                                   [--records 10] [--output FILE]

No client library speaks transactions version 2 yet, so both producers here are written with
`strom.protocol` over one blocking connection each (the broker is a BrokerProcess: 127.0.0.1,
ephemeral port, temp dir, `transaction.state.log.num.partitions=1`). Each transaction writes
`--records` records of 100 bytes to every one of `--partitions` partitions in one Produce
request, then commits:

- `tv1`: AddPartitionsToTxn v3 (all partitions), Produce v11, EndTxn v4: three round trips.
- `tv2`: Produce v12 (the leader adds the partitions to the transaction), EndTxn v5 (the
  epoch is bumped; the producer goes on with the epoch it is given): two round trips.

The two run alternately for `--seconds` each, twice, and each one's better pass is reported:
txns_per_s, the p50 / p99 of one whole transaction in ms, and broker CPU ms per transaction
(utime+stime of the broker process over the pass). `tv2_to_tv1` is the ratio of txns/s.
A check afterwards reads the committed end offsets: every transaction's records are there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402  (machine_info)
from strom.protocol.records import build_batch  # noqa: E402
from strom.testing import BrokerProcess, RawClient, create_topic  # noqa: E402

PRODUCE, LIST_OFFSETS, FIND_COORDINATOR, INIT_PRODUCER_ID = 0, 2, 10, 22
ADD_PARTITIONS_TO_TXN, END_TXN = 24, 26


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class RawTransactionalProducer:
    def __init__(self, client: RawClient, txn_id: str, version: int) -> None:
        self.client, self.txn_id, self.version = client, txn_id, version
        client.call(FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": [txn_id]})
        while True:
            body = client.call(INIT_PRODUCER_ID, 5, {"transactional_id": txn_id, "transaction_timeout_ms": 60000,
                                                     "producer_id": -1, "producer_epoch": -1})
            if body.error_code == 0:
                break
            time.sleep(0.1)
        self.producer_id, self.epoch = body.producer_id, body.producer_epoch
        self.sequence: dict[int, int] = {}

    def transaction(self, topic: str, partitions: int, records: int, value: bytes) -> None:
        if self.version == 1:
            body = self.client.call(ADD_PARTITIONS_TO_TXN, 3, {
                "v3_and_below_transactional_id": self.txn_id, "v3_and_below_producer_id": self.producer_id,
                "v3_and_below_producer_epoch": self.epoch,
                "v3_and_below_topics": [{"name": topic, "partitions": list(range(partitions))}]})
            errors = [p.partition_error_code for t in body.results_by_topic_v3_and_below
                      for p in t.results_by_partition]
            assert not any(errors), errors
        data = []
        for p in range(partitions):
            seq = self.sequence.get(p, 0)
            data.append({"index": p, "records": build_batch(
                [(None, value)] * records, producer_id=self.producer_id, producer_epoch=self.epoch,
                base_sequence=seq, transactional=True)})
            self.sequence[p] = seq + records
        body = self.client.call(PRODUCE, 12 if self.version == 2 else 11, {
            "transactional_id": self.txn_id, "acks": -1, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": data}]})
        errors = [p.error_code for t in body.responses for p in t.partition_responses]
        assert not any(errors), errors
        body = self.client.call(END_TXN, 5 if self.version == 2 else 4, {
            "transactional_id": self.txn_id, "producer_id": self.producer_id,
            "producer_epoch": self.epoch, "committed": True})
        assert body.error_code == 0, body
        if self.version == 2:
            self.producer_id, self.epoch = body.producer_id, body.producer_epoch
            self.sequence.clear()


def run_pass(broker: BrokerProcess, producer: RawTransactionalProducer, topic: str, args) -> dict:
    value = b"x" * 100
    times: list[float] = []
    cpu_before = cpu_seconds(broker.proc.pid)
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        t0 = time.perf_counter()
        producer.transaction(topic, args.partitions, args.records, value)
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    cpu = cpu_seconds(broker.proc.pid) - cpu_before
    return {"transactions": len(times), "txns_per_s": round(len(times) / wall, 1),
            "txn_p50_ms": round(percentile(times, 0.5) * 1000, 3),
            "txn_p99_ms": round(percentile(times, 0.99) * 1000, 3),
            "broker_cpu_ms_per_txn": round(cpu * 1000 / len(times), 3)}


def committed_records(client: RawClient, topic: str, partitions: int) -> int:
    body = client.call(LIST_OFFSETS, 5, {"replica_id": -1, "isolation_level": 1, "topics": [
        {"name": topic, "partitions": [{"partition_index": p, "current_leader_epoch": -1, "timestamp": -1}
                                       for p in range(partitions)]}]})
    return sum(p.offset for t in body.topics for p in t.partitions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--records", type=int, default=10, help="records per partition per transaction")
    parser.add_argument("--output")
    args = parser.parse_args()
    results: dict[str, dict] = {}
    with BrokerProcess(overrides={"transaction.state.log.num.partitions": "1"}) as broker:
        topics = {}
        producers = {}
        for version in (1, 2):
            topics[version] = f"bench-tv{version}"
            create_topic(broker.bootstrap, topics[version], partitions=args.partitions)
            producers[version] = RawTransactionalProducer(RawClient(broker), f"bench-tv{version}", version)
        total = {1: 0, 2: 0}
        for version in (1, 2, 1, 2):
            res = run_pass(broker, producers[version], topics[version], args)
            progress(f"tv{version}: {res}")
            total[version] += res["transactions"]
            best = results.get(f"tv{version}")
            if best is None or res["txns_per_s"] > best["txns_per_s"]:
                results[f"tv{version}"] = res
        with RawClient(broker) as client:
            for version in (1, 2):
                # Every transaction committed: the read_committed end offsets moved past its
                # records and the marker each partition got (a marker takes an offset too).
                want = total[version] * args.partitions * (args.records + 1)
                results[f"tv{version}"]["complete"] = committed_records(client, topics[version],
                                                                        args.partitions) == want
        results["tv2_to_tv1"] = round(results["tv2"]["txns_per_s"] / results["tv1"]["txns_per_s"], 3)
    document = {"machine": run.machine_info(), "args": vars(args), "results": results}
    text = json.dumps(document, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
