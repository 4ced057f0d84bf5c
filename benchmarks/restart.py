"""Restart time of a broker with many partitions, and how much the recovery point saves.

Creates a topic with --partitions partitions on a real `strom serve`, stops it, fills every
partition's log directly through `strom.log` (much faster than producing over the network;
the files are the same), and then measures, as a client sees it (process start to "ready"):

- clean restart: indexes trusted after a sanity check, nothing re-scanned;
- restart after kill -9, recovery point honoured: only segments past the checkpointed recovery
  point (the active ones) are re-scanned;
- restart after kill -9 with the recovery-point checkpoint removed: every segment re-scanned
  (what start-up cost before the recovery point advanced on roll).

Also measures the cleaner's throughput on one compacted log. Prints one JSON object.

    python benchmarks/restart.py --partitions 1000 --gb 10
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from strom.log import Log, LogConfig, LogManager
from strom.log.cleaner import Cleaner, CleanerConfig, LogCleaner, LogToClean, cleanable_offsets
from strom.log.manager import RECOVERY_POINT_CHECKPOINT
from strom.protocol.records import build_batch
from strom.testing import BrokerProcess

TOPIC = "restart-bench"


def fill(logs_dir: Path, partitions: int, bytes_per_partition: int, segment_bytes: int) -> int:
    """Append ~bytes_per_partition to each partition's log; returns the bytes written."""
    config = LogConfig(segment_bytes=segment_bytes)
    template = build_batch([(b"key-%04d" % i, os.urandom(1000)) for i in range(64)], timestamp=int(time.time() * 1000))
    manager = LogManager([logs_dir], config)
    manager.startup(0)
    written = 0
    for p in range(partitions):
        log = manager.get_or_create_log(TOPIC, p, config)
        while log.size_in_bytes < bytes_per_partition:
            log.append(bytearray(template))
            written += len(template)
        log.flush()
    manager.shutdown()  # checkpoints and the clean shutdown marker, as a broker would
    return written


def loaded_seconds(proc: BrokerProcess) -> float | None:
    for line in reversed(proc.stderr_lines):
        m = re.search(r"loaded \d+ logs from \d+ log dir\(s\) in ([\d.]+)s", line)
        if m:
            return float(m[1])
    return None


def drop_page_cache() -> bool:
    """Start cold, as after a reboot (needs root; best effort)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed_start(proc: BrokerProcess, cold: bool) -> dict:
    dropped = drop_page_cache() if cold else False
    proc.stderr_lines.clear()
    proc.start(timeout=1800)
    return {"ready_s": round(proc.startup_seconds, 2), "logs_loaded_s": loaded_seconds(proc),
            "cold_page_cache": dropped}


def cleaner_throughput(tmp: Path, mb: int) -> dict:
    """One pass of the cleaner over `mb` MB of 1 KB records on 10,000 keys (none superseded
    within a batch), 64 MB segments."""
    config = LogConfig(segment_bytes=64 << 20, cleanup_policy="compact")
    log = Log.open(tmp / "clean-0", config)
    ts = int(time.time() * 1000)
    i = 0
    while log.size_in_bytes < mb << 20:
        log.append(bytearray(build_batch([(b"k%05d" % ((i + j) % 10_000), os.urandom(1000)) for j in range(100)],
                                         timestamp=ts)))
        i += 100
    log.roll()
    first_dirty, uncleanable = cleanable_offsets(log, None, ts)
    job = LogCleaner(None, CleanerConfig).plan(LogToClean(("clean", 0), log, first_dirty, uncleanable, 0, 0), ts)

    def swap(base, old):
        log.replace_segments(base, old)
        return True

    started = time.monotonic()
    result = Cleaner(CleanerConfig().map_capacity_bytes).clean(job, swap, lambda: False)
    elapsed = time.monotonic() - started
    job.close()
    log.close()
    return {"read_mb": round(result.bytes_read / 1e6, 1), "written_mb": round(result.bytes_written / 1e6, 1),
            "records_read": result.records_read, "records_kept": result.records_retained,
            "seconds": round(elapsed, 2), "mb_per_s": round(result.bytes_read / 1e6 / elapsed, 1),
            "records_per_s": round(result.records_read / elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--gb", type=float, default=1.0, help="total data (default 1)")
    parser.add_argument("--segment-mb", type=int, default=1, help="segment.bytes in MB (default 1)")
    parser.add_argument("--cleaner-mb", type=int, default=200, help="data for the cleaner measurement")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the data (default: a temp dir)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each start (root)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="strom-restart-", dir=args.dir))
    out: dict = {"partitions": args.partitions, "gb": args.gb, "segment_mb": args.segment_mb,
                 "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    try:
        proc = BrokerProcess(data_dir=root, overrides={"num.partitions": "1"})
        proc.start()
        client = AdminClient({"bootstrap.servers": proc.bootstrap})
        client.create_topics([NewTopic(TOPIC, args.partitions, 1,
                                       config={"segment.bytes": str(args.segment_mb << 20)})],
                             operation_timeout=60)[TOPIC].result(timeout=120)
        del client
        assert proc.stop(timeout=120) == 0
        started = time.monotonic()
        written = fill(root / "logs", args.partitions, int(args.gb * 1e9 / args.partitions), args.segment_mb << 20)
        out["fill"] = {"bytes": written, "seconds": round(time.monotonic() - started, 1),
                       "segments": sum(1 for _ in (root / "logs").glob("*/*.log"))}

        # The first start after the offline fill finds no producer-state snapshots and
        # rebuilds them from the logs (like a first start after an upgrade); the broker's clean
        # shutdown writes them, so later starts do not.
        out["first_start_no_producer_snapshots"] = timed_start(proc, args.cold)
        assert proc.stop(timeout=600) == 0
        out["clean_restart"] = timed_start(proc, args.cold)
        started = time.monotonic()
        assert proc.stop(timeout=600) == 0
        out["clean_stop_s"] = round(time.monotonic() - started, 2)

        proc.start(timeout=1800)
        proc.kill()
        out["kill9_restart_recovery_point"] = timed_start(proc, args.cold)
        proc.kill()
        (root / "logs" / RECOVERY_POINT_CHECKPOINT).unlink()
        out["kill9_restart_no_recovery_point"] = timed_start(proc, args.cold)
        proc.close()
        out["cleaner"] = cleaner_throughput(root, args.cleaner_mb)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
