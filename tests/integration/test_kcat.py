"""kcat, librdkafka's command-line client: produce lines, consume them back, list metadata."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from strom.testing import create_topic

from .conftest import watermarks

pytestmark = pytest.mark.timeout(60)


def kcat(bootstrap: str, *args: str, stdin: str | None = None) -> str:
    exe = shutil.which("kcat")
    assert exe, "kcat is not installed (scripts/bootstrap test installs it with apt-get)"
    done = subprocess.run([exe, "-b", bootstrap, *args], input=stdin, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("codec", ["none", "snappy", "zstd"])
def test_produce_and_consume_lines(broker, topic, codec):
    create_topic(broker.bootstrap, topic, partitions=2)
    lines = [f"key{i}:line {i} " + "x" * i for i in range(50)]
    kcat(broker.bootstrap, "-P", "-t", topic, "-p", "1", "-K:", "-H", "origin=kcat", "-z", codec,
         stdin="\n".join(lines) + "\n")
    assert watermarks(broker.bootstrap, topic, 1) == (0, 50)
    out = kcat(broker.bootstrap, "-C", "-t", topic, "-p", "1", "-o", "beginning", "-e", "-q",
               "-f", "%o|%k|%s|%h\n")
    assert out.splitlines() == [f"{i}|key{i}|line {i} {'x' * i}|origin=kcat" for i in range(50)]
    tail = kcat(broker.bootstrap, "-C", "-t", topic, "-p", "1", "-o", "45", "-e", "-q", "-f", "%o %s\n")
    assert tail.splitlines() == [f"{i} line {i} {'x' * i}" for i in range(45, 50)]


def test_metadata_listing(broker, topic):
    create_topic(broker.bootstrap, topic, partitions=3)
    meta = json.loads(kcat(broker.bootstrap, "-L", "-J", "-t", topic))
    assert [(b["id"], b["name"]) for b in meta["brokers"]] == [(0, broker.bootstrap)]
    [entry] = meta["topics"]
    assert entry["topic"] == topic and [p["partition"] for p in entry["partitions"]] == [0, 1, 2]
    assert all(p["leader"] == 0 and p["replicas"] == [{"id": 0}] for p in entry["partitions"])
