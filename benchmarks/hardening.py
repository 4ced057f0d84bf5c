"""What careless or hostile clients cost a Strom broker, each next to its baseline.

    .venv/bin/python benchmarks/hardening.py [--scenarios idle-connections,slow-large-frames,produce-cpu]
                                             [--connections 2000] [--clients 20] [--json FILE]

Scenarios (every broker is a real `strom serve` on 127.0.0.1, ephemeral port, temp dir):

- idle-connections: the broker's RSS idle with no client, then with N connections open that
  send nothing, then once each has sent one ApiVersions request (the state of an idle client
  after its handshake), then after they all closed. Baseline: the same broker before the first
  connection. `per_connection_kb` is (RSS with N - RSS idle) / N.
- slow-large-frames: C clients each announce a frame of `socket.request.max.bytes` (100 MiB
  by default) and send its bytes slowly (64 KiB every 50 ms each); the broker's RSS is
  sampled every 250 ms for 10 s, then once more after the clients left. Baseline: the bytes
  the clients actually sent, which a broker that buffers requests must hold at least, and the
  bytes they announced, which a broker trusting the size prefix would allocate at once.
  `api_versions_answered_in_s` checks that the broker kept serving others meanwhile.
- wide-request: one Metadata v9 request naming N empty (invalid) topic names, 2 bytes each
  on the wire, against the same request naming one: time to its answer, the broker's peak
  RSS (VmHWM), and the longest a second client's ApiVersions (sent one after the other on
  its own connection) waits meanwhile.
- produce-cpu: broker CPU seconds per GB produced (1 KiB records, one partition, acks=1,
  kcat; run.py's produce load; `--size`, `--compression`) for two versions of Strom, alternating them pass by pass:
  `--after` (default: this working tree) and `--before` (default: the commit before Produce
  started validating every record). A commit's `src/` is taken with `git archive` into a
  temp dir and put first on the broker's PYTHONPATH; nothing in the repository changes.

Lines of numbers go to stderr, one JSON document to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run  # noqa: E402  (the harness next to this file: memory, CPU, kcat load, progress log)
from strom.protocol.varint import write_uvarint  # noqa: E402
from strom.testing import BrokerProcess  # noqa: E402

REPO = HERE.parent
# The commit whose parent Produce did not yet validate each record (KIP-467 record errors).
RECORD_VALIDATION_COMMIT = "211d584"
DEFAULT_MAX_REQUEST = 104_857_600  # socket.request.max.bytes, Kafka's default
API_VERSIONS_V0 = struct.pack(">ihhih", 10, 18, 0, 1, -1)  # size, key, version, id, null client


def rss_mb(pid: int) -> float:
    return run.memory_mb(pid)["rss_mb"]


def settled_rss(pid: int, timeout: float = 10.0) -> float:
    """RSS once three samples 200 ms apart agree within 0.3 MB (or after `timeout`)."""
    samples = [rss_mb(pid)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        samples.append(rss_mb(pid))
        if len(samples) >= 3 and max(samples[-3:]) - min(samples[-3:]) <= 0.3:
            break
    return samples[-1]


def raise_fd_limit(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        soft = min(hard, wanted) if hard != resource.RLIM_INFINITY else wanted
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def read_frames(sock: socket.socket, count: int, timeout: float) -> int:
    """Read `count` response frames (their sizes only matter); returns how many arrived."""
    sock.settimeout(timeout)
    buf = bytearray()
    got = 0
    while got < count:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionError):
            break
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
            del buf[: 4 + int.from_bytes(buf[:4], "big")]
            got += 1
    return got


def api_versions_seconds(port: int, timeout: float = 30.0) -> float | None:
    """Time for a new connection's ApiVersions v0 to be answered, or None."""
    begin = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(API_VERSIONS_V0)
        return time.monotonic() - begin if read_frames(sock, 1, timeout) == 1 else None


# --- idle connections ---------------------------------------------------------------------------

