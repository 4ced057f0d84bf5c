"""Strom benchmark harness: throughput, latency, start-up and memory of one broker process.

    .venv/bin/python benchmarks/run.py [--quick] [--only NAME] [--loops asyncio,uvloop]
                                       [--generator auto|kcat|python] [--output FILE]

Prints one JSON document to stdout (progress goes to stderr). Every scenario starts its own
broker (fresh temp dir, 127.0.0.1, ephemeral port) once per event loop, and runs the same load
once more against the baseline broker (benchmarks/membroker.py, an in-memory endpoint that does
next to nothing) so that each number comes with the ceiling set by the clients themselves.
See benchmarks/README.md for what each number means.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
T0 = time.monotonic()
CLK_TCK = os.sysconf("SC_CLK_TCK")
MB = 1_000_000

try:
    import confluent_kafka as ck
    from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

    from strom.testing import BrokerProcess
except ImportError as e:  # pragma: no cover - a usage error, not a benchmark result
    sys.exit(f"run.py needs the project venv (confluent-kafka and strom): {e}\n"
             f"use: .venv/bin/python benchmarks/run.py")

sys.path.insert(0, str(HERE))
from workers import CONSUMER_THROUGHPUT, PRODUCER_THROUGHPUT  # noqa: E402

# --- targets for this 2-core machine (reported as met / not met) -------------------------
TARGET_PRODUCE_100B = 1_000_000  # records/s
TARGET_CONSUME_100B = 2_000_000  # records/s
TARGET_STARTUP_S = 0.300
TARGET_IDLE_RSS_MB = 60.0


@dataclass(frozen=True)
class Mode:
    produce_seconds: float  # one produce pass
    repeats: int  # produce passes per scenario (the median rate is reported)
    consume_repeats: int  # consume passes over the produced data (the median is reported)
    latency_seconds: float
    latency_rate: int
    startup_runs: int
    flush_timeout: float = 30.0
    consume_timeout: float = 60.0


QUICK = Mode(produce_seconds=1.5, repeats=1, consume_repeats=3, latency_seconds=3.0,
             latency_rate=5000, startup_runs=5)
FULL = Mode(produce_seconds=3.0, repeats=3, consume_repeats=3, latency_seconds=10.0,
            latency_rate=5000, startup_runs=5)


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# --- /proc -------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak) in MB (10^6 bytes) from /proc/<pid>/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024 / MB
    return {"rss_mb": round(out.get("VmRSS", 0.0), 1), "hwm_mb": round(out.get("VmHWM", 0.0), 1)}


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over all cores, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return total - idle, total


def children_cpu() -> float:
    """CPU seconds of all reaped children of this process (the load generators)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


FOREIGN: list[float] = []  # foreign_cpu_util of every measured interval, for the warning


