import struct
import uuid

import pytest

from strom.protocol import messages
from strom.protocol.messages import RESPONSES, build


def test_request_round_trip_flexible_header():
    raw = messages.encode_request(3, 12, {"topics": [{"name": "t"}], "allow_auto_topic_creation": False},
                                  correlation_id=7, client_id="me")
    request = messages.parse_request(raw[4:])
    assert request.header.api_key == 3 and request.header.api_version == 12
    assert request.header.correlation_id == 7 and request.header.client_id == "me"
    assert request.header.flexible
    assert [name for _, name in request.body.topics()] == ["t"]
    assert request.body.allow_auto_topic_creation is False


def test_non_flexible_header_has_no_tag_buffer():
    raw = messages.encode_request(3, 1, {"topics": None}, correlation_id=3)
    header, pos = messages.parse_header(raw[4:])
    assert not header.flexible
    assert pos == 10 + len("strom")


def test_header_tagged_fields_are_skipped():
    body = messages.build(messages.REQUESTS[18], 3, {"client_software_name": "x",
                                                     "client_software_version": "1"}).encode(version=3)
    head = struct.pack(">hhih", 18, 3, 9, 1) + b"c" + b"\x01" + b"\x05\x02ab"  # one unknown tag
    request = messages.parse_request(head + body)
    assert request.header.correlation_id == 9
    assert request.body.client_software_name == "x"


def test_unknown_api_key_and_version():
    with pytest.raises(messages.UnsupportedRequest):
        messages.parse_request(struct.pack(">hhih", 999, 0, 1, -1))
    with pytest.raises(messages.UnsupportedRequest):
        messages.parse_request(struct.pack(">hhih", 3, 99, 1, -1))


def test_truncated_request_is_invalid():
    raw = messages.encode_request(19, 5, {"topics": [{"name": "abc", "num_partitions": 1,
                                                      "replication_factor": 1, "assignments": [],
                                                      "configs": []}], "timeout_ms": 1000})
    with pytest.raises(messages.InvalidRequest):
        messages.parse_request(raw[4:-6])
    with pytest.raises(messages.InvalidRequest):
        messages.parse_request(b"\x00\x03")


def test_response_header_versions():
    flex = messages.RequestHeader(3, 12, 5, None, True)
    assert messages.response_header(flex) == struct.pack(">i", 5) + b"\x00"
    api_versions = messages.RequestHeader(18, 3, 5, None, True)
    assert messages.response_header(api_versions) == struct.pack(">i", 5)


def test_response_encode_decode_round_trip():
    header = messages.RequestHeader(20, 4, 11, "c", True)
    raw = messages.encode_response(header, {"throttle_time_ms": 0, "responses": [
        {"name": "t", "error_code": 3, "error_message": None}]})
    (size,) = struct.unpack_from(">i", raw)
    assert size == len(raw) - 4
    correlation_id, body = messages.decode_response(20, 4, raw[4:])
    assert correlation_id == 11 and body.responses[0].error_code == 3


TOPIC_ID = uuid.UUID("6f1c4d5e-0a2b-4c3d-8e9f-112233445566")


def _produce_request(version: int, records: bytes | None) -> bytes:
    # a name up to v12, the topic id from v13 (KIP-516): the codec writes the one the version has
    return messages.encode_request(0, version, {
        "transactional_id": "tx" if version >= 3 else None, "acks": -1, "timeout_ms": 1500,
        "topic_data": [{"name": "t", "topic_id": TOPIC_ID, "partition_data": [{"index": 2, "records": records},
                                                                             {"index": 3, "records": None}]}]})[4:]


@pytest.mark.parametrize("version", [3, 8, 9, 11, 12, 13])
def test_produce_records_are_writable_views_of_the_frame(version):
    frame = bytearray(_produce_request(version, b"\x01\x02\x03"))
    body = messages.parse_request(frame).body
    assert (body.transactional_id, body.acks, body.timeout_ms) == ("tx", -1, 1500)
    (topic,) = body.topic_data
    first, second = topic.partition_data
    named = ("", TOPIC_ID) if version >= 13 else ("t", None)  # the handler names a v13 topic
    assert (topic.name, topic.topic_id, first.index, bytes(first.records)) == (*named, 2, b"\x01\x02\x03")
    assert second.records is None
    first.records[0] = 9  # writes land in the frame: no copy was made
    assert b"\x09\x02\x03" in frame


@pytest.mark.parametrize("version", [3, 9, 13])
def test_truncated_produce_is_invalid(version):
    raw = _produce_request(version, b"abc")
    with pytest.raises(messages.InvalidRequest):
        messages.parse_request(raw[:-3])
    with pytest.raises(messages.InvalidRequest):
        messages.parse_request(raw + b"\x00")