def idle_connections(count: int) -> dict:
    limit = raise_fd_limit(count + 200)
    if limit < count + 50:
        raise RuntimeError(f"open file limit {limit} is too low for {count} connections")
    overrides = {"max.connections": str(count + 100), "max.connections.per.ip": str(count + 100)}
    with BrokerProcess(overrides=overrides) as broker:
        pid = broker.proc.pid
        time.sleep(1.0)  # let start-up garbage settle, as run.py's memory-idle does
        idle = settled_rss(pid)
        run.log(f"idle-connections: idle broker {idle:.1f} MB; opening {count} connections")
        socks = []
        try:
            for _ in range(count):
                sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
                socks.append(sock)
            connected = settled_rss(pid)
            run.log(f"idle-connections: {count} connections open: {connected:.1f} MB")
            for sock in socks:
                sock.sendall(API_VERSIONS_V0)
            answered = sum(read_frames(sock, 1, 10.0) for sock in socks)
            after_request = settled_rss(pid)
            run.log(f"idle-connections: after one ApiVersions each ({answered} answered): "
                    f"{after_request:.1f} MB")
        finally:
            for sock in socks:
                sock.close()
        time.sleep(1.0)
        closed = settled_rss(pid)
        run.log(f"idle-connections: all closed: {closed:.1f} MB")
        refused = broker.log_text().count("refusing a connection")
    return {
        "connections": count,
        "idle_rss_mb": idle,
        "connected_rss_mb": connected,
        "after_one_request_rss_mb": after_request,
        "after_close_rss_mb": closed,
        "per_connection_kb": round((connected - idle) * 1000 / count, 1),
        "per_connection_after_request_kb": round((after_request - idle) * 1000 / count, 1),
        "answered": answered,
        "refusal_log_lines": refused,
    }


# --- slow large frames --------------------------------------------------------------------------

def slow_large_frames(clients: int, chunk: int, interval: float, seconds: float,
                      max_request: int) -> dict:
    overrides = {"socket.request.max.bytes": str(max_request)}
    with BrokerProcess(overrides=overrides) as broker:
        pid = broker.proc.pid
        time.sleep(1.0)
        idle = settled_rss(pid)
        run.log(f"slow-large-frames: idle broker {idle:.1f} MB; {clients} clients announce "
                f"{max_request} bytes each and send {chunk} bytes every {interval * 1000:.0f} ms")
        socks = [socket.create_connection(("127.0.0.1", broker.port), timeout=10) for _ in range(clients)]
        payload = bytes(chunk)
        sent = [0] * clients
        samples: list[tuple[float, float]] = []
        begin = time.monotonic()
        try:
            for sock in socks:
                sock.sendall(struct.pack(">i", max_request))
                sock.setblocking(False)
            next_send = next_sample = begin
            while (now := time.monotonic()) - begin < seconds:
                if now >= next_send:
                    for i, sock in enumerate(socks):
                        left = max_request - sent[i]
                        if left > 0:
                            try:
                                sent[i] += sock.send(payload[: min(chunk, left)])
                            except BlockingIOError:
                                pass  # the broker is not reading it now: try next tick
                    next_send += interval
                if now >= next_sample:
                    samples.append((round(now - begin, 2), rss_mb(pid)))
                    next_sample += 0.25
                time.sleep(max(0.0, min(next_send, next_sample) - time.monotonic()))
            serving = api_versions_seconds(broker.port)
            end = rss_mb(pid)
        finally:
            for sock in socks:
                sock.close()
        time.sleep(1.0)
        after = settled_rss(pid)
        alive = broker.proc.poll() is None
        peak_t, peak = max(samples, key=lambda s: s[1])
        run.log(f"slow-large-frames: peak {peak:.1f} MB at {peak_t:.1f} s, end {end:.1f} MB, "
                f"after the clients left {after:.1f} MB; sent {sum(sent) / 1e6:.1f} MB of "
                f"{clients * max_request / 1e6:.0f} MB announced")
    return {
        "clients": clients,
        "announced_mb": round(clients * max_request / 1e6, 1),
        "sent_mb": round(sum(sent) / 1e6, 1),
        "idle_rss_mb": idle,
        "peak_rss_mb": peak,
        "peak_at_s": peak_t,
        "end_rss_mb": end,
        "above_idle_at_end_mb": round(end - idle, 1),
        "after_clients_left_rss_mb": after,
        "api_versions_answered_in_s": None if serving is None else round(serving, 4),
        "broker_alive": alive,
        "samples": samples,
    }


# --- one wide request ---------------------------------------------------------------------------

def metadata_request(topics: int) -> bytes:
    """Metadata v9 naming `topics` empty topic names: 2 bytes per name on the wire."""
    head = struct.pack(">hhih", 3, 9, 1, 1) + b"w" + b"\x00"
    body = write_uvarint(topics + 1) + b"\x01\x00" * topics + b"\x00\x00\x00\x00"
    payload = head + body
    return struct.pack(">i", len(payload)) + payload


