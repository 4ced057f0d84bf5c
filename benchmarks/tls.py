"""What TLS and SASL cost: fetch and produce throughput over PLAINTEXT, SSL and SASL_SSL
(SCRAM-SHA-256), and connections per second that complete each handshake, from one broker with
the three listeners.

    .venv/bin/python benchmarks/tls.py [--mb 500] [--size 1024] [--passes 3] [--json FILE]
        [--handshake-seconds 5] [--handshake-clients 2] [--skip fetch,produce,handshakes]

The broker (`strom.testing.BrokerProcess`, 127.0.0.1, temp dir) gets a certificate made for the
run (trustme, ECDSA P-256) on its SSL and SASL_SSL listeners, and a SCRAM-SHA-256 user made with
`strom users scram-set` (4096 iterations, the default).

fetch: a topic (one partition) is filled once with `--mb` MB of `--size`-byte records by kcat over
PLAINTEXT. Each pass reads it all with `kcat -C -o beginning -e -q -X fetch.wait.max.ms=10` to
/dev/null, once per listener, the order rotated from pass to pass. (kcat -e exits on the empty
fetch at the end of the partition, which the broker holds for fetch.wait.max.ms: at librdkafka's
500 ms default that wait was most of a 300 MB read.) Over PLAINTEXT file regions go out with
sendfile; over SSL and SASL_SSL they pass through the TLS layer in copied chunks.

produce: each pass, per listener, `kcat -P -l` writes the same `--mb` MB of records (linger.ms=20,
acks=-1, kcat's defaults otherwise) to a new one-partition topic; the topic's high watermark is
checked to hold every record, and the topic deleted.

Per listener (median of the passes): MB/s (payload, 10^6 bytes, wall time from spawning kcat
to its exit), records/s, and the broker's CPU seconds per GB moved (/proc/<pid>/stat around
each run).

handshakes: for `--handshake-seconds` per listener and pass, `--handshake-clients` threads each
open a `strom.client.Connection` (TCP; TLS; TLS then SaslHandshake and the two SCRAM
SaslAuthenticate rounds), send one ApiVersions (so the broker has finished its side of the
handshake too), and close it, over and over. Reported: connections per second, the broker's
CPU ms per connection, and this process's (the clients') CPU ms per connection; the clients
share the machine with the broker, so on a small machine the rate is bounded by both.

Every SSL and SASL_SSL number comes with its ratio to PLAINTEXT's, from the same run. How busy
the machine was with other processes, before the run (meta.background_load) and during each
measured interval (run.Meter's foreign_cpu_util; the largest in meta.foreign_cpu_util_max), is
reported, with a warning past 5%. Progress goes to stderr, one JSON document to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run  # noqa: E402  (Meter, FOREIGN, background_load, log, machine_info, own_cpu)
from strom.client import ClientSecurity, Connection  # noqa: E402
from strom.testing import BrokerProcess, create_topic, make_pki  # noqa: E402

LISTENERS = ("PLAINTEXT", "SSL", "SASL_SSL")
MECHANISM = "SCRAM-SHA-256"
USER, PASSWORD = "tls-bench", "tls-bench-secret"
PARTS = ("fetch", "produce", "handshakes")


def timed(args: list[str], **kw) -> float:
    started = time.monotonic()
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=900, **kw)
    return time.monotonic() - started


def kcat_security(listener: str, pki: dict) -> list[str]:
    """kcat's -X settings for a listener of this broker."""
    settings = {}
    if listener in ("SSL", "SASL_SSL"):
        settings |= {"security.protocol": listener, "ssl.ca.location": str(pki["ca"])}
    if listener == "SASL_SSL":
        settings |= {"sasl.mechanisms": MECHANISM, "sasl.username": USER, "sasl.password": PASSWORD}
    return [arg for key, value in settings.items() for arg in ("-X", f"{key}={value}")]


def client_security(listener: str, pki: dict) -> ClientSecurity | None:
    if listener == "PLAINTEXT":
        return None
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    if listener == "SSL":
        return ClientSecurity(ssl=context)
    return ClientSecurity(ssl=context, sasl_mechanism=MECHANISM, username=USER, password=PASSWORD)


def rotations(passes: int) -> list[list[str]]:
    """The listener order of each pass: rotated, so none always goes first."""
    return [list(LISTENERS[i % 3:] + LISTENERS[:i % 3]) for i in range(passes)]


def high_watermark(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tls-bench"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    finally:
        consumer.close()


def delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=35)


