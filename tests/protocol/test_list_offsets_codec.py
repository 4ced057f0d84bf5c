"""The hand-written ListOffsets request reader and response writer against the codec tables."""

from __future__ import annotations

import random

import pytest

from strom.protocol import messages
from strom.protocol.list_offsets import ListOffsetsResponseWriter, parse_list_offsets_request
from strom.protocol.produce import MalformedRequest

VERSIONS = range(1, 12)


def _topics(rng: random.Random) -> list[dict]:
    return [{"name": rng.choice(("t", "ünï", "x" * 200)) + str(k), "partitions": [
        {"partition_index": rng.randrange(100), "current_leader_epoch": rng.randrange(-1, 5),
         "timestamp": rng.choice((-1, -2, 1_700_000_000_000)), "max_num_offsets": 1}
        for _ in range(rng.randrange(0, 4))]} for k in range(rng.randrange(0, 4))]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_reader_reads_what_the_codec_writes(version):
    rng = random.Random(version)
    for _ in range(20):
        fields = {"replica_id": rng.choice((-1, 3)), "isolation_level": rng.choice((0, 1)),
                  "topics": _topics(rng), "timeout_ms": 1234}
        body = messages.build(messages.REQUESTS[2], version, fields).encode(version=version)
        request = parse_list_offsets_request(bytes(body), 0, version)
        assert request.replica_id == fields["replica_id"]
        assert request.isolation_level == (fields["isolation_level"] if version >= 2 else 0)
        got = [(name, [(p.partition_index, p.current_leader_epoch, p.timestamp) for p in partitions])
               for name, count, partitions in request.topics()]
        assert [count for _, count, _ in request.topics()] == [len(t["partitions"]) for t in fields["topics"]]
        assert got == [(t["name"], [(p["partition_index"], p["current_leader_epoch"] if version >= 4 else -1,
                                     p["timestamp"]) for p in t["partitions"]]) for t in fields["topics"]]
        for cut in range(1, len(body), 7):
            with pytest.raises(MalformedRequest):
                parse_list_offsets_request(bytes(body[:cut]), 0, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_writer_lays_out_what_the_codec_does(version):
    rng = random.Random(50 + version)
    for _ in range(20):
        topics = [{"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": rng.choice((0, 3, 6)),
             "timestamp": p["timestamp"], "offset": rng.randrange(-1, 10**9), "leader_epoch": rng.randrange(-1, 9),
             "old_style_offsets": []} for p in t["partitions"]]} for t in _topics(rng)]
        codec = messages.encode_body(2, version, {"throttle_time_ms": 5, "topics": topics})
        writer = ListOffsetsResponseWriter(version)
        for t in topics:
            writer.topic(t["name"], len(t["partitions"]))
            for p in t["partitions"]:
                writer.partition(p["partition_index"], p["error_code"], p["timestamp"], p["offset"], p["leader_epoch"])
        assert b"".join(writer.parts(5)) == bytes(codec)
