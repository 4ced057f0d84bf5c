"""What the metrics cost: broker CPU per GB produced with the Prometheus endpoint on (and
scraped) against off, and against Strom before it counted anything.

    .venv/bin/python benchmarks/metrics.py [--sizes 100,1024] [--passes 4] [--pass-seconds 5]
                                           [--scrape-interval 1] [--before REF] [--json FILE]

Per record size, four brokers take turns under the same kcat produce load (hardening.py's
produce-cpu: one partition, acks=1), pass by pass:

- `before-metrics`: `--before`'s `src/` (default: the commit before the metrics were added),
  the baseline: no counters at all;
- `off`: this working tree without `metrics.port` (per-topic counters only; no request timing,
  no endpoint);
- `on`: this working tree with `metrics.port=0`, never scraped: what recording costs;
- `on-scraped`: the same, scraped every `--scrape-interval` seconds by a thread of this
  process (Prometheus' default is 15 s, so 1 s is a harsh case); the scrapes' CPU is the
  broker's and counts.

Lines of numbers go to stderr, one JSON document to stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hardening  # noqa: E402  (produce CPU per GB for several broker variants)
import run  # noqa: E402

# The commit before the broker counted anything for metrics.
BEFORE_METRICS = "435b329"


def scraper(interval: float):
    """Variant.beside: scrape the target's endpoint every `interval` s until stopped."""

    def start(target: run.StromTarget):
        stop, scrapes = threading.Event(), []

        def loop() -> None:
            while not stop.wait(interval):
                with urllib.request.urlopen(target.broker.metrics_url, timeout=10) as response:
                    scrapes.append(len(response.read()))

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()

        def finish() -> None:
            stop.set()
            thread.join(15)
            run.log(f"metrics on: {len(scrapes)} scrapes, last {scrapes[-1] if scrapes else 0} bytes")

        return finish

    return start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1024", help="record sizes, comma-separated")
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--pass-seconds", type=float, default=5.0)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--before", default=BEFORE_METRICS, help="the baseline commit")
    parser.add_argument("--loop", default="uvloop")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started = datetime.now(UTC)
    workdir = Path(tempfile.mkdtemp(prefix="strom-metrics-bench-"))
    results = {}
    try:
        before, before_commit = hardening.commit_variant(args.before, workdir)
        variants = {
            "before-metrics": before,
            "off": hardening.Variant(),
            "on": hardening.Variant(overrides={"metrics.port": "0"}),
            "on-scraped": hardening.Variant(overrides={"metrics.port": "0"},
                                            beside=scraper(args.scrape_interval)),
        }
        for size in (int(s) for s in args.sizes.split(",")):
            found = hardening.compare_produce_cpu(variants, args.passes, args.pass_seconds, size,
                                                  args.loop, "none", f"metrics-{size}B")
            results[f"{size}B"] = {
                **found,
                **{f"{label}_vs_before": hardening.cpu_ratio(found[label], found["before-metrics"])
                   for label in ("off", "on", "on-scraped")},
                "on_vs_off": hardening.cpu_ratio(found["on"], found["off"]),
                "on-scraped_vs_off": hardening.cpu_ratio(found["on-scraped"], found["off"]),
            }
            ratios = {k: v for k, v in results[f"{size}B"].items() if k.endswith(("_vs_off", "_vs_before"))}
            run.log(f"{size} B records, CPU per GB ratios: {ratios}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    doc = {"meta": {"date": started.isoformat(timespec="seconds"), "machine": run.machine_info(),
                    "before_commit": before_commit, "scrape_interval_s": args.scrape_interval,
                    "elapsed_s": round(time.monotonic() - run.T0, 1)},
           "results": results}
    text = json.dumps(doc, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
