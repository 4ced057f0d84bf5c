"""Produces random click events as JSON to a Strom topic at a steady rate."""

from __future__ import annotations

import json
import random
import threading
import time

from confluent_kafka import Producer

PAGES = ["/", "/search", "/product/1", "/product/2", "/cart", "/checkout", "/help"]
WEIGHTS = [30, 20, 15, 12, 10, 8, 5]


def generate(bootstrap: str, topic: str, rate: int, seconds: float, stop: threading.Event) -> int:
    """Send `rate` events a second for `seconds` (or until `stop`); returns how many were sent."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    rng = random.Random(42)
    sent, begin = 0, time.monotonic()
    while not stop.is_set() and time.monotonic() - begin < seconds:
        due = int((time.monotonic() - begin) * rate)
        for _ in range(due - sent):
            user = f"user-{rng.randrange(500)}"
            event = {"user": user, "page": rng.choices(PAGES, WEIGHTS)[0], "ts": int(time.time() * 1000)}
            producer.produce(topic, json.dumps(event).encode(), user.encode())
        sent = max(sent, due)
        producer.poll(0)
        time.sleep(0.01)
    if producer.flush(30):
        raise RuntimeError("click events still unsent after 30 s")
    return sent