class Prober:
    """Another client: ApiVersions on its own connection, one after the other, each answer
    timed, until stopped. Its longest wait is how long the broker served nobody else."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=300)
        self.waits: list[float] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            begin = time.monotonic()
            self.sock.sendall(API_VERSIONS_V0)
            if read_frames(self.sock, 1, 300.0) != 1:
                return
            self.waits.append(time.monotonic() - begin)
            time.sleep(0.01)

    def stop(self) -> float:
        self.stopped.set()
        self.thread.join(310)
        self.sock.close()
        return max(self.waits, default=0.0)


def wide_request(topics: int) -> dict:
    """One Metadata request naming many (invalid) topics, against the same request naming
    one: how long it takes, what it makes the broker hold, and the longest another client's
    ApiVersions waits meanwhile (one event loop serves every connection)."""
    out = {}
    with BrokerProcess(overrides={"auto.create.topics.enable": "false"}) as broker:
        pid = broker.proc.pid
        time.sleep(1.0)
        idle = settled_rss(pid)
        for label, count in (("one topic", 1), (f"{topics} topics", topics)):
            request = metadata_request(count)
            prober = Prober(broker.port)
            with socket.create_connection(("127.0.0.1", broker.port), timeout=300) as sock:
                begin = time.monotonic()
                sock.sendall(request)
                answered = read_frames(sock, 1, 300.0) == 1
                took = time.monotonic() - begin
            stall = prober.stop()
            peak = run.memory_mb(pid)["hwm_mb"]
            out[label] = {"request_bytes": len(request), "answered": answered,
                          "answered_in_s": round(took, 3),
                          "other_client_longest_wait_s": round(stall, 3),
                          "broker_peak_rss_mb": peak}
            run.log(f"wide-request {label} ({len(request)} bytes): answered in {took:.2f} s, "
                    f"another client waited up to {stall:.3f} s, broker peak RSS {peak:.0f} MB "
                    f"(idle {idle:.0f} MB)")
        out["idle_rss_mb"] = idle
    return out


# --- produce CPU per GB, two commits ------------------------------------------------------------

def checkout_src(ref: str, into: Path) -> str:
    """`src/` of commit `ref` under `into` (git archive: the repository is only read);
    returns the full commit id."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "src"],
                             capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(into, filter="data")
    return commit


def strom_source(env: dict[str, str]) -> str:
    """Which strom package a broker with `env` imports (to be sure the right one runs)."""
    out = subprocess.run([run.PY, "-c", "import strom; print(strom.__file__)"],
                         env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@dataclass
class Variant:
    """One way of running the broker in a CPU comparison: its environment, its overrides, and
    what runs beside the load (`beside(target)` returns the function that stops it)."""

    env: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)
    beside: Callable[[run.StromTarget], Callable[[], None]] | None = None


def compare_produce_cpu(variants: dict[str, Variant], passes: int, seconds: float, size: int,
                        loop: str, compression: str, scenario: str) -> dict[str, dict]:
    """Broker CPU per GB produced (kcat, one partition, acks=1) for each variant, the variants
    alternating pass by pass so drifts of the machine hit them all alike."""
    if not run.KCAT:
        raise RuntimeError(f"{scenario} needs kcat (apt-get install -y kcat)")
    workdir = Path(tempfile.mkdtemp(prefix=f"strom-{scenario}-"))
    codec = run.PRODUCER_THROUGHPUT["compression.type"]
    run.PRODUCER_THROUGHPUT["compression.type"] = compression
    found: dict[str, list[dict]] = {label: [] for label in variants}
    try:
        gen = run.Generator("kcat", 1, workdir)
        mode = run.Mode(produce_seconds=seconds, repeats=1, consume_repeats=0, latency_seconds=0,
                        latency_rate=0, startup_runs=0)
        for i in range(passes):
            order = list(variants) if i % 2 == 0 else list(reversed(variants))
            for label in order:
                variant = variants[label]
                run.StromTarget.env, run.StromTarget.overrides = variant.env, variant.overrides
                target = run.StromTarget(loop, f"{scenario}-{label}")
                stop = variant.beside(target) if variant.beside is not None else None
                try:
                    topic = f"bench-cpu-{i}"
                    run.create_topic(target.bootstrap, topic, 1)
                    res = run.produce_run(target, gen, topic, size, 1, "1", mode)
                finally:
                    if stop is not None:
                        stop()
                    target.close()
                found[label].append(res)
                run.log(f"{scenario} pass {i + 1}/{passes} {label}: {res['records_per_s']} rec/s, "
                        f"{res['broker_cpu_s_per_gb']} CPU s/GB (foreign load {res['foreign_cpu_util']})")
    finally:
        run.PRODUCER_THROUGHPUT["compression.type"] = codec
        run.StromTarget.env, run.StromTarget.overrides = {}, {}
        run.PROCS.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
    return {label: _cpu_summary(results) for label, results in found.items()}


