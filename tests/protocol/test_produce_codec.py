"""The hand-written ProduceResponse encoder against the schema codec, every version."""

from __future__ import annotations

import uuid

import pytest

from strom.protocol import messages
from strom.protocol.produce import PartitionProduceResponse, encode_produce_response

PRODUCE = 0


def _partitions() -> list[PartitionProduceResponse]:
    return [
        PartitionProduceResponse(0, 0, 42, -1, 0),
        PartitionProduceResponse(7, 87, -1, 1_700_000_000_000, 5, [(3, "bad timestamp"), (9, None)],
                                 "One or more records have been rejected"),
        PartitionProduceResponse(2, 6, -1, -1, -1, [], None),
    ]


@pytest.mark.parametrize("version", range(3, 14))
def test_produce_response_matches_the_schema(version):
    ids = [uuid.uuid4(), uuid.uuid4()]
    names = ["orders", "ünïcode-topic"]
    topics = [(ids[i] if version >= 13 else names[i], _partitions()[i:]) for i in range(2)]
    body, throttle_at = encode_produce_response(topics, version, throttle_time_ms=250)
    decoded = messages.RESPONSES[PRODUCE].decode(memoryview(body), version=version)
    assert decoded.throttle_time_ms == 250
    assert body[throttle_at:throttle_at + 4] == (250).to_bytes(4, "big")
    assert len(decoded.responses) == 2
    for (topic, partitions), got in zip(topics, decoded.responses, strict=True):
        if version >= 13:
            assert got.topic_id == topic
        else:
            assert got.name == topic
        assert len(got.partition_responses) == len(partitions)
        for want, p in zip(partitions, got.partition_responses, strict=True):
            assert (p.index, p.error_code, p.base_offset, p.log_append_time_ms) == (
                want.index, want.error_code, want.base_offset, want.log_append_time_ms)
            if version >= 5:
                assert p.log_start_offset == want.log_start_offset
            if version >= 8:
                assert [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] == \
                    list(want.record_errors or [])
                assert p.error_message == want.error_message
    # and byte for byte what the codec writes from the same fields
    fields = {"throttle_time_ms": 250, "responses": [
        {("topic_id" if version >= 13 else "name"): topic, "partition_responses": [
            {"index": p.index, "error_code": p.error_code, "base_offset": p.base_offset,
             "log_append_time_ms": p.log_append_time_ms, "log_start_offset": p.log_start_offset,
             "record_errors": [{"batch_index": i, "batch_index_error_message": m} for i, m in p.record_errors or []],
             "error_message": p.error_message} for p in partitions]}
        for topic, partitions in topics]}
    assert body == messages.encode_body(PRODUCE, version, fields)


@pytest.mark.parametrize("version", range(3, 14))
@pytest.mark.parametrize("topic", ["t", "a-topic-name-longer-than-one-hundred-and-twenty-seven-bytes-" * 3])
def test_one_partition_answer_matches_the_codec(version, topic):
    """The single-record request's answer (one topic, one partition, no record errors) takes
    a shorter way: the same bytes as the codec's."""
    name = uuid.uuid4() if version >= 13 else topic
    p = PartitionProduceResponse(3, 0, 1 << 40, 1_700_000_000_000, 17)
    for _ in range(2):  # the topic's part is made once, then reused
        body, throttle_at = encode_produce_response([(name, [p])], version, throttle_time_ms=9)
        assert body == messages.encode_body(PRODUCE, version, {"throttle_time_ms": 9, "responses": [
            {("topic_id" if version >= 13 else "name"): name, "partition_responses": [
                {"index": 3, "error_code": 0, "base_offset": 1 << 40, "log_append_time_ms": 1_700_000_000_000,
                 "log_start_offset": 17, "record_errors": [], "error_message": None}]}]})
        assert body[throttle_at:throttle_at + 4] == (9).to_bytes(4, "big")


@pytest.mark.parametrize("version", range(3, 14))
def test_parsed_request_has_what_the_codec_wrote(version):
    """parse_produce_request against the schema codec's encoding: null and set transactional
    ids, names and record sets whose lengths take one and several varint bytes, null records."""
    from strom.protocol.produce import parse_produce_request
    from strom.protocol.records import build_batch

    small, large = build_batch([(None, b"v")]), build_batch([(b"k", b"x" * 300)] * 3)
    topics = [("t", [(0, small)]), ("long-" * 40, [(1, large), (2, None), (5, small)])]
    for txn in (None, "txn-" * 50):
        ids = [uuid.uuid4() for _ in topics]
        body = messages.build(messages.REQUESTS[PRODUCE], version, {
            "transactional_id": txn, "acks": -1, "timeout_ms": 1234, "topic_data": [
                {"name": name, "topic_id": ids[i], "partition_data": [{"index": idx, "records": rec}
                                                                      for idx, rec in parts]}
                for i, (name, parts) in enumerate(topics)]}).encode(version=version)
        request = parse_produce_request(memoryview(bytearray(body)), version)
        assert (request.transactional_id, request.acks, request.timeout_ms) == (txn, -1, 1234)
        for i, (t, (name, parts)) in enumerate(zip(request.topic_data, topics, strict=True)):
            assert (t.topic_id, t.name) == ((ids[i], "") if version >= 13 else (None, name))
            assert [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data] == parts