def connect_repeatedly(port: int, security: ClientSecurity | None, seconds: float, clients: int) -> tuple[int, float]:
    """(connections completed, wall seconds) with `clients` threads connecting for `seconds`."""
    stop = time.monotonic() + seconds
    counts = [0] * clients
    failures: list[BaseException] = []

    def work(k: int) -> None:
        try:
            while time.monotonic() < stop:
                with Connection("127.0.0.1", port, client_id="tls-bench", security=security) as conn:
                    answer = conn.call(18, 3, {"client_software_name": "tls-bench", "client_software_version": "1"})
                    if answer.error_code:
                        raise RuntimeError(f"ApiVersions answered error {answer.error_code}")
                counts[k] += 1
        except Exception as e:  # reported by the caller
            failures.append(e)

    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    if failures:
        raise RuntimeError(f"a connection failed: {failures[0]!r}") from failures[0]
    return sum(counts), elapsed


def measured(meter: run.Meter) -> tuple[float, str]:
    """The broker's CPU seconds over the meter's interval, and a note for the progress line when
    other processes took more than 5% of the machine meanwhile."""
    reading = meter.read()
    foreign = reading["foreign_cpu_util"]
    return reading["broker_cpu_s"], f" (other processes: {foreign:.0%} of the machine)" if foreign > 0.05 else ""


def throughput(runs: list[tuple[float, float]], mb: int, records: int) -> dict:
    return {"mb_per_s": round(statistics.median(mb / s for s, _ in runs), 1),
            "records_per_s": round(statistics.median(records / s for s, _ in runs)),
            "broker_cpu_s_per_gb": round(statistics.median(c / (mb / 1000) for _, c in runs), 3)}


def with_ratios(found: dict[str, dict], keys: tuple[str, ...]) -> dict:
    """Each listener's numbers, and SSL's and SASL_SSL's as ratios to PLAINTEXT's."""
    base = found["PLAINTEXT"]
    ratios = {name: {key: round(found[name][key] / base[key], 3) if base[key] else None for key in keys}
              for name in found if name != "PLAINTEXT"}
    return {**found, "vs_plaintext": ratios}


