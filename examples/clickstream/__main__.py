"""Run the clickstream pipeline for a fixed time:

    examples/clickstream/run [--seconds 30] [--rate 2000] [--bootstrap HOST:PORT] [--out DIR]

Without --bootstrap it starts its own Strom broker (a temp dir, an ephemeral port)."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import threading
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

import strom.spark
from examples.clickstream.generator import generate
from examples.clickstream.job import start
from strom.testing import BrokerProcess

SOURCE, TARGET = "clicks", "clicks-per-page"


def create_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(SOURCE, 2, 1), NewTopic(TARGET, 1, 1)])
    for future in futures.values():
        with contextlib.suppress(Exception):  # already there from an earlier run
            future.result(15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rate", type=int, default=2000, help="click events per second")
    ap.add_argument("--bootstrap", help="an existing broker; default: start one")
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "strom-clickstream"),
                    help="Parquet output (and, with --bootstrap, the query checkpoint); with its own "
                         "broker the run starts afresh and replaces earlier results")
    args = ap.parse_args()

    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            bootstrap = stack.enter_context(BrokerProcess()).bootstrap
            print(f"started a Strom broker on {bootstrap}", flush=True)
        create_topics(bootstrap)
        out = Path(args.out).resolve()
        if args.bootstrap is None:
            shutil.rmtree(out / "counts", ignore_errors=True)  # counts of an earlier broker's clicks
        checkpoint = tempfile.mkdtemp(prefix="clickstream-ckpt-") if args.bootstrap is None else str(out / "_checkpoint")
        spark = strom.spark.local_session("local[2]", "clickstream")
        spark.sparkContext.setLogLevel("ERROR")
        stack.callback(spark.stop)

        stop = threading.Event()
        sent: list[int] = []
        producer = threading.Thread(target=lambda: sent.append(generate(bootstrap, SOURCE, args.rate, args.seconds, stop)))
        producer.start()
        query = start(spark, bootstrap, SOURCE, TARGET, str(out / "counts"), checkpoint)
        try:
            producer.join()
            query.processAllAvailable()  # everything produced is counted before we stop
        finally:
            stop.set()
            query.stop()
        counted = spark.read.parquet(str(out / "counts")).groupBy("window", "page").agg({"count": "max"}) \
            .agg({"max(count)": "sum"}).first()[0]
        print(f"produced {sent[0]} clicks; the last count of every window and page adds up to {counted}; "
              f"results in topic {TARGET!r} and {out / 'counts'}", flush=True)


if __name__ == "__main__":
    main()