@pytest.mark.parametrize("version", [3, 8, 9, 12, 13])
def test_every_truncation_of_a_request_is_malformed(version):
    from strom.protocol.produce import MalformedRequest, parse_produce_request
    from strom.protocol.records import build_batch

    body = messages.build(messages.REQUESTS[PRODUCE], version, {
        "transactional_id": "x", "acks": 1, "timeout_ms": 1, "topic_data": [
            {"name": "t", "topic_id": uuid.uuid4(), "partition_data": [
                {"index": 0, "records": build_batch([(None, b"v" * 200)])}]}]}).encode(version=version)
    for cut in range(len(body)):
        with pytest.raises(MalformedRequest):
            parse_produce_request(memoryview(bytearray(body[:cut])), version)


# --- the compiled parser of the usual Produce request (_produce.c) -----------------------------

def _frame(version: int, txn: str | None = None, client_id: str | None = "client", *,
           topics=(("t", ((0, b"v"),)),)) -> bytearray:
    from strom.protocol.records import build_batch

    body = {"transactional_id": txn, "acks": -1, "timeout_ms": 1234, "topic_data": [
        {"name": name, "topic_id": uuid.uuid4(), "partition_data": [
            {"index": idx, "records": None if value is None else build_batch([(None, value)])}
            for idx, value in parts]} for name, parts in topics]}
    frame = bytearray(messages.encode_request(PRODUCE, version, body, correlation_id=77, client_id=client_id or "")[4:])
    if client_id is None:
        frame[8:10] = b"\xff\xff"  # a null client id (length -1)
    return frame


def _plain(request) -> tuple:
    body = request.body
    return (request.header, request.size, body.transactional_id, body.acks, body.timeout_ms,
            [(t.name, t.topic_id, [(p.index, None if p.records is None else (bytes(p.records), p.records.readonly))
                                   for p in t.partition_data]) for t in body.topic_data])


def test_the_compiled_produce_parser_is_built() -> None:
    """scripts/bootstrap builds it; without it every Produce takes the Python parser."""
    assert messages._parse_compiled is not None


@pytest.mark.parametrize("version", range(3, 14))
def test_compiled_and_python_parsers_agree(version):
    """Both parsers make the same objects, record sets writable views of the frame; v13
    (topic ids) is left to Python."""
    long_value = b"x" * 300
    cases = [_frame(version), _frame(version, "txn-" * 40, None),
             _frame(version, client_id="ünï", topics=(("long-" * 40, ((1, long_value), (2, None), (5, b"v"))),
                                                      ("second", ()), ("third", ((0, b"w"),))))]
    for frame in cases:
        compiled = messages._parse_compiled(frame)
        python = messages.parse_request_py(bytearray(frame))
        if version >= 13:
            assert compiled is None
            continue
        assert compiled is not None
        assert type(compiled) is type(python) and type(compiled.body) is type(python.body)
        assert _plain(compiled) == _plain(python)
        records = compiled.body.topic_data[0].partition_data[0].records
        assert records.obj is frame and not records.readonly  # offsets are assigned in place


def test_other_requests_and_unusual_produce_requests_are_left_to_python() -> None:
    metadata = bytearray(messages.encode_request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                         "include_topic_authorized_operations": False})[4:])
    assert messages._parse_compiled(metadata) is None
    frame = _frame(9)
    assert messages._parse_compiled(frame) is not None
    tags_at = 10 + len("client")  # api key, version, correlation id, client id: then the tags
    with_header_tag = frame[:tags_at] + b"\x01\x05\x01\x00" + frame[tags_at + 1:]  # one tagged field
    assert messages._parse_compiled(with_header_tag) is None
    assert messages.parse_request_py(with_header_tag).header.correlation_id == 77
    assert messages._parse_compiled(bytearray(b"\x00\x00\x00\x09\x00")) is None
    assert messages._parse_compiled(bytearray()) is None


@pytest.mark.parametrize("version", [3, 8, 9, 12])
def test_compiled_parser_never_accepts_what_python_refuses(version):
    """Every truncation and thousands of random byte changes: the compiled parser answers
    None (left to Python, which names the fault) or exactly what Python parses."""
    from compiled_support import agrees_on_damage

    def same(compiled, python) -> None:
        assert _plain(compiled) == _plain(python)

    good = _frame(version, "t", topics=(("a", ((0, b"v" * 3), (1, None))), ("b", ((2, b"w"),))))
    accepted = agrees_on_damage(good, version, 3000, same)
    assert accepted > 100  # the changes that keep a frame well formed (a value, an index)