def warnings(idle_load: float) -> list[str]:
    out = []
    if idle_load > 0.05:
        out.append(f"the machine was {idle_load:.0%} busy before the run started")
    disturbed = [f for f in run.FOREIGN if f > 0.05]
    if disturbed:
        out.append(f"{len(disturbed)} of {len(run.FOREIGN)} measured intervals had more than 5% of the machine "
                   f"busy with other processes (at most {max(disturbed):.0%}): compare with care")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--handshake-seconds", type=float, default=5.0)
    parser.add_argument("--handshake-clients", type=int, default=2)
    parser.add_argument("--skip", default="", help=f"comma-separated parts not to run: {', '.join(PARTS)}")
    args = parser.parse_args()
    skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    if skip - set(PARTS):
        parser.error(f"--skip takes {', '.join(PARTS)}")
    records = args.mb * 1_000_000 // args.size
    results: dict[str, dict] = {}
    idle_load = run.background_load(2.0)  # other processes share the machine: say so
    if idle_load > 0.05:
        run.log(f"warning: the machine is {idle_load:.0%} busy before the run: compare with care")
    with tempfile.TemporaryDirectory(prefix="strom-tls-bench-") as tmp:
        pki = make_pki(Path(tmp))
        overrides = {"listeners": ",".join(f"{name}://127.0.0.1:0" for name in LISTENERS),
                     "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki["server"]),
                     "sasl.enabled.mechanisms": MECHANISM}
        with BrokerProcess(overrides=overrides) as broker:
            pid = broker.proc.pid
            addresses = {name: f"127.0.0.1:{broker.ports[name]}" for name in LISTENERS}
            done = subprocess.run([sys.executable, "-m", "strom", "users", "scram-set", USER, "--mechanism", MECHANISM,
                                   "--password", PASSWORD, "--bootstrap-server", broker.bootstrap],
                                  capture_output=True, text=True, timeout=60)
            if done.returncode:
                raise RuntimeError(f"strom users scram-set failed: {done.stderr}")
            data = Path(tmp) / "records.txt"
            line = (b"x" * (args.size - 1)) + b"\n"
            if not {"fetch", "produce"} <= skip:
                with data.open("wb") as f:
                    for _ in range(records):
                        f.write(line)

            if "fetch" not in skip:
                topic = "tls-bench"
                create_topic(broker.bootstrap, topic)
                run.log(f"filling {topic} with {records} records of {args.size} bytes")
                subprocess.run(["kcat", "-b", broker.bootstrap, "-t", topic, "-P", "-X", "linger.ms=20", "-l", str(data)],
                               check=True, timeout=900)
                found: dict[str, list[tuple[float, float]]] = {name: [] for name in LISTENERS}
                for i, order in enumerate(rotations(args.passes)):
                    for name in order:
                        reader = ["kcat", "-b", addresses[name], *kcat_security(name, pki), "-t", topic,
                                  "-C", "-o", "beginning", "-e", "-q", "-X", "fetch.wait.max.ms=10"]
                        meter = run.Meter(pid)
                        seconds = timed(reader)
                        cpu, others = measured(meter)
                        found[name].append((seconds, cpu))
                        run.log(f"fetch pass {i + 1} {name}: {args.mb / seconds:.0f} MB/s, "
                                f"broker {cpu / (args.mb / 1000):.2f} CPU s/GB{others}")
                results["fetch"] = with_ratios({name: throughput(runs, args.mb, records) for name, runs in found.items()},
                                               ("mb_per_s", "broker_cpu_s_per_gb"))
                delete_topic(broker.bootstrap, topic)

            if "produce" not in skip:
                found = {name: [] for name in LISTENERS}
                for i, order in enumerate(rotations(args.passes)):
                    for name in order:
                        topic = f"tls-bench-produce-{name.lower().replace('_', '-')}-{i}"
                        create_topic(broker.bootstrap, topic)
                        writer = ["kcat", "-b", addresses[name], *kcat_security(name, pki), "-t", topic, "-P",
                                  "-X", "linger.ms=20", "-X", "acks=-1", "-l", str(data)]
                        meter = run.Meter(pid)
                        seconds = timed(writer)
                        cpu, others = measured(meter)
                        written = high_watermark(broker.bootstrap, topic)
                        if written != records:
                            raise RuntimeError(f"{topic}: {written} records written over {name}, not {records}")
                        delete_topic(broker.bootstrap, topic)
                        found[name].append((seconds, cpu))
                        run.log(f"produce pass {i + 1} {name}: {args.mb / seconds:.0f} MB/s, "
                                f"{records / seconds:,.0f} records/s, broker {cpu / (args.mb / 1000):.2f} CPU s/GB{others}")
                results["produce"] = with_ratios(
                    {name: throughput(runs, args.mb, records) for name, runs in found.items()},
                    ("mb_per_s", "broker_cpu_s_per_gb"))
            if data.exists():
                os.unlink(data)

            if "handshakes" not in skip:
                shakes: dict[str, list[tuple[float, float, float]]] = {name: [] for name in LISTENERS}
                for i, order in enumerate(rotations(args.passes)):
                    for name in order:
                        security = client_security(name, pki)
                        meter, own_before = run.Meter(pid), run.own_cpu()
                        count, seconds = connect_repeatedly(broker.ports[name], security, args.handshake_seconds,
                                                            args.handshake_clients)
                        own = run.own_cpu() - own_before
                        cpu, others = measured(meter)
                        shakes[name].append((count / seconds, cpu * 1000 / count, own * 1000 / count))
                        run.log(f"handshakes pass {i + 1} {name}: {count / seconds:.0f} connections/s, broker "
                                f"{cpu * 1000 / count:.2f} CPU ms each, clients {own * 1000 / count:.2f} CPU ms "
                                f"each{others}")
                results["handshakes"] = with_ratios(
                    {name: {"connections_per_s": round(statistics.median(r for r, _, _ in runs), 1),
                            "broker_cpu_ms_per_connection": round(statistics.median(b for _, b, _ in runs), 3),
                            "client_cpu_ms_per_connection": round(statistics.median(c for _, _, c in runs), 3)}
                     for name, runs in shakes.items()},
                    ("connections_per_s", "broker_cpu_ms_per_connection"))
    doc = {"meta": {"machine": run.machine_info(), "mb": args.mb, "record_size": args.size, "records": records,
                    "passes": args.passes, "handshake_seconds": args.handshake_seconds,
                    "handshake_clients": args.handshake_clients, "sasl_mechanism": MECHANISM,
                    "background_load": idle_load,
                    "foreign_cpu_util_max": round(max(run.FOREIGN, default=0.0), 3)},
           "results": results, "warnings": warnings(idle_load)}
    text = json.dumps(doc, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