def _cpu_summary(results: list[dict]) -> dict:
    per_gb = [r["broker_cpu_s_per_gb"] for r in results if r["broker_cpu_s_per_gb"]]
    rates = [r["records_per_s"] for r in results if r["records_per_s"]]
    return {"cpu_s_per_gb_median": statistics.median(per_gb) if per_gb else None,
            "cpu_s_per_gb_passes": per_gb,
            "records_per_s_median": statistics.median(rates) if rates else None,
            "foreign_cpu_util_max": max(r["foreign_cpu_util"] for r in results)}


def cpu_ratio(now: dict, then: dict) -> float | None:
    a, b = now["cpu_s_per_gb_median"], then["cpu_s_per_gb_median"]
    return round(a / b, 3) if a and b else None


def commit_variant(ref: str, workdir: Path) -> tuple[Variant, str]:
    """A broker running commit `ref`'s `src/` (first on its PYTHONPATH), and the full commit id.
    Compiled helpers built here are copied next to their sources when these are the same in
    `ref`, so the two sides differ only in their Python."""
    into = workdir / ref.replace("/", "_")
    commit = checkout_src(ref, into)
    for built in (REPO / "src").rglob("*.so"):
        source = built.with_name(built.name.split(".")[0] + ".c")
        theirs = into / source.relative_to(REPO)
        if source.exists() and theirs.exists() and theirs.read_bytes() == source.read_bytes():
            shutil.copy2(built, theirs.with_name(built.name))
    return Variant(env={"PYTHONPATH": str(into / "src")}), commit


def produce_cpu(before: str, after: str | None, passes: int, seconds: float, size: int,
                loop: str, compression: str) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="strom-hardening-src-"))
    try:
        before_variant, before_commit = commit_variant(before, workdir)
        if after is None:
            after_commit = "working tree at " + subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                check=True).stdout.strip()
            after_variant = Variant()
        else:
            after_variant, after_commit = commit_variant(after, workdir)
        variants = {"after": after_variant, "before": before_variant}
        sources = {label: strom_source(v.env) for label, v in variants.items()}
        found = compare_produce_cpu(variants, passes, seconds, size, loop, compression, "produce-cpu")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"record_size": size, "compression": compression, "loop": loop, "passes": passes,
            "pass_seconds": seconds,
            "after_commit": after_commit, "before_commit": before_commit,
            "strom_imported_from": sources, "after": found["after"], "before": found["before"],
            "cpu_per_gb_ratio_to_before": cpu_ratio(found["after"], found["before"])}


SCENARIOS = ("idle-connections", "slow-large-frames", "wide-request", "produce-cpu")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, from {', '.join(SCENARIOS)}")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--chunk", type=int, default=64 * 1024, help="bytes per send per client")
    parser.add_argument("--interval-ms", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=10.0, help="slow-large-frames duration")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST)
    parser.add_argument("--wide-topics", type=int, default=200_000,
                        help="topic names in the wide Metadata request")
    parser.add_argument("--before", default=f"{RECORD_VALIDATION_COMMIT}^",
                        help="commit to compare produce CPU with (default: before record validation)")
    parser.add_argument("--after", default=None,
                        help="commit to measure against --before (default: this working tree)")
    parser.add_argument("--passes", type=int, default=3, help="produce-cpu passes per commit")
    parser.add_argument("--pass-seconds", type=float, default=3.0)
    parser.add_argument("--size", type=int, default=1024, help="produce-cpu record size")
    parser.add_argument("--loop", default="uvloop", help="produce-cpu broker event loop")
    parser.add_argument("--compression", default="none",
                        help="produce-cpu producer compression.type (none, gzip, snappy, lz4, zstd)")
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    args = parser.parse_args()
    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(wanted) - set(SCENARIOS)
    if unknown:
        sys.exit(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")

    started = datetime.now(UTC)
    idle_load = run.background_load()
    results: dict[str, dict] = {}
    failed: dict[str, str] = {}
    for name in wanted:
        try:
            if name == "idle-connections":
                results[name] = idle_connections(args.connections)
            elif name == "wide-request":
                results[name] = wide_request(args.wide_topics)
            elif name == "slow-large-frames":
                results[name] = slow_large_frames(args.clients, args.chunk, args.interval_ms / 1000,
                                                  args.seconds, args.max_request_bytes)
            else:
                results[name] = produce_cpu(args.before, args.after, args.passes,
                                            args.pass_seconds, args.size, args.loop,
                                            args.compression)
        except Exception as e:  # one failing scenario is reported; the others still run
            run.log(f"{name} failed: {e!r}")
            failed[name] = repr(e)
    doc = {"meta": {"date": started.isoformat(timespec="seconds"), "machine": run.machine_info(),
                    "background_cpu_util_at_start": idle_load,
                    "elapsed_s": round(time.monotonic() - run.T0, 1)},
           "results": results, "failed": failed}
    text = json.dumps(doc, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
