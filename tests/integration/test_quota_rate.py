"""A producer byte-rate quota holds a producer to its rate, measured: a confluent-kafka
producer whose client id has producer_byte_rate=1048576 (1 MiB/s) produces as fast as it can
for 10 s, and what the broker acknowledged in that time comes to about 1 MiB/s; librdkafka
reports the throttle (throttle_cb); a producer of another client id, with no quota, on the
same broker at the same time, goes well past that.

Kafka measures a rate over `quota.window.num` windows of `quota.window.size.seconds`, counting
at least all but one window as elapsed, so a new client may first send up to
(quota.window.num - 1) windows' worth at full speed. With Kafka's defaults (11 windows of 1 s)
that burst is about 10 MiB: what a 10 s run gets through is bounded by the quota over the
window, burst included. With 2 windows the burst is about 1 MiB and the rate after the first
seconds is the steady one: that run is measured from second 2 on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Producer

from strom.testing import BrokerProcess, create_topic, unique_name

MiB = 1_048_576
QUOTA = MiB  # producer_byte_rate of the throttled client id
RUN_S = 10.0
VALUE = os.urandom(10_000)
FREE_PACE = 10 * MiB  # the unthrottled producer's own pace: ten times the quota, without writing GBs


@dataclass
class Run:
    client_id: str
    acked: list[tuple[float, int]] = field(default_factory=list)  # (when, value bytes)
    throttles: list[float] = field(default_factory=list)  # librdkafka's throttle events, seconds
    start: float = 0.0

    def rate(self, skip_s: float) -> float:
        """Bytes per second acknowledged from `skip_s` after the start to the end of the run."""
        acked = sum(size for at, size in self.acked if skip_s <= at - self.start < RUN_S)
        return acked / (RUN_S - skip_s)


def produce_for(bootstrap: str, topic: str, run: Run, begin: threading.Barrier, pace: float | None) -> None:
    """Produce 10 KB records to `topic` for RUN_S seconds, at most `pace` bytes a second."""

    def delivered(err, msg) -> None:
        if err is None:
            run.acked.append((time.monotonic(), len(msg)))

    producer = Producer({
        "bootstrap.servers": bootstrap, "client.id": run.client_id, "acks": 1, "linger.ms": 5,
        # Kafka throttles after the request that goes over: a request's bytes beyond the quota
        # earn its delay, so requests of 64 KB (not librdkafka's 1 MB) keep the overshoot small.
        "batch.size": 65536,
        "queue.buffering.max.kbytes": 4096,  # a producer held back waits, not buffers a GB
        "throttle_cb": lambda event: run.throttles.append(event.throttle_time)})
    producer.list_topics(topic, timeout=10)  # connected before the clock starts
    begin.wait()
    run.start = time.monotonic()
    sent = 0
    while (now := time.monotonic()) < run.start + RUN_S:
        if pace is not None and sent > pace * (now - run.start):
            producer.poll(0.005)
            continue
        try:
            producer.produce(topic, VALUE, on_delivery=delivered)
            sent += len(VALUE)
        except BufferError:
            producer.poll(0.02)
        producer.poll(0)
    producer.purge()  # what is still queued is outside the window
    producer.flush(15)


@pytest.mark.parametrize(("windows", "skip_s"), [
    pytest.param(11, 0.0, id="kafka-default-windows-over-the-whole-run"),
    pytest.param(2, 2.0, id="two-windows-after-the-first-seconds"),
])
def test_producer_byte_rate_quota(windows: int, skip_s: float):
    with BrokerProcess(overrides={"quota.window.size.seconds": "1", "quota.window.num": str(windows)}) as broker:
        done = subprocess.run([sys.executable, "-m", "strom", "quotas", "set", "--client-id", "throttled-producer",
                               f"producer_byte_rate={QUOTA}", "--bootstrap-server", broker.bootstrap],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        throttled, free = Run("throttled-producer"), Run("unthrottled-producer")
        begin = threading.Barrier(2)
        threads = []
        for run, pace in ((throttled, None), (free, FREE_PACE)):
            topic = unique_name(run.client_id)
            create_topic(broker.bootstrap, topic)
            threads.append(threading.Thread(target=produce_for, args=(broker.bootstrap, topic, run, begin, pace)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(RUN_S + 60)
        assert not any(t.is_alive() for t in threads), "a producer did not finish"

    held, unheld = throttled.rate(skip_s), free.rate(skip_s)
    print(f"\n{windows} windows, from {skip_s:.0f} s: throttled {held / MiB:.2f} MiB/s "
          f"({len(throttled.throttles)} throttles, longest {max(throttled.throttles, default=0):.2f} s), "
          f"unthrottled {unheld / MiB:.2f} MiB/s")
    assert 0.6 * QUOTA <= held <= 1.5 * QUOTA
    assert throttled.throttles and max(throttled.throttles) > 0
    assert unheld > 3 * MiB and unheld > 3 * held
    assert free.throttles == []  # no quota: never told to wait
