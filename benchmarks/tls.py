"""What TLS costs a fetch: the same topic read by kcat over PLAINTEXT (zero copy, sendfile)
and over SSL (the file regions copied through the TLS layer in 256 KiB chunks), from one broker
with both listeners.

    .venv/bin/python benchmarks/tls.py [--mb 500] [--size 1024] [--passes 3] [--json FILE]

The broker (`strom.testing.BrokerProcess`, 127.0.0.1, temp dir) gets a certificate made for the
run (trustme); the topic (one partition) is filled once with `--mb` MB of `--size`-byte records
by kcat over PLAINTEXT. Each pass reads it all with `kcat -C -o beginning -e -q` to /dev/null,
once per listener, alternating which goes first. Per listener (median of the passes): MB/s
(payload, 10^6 bytes, wall time from spawning kcat to its exit) and the broker's CPU seconds per
GB read (/proc/<pid>/stat around each read). Progress goes to stderr, one JSON document to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run  # noqa: E402  (cpu_seconds, log, machine_info)
from strom.testing import BrokerProcess, create_topic, make_pki  # noqa: E402


def read_all(args: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="strom-tls-bench-") as tmp:
        pki = make_pki(Path(tmp))
        overrides = {"listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
                     "ssl.keystore.location": str(pki["server"])}
        with BrokerProcess(overrides=overrides) as broker:
            topic = "tls-bench"
            create_topic(broker.bootstrap, topic)
            records = args.mb * 1_000_000 // args.size
            data = Path(tmp) / "records.txt"
            line = (b"x" * (args.size - 1)) + b"\n"
            with data.open("wb") as f:
                for _ in range(records):
                    f.write(line)
            run.log(f"filling {topic} with {records} records of {args.size} bytes")
            subprocess.run(["kcat", "-b", broker.bootstrap, "-t", topic, "-P", "-X", "linger.ms=20", "-l", str(data)],
                           check=True, timeout=900)
            os.unlink(data)
            readers = {
                "PLAINTEXT": ["kcat", "-b", broker.bootstrap, "-t", topic, "-C", "-o", "beginning", "-e", "-q"],
                "SSL": ["kcat", "-b", f"127.0.0.1:{broker.ports['SSL']}", "-X", "security.protocol=SSL",
                        "-X", f"ssl.ca.location={pki['ca']}", "-t", topic, "-C", "-o", "beginning", "-e", "-q"],
            }
            found: dict[str, list[tuple[float, float]]] = {name: [] for name in readers}
            for i in range(args.passes):
                for name in (list(readers) if i % 2 == 0 else list(reversed(readers))):
                    before = run.cpu_seconds(broker.proc.pid)
                    seconds = read_all(readers[name])
                    cpu = run.cpu_seconds(broker.proc.pid) - before
                    found[name].append((seconds, cpu))
                    run.log(f"pass {i + 1} {name}: {args.mb / seconds:.0f} MB/s, broker {cpu / (args.mb / 1000):.2f} CPU s/GB")
    results = {name: {"mb_per_s": round(statistics.median(args.mb / s for s, _ in runs), 1),
                      "broker_cpu_s_per_gb": round(statistics.median(c / (args.mb / 1000) for _, c in runs), 3)}
               for name, runs in found.items()}
    results["ssl_vs_plaintext_throughput"] = round(results["SSL"]["mb_per_s"] / results["PLAINTEXT"]["mb_per_s"], 3)
    doc = {"meta": {"machine": run.machine_info(), "mb": args.mb, "record_size": args.size, "passes": args.passes},
           "results": results}
    text = json.dumps(doc, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