class Meter:
    """Broker CPU, generator CPU and machine utilisation over one measured interval.

    `foreign_cpu_util` is the share of the machine (all cores) that was busy with something
    other than the broker, the load generators and this harness: other users' processes and
    kernel threads (e.g. page-cache writeback). Above ~0.05 the interval was disturbed.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cpu0 = cpu_seconds(pid)
        self.children0 = children_cpu()
        self.own0 = own_cpu()
        self.busy0, self.total0 = machine_ticks()
        self.t0 = time.monotonic()

    def read(self) -> dict:
        cpu = cpu_seconds(self.pid) - self.cpu0
        generator = children_cpu() - self.children0
        busy, total = machine_ticks()
        wall = time.monotonic() - self.t0
        ticks = max(1, total - self.total0)
        ours = cpu + generator + own_cpu() - self.own0
        foreign = max(0.0, ((busy - self.busy0) / CLK_TCK - ours) / (ticks / CLK_TCK))
        FOREIGN.append(foreign)
        return {
            "wall_s": round(wall, 3),
            "broker_cpu_s": round(cpu, 3),
            "broker_cpu_util": round(cpu / wall, 3) if wall > 0 else None,
            "generator_cpu_s": round(generator, 3),
            "machine_cpu_util": round((busy - self.busy0) / ticks, 3),
            "foreign_cpu_util": round(foreign, 3),
        }


def background_load(seconds: float = 1.0) -> float:
    """Share of the machine busy while the harness does nothing (before the first scenario)."""
    busy0, total0 = machine_ticks()
    time.sleep(seconds)
    busy, total = machine_ticks()
    return round((busy - busy0) / max(1, total - total0), 3)


# --- processes ---------------------------------------------------------------------------
class Processes:
    """Every child the harness starts, so that all of them are ended on any exit path."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.brokers: list = []

    def spawn(self, args: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(args, start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def end(self, proc: subprocess.Popen, timeout: float = 5.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if proc in self.procs:
            self.procs.remove(proc)

    def cleanup(self) -> None:
        for proc in list(self.procs):
            with contextlib.suppress(Exception):
                self.end(proc, timeout=2.0)
        for broker in list(self.brokers):
            with contextlib.suppress(Exception):
                broker.close()
        self.brokers.clear()


PROCS = Processes()


def wait_all(procs: list[subprocess.Popen], timeout: float) -> bool:
    """Wait for all to exit within `timeout`; kill the rest. True if all exited by themselves."""
    deadline = time.monotonic() + timeout
    ok = True
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            ok = False
            PROCS.end(proc, timeout=1.0)
    return ok


# --- brokers under test ------------------------------------------------------------------
class Target:
    """A broker the load is pointed at: Strom (one event loop) or the baseline membroker."""

    name: str
    bootstrap: str
    pid: int

    def close(self) -> None:
        raise NotImplementedError

    def memory(self) -> dict[str, float]:
        return memory_mb(self.pid)


class StromTarget(Target):
    overrides: dict[str, str] = {}  # --override KEY=VALUE, for experiments
    env: dict[str, str] = {}  # --env KEY=VALUE: extra environment of the broker process
    profile_dir: Path | None = None  # --profile DIR: py-spy record of every broker

    def __init__(self, loop: str, label: str = "") -> None:
        self.name = loop
        self.broker = BrokerProcess(env={**self.env, "STROM_EVENT_LOOP": loop},
                                    overrides=self.overrides)
        PROCS.brokers.append(self.broker)
        self.broker.start()
        self.bootstrap = self.broker.bootstrap
        self.pid = self.broker.proc.pid
        self.spy: subprocess.Popen | None = None
        self.profile_path: Path | None = None
        if self.profile_dir is not None:
            self.profile_path = self.profile_dir / f"{label or 'broker'}-{loop}.txt"
            self.spy = PROCS.spawn([PY_SPY, "record", "-p", str(self.pid), "-o",
                                    str(self.profile_path), "--format", "raw", "-r", "250",
                                    "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop_profile(self) -> dict | None:
        """Stop py-spy (it writes its collapsed stacks on SIGINT) and summarise them."""
        if self.spy is None:
            return None
        self.spy.send_signal(signal.SIGINT)
        try:
            self.spy.wait(30)
        except subprocess.TimeoutExpired:
            pass
        PROCS.end(self.spy)
        self.spy = None
        return summarize_profile(self.profile_path)

    def close(self) -> None:
        self.stop_profile()
        try:
            self.broker.stop(timeout=20)
        except Exception as e:  # a broker that does not stop cleanly is noted, then killed
            log(f"broker did not stop cleanly: {e!r}")
        errors = [line for line in self.broker.stderr_lines if " ERROR " in line or "Traceback" in line]
        if errors:
            log(f"broker logged {len(errors)} error line(s), first: {errors[0][:200]}")
        self.broker.close()
        if self.broker in PROCS.brokers:
            PROCS.brokers.remove(self.broker)


class MemTarget(Target):
    def __init__(self) -> None:
        self.name = "baseline"
        args = [PY, str(HERE / "membroker.py"), "--event-loop", "uvloop"]
        # glibc would mmap (and page-fault in) every ~1 MB request buffer afresh; keeping them
        # in the heap makes the baseline as cheap as it can be (see README, "baseline").
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(32 << 20),
                   MALLOC_TRIM_THRESHOLD_=str(256 << 20))
        self.proc = PROCS.spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        line = _readline(self.proc, 20.0)
        match = re.search(r"ready on (\S+)", line or "")
        if not match:
            PROCS.end(self.proc)
            raise RuntimeError(f"membroker did not start: {line!r}")
        self.bootstrap = match[1]
        self.pid = self.proc.pid
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def close(self) -> None:
        PROCS.end(self.proc)


def _readline(proc: subprocess.Popen, timeout: float) -> str | None:
    """One stdout line of `proc`, or None after `timeout` seconds."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return result[0] if result else None


PY_SPY = shutil.which("py-spy") or str(Path(PY).with_name("py-spy"))


def summarize_profile(path: Path | None, top: int = 12) -> dict | None:
    """Top functions by own and by inclusive samples from py-spy's collapsed stacks."""
    if path is None or not path.exists():
        return None
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n

    def pct(table: dict[str, int]) -> list[str]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1])
        return [f"{100 * n / total:5.1f}% {name}" for name, n in ranked
                if "strom" in name or "asyncio" in name or "kafka" in name or n / total > 0.02
                ][:top]

    if not total:
        return None
    return {"file": str(path), "samples": total, "top_own": pct(own),
            "top_inclusive": pct(inclusive)}


# --- kafka helpers -----------------------------------------------------------------------
def create_topic(bootstrap: str, topic: str, partitions: int,
                 config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})],
                                  operation_timeout=10)
    futures[topic].result(15)
    # Wait until every partition has a leader in the metadata.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta and meta.error is None and len(meta.partitions) == partitions and all(
                p.leader >= 0 for p in meta.partitions.values()):
            return
        time.sleep(0.05)
    raise RuntimeError(f"topic {topic} has no leaders after 10 s")


