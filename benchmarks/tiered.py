"""Tiered storage (KIP-405) under load: does copying keep pace with produce, how fast is history
read back from the object store, and does the broker stay responsive meanwhile.

    .venv/bin/python benchmarks/tiered.py [--seconds 20] [--record-size 1024] [--segment-mb 16]
                                          [--idle-seconds 5] [--ping-interval-ms 10] [--json FILE]
                                          [--broker-log FILE] [--override KEY=VALUE] [--loop uvloop]

One `strom serve` process (strom.testing.BrokerProcess) with remote storage on a SeaweedFS S3
server (strom.s3_server.S3Server), both on 127.0.0.1 in temp dirs, remote log manager and
retention checks every 500 ms. Phases, in order:

1. idle: pings only (below), --idle-seconds.
2. produce, baseline: one kcat producer (run.py's settings: linger.ms=20, 1 MB batches, acks=1)
   writes --record-size records as fast as it can for --seconds into a topic without remote
   storage. produce MB/s = the rate of the end offset between the 1 s samples that reach 5% and
   95% of the records (run.py's steady_rate) x record size (10^6 bytes).
3. produce, tiered: the same into a topic with remote.storage.enable=true, segment.bytes
   --segment-mb MiB and local.retention.ms of an hour (every segment stays local for phase 5).
   Every second: the log end offset (ListOffsets LATEST), the highest tiered offset
   (LATEST_TIERED, -5) and the last rolled segment's end (the active segment's base offset - 1,
   from the file names in the broker's log dir). copy lag = last rolled offset - tiered offset
   (what could be copied but is not yet); max over the samples and at the end of the produce.
   copy MB/s = tiered offsets gained over the produce window / its length x record size; then
   the time until the copy catches up with the last rolled segment (bounded by --drain-timeout)
   and the copy rate over that time (copy alone, no produce).
4. consume, local: one confluent-kafka consumer process (workers.py consume: run.py's consumer
   settings, fetch.wait.max.ms=5, max.partition.fetch.bytes=4 MiB, fetch.max.bytes=64 MiB) reads
   the tiered topic from offset 0 to its end while every segment is still on local disk.
5. consume, remote: local.retention.ms set to 1 (IncrementalAlterConfigs); once the local log
   start (EARLIEST_LOCAL, -4) has reached the active segment, the same read from offset 0 comes
   from the object store (all but the active segment). records/s and MB/s are the consumer's own
   (first to last record); remote/local is the ratio of the two.

Pings: a thread of this process sends a Metadata v12 request for the tiered topic over its own
connection (strom.testing.RawClient) every --ping-interval-ms (the next one at once when one
took longer) and records each round trip; p50/p99/max per phase: idle, baseline produce, tiered
produce with the copy running (until the copy has caught up, so it includes the copy alone),
local read, remote read. Pings over 50 ms are listed in the JSON with the local time they were
sent, to match against the broker's log (--broker-log FILE keeps it).

The broker's and SeaweedFS' CPU (utime+stime, 1.0 = one core), the machine's busy share (1.0 =
both cores) and the foreign share (busy with other processes than the broker, SeaweedFS, the
clients and this one: the machine is shared; above ~0.05 the phase was disturbed) per phase come
from /proc; dirty pages are written back (sync) before each phase so that none pays for the one
before. A compact table goes to stdout (--json FILE also writes every number and the 1 s
samples), progress to stderr; every process and temp dir is removed on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource  # noqa: E402

import run  # noqa: E402  (Generator, PROCS, create_topic, cpu_seconds, steady_rate, log, machine_info)
from strom.s3_server import S3Server  # noqa: E402
from strom.testing import BrokerProcess, RawClient, free_ports  # noqa: E402

EARLIEST_LOCAL, LATEST_TIERED = -4, -5
METADATA = 3
MB = 1_000_000
PING_TARGET_MS = 50.0


class Pinger:
    """A Metadata request for one topic every `interval` s on its own connection; round trips
    are filed under the phase set when each was sent (None: not recorded)."""

    def __init__(self, broker: BrokerProcess, topic: str, interval: float) -> None:
        self.client = RawClient(broker)
        self.request = {"topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": False,
                        "include_topic_authorized_operations": False}
        self.interval = interval
        self.phase: str | None = None
        self.samples: dict[str, list[float]] = {}
        self.failures = 0
        self.slow: list[tuple[str, str, float]] = []  # (phase, wall-clock time sent, ms) of those over 50 ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            phase = self.phase
            began = time.monotonic()
            try:
                body = self.client.call(METADATA, 12, self.request)
                ok = body.topics[0].error_code == 0
            except Exception:  # a ping that fails is counted, not timed
                ok = False
            took = time.monotonic() - began
            if phase is not None:
                if ok:
                    self.samples.setdefault(phase, []).append(took * 1000)
                    if took * 1000 > PING_TARGET_MS:
                        sent = datetime.now() - timedelta(seconds=took)
                        self.slow.append((phase, sent.strftime("%H:%M:%S.%f")[:-3], round(took * 1000, 1)))
                else:
                    self.failures += 1
            due = max(due + self.interval, time.monotonic())
            self._stop.wait(max(0.0, due - time.monotonic()))

    def stats(self, phase: str) -> dict:
        values = sorted(self.samples.get(phase, []))
        if not values:
            return {"pings": 0}

        def pct(q: float) -> float:
            return round(values[min(len(values) - 1, int(q * len(values)))], 2)

        return {"pings": len(values), "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": round(values[-1], 2),
                "over_50ms": sum(v > PING_TARGET_MS for v in values)}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


class CpuMeter:
    """CPU (utime+stime) of the broker and SeaweedFS over a phase, as a share of one core; the
    busy share of the whole machine (1.0 = every core busy); and `foreign_cpu_util`, the share
    of the machine busy with anything but the broker, SeaweedFS, the clients (reaped children)
    and this process: other users' jobs on this shared machine (above ~0.05: disturbed)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.t0 = time.monotonic()
        self.cpu0 = {name: run.cpu_seconds(pid) for name, pid in pids.items()}
        self.ours0 = run.children_cpu() + run.own_cpu()
        self.busy0, self.total0 = run.machine_ticks()

    def read(self) -> dict:
        wall = time.monotonic() - self.t0
        busy, total = run.machine_ticks()
        cpu = {name: run.cpu_seconds(pid) - self.cpu0[name] for name, pid in self.pids.items()}
        ours = sum(cpu.values()) + run.children_cpu() + run.own_cpu() - self.ours0
        ticks = max(1, total - self.total0)
        foreign = max(0.0, ((busy - self.busy0) / run.CLK_TCK - ours) / (ticks / run.CLK_TCK))
        return {**{f"{name}_cpu_util": round(seconds / wall, 2) for name, seconds in cpu.items()},
                "machine_cpu_util": round((busy - self.busy0) / ticks, 2), "foreign_cpu_util": round(foreign, 2)}


