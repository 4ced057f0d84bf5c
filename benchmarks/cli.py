"""`strom consume` throughput to /dev/null, compared with kcat (librdkafka's command line).

    .venv/bin/python benchmarks/cli.py [--records 500000] [--size 100] [--partitions 1,4]
                                       [--passes 3] [--json FILE]

One broker process (`strom.testing.BrokerProcess`: 127.0.0.1, ephemeral port, temp dir).
For each partition count a topic is filled with `--records` records of `--size` bytes by
`kcat -P` (a pre-generated file on its stdin, linger.ms=20), and its end offsets are checked.
Then each reader reads the whole topic from the beginning, `--passes` times, alternating:

- `kcat`: `kcat -C -b B -t T -o beginning -e -q` (assign, no group, exits at the end of every
  partition), output to /dev/null;
- `strom-consume`: `strom consume T --from-beginning --exit-at-end` (kafka-python, assign, no
  group), default text output (values only) to /dev/null, as users run it;
- `strom-consume-json`: the same with `--format json` (every field, JSON-encoded).

Numbers per reader (median of the passes): `records_per_s` = records / wall time from spawning
the reader to its exit (start-up included: ~0.3 s for `strom`, ~10 ms for kcat), `mb_per_s` the
same in payload bytes (10^6), `cpu_s` the reader's user+system CPU (wait4), `complete` whether
every pass printed exactly `--records` lines (kcat: output lines counted in a separate pass).
`ratio_vs_kcat` = strom-consume's records_per_s / kcat's. Progress goes to stderr, one JSON
document to stdout (and to `--json FILE`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from confluent_kafka import Consumer, TopicPartition

    from strom.testing import BrokerProcess, create_topic
except ImportError as e:  # pragma: no cover - a usage error, not a benchmark result
    sys.exit(f"cli.py needs the project venv (confluent-kafka and strom): {e}")

STROM = [sys.executable, "-m", "strom"]


def progress(message: str) -> None:
    print(f"[cli] {message}", file=sys.stderr, flush=True)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "cli-bench"})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)]
    finally:
        c.close()


def fill(bootstrap: str, topic: str, partitions: int, records: int, size: int, work: Path) -> None:
    data = work / f"records-{size}.txt"
    if not data.exists():
        line = b"x" * (size - 1) + b"\n"
        with open(data, "wb") as f:
            for start in range(0, records, 10_000):
                f.write(line * min(10_000, records - start))
    create_topic(bootstrap, topic, partitions)
    with open(data, "rb") as stdin:
        subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-X", "linger.ms=20",
                        "-X", "batch.num.messages=100000", "-X", "queue.buffering.max.kbytes=1048576"],
                       stdin=stdin, check=True, timeout=600)
    deadline = time.monotonic() + 60
    while sum(end_offsets(bootstrap, topic, partitions)) < records:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic} holds {end_offsets(bootstrap, topic, partitions)} of {records} records")
        time.sleep(0.2)


def timed(args: list[str], stdout: int | None = subprocess.DEVNULL) -> tuple[float, float, int, bytes]:
    """(wall s, cpu s, exit code, captured stdout if asked) of one reader run."""
    started = time.monotonic()
    proc = subprocess.Popen(args, stdout=stdout, stderr=subprocess.PIPE)
    out = b""
    if stdout == subprocess.PIPE:
        out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    if proc.stdout:
        proc.stdout.close()
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode, out


def readers(bootstrap: str, topic: str) -> dict[str, list[str]]:
    return {
        "kcat": ["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q"],
        "strom-consume": [*STROM, "consume", topic, "--bootstrap-server", bootstrap,
                          "--from-beginning", "--exit-at-end"],
        "strom-consume-json": [*STROM, "consume", topic, "--bootstrap-server", bootstrap,
                               "--from-beginning", "--exit-at-end", "--format", "json"],
    }


def measure(bootstrap: str, topic: str, records: int, size: int, passes: int) -> dict:
    commands = readers(bootstrap, topic)
    complete = {}
    for name, args in commands.items():  # one counted pass each: every record printed once
        _, _, code, out = timed(args, stdout=subprocess.PIPE)
        complete[name] = code == 0 and out.count(b"\n") == records
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for i in range(passes):
        for name, args in commands.items():
            wall, cpu, code, _ = timed(args)
            if code != 0:
                raise RuntimeError(f"{name} exited with {code}")
            runs[name].append((wall, cpu))
            progress(f"{topic} pass {i + 1}: {name} {records / wall:,.0f} records/s ({cpu:.2f} s CPU)")
    out = {}
    for name, samples in runs.items():
        wall = statistics.median(w for w, _ in samples)
        out[name] = {"records_per_s": round(records / wall), "mb_per_s": round(records * size / wall / 1e6, 1),
                     "wall_s": round(wall, 3), "cpu_s": round(statistics.median(c for _, c in samples), 3),
                     "wall_s_passes": [round(w, 3) for w, _ in samples], "complete": complete[name]}
    out["ratio_vs_kcat"] = round(out["strom-consume"]["records_per_s"] / out["kcat"]["records_per_s"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=100, help="record value bytes (>= 2)")
    parser.add_argument("--partitions", default="1,4", help="partition counts, comma-separated")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    args = parser.parse_args()
    if shutil.which("kcat") is None:
        sys.exit("cli.py compares with kcat: install it (scripts/bootstrap test does)")
    doc = {"meta": {"records": args.records, "size": args.size, "passes": args.passes,
                    "cpus": os.cpu_count()}, "results": {}}
    with tempfile.TemporaryDirectory(prefix="strom-cli-bench-") as work, BrokerProcess() as broker:
        for partitions in (int(p) for p in args.partitions.split(",")):
            topic = f"cli-bench-p{partitions}"
            progress(f"filling {topic}: {args.records:,} records of {args.size} bytes")
            fill(broker.bootstrap, topic, partitions, args.records, args.size, Path(work))
            doc["results"][f"p{partitions}"] = measure(broker.bootstrap, topic, args.records, args.size,
                                                       args.passes)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
