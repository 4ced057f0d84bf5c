"""What checking every record of a produced batch costs (Kafka's LogValidator rules).

    .venv/bin/python benchmarks/validation.py [--mb 200]

For record sizes and batch sizes producers use, prints CPU seconds per GB of produced record
sets for three checks, each over the same buffers in one invocation:
  header   batch headers and CRC32C only (what the broker did before records were checked),
  compiled headers, CRC and the compiled record walk (what it does now),
  python   headers, CRC and the same walk in Python (the fallback without a C compiler).
Compressed batches add the codec's decompression, reported on its own line.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from strom.protocol import compression, records
from strom.protocol.records import build_batch, validate_batches

SHAPES = [  # (record bytes, records per batch, codec)
    (100, 160, compression.NONE),  # 16 KiB batches: librdkafka's default batch.size
    (100, 10_000, compression.NONE),  # 1 MiB batches
    (1000, 1000, compression.NONE),
    (100, 10_000, compression.LZ4),
]


def seconds_per_gb(batch: bytes, mb: int, check) -> float:
    copies = max(1, mb * 1_000_000 // len(batch))
    start = time.process_time()
    for _ in range(copies):
        check(batch)
    return (time.process_time() - start) / (copies * len(batch) / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200, help="MB of record sets per measurement")
    args = parser.parse_args()
    rng = random.Random(1)
    compiled = records._check_records
    results = []
    for size, count, codec in SHAPES:
        batch = build_batch([(b"key-%08d" % i, rng.randbytes(size - 12)) for i in range(count)],
                            codec=codec)
        row = {"record_bytes": size, "records_per_batch": count,
               "codec": compression.NAMES.get(codec, codec) if hasattr(compression, "NAMES") else codec,
               "batch_bytes": len(batch)}
        records._check_records = None
        row["python_s_per_gb"] = round(seconds_per_gb(batch, max(1, args.mb // 20), lambda b: validate_batches(b, 1 << 30, check_records=True)), 3)
        records._check_records = compiled
        row["compiled_s_per_gb"] = round(seconds_per_gb(batch, args.mb, lambda b: validate_batches(b, 1 << 30, check_records=True)), 3)
        row["header_only_s_per_gb"] = round(seconds_per_gb(batch, args.mb, _header_and_crc), 3)
        results.append(row)
        print(json.dumps(row), flush=True)


def _header_and_crc(batch: bytes) -> None:
    header = records.read_header(batch)
    assert records.crc_ok(batch, 0, header)


if __name__ == "__main__":
    main()