def settle() -> None:
    """Write dirty pages back before a phase, so that it does not pay for the one before."""
    began = time.monotonic()
    os.sync()
    run.log(f"sync: {time.monotonic() - began:.1f} s")


class Offsets:
    """The offsets of partition 0 of a topic that the benchmark samples."""

    def __init__(self, broker: BrokerProcess, topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "strom-tiered-bench"})
        self.segments_dir = broker.data_dir / "logs" / f"{topic}-0"

    def spec(self, spec: int) -> int:
        return self.consumer.offsets_for_times([TopicPartition(self.topic, 0, spec)], timeout=10)[0].offset

    def end(self) -> int:
        return self.consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=10, cached=False)[1]

    def active_base(self) -> int:
        """The base offset of the active (last) local segment, from the segment files' names."""
        bases = [int(p.name[:-4]) for p in self.segments_dir.glob("*.log") if re.fullmatch(r"\d{20}\.log", p.name)]
        return max(bases, default=0)

    def close(self) -> None:
        self.consumer.close()


class Broker:
    """The broker target run.Generator produces to."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.bootstrap = broker.bootstrap
        self.pid = broker.proc.pid


def produce_phase(gen: run.Generator, target: Broker, offsets: Offsets, size: int, seconds: float,
                  tiered: bool) -> dict:
    """kcat for `seconds`; one sample a second of the end offset (and, tiered, of the tiered
    offset and the last rolled segment's end)."""
    start_end = offsets.end()
    procs = gen.start_produce(target, offsets.topic, size, 1, "1", seconds)
    began = time.monotonic()
    samples: list[dict] = []
    deadline = began + seconds + 30
    next_at = began
    while time.monotonic() < deadline:
        running = any(p.poll() is None for p in procs)
        now = time.monotonic()
        sample = {"t": round(now - began, 3), "end": offsets.end() - start_end}
        if tiered:
            sample["tiered"] = offsets.spec(LATEST_TIERED)
            sample["last_rolled"] = offsets.active_base() - 1
        samples.append(sample)
        if not running:
            break
        next_at += 1.0
        time.sleep(max(0.0, next_at - time.monotonic()))
    clean = run.wait_all(procs, max(1.0, deadline - time.monotonic()))
    for proc in procs:
        if proc in run.PROCS.procs:
            run.PROCS.procs.remove(proc)
    produce_end = samples[-1]["t"]
    total = offsets.end() - start_end
    rate = run.steady_rate([(s["t"], s["end"]) for s in samples], total)
    out = {"records": total, "seconds": round(produce_end, 1), "generator_exited_cleanly": clean,
           "records_per_s": round(rate) if rate else None,
           "mb_per_s": round(rate * size / MB, 1) if rate else None}
    if tiered:
        for s in samples:
            s["lag"] = max(0, s["last_rolled"] - max(s["tiered"], -1))
        first = samples[0]
        last = samples[-1]
        gained = max(last["tiered"], -1) - max(first["tiered"], -1)
        copy_rate = gained / (last["t"] - first["t"]) if last["t"] > first["t"] else None
        max_lag = max(s["lag"] for s in samples)
        out.update({
            "copy_records_per_s": round(copy_rate) if copy_rate else None,
            "copy_mb_per_s": round(copy_rate * size / MB, 1) if copy_rate else None,
            "copy_lag_max_offsets": max_lag, "copy_lag_max_mb": round(max_lag * size / MB, 1),
            "copy_lag_final_offsets": last["lag"], "copy_lag_final_mb": round(last["lag"] * size / MB, 1),
            "samples": samples,
        })
    return out


def wait_copied(offsets: Offsets, timeout: float) -> tuple[float | None, int, int]:
    """Seconds until the tiered offset reaches the last rolled segment's end (None: not within
    `timeout`), and the two offsets at the end."""
    began = time.monotonic()
    while True:
        tiered, rolled = offsets.spec(LATEST_TIERED), offsets.active_base() - 1
        if tiered >= rolled:
            return time.monotonic() - began, tiered, rolled
        if time.monotonic() - began > timeout:
            return None, tiered, rolled
        time.sleep(0.2)


def consume_phase(bootstrap: str, topic: str, end: int, size: int, timeout: float) -> dict:
    """workers.py consume: one confluent-kafka consumer from offset 0 to `end`."""
    args = [run.PY, str(HERE / "workers.py"), "consume", "--bootstrap", bootstrap, "--topic", topic,
            "--partitions", "0", "--ends", str(end), "--seconds", str(timeout)]
    began = time.monotonic()
    proc = run.PROCS.spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        run.PROCS.end(proc)
        return {"error": "consumer timed out"}
    finally:
        if proc in run.PROCS.procs:
            run.PROCS.procs.remove(proc)
    wall = time.monotonic() - began
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"consumer failed: {err.strip()[-300:]}"}
    rate = report["count"] / report["seconds"] if report["seconds"] > 0 else None
    return {"records": report["count"], "complete": report["complete"] and report["count"] == end,
            "errors": report["errors"], "seconds": round(report["seconds"], 2), "wall_s": round(wall, 2),
            "records_per_s": round(rate) if rate else None,
            "mb_per_s": round(report["bytes"] / report["seconds"] / MB, 1) if report["seconds"] > 0 else None}