class EndOffsets:
    """Log end offsets of a topic's partitions: one ListOffsets request per call."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.tps = [ck.TopicPartition(topic, p) for p in range(partitions)]

    def get(self) -> list[int]:
        futures = self.admin.list_offsets({tp: OffsetSpec.latest() for tp in self.tps},
                                          request_timeout=10)
        return [futures[tp].result(10).offset for tp in self.tps]


def steady_rate(samples: list[tuple[float, int]], total: int) -> float | None:
    """Records/s between the samples that first reach 5% and 95% of the final count.

    This leaves out connection set-up at the start and the last partial batches at the end.
    """
    if total <= 0 or len(samples) < 2:
        return None
    lo = next(((t, n) for t, n in samples if n >= 0.05 * total), None)
    hi = next(((t, n) for t, n in samples if n >= 0.95 * total), None)
    if lo is None or hi is None or hi[0] <= lo[0]:
        first, last = samples[0], samples[-1]
        return (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else None
    return (hi[1] - lo[1]) / (hi[0] - lo[0])


# --- load generators ---------------------------------------------------------------------
KCAT = shutil.which("kcat") or shutil.which("kafkacat")
F_SETPIPE_SZ = 1031


def _kcat_version() -> str | None:
    if not KCAT:
        return None
    try:
        out = subprocess.run([KCAT, "-V"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"Version (\S+) .*?librdkafka (\S+)", out.replace("\n", " "))
    return f"kcat {match[1]} (librdkafka {match[2]})" if match else out.splitlines()[0]


class LineBlock:
    """A file of newline-separated records of one size, fed to kcat through a pipe."""

    def __init__(self, workdir: Path, size: int, target_bytes: int = 32 << 20) -> None:
        line = b"x" * size + b"\n"
        self.line = len(line)
        count = max(1, target_bytes // len(line))
        self.path = workdir / f"records-{size}.txt"
        self.path.write_bytes(line * count)
        self.length = count * len(line)

    def feed(self, proc: subprocess.Popen, deadline: float, max_bytes: int) -> threading.Thread:
        """Stream the block to proc's stdin (sendfile: no copies through Python) until the
        deadline or max_bytes, then close stdin so that kcat flushes and exits."""
        pipe = proc.stdin
        with contextlib.suppress(OSError):
            fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, 1 << 20)

        def send(fd: int, offset: int, count: int) -> int:
            n = os.sendfile(pipe.fileno(), fd, offset, count)
            if n <= 0:
                raise BrokenPipeError
            return n

        def run() -> None:
            fd = os.open(self.path, os.O_RDONLY)
            sent = offset = 0
            try:
                while time.monotonic() < deadline and sent < max_bytes:
                    n = send(fd, offset, min(1 << 20, self.length - offset))
                    sent += n
                    offset = (offset + n) % self.length
                # End on a line boundary so that the last record is whole.
                while offset % self.line:
                    offset += send(fd, offset, self.line - offset % self.line)
            except OSError:
                pass
            finally:
                os.close(fd)
                with contextlib.suppress(OSError):
                    pipe.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


def _kcat_x(settings: dict) -> list[str]:
    out = []
    for key, value in settings.items():
        out += ["-X", f"{key}={value}"]
    return out


@dataclass
class Generator:
    kind: str  # "kcat" or "python"
    producers: int
    workdir: Path
    blocks: dict[int, LineBlock] = field(default_factory=dict)

    def describe(self) -> dict:
        if self.kind == "kcat":
            return {"tool": _kcat_version(), "produce_processes": self.producers,
                    "consume_processes": "one kcat -C per partition",
                    "producer_settings": PRODUCER_THROUGHPUT,
                    "consumer_settings": CONSUMER_THROUGHPUT,
                    "feed": "pre-generated line file streamed to kcat -P stdin with sendfile"}
        return {"tool": f"confluent-kafka {ck.__version__} (librdkafka {ck.libversion()[0]})",
                "produce_processes": self.producers,
                "consume_processes": "one Python consumer process per partition (max 4)",
                "producer_settings": PRODUCER_THROUGHPUT,
                "consumer_settings": CONSUMER_THROUGHPUT}

    def block(self, size: int) -> LineBlock:
        if size not in self.blocks:
            self.blocks[size] = LineBlock(self.workdir, size)
        return self.blocks[size]

    def start_produce(self, target: Target, topic: str, size: int, partitions: int, acks: str,
                      seconds: float) -> list[subprocess.Popen]:
        deadline = time.monotonic() + seconds
        max_records = int(seconds * 2.5e9 / (size + 1))  # a bound far above any rate seen
        procs = []
        for _ in range(self.producers):
            if self.kind == "kcat":
                args = [KCAT, "-P", "-q", "-b", target.bootstrap, "-t", topic]
                if partitions == 1:
                    args += ["-p", "0"]
                args += _kcat_x({**PRODUCER_THROUGHPUT, "acks": acks})
                proc = PROCS.spawn(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
                threading.Thread(target=proc.stderr.read, daemon=True).start()
                self.block(size).feed(proc, deadline, max_records // self.producers * (size + 1))
            else:
                args = [PY, str(HERE / "workers.py"), "produce", "--bootstrap", target.bootstrap,
                        "--topic", topic, "--size", str(size), "--acks", acks,
                        "--seconds", str(seconds),
                        "--max-records", str(max_records // self.producers)]
                proc = PROCS.spawn(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            procs.append(proc)
        return procs

    def consume(self, target: Target, topic: str, size: int, ends: list[int],
                timeout: float) -> dict:
        """Read every partition from offset 0 to `ends`; records/s over the wall time."""
        procs: list[tuple[subprocess.Popen, int]] = []
        begin = time.monotonic()
        if self.kind == "kcat":
            # Output goes to /dev/null: through a pipe kcat writes each record separately and
            # becomes the bottleneck. Without -q, kcat reports on stderr the offset at which
            # it reached the end of the partition, which is checked against `ends`.
            for p, end in enumerate(ends):
                if end == 0:
                    continue
                args = [KCAT, "-C", "-e", "-o", "beginning", "-b", target.bootstrap, "-t", topic,
                        "-p", str(p), *_kcat_x(CONSUMER_THROUGHPUT)]
                procs.append((PROCS.spawn(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          text=True), p))
        else:
            groups = [list(range(len(ends)))[i::min(4, len(ends))] for i in range(min(4, len(ends)))]
            for group in groups:
                args = [PY, str(HERE / "workers.py"), "consume", "--bootstrap", target.bootstrap,
                        "--topic", topic, "--partitions", ",".join(map(str, group)),
                        "--ends", ",".join(str(ends[p]) for p in group), "--seconds", str(timeout)]
                procs.append((PROCS.spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True), -1))
        outputs = []
        deadline = begin + timeout
        for proc, _ in procs:
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
                outputs.append((proc.returncode, out, err))
            except subprocess.TimeoutExpired:
                PROCS.end(proc, timeout=1.0)
                outputs.append((None, "", "timed out"))
            if proc in PROCS.procs:
                PROCS.procs.remove(proc)
        wall = time.monotonic() - begin
        records = 0
        errors = []
        busiest = 0.0  # Python consumers time themselves from first to last record
        for code, out, err in outputs:
            if code != 0:
                errors.append((err or "").strip()[-300:] or f"exit {code}")
                continue
            if self.kind == "kcat":
                reached = re.findall(r"Reached end of topic \S+ \[\d+\] at offset (\d+)", err)
                bad = [line for line in err.splitlines() if line.startswith(("%3|", "% ERROR"))]
                if bad:
                    errors.append(bad[0][-300:])
                records += int(reached[-1]) if reached else 0
            else:
                report = json.loads(out.strip().splitlines()[-1])
                records += report["count"]
                busiest = max(busiest, report["seconds"])
        return {"records": records, "wall_s": busiest if self.kind == "python" and busiest else wall,
                "errors": errors, "processes": len(procs)}


# --- scenarios ---------------------------------------------------------------------------
def produce_pass(target: Target, gen: Generator, topic: str, size: int, partitions: int,
                 acks: str, mode: Mode, offsets: EndOffsets) -> dict:
    """One time-bounded produce pass; its rate is measured from the end offsets it moves."""
    before = sum(offsets.get())
    meter = Meter(target.pid)
    procs = gen.start_produce(target, topic, size, partitions, acks, mode.produce_seconds)
    samples: list[tuple[float, int]] = []
    deadline = time.monotonic() + mode.produce_seconds + mode.flush_timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        samples.append((time.monotonic(), sum(offsets.get()) - before))
        time.sleep(0.04)
    clean = wait_all(procs, max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc in PROCS.procs:
            PROCS.procs.remove(proc)
    after = sum(offsets.get())
    samples.append((time.monotonic(), after - before))
    usage = meter.read()
    rate = steady_rate(samples, after - before)
    return {"records": after - before, "rate": rate, "clean": clean, **usage}


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def produce_run(target: Target, gen: Generator, topic: str, size: int, partitions: int,
                acks: str, mode: Mode) -> dict:
    offsets = EndOffsets(target.bootstrap, topic, partitions)
    passes = [produce_pass(target, gen, topic, size, partitions, acks, mode, offsets)
              for _ in range(mode.repeats)]
    ends = offsets.get()
    total = sum(p["records"] for p in passes)
    cpu = sum(p["broker_cpu_s"] for p in passes)
    wall = sum(p["wall_s"] for p in passes)
    rate = _median([p["rate"] for p in passes])
    return {
        "records": total,
        "records_per_s": round(rate) if rate else None,
        "mb_per_s": round(rate * size / MB, 1) if rate else None,
        "records_per_s_passes": [round(p["rate"]) if p["rate"] else None for p in passes],
        "wall_s": round(wall, 3),
        "broker_cpu_s": round(cpu, 3),
        "broker_cpu_util": round(cpu / wall, 3) if wall else None,
        "broker_cpu_s_per_gb": round(cpu / (total * size / 1e9), 2) if total else None,
        "generator_cpu_s": round(sum(p["generator_cpu_s"] for p in passes), 3),
        "machine_cpu_util": round(_median([p["machine_cpu_util"] for p in passes]), 3),
        "foreign_cpu_util": round(max(p["foreign_cpu_util"] for p in passes), 3),
        "generator_exited_cleanly": all(p["clean"] for p in passes),
        "partition_end_offsets": ends,
    }


def consume_run(target: Target, gen: Generator, topic: str, size: int, ends: list[int],
                mode: Mode) -> dict:
    """Read everything from offset 0, `mode.consume_repeats` times; the median is reported."""
    total = sum(ends)
    passes = []
    for _ in range(mode.consume_repeats):
        meter = Meter(target.pid)
        out = gen.consume(target, topic, size, ends, mode.consume_timeout)
        passes.append({**out, **meter.read()})
    rates = [p["records"] / p["wall_s"] if p["wall_s"] > 0 else None for p in passes]
    rate = _median(rates)
    cpu = sum(p["broker_cpu_s"] for p in passes)
    wall = sum(p["wall_s"] for p in passes)
    records = sum(p["records"] for p in passes)
    errors = [e for p in passes for e in p["errors"]]
    return {
        "records": total,
        "complete": all(p["records"] == total for p in passes) and not errors,
        "records_per_s": round(rate) if rate else None,
        "mb_per_s": round(rate * size / MB, 1) if rate else None,
        "records_per_s_passes": [round(r) if r else None for r in rates],
        "wall_s": round(wall, 3),
        "broker_cpu_s": round(cpu, 3),
        "broker_cpu_util": round(cpu / wall, 3) if wall else None,
        "broker_cpu_s_per_gb": round(cpu / (records * size / 1e9), 2) if records else None,
        "generator_cpu_s": round(sum(p["generator_cpu_s"] for p in passes), 3),
        "machine_cpu_util": round(_median([p["machine_cpu_util"] for p in passes]), 3),
        "foreign_cpu_util": round(max(p["foreign_cpu_util"] for p in passes), 3),
        "consumer_processes": passes[0]["processes"],
        "errors": errors[:3],
    }


def latency_run(target: Target, mode: Mode) -> dict:
    topic = "bench-latency"
    create_topic(target.bootstrap, topic, 1,
                 {"membroker.mode": "store"} if isinstance(target, MemTarget) else None)
    meter = Meter(target.pid)
    count = int(mode.latency_rate * mode.latency_seconds)
    consumer = PROCS.spawn([PY, str(HERE / "workers.py"), "latency-consumer", "--bootstrap",
                            target.bootstrap, "--topic", topic, "--count", str(count),
                            "--seconds", str(mode.latency_seconds + 20)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if (_readline(consumer, 20.0) or "").strip() != "ready":
        PROCS.end(consumer)
        return {"error": "latency consumer did not start"}
    producer = PROCS.spawn([PY, str(HERE / "workers.py"), "latency-producer", "--bootstrap",
                            target.bootstrap, "--topic", topic, "--rate", str(mode.latency_rate),
                            "--seconds", str(mode.latency_seconds)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        p_out, _ = producer.communicate(timeout=mode.latency_seconds + 40)
        c_out, c_err = consumer.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        PROCS.end(producer)
        PROCS.end(consumer)
        return {"error": "latency clients timed out"}
    finally:
        for proc in (producer, consumer):
            if proc in PROCS.procs:
                PROCS.procs.remove(proc)
    usage = meter.read()
    try:
        produced = json.loads(p_out.strip().splitlines()[-1])
        consumed = json.loads(c_out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"latency clients failed: {c_err[-300:]}"}
    return {
        "rate_target": mode.latency_rate,
        "rate_achieved": round(produced["achieved_rate"]),
        "sent": produced["sent"],
        "received": consumed["received"],
        "p50_ms": _r(consumed["p50_ms"]), "p99_ms": _r(consumed["p99_ms"]),
        "p999_ms": _r(consumed["p999_ms"]), "max_ms": _r(consumed["max_ms"]),
        "mean_ms": _r(consumed["mean_ms"]),
        **usage,
    }


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConnectProbe:
    """Times the first TCP connect that succeeds on a port, polling every millisecond."""

    def __init__(self, port: int, timeout: float = 30.0) -> None:
        self.port = port
        self.connected_at: float | None = None
        self.stop = threading.Event()
        self.timeout = timeout
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    self.connected_at = time.monotonic()
                    return
            except OSError:
                time.sleep(0.001)

    def start(self) -> ConnectProbe:
        self.thread.start()
        return self


BARE_LISTENER = """
import asyncio, sys
async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(asyncio.Protocol, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await asyncio.sleep(float(sys.argv[2]))
asyncio.run(main())
"""


def startup_strom(loop: str, runs: int) -> dict:
    connects, readies, idle = [], [], []
    meter = Meter(os.getpid())  # the brokers are reaped children: their CPU is "ours"
    for _ in range(runs):
        port = free_port()
        broker = BrokerProcess(env={**StromTarget.env, "STROM_EVENT_LOOP": loop},
                               overrides={**StromTarget.overrides,
                                          "listeners": f"PLAINTEXT://127.0.0.1:{port}"})
        PROCS.brokers.append(broker)
        probe = ConnectProbe(port).start()
        begin = time.monotonic()
        try:
            broker.start()
            probe.thread.join(10)
            if probe.connected_at is not None:
                connects.append(probe.connected_at - begin)
            readies.append(broker.startup_seconds)
            time.sleep(1.0)  # let start-up garbage settle before reading the idle RSS
            idle.append(memory_mb(broker.proc.pid)["rss_mb"])
        finally:
            probe.stop.set()
            broker.stop()
            broker.close()
            PROCS.brokers.remove(broker)
    return {
        "runs": runs,
        "connect_s_median": _r(statistics.median(connects)) if connects else None,
        "connect_s_all": [_r(x) for x in connects],
        "ready_line_s_median": _r(statistics.median(readies)) if readies else None,
        "ready_line_s_all": [_r(x) for x in readies],
        "idle_rss_mb_median": round(statistics.median(idle), 1) if idle else None,
        "foreign_cpu_util": meter.read()["foreign_cpu_util"],
    }


def startup_baseline(runs: int) -> dict:
    """A bare `python -c` asyncio listener from the same interpreter: the floor for any
    Python broker to accept its first connection, and its resident memory."""
    connects, idle = [], []
    meter = Meter(os.getpid())
    for _ in range(runs):
        port = free_port()
        probe = ConnectProbe(port).start()
        begin = time.monotonic()
        proc = PROCS.spawn([PY, "-c", BARE_LISTENER, str(port), "30"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        try:
            _readline(proc, 20.0)
            probe.thread.join(10)
            if probe.connected_at is not None:
                connects.append(probe.connected_at - begin)
            time.sleep(0.5)
            idle.append(memory_mb(proc.pid)["rss_mb"])
        finally:
            probe.stop.set()
            PROCS.end(proc)
    return {"runs": runs, "connect_s_median": _r(statistics.median(connects)) if connects else None,
            "connect_s_all": [_r(x) for x in connects],
            "idle_rss_mb_median": round(statistics.median(idle), 1) if idle else None,
            "foreign_cpu_util": meter.read()["foreign_cpu_util"]}


# --- orchestration -----------------------------------------------------------------------
SIZES = (100, 1024)
PARTITIONS = (1, 8)


def _label(size: int) -> str:
    return f"{size}B" if size < 1024 else f"{size // 1024}KiB"


def units() -> list[tuple[str, list[str], dict]]:
    """(unit id, scenario names it reports, parameters). One broker per unit and loop."""
    out = []
    for size in SIZES:
        for partitions in PARTITIONS:
            tag = f"{_label(size)}-p{partitions}"
            out.append((f"produce-consume-{tag}", [f"produce-{tag}-acks1", f"consume-{tag}"],
                        {"kind": "produce", "size": size, "partitions": partitions, "acks": "1",
                         "consume": True}))
            out.append((f"produce-{tag}-acksall", [f"produce-{tag}-acksall"],
                        {"kind": "produce", "size": size, "partitions": partitions, "acks": "all",
                         "consume": False}))
    out.append(("latency", ["latency-p1-acks1"], {"kind": "latency"}))
    out.append(("startup", ["startup", "memory-idle"], {"kind": "startup"}))
    return out


def run_unit(params: dict, target_factory, gen: Generator, mode: Mode) -> dict[str, dict]:
    """Run one unit against one target; returns {scenario name: result}."""
    out: dict[str, dict] = {}
    target = target_factory()
    try:
        if params["kind"] == "produce":
            size, partitions, acks = params["size"], params["partitions"], params["acks"]
            tag = f"{_label(size)}-p{partitions}"
            topic = f"bench-{tag}-{acks}"
            create_topic(target.bootstrap, topic, partitions)
            res = produce_run(target, gen, topic, size, partitions, acks, mode)
            res["peak_rss_mb"] = target.memory()["hwm_mb"]
            out[f"produce-{tag}-acks{acks}"] = res
            if params["consume"]:
                ends = res["partition_end_offsets"]
                if isinstance(target, MemTarget):
                    # The baseline kept nothing: it serves the same number of records of the
                    # same size, in batches about as big as the producer's (batch.size).
                    topic = f"{topic}-synthetic"
                    per_batch = PRODUCER_THROUGHPUT["batch.size"] // (size + 10)
                    ends = [max(per_batch, e - e % per_batch) if e else 0 for e in ends]
                    create_topic(target.bootstrap, topic, partitions, {
                        "membroker.mode": "synthetic",
                        "membroker.synthetic.records": ",".join(map(str, ends)),
                        "membroker.synthetic.size": str(size),
                        "membroker.synthetic.batch.records": str(per_batch)})
                cres = consume_run(target, gen, topic, size, ends, mode)
                cres["peak_rss_mb"] = target.memory()["hwm_mb"]
                out[f"consume-{tag}"] = cres
        elif params["kind"] == "latency":
            res = latency_run(target, mode)
            res["peak_rss_mb"] = target.memory()["hwm_mb"]
            out["latency-p1-acks1"] = res
        if isinstance(target, StromTarget):
            profile = target.stop_profile()
            if profile is not None:
                for res in out.values():
                    res["profile"] = profile
    finally:
        target.close()
    return out


def ratio(value, base) -> float | None:
    if value is None or base in (None, 0):
        return None
    return round(value / base, 3)


def attach_baseline(results: dict, scenario: str, loop_result: dict, base: dict) -> None:
    entry = results.setdefault(scenario, {})
    entry["baseline"] = base
    if scenario.startswith(("produce", "consume")):
        loop_result["ratio_to_baseline"] = ratio(loop_result.get("records_per_s"),
                                                 base.get("records_per_s"))
    elif scenario.startswith("latency"):
        loop_result["p99_ratio_to_baseline"] = ratio(loop_result.get("p99_ms"), base.get("p99_ms"))


def evaluate_targets(results: dict, loops: list[str]) -> list[dict]:
    """Each target per event loop. A throughput target counts as met only when every scenario
    of that record size meets it (1 and 8 partitions, acks=1 and acks=all); `met` is None
    when the scenario was not run."""
    def spread(prefix: str, loop: str) -> dict:
        found = sorted((r[loop]["records_per_s"], name) for name, r in results.items()
                       if name.startswith(prefix) and r.get(loop, {}).get("records_per_s"))
        if not found:
            return {"value": None}
        return {"value": found[0][0], "worst_scenario": found[0][1],
                "best_value": found[-1][0], "best_scenario": found[-1][1]}

    targets = []
    for loop in loops:
        for prefix, goal, text in (
                ("produce-100B", TARGET_PRODUCE_100B, "produce 100-byte records >= 1,000,000/s"),
                ("consume-100B", TARGET_CONSUME_100B, "consume 100-byte records >= 2,000,000/s")):
            found = spread(prefix, loop)
            targets.append({"target": text, "loop": loop, **found,
                            "met": None if found["value"] is None else found["value"] >= goal})
        value = results.get("startup", {}).get(loop, {}).get("connect_s_median")
        targets.append({"target": "start-up (spawn to first accepted connection) < 300 ms",
                        "loop": loop, "value": value,
                        "met": None if value is None else value < TARGET_STARTUP_S})
        value = results.get("memory-idle", {}).get(loop, {}).get("idle_rss_mb")
        targets.append({"target": "idle RSS < 60 MB", "loop": loop, "value": value,
                        "met": None if value is None else value < TARGET_IDLE_RSS_MB})
    return targets


def machine_info() -> dict:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        mem = f.readline().split(":", 1)[1].strip()
    return {"cores": os.cpu_count(), "cpu_model": model, "memory": mem,
            "kernel": platform.release(), "python": platform.python_version()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (~2 minutes in all)")
    parser.add_argument("--only", action="append", default=[],
                        help="run only scenarios whose name contains NAME (repeatable), e.g. "
                             "produce, consume-100B, latency, startup")
    parser.add_argument("--loops", default="asyncio,uvloop",
                        help="broker event loops to measure (comma-separated)")
    parser.add_argument("--generator", choices=("auto", "kcat", "python"), default="auto")
    parser.add_argument("--producers", type=int, default=0,
                        help="producer processes (default: 1 kcat, or 2 Python processes)")
    parser.add_argument("--output", type=Path, help="also write the JSON document here")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="broker config for Strom runs (repeatable), for experiments")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment variable for Strom brokers (repeatable), e.g. "
                             "MALLOC_MMAP_THRESHOLD_=33554432")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to SECONDS for the machine to be idle (shared hosts)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="record every Strom broker with py-spy into DIR (slows it down: "
                             "numbers from a profiled run are not benchmark results)")
    args = parser.parse_args()
    for item in args.override:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"--override expects KEY=VALUE, got {item!r}")
        StromTarget.overrides[key.strip()] = value
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"--env expects KEY=VALUE, got {item!r}")
        StromTarget.env[key.strip()] = value
    if args.profile is not None:
        if not Path(PY_SPY).exists():
            sys.exit("--profile needs py-spy: .venv/bin/pip install py-spy")
        args.profile.mkdir(parents=True, exist_ok=True)
        StromTarget.profile_dir = args.profile

    mode = QUICK if args.quick else FULL
    loops = [x.strip() for x in args.loops.split(",") if x.strip()]
    kind = args.generator
    if kind == "auto":
        kind = "kcat" if KCAT else "python"
    if kind == "kcat" and not KCAT:
        sys.exit("kcat not found: apt-get install -y kcat, or use --generator python")
    workdir = Path(tempfile.mkdtemp(prefix="strom-bench-"))
    gen = Generator(kind, args.producers or (1 if kind == "kcat" else 2), workdir)

    selected = [u for u in units()
                if not args.only or any(o in name for o in args.only for name in [u[0], *u[1]])]
    if not selected:
        sys.exit(f"--only {args.only} matches no scenario; names: "
                 + ", ".join(n for u in units() for n in u[1]))

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    results: dict[str, dict] = {}
    started = datetime.datetime.now(datetime.UTC)
    idle_load = background_load()
    quiet_deadline = time.monotonic() + args.wait_quiet
    while idle_load > 0.05 and time.monotonic() < quiet_deadline:
        log(f"machine {idle_load:.0%} busy with other processes; waiting (--wait-quiet)")
        time.sleep(min(10.0, max(0.0, quiet_deadline - time.monotonic())))
        idle_load = background_load()
    if idle_load > 0.05:
        log(f"warning: the machine is {idle_load:.0%} busy before the benchmark starts; "
            f"results will be low and noisy")
    try:
        for unit_id, _names, params in selected:
            if params["kind"] == "startup":
                log(f"{unit_id}: baseline (bare asyncio listener) x{mode.startup_runs}")
                base = startup_baseline(mode.startup_runs)
                results.setdefault("startup", {})["baseline"] = {
                    "connect_s_median": base["connect_s_median"],
                    "connect_s_all": base["connect_s_all"],
                    "foreign_cpu_util": base["foreign_cpu_util"]}
                results.setdefault("memory-idle", {})["baseline"] = {
                    "idle_rss_mb": base["idle_rss_mb_median"]}
                for loop in loops:
                    log(f"{unit_id}: strom ({loop}) x{mode.startup_runs}")
                    res = startup_strom(loop, mode.startup_runs)
                    idle = res.pop("idle_rss_mb_median")
                    res["connect_ratio_to_baseline"] = ratio(res["connect_s_median"],
                                                             base["connect_s_median"])
                    results["startup"][loop] = res
                    results["memory-idle"][loop] = {
                        "idle_rss_mb": idle,
                        "above_baseline_mb": round(idle - base["idle_rss_mb_median"], 1)
                        if idle is not None and base["idle_rss_mb_median"] else None}
                continue
            log(f"{unit_id}: baseline (membroker)")
            try:
                base = run_unit(params, MemTarget, gen, mode)
            except Exception as e:
                log(f"{unit_id}: baseline failed: {e!r}")
                base = {}
            for loop in loops:
                log(f"{unit_id}: strom ({loop})")
                try:
                    res = run_unit(params, lambda loop=loop, u=unit_id: StromTarget(loop, u),
                                   gen, mode)
                except Exception as e:
                    log(f"{unit_id}: strom ({loop}) failed: {e!r}")
                    res = {name: {"error": repr(e)} for name in _names}
                for scenario, value in res.items():
                    results.setdefault(scenario, {})[loop] = value
                    attach_baseline(results, scenario, value, base.get(scenario, {}))
                    _progress(scenario, loop, value)
            for scenario, value in base.items():
                results.setdefault(scenario, {})["baseline"] = value
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
    finally:
        PROCS.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)

    peaks = {loop: max((r[loop].get("peak_rss_mb") or 0 for r in results.values()
                        if isinstance(r.get(loop), dict)), default=None) for loop in loops}
    if any(peaks.values()):
        results.setdefault("memory-peak", {}).update(
            {loop: {"peak_rss_mb": peak, "note": "max VmHWM over the load scenarios"}
             for loop, peak in peaks.items()})
    doc = {
        "meta": {
            "date": started.isoformat(timespec="seconds"),
            "mode": "quick" if args.quick else "full",
            "machine": machine_info(),
            "loops": loops,
            "client": f"confluent-kafka {ck.__version__}, librdkafka {ck.libversion()[0]}",
            "generator": gen.describe(),
            "baseline": "benchmarks/membroker.py: in-memory endpoint on the same loopback, "
                        "uvloop; same clients and settings (see README)",
            "durations": {"produce_s": mode.produce_seconds, "produce_passes": mode.repeats,
                          "consume_passes": mode.consume_repeats,
                          "latency_s": mode.latency_seconds,
                          "latency_rate": mode.latency_rate, "startup_runs": mode.startup_runs},
            "background_cpu_util_at_start": idle_load,
            "max_foreign_cpu_util": round(max(FOREIGN), 3) if FOREIGN else None,
            "warnings": _warnings(idle_load),
            "broker_overrides": StromTarget.overrides,
            "broker_env": StromTarget.env,
            "profiled": args.profile is not None,
            "elapsed_s": round(time.monotonic() - T0, 1),
        },
        "results": dict(sorted(results.items())),
        "targets": evaluate_targets(results, loops),
    }
    text = json.dumps(doc, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    print(text)
    return 0


def _warnings(idle_load: float) -> list[str]:
    out = []
    if idle_load > 0.05:
        out.append(f"machine {idle_load:.0%} busy before the run started")
    disturbed = [f for f in FOREIGN if f > 0.05]
    if disturbed:
        out.append(f"{len(disturbed)} of {len(FOREIGN)} measured intervals had more than 5% of "
                   f"the machine busy with other processes (max {max(disturbed):.0%}): "
                   f"compare with care")
    return out


def _interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _progress(scenario: str, loop: str, value: dict) -> None:
    if "records_per_s" in value:
        log(f"  {scenario} [{loop}]: {value['records_per_s']} rec/s, {value.get('mb_per_s')} MB/s,"
            f" broker cpu {value.get('broker_cpu_s')} s, ratio {value.get('ratio_to_baseline')},"
            f" foreign cpu {value.get('foreign_cpu_util')}")
    elif "p99_ms" in value:
        log(f"  {scenario} [{loop}]: p50 {value['p50_ms']} ms, p99 {value['p99_ms']} ms, "
            f"p999 {value['p999_ms']} ms")
    else:
        log(f"  {scenario} [{loop}]: {value}")


if __name__ == "__main__":
    sys.exit(main())