def _by_constructor(cls: type, version: int, fields: dict):
    """The codec's own way: every struct made by its class's constructor."""
    kwargs = {}
    for name, value in fields.items():
        nested = cls._struct.fields[name]
        if value is not None and nested.is_struct_array():
            value = [_by_constructor(nested.data_class, version, v) for v in value]
        elif value is not None and nested.is_struct():
            value = _by_constructor(nested.data_class, version, value)
        kwargs[name] = value
    return cls(version=version, **kwargs)


def test_build_makes_what_the_codecs_constructors_make():
    """`build` makes elements from a plan, not through their constructors: the same objects,
    down to the bytes, the tagged fields noted and the defaults of fields left out."""
    partition = {"partition_index": 3, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
                 "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1,
                 "records": b"", "diverging_epoch": {"epoch": 4, "end_offset": 7}}
    fields = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic_id": uuid.UUID(int=5), "partitions": [partition, {
            **{k: v for k, v in partition.items() if k != "log_start_offset"}, "partition_index": 4}]}]}
    response = RESPONSES[1]
    for version in (12, 13, 16):
        made, reference = build(response, version, fields), _by_constructor(response, version, fields)
        assert made.encode(version=version) == reference.encode(version=version)
        first, second = made.responses[0].partitions
        assert first.tags == {"diverging_epoch"} == reference.responses[0].partitions[0].tags
        assert first.diverging_epoch.epoch == 4 and first.log_start_offset == 0
        assert second.log_start_offset == -1 == reference.responses[0].partitions[1].log_start_offset  # the default
    # One answer for every version: what a version does not have is left out, even a struct
    # that cannot be made at it (FetchResponse's node endpoints came in v16).
    endpoints = {"node_endpoints": [{"node_id": 1, "host": "h", "port": 9, "rack": None}]}
    older = build(response, 13, {**fields, **endpoints})
    assert older.encode(version=13) == build(response, 13, fields).encode(version=13)
    assert build(response, 16, {**fields, **endpoints}).node_endpoints[0].port == 9
    with pytest.raises(ValueError, match="bogus"):
        build(response, 12, {"responses": [{"partitions": [{"bogus": 1}]}]})
    with pytest.raises(ValueError, match="version"):
        build(response, 99, {})


def test_the_lazy_codec_table_names_each_apis_module():
    """REQUESTS and RESPONSES import an API's module at its first lookup, from a table: it must
    name every API the codec modules register, each under the module that registers it, so a
    kafka-python upgrade that adds or moves one fails here and not as a closed connection."""
    import importlib
    import subprocess
    import sys

    for module in messages.CODEC_MODULES:
        importlib.import_module(module)
    requests, responses = messages.registered_codecs()
    listed = {key: module for module, keys in messages.CODEC_MODULES.items() for key in keys}
    assert sorted(requests) == sorted(responses) == sorted(listed)
    for key, module in listed.items():
        assert messages.REQUESTS[key] is requests[key] and messages.RESPONSES[key] is responses[key]
        assert requests[key].__module__ == module or requests[key].__module__.startswith(module + "."), key
    assert messages.REQUESTS.get(99) is None and 99 not in messages.RESPONSES
    # A fresh process parses a request having imported only that API's module.
    probe = ("import sys; from strom.protocol import messages as m; "
             "raw = m.encode_request(3, 12, {'topics': None, 'allow_auto_topic_creation': False}); "
             "m.parse_request(raw[4:]); "
             "print(sorted(n for n in m.CODEC_MODULES if n in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert loaded.strip() == "['kafka.protocol.metadata']", loaded


def test_the_request_codec_table_agrees_with_the_codec_and_keeps_only_known_versions():
    for api_key in (0, 1, 3, 18, 19):
        cls = messages.REQUESTS[api_key]
        for version in range(cls.max_version + 1):
            assert messages.request_codec(api_key, version) == (cls, cls.flexible_version_q(version))
            assert messages.is_flexible(api_key, version) == cls.flexible_version_q(version)
    before = len(messages._REQUEST_CODECS)
    for version in (-1, 99, 32767):
        assert messages.request_codec(3, version) is None
    assert messages.request_codec(999, 0) is None
    assert len(messages._REQUEST_CODECS) == before  # what a client makes up is not kept
    assert messages.is_flexible(18, 99)  # newer ApiVersions stay flexible, to be answered at all


def test_header_client_id_and_tag_section_edges():
    head = struct.pack(">hhih", 3, 12, 4, 2) + b"\xff\xfe" + b"\x00"
    header, pos = messages.parse_header(head)
    assert header.client_id == "\ufffd\ufffd" and pos == len(head)  # bad UTF-8 replaced, not refused
    with pytest.raises(messages.InvalidRequest):  # flexible, cut before its tag section
        messages.parse_request(head[:-1])