def alter_topic(bootstrap: str, topic: str, key: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(15)


def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def table(doc: dict) -> str:
    r = doc["results"]
    base, tiered = r["produce_baseline"], r["produce_tiered"]
    local, remote = r["consume_local"], r["consume_remote"]
    lines = [
        f"Strom tiered storage, {doc['meta']['record_size']} B records, segment.bytes "
        f"{doc['meta']['segment_mb']} MiB, {doc['meta']['produce_seconds']:g} s produce, SeaweedFS S3",
        "",
        "produce (one kcat, acks=1)     records/s     MB/s   broker CPU  weed CPU  machine  foreign",
        f"  non-tiered topic (baseline) {fmt(base['records_per_s']):>11} {fmt(base['mb_per_s']):>8}"
        f"   {fmt(base['broker_cpu_util'], 2):>10} {fmt(base['weed_cpu_util'], 2):>9} {fmt(base['machine_cpu_util'], 2):>8}"
        f" {fmt(base['foreign_cpu_util'], 2):>8}",
        f"  tiered topic                {fmt(tiered['records_per_s']):>11} {fmt(tiered['mb_per_s']):>8}"
        f"   {fmt(tiered['broker_cpu_util'], 2):>10} {fmt(tiered['weed_cpu_util'], 2):>9} {fmt(tiered['machine_cpu_util'], 2):>8}"
        f" {fmt(tiered['foreign_cpu_util'], 2):>8}",
        f"  copy to S3 while producing  {fmt(tiered['copy_records_per_s']):>11} {fmt(tiered['copy_mb_per_s']):>8}",
        f"  tiered / baseline produce: {fmt(r['produce_ratio_tiered_to_baseline'], 2)};"
        f" copy / produce: {fmt(r['copy_ratio_to_produce'], 2)}",
        f"  copy lag behind the last rolled segment: max {fmt(tiered['copy_lag_max_offsets'])} offsets"
        f" ({fmt(tiered['copy_lag_max_mb'])} MB), at the end of produce {fmt(tiered['copy_lag_final_offsets'])}"
        f" ({fmt(tiered['copy_lag_final_mb'])} MB)",
        f"  copy caught up {fmt(r['copy_caught_up_after_s'], 1)} s after produce ended"
        f" (copy alone: {fmt(r['copy_mb_per_s_after_produce'])} MB/s)",
        "",
        "consume from offset 0          records/s     MB/s   broker CPU  weed CPU  machine  foreign  complete",
    ]
    for label, c in (("all local", local), ("remote (S3)", remote)):
        lines.append(f"  {label:<28} {fmt(c.get('records_per_s')):>11} {fmt(c.get('mb_per_s')):>8}"
                     f"   {fmt(c.get('broker_cpu_util'), 2):>10} {fmt(c.get('weed_cpu_util'), 2):>9}"
                     f" {fmt(c.get('machine_cpu_util'), 2):>8} {fmt(c.get('foreign_cpu_util'), 2):>8}"
                     f"  {c.get('complete', c.get('error'))}")
    lines.append(f"  remote / local: {fmt(r['consume_ratio_remote_to_local'], 2)}"
                 f" (records below the local log start: {fmt(remote.get('remote_share'), 3)} of the topic)")
    lines += ["", f"ping (Metadata, every {doc['meta']['ping_interval_ms']} ms)   pings   p50 ms   p99 ms   max ms  >50 ms"]
    for phase, p in r["ping"].items():
        lines.append(f"  {phase:<28} {fmt(p['pings']):>5} {fmt(p.get('p50_ms'), 2):>8} {fmt(p.get('p99_ms'), 2):>8}"
                     f" {fmt(p.get('max_ms'), 2):>8} {fmt(p.get('over_50ms')):>7}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="each produce phase (default 20)")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--segment-mb", type=int, default=16, help="segment.bytes of both topics, MiB")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--ping-interval-ms", type=float, default=10.0)
    parser.add_argument("--task-interval-ms", type=int, default=500,
                        help="remote.log.manager.task.interval.ms and log.retention.check.interval.ms")
    parser.add_argument("--drain-timeout", type=float, default=60.0, help="wait for the copy to catch up, s")
    parser.add_argument("--consume-timeout", type=float, default=120.0)
    parser.add_argument("--loop", default="", help="STROM_EVENT_LOOP of the broker (default: the broker's)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra broker config, for experiments")
    parser.add_argument("--json", type=Path, help="also write every number (and the samples) here")
    parser.add_argument("--broker-log", type=Path, help="write the broker's log (stderr) here at the end")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = datetime.now(UTC)
    workdir = Path(tempfile.mkdtemp(prefix="strom-tiered-bench-"))
    size = args.record_size
    s3 = S3Server(workdir / "s3", ports=free_ports)
    broker: BrokerProcess | None = None
    pinger: Pinger | None = None
    offsets: list[Offsets] = []
    results: dict = {}
    try:
        load = run.background_load(1.0)
        s3.start()
        interval = str(args.task_interval_ms)
        overrides = {"remote.log.storage.system.enable": "true", **s3.rsm_config(key_prefix="bench/"),
                     "remote.log.manager.task.interval.ms": interval, "log.retention.check.interval.ms": interval,
                     "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
                     **dict(o.split("=", 1) for o in args.override)}
        broker = BrokerProcess(workdir / "broker", overrides, env={"STROM_EVENT_LOOP": args.loop} if args.loop else None)
        run.PROCS.brokers.append(broker)
        broker.start()
        run.log(f"broker on {broker.bootstrap}, SeaweedFS S3 on {s3.endpoint_url}")
        target = Broker(broker)
        pids = {"broker": broker.proc.pid, "weed": s3.proc.pid}
        segment = str(args.segment_mb << 20)
        plain, tiered = "bench-plain", "bench-tiered"
        run.create_topic(broker.bootstrap, plain, 1, {"segment.bytes": segment})
        run.create_topic(broker.bootstrap, tiered, 1, {"segment.bytes": segment, "remote.storage.enable": "true",
                                                       "local.retention.ms": "3600000"})
        plain_offsets, tiered_offsets = Offsets(broker, plain), Offsets(broker, tiered)
        offsets += [plain_offsets, tiered_offsets]
        gen = run.Generator("kcat" if run.KCAT else "python", 1, workdir)
        gen.block(size)
        pinger = Pinger(broker, tiered, args.ping_interval_ms / 1000)
        time.sleep(0.5)  # connected, metadata warm

        pinger.phase = "idle"
        time.sleep(args.idle_seconds)
        pinger.phase = None

        settle()
        run.log(f"produce {size} B records for {args.seconds:g} s into {plain} (no remote storage)")
        meter = CpuMeter(pids)
        pinger.phase = "produce, non-tiered"
        base = produce_phase(gen, target, plain_offsets, size, args.seconds, tiered=False)
        pinger.phase = None
        results["produce_baseline"] = {**base, **meter.read()}
        run.log(f"  {base['records_per_s']} records/s, {base['mb_per_s']} MB/s")
        settle()

        run.log(f"produce {size} B records for {args.seconds:g} s into {tiered} (remote storage, copy running)")
        meter = CpuMeter(pids)
        pinger.phase = "produce + copy (tiered)"
        prod = produce_phase(gen, target, tiered_offsets, size, args.seconds, tiered=True)
        results["produce_tiered"] = {**prod, **meter.read()}
        caught_up, tiered_at, rolled_at = wait_copied(tiered_offsets, args.drain_timeout)
        pinger.phase = None
        results["copy_caught_up_after_s"] = round(caught_up, 1) if caught_up is not None else None
        results["copy_after_drain"] = {"tiered_offset": tiered_at, "last_rolled_offset": rolled_at}
        drained = tiered_at - max(prod["samples"][-1]["tiered"], -1)
        results["copy_mb_per_s_after_produce"] = (round(drained * size / MB / caught_up, 1)
                                                  if caught_up and drained > 0 else None)
        run.log(f"  {prod['records_per_s']} records/s, {prod['mb_per_s']} MB/s; copy {prod['copy_mb_per_s']} MB/s, "
                f"lag max {prod['copy_lag_max_mb']} MB, final {prod['copy_lag_final_mb']} MB; "
                f"caught up after {results['copy_caught_up_after_s']} s")
        end = tiered_offsets.end()
        settle()

        run.log(f"consume {end} records from offset 0, all local")
        meter = CpuMeter(pids)
        pinger.phase = "consume, local"
        local = consume_phase(broker.bootstrap, tiered, end, size, args.consume_timeout)
        pinger.phase = None
        results["consume_local"] = {**local, **meter.read(), "local_log_start": tiered_offsets.spec(EARLIEST_LOCAL)}
        run.log(f"  {local.get('records_per_s')} records/s, {local.get('mb_per_s')} MB/s")

        alter_topic(broker.bootstrap, tiered, "local.retention.ms", "1")
        began = time.monotonic()
        while True:
            local_start, rolled = tiered_offsets.spec(EARLIEST_LOCAL), tiered_offsets.active_base()
            if local_start >= rolled or time.monotonic() - began > args.drain_timeout:
                break
            time.sleep(0.2)
        run.log(f"local log start {local_start} of {end} after {time.monotonic() - began:.1f} s")
        settle()

        run.log(f"consume {end} records from offset 0, {local_start} of them from remote storage")
        meter = CpuMeter(pids)
        pinger.phase = "consume, remote"
        remote = consume_phase(broker.bootstrap, tiered, end, size, args.consume_timeout)
        pinger.phase = None
        results["consume_remote"] = {**remote, **meter.read(), "local_log_start": local_start,
                                     "remote_share": round(local_start / end, 3) if end else None}
        run.log(f"  {remote.get('records_per_s')} records/s, {remote.get('mb_per_s')} MB/s")

        pinger.close()
        results["ping"] = {phase: pinger.stats(phase) for phase in pinger.samples}
        results["ping_failures"] = pinger.failures
        results["slow_pings"] = pinger.slow  # local time, to match the broker's log (--broker-log)
        pinger = None

        def ratio(a, b):
            return round(a / b, 3) if a and b else None

        results["produce_ratio_tiered_to_baseline"] = ratio(prod["records_per_s"], base["records_per_s"])
        results["copy_ratio_to_produce"] = ratio(prod["copy_records_per_s"], prod["records_per_s"])
        results["consume_ratio_remote_to_local"] = ratio(remote.get("records_per_s"), local.get("records_per_s"))
        errors = [line for line in broker.stderr_lines if " ERROR " in line or "Traceback" in line]
        results["broker_error_lines"] = len(errors)
        if errors:
            run.log(f"broker logged {len(errors)} error line(s), first: {errors[0][:200]}")
    finally:
        if pinger is not None:
            pinger.close()
        for o in offsets:
            o.close()
        if broker is not None:
            try:
                broker.stop(timeout=20)
            except Exception as e:
                run.log(f"broker did not stop cleanly: {e!r}")
            if args.broker_log:
                args.broker_log.write_text("\n".join(broker.stderr_lines) + "\n")
        run.PROCS.cleanup()
        s3.close()
        shutil.rmtree(workdir, ignore_errors=True)
    doc = {"meta": {"date": started.isoformat(timespec="seconds"), "machine": run.machine_info(),
                    "background_load_at_start": load, "generator": gen.describe(),
                    "record_size": size, "segment_mb": args.segment_mb, "produce_seconds": args.seconds,
                    "ping_interval_ms": args.ping_interval_ms, "task_interval_ms": args.task_interval_ms,
                    "elapsed_s": round(time.monotonic() - run.T0, 1)},
           "results": results}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
